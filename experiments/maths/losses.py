"""Training losses over task logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Label of a position that is not scored (padding, sub-word continuations)."""


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over (B, C) logits with (B,) labels, or (B, T, C) with (B, T);
    positions labelled ``IGNORE_INDEX`` are not scored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


# Debiasing losses (Clark et al. 2019; Utama et al. 2020; used by Liu et al. 2022, see PAPERS.md).
# A bias model (trained on a shortcut feature only) gives, per training example, its class
# probabilities p_b; these losses down-weight what the bias model already gets right. All take
# classification logits (B, C) and labels (B,); the bias inputs are constants (no gradient).


def poe_loss(logits: torch.Tensor, labels: torch.Tensor, bias_log_probs: torch.Tensor) -> torch.Tensor:
    """Product of experts: ``mean_i CE(log_softmax(z_i) + log p_b(. | x_i), y_i)``.

    ``logits`` (B, C), ``labels`` (B,), ``bias_log_probs`` (B, C) the bias model's
    log-probabilities. The main model is trained inside the product with the bias model, so
    it gains little from examples the bias model already solves. A uniform bias model
    (``log p_b = -log C``) gives plain cross-entropy.
    """
    return F.cross_entropy(F.log_softmax(logits, dim=-1) + bias_log_probs, labels)


def reweight_loss(logits: torch.Tensor, labels: torch.Tensor, bias_probs_of_label: torch.Tensor) -> torch.Tensor:
    """Example reweighting: ``sum_i w_i CE_i / sum_i w_i`` with ``w_i = 1 - p_b(y_i | x_i)``.

    ``logits`` (B, C), ``labels`` (B,), ``bias_probs_of_label`` (B,) the bias model's
    probability of each example's gold label. A constant ``p_b`` gives plain cross-entropy;
    a batch where the bias model is certain of every label (all ``w_i = 0``) gives NaN.
    """
    weights = 1.0 - bias_probs_of_label.to(logits.dtype)  # (B,)
    per_example = F.cross_entropy(logits, labels, reduction="none")  # (B,)
    return (weights * per_example).sum() / weights.sum()


def conf_reg_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_probs: torch.Tensor,
    bias_probs_of_label: torch.Tensor,
) -> torch.Tensor:
    """Confidence regularisation (Utama et al. 2020): distillation from a scaled teacher.

    ``t~_ij = t_ij ** (1 - p_b(y_i)) / sum_k t_ik ** (1 - p_b(y_i))``,
    ``loss = mean_i -sum_j t~_ij log softmax(z_i)_j``.

    ``logits`` (B, C); ``teacher_probs`` (B, C) a fine-tuned teacher's probabilities;
    ``bias_probs_of_label`` (B,). The more the bias model trusts the gold label, the flatter
    the target (uniform when ``p_b(y_i) = 1``); with ``p_b(y_i) = 0`` the target is the
    teacher itself, and a one-hot teacher then gives plain cross-entropy. ``labels`` (B,) enter
    only through ``bias_probs_of_label``; they are taken to keep one signature for every loss.
    The reference code (``SmoothedDistillLoss``) raises the probabilities themselves to the
    power, so a teacher probability of exactly 0 stays 0 (``0 ** 0 = 1`` when ``p_b = 1``).
    """
    if labels.shape != bias_probs_of_label.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and bias_probs_of_label "
                         f"{tuple(bias_probs_of_label.shape)} must both be (B,)")
    exponent = (1.0 - bias_probs_of_label.to(teacher_probs.dtype))[:, None]  # (B, 1)
    scaled = teacher_probs**exponent  # (B, C)
    targets = scaled / scaled.sum(dim=-1, keepdim=True)  # (B, C), rows sum to 1
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
