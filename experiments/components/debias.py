"""The training objective of a classification run: cross-entropy or a debiasing loss.

Liu et al. (2022) train subnetworks with four objectives (PAPERS.md; the maths is in
``experiments/maths/losses.py``):

- ``ce``: cross-entropy;
- ``poe``: product of experts with a bias model, ``CE(log_softmax(z) + log p_b, y)``;
- ``reweight``: example reweighting, ``w_i = 1 - p_b(y_i)``;
- ``conf_reg``: confidence regularisation, a teacher's probabilities raised to
  ``1 - p_b(y_i)``, renormalised, as soft targets.

The bias model and the teacher are stages (DESIGN.md decision 10): a method with a ``loss``
key takes :func:`loss_stages` as its default stages, so ``loss: poe`` runs a
``bias_model: {method: bias_only}`` (a logistic regression on the task's bias features,
experiments/methods/bias_only.py) and ``loss: conf_reg`` also a ``teacher: {method:
finetune}`` (the same model fine-tuned with cross-entropy on the same task, seed and training
settings), each once per distinct config and shared by every cell that needs it. A config's
own ``bias_model`` / ``teacher`` wins. :func:`check_loss` rejects at validation what cannot
run: a debiasing loss on a task without bias features or on a tagging task, a teacher that
is not a model of the task's labels.

:func:`objective` is what a method's loop calls: ``loss_fn(logits, labels, index)`` with the
batch's example indices (``RunState.batch_index``), the bias model's and the teacher's
probabilities of every training example computed once before the first step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from base.naming import suggest
from experiments.maths.losses import conf_reg_loss, poe_loss, reweight_loss, task_loss

LOSSES = {
    "ce": "cross-entropy",
    "poe": "product of experts with the bias model (bias_model stage)",
    "reweight": "examples weighted by 1 - p_b(gold label) (bias_model stage)",
    "conf_reg": "confidence regularisation: a teacher's probabilities scaled by the bias model (teacher + bias_model stages)",
}
"""The objectives a method's ``loss`` key takes, with what they need."""

TEACHERS = ("finetune",)
"""Methods whose runs can teach (a task model with a decoder of the task's labels)."""

Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(logits (B, C), labels (B,), example indices (B,)) -> scalar``."""


def loss_stages(loss: str) -> dict[str, dict]:
    """The default stages of ``loss``: a bias model for every debiasing loss, a teacher for conf_reg."""
    stages: dict[str, dict] = {}
    if loss != "ce":
        stages["bias_model"] = {"method": "bias_only"}
    if loss == "conf_reg":
        stages["teacher"] = {"method": "finetune"}
    return stages


def check_loss(cfg, loss: str) -> None:
    """Raise ValueError naming the key when ``loss`` cannot run on this config."""
    from experiments.tasks import TASKS, bias_feature_names

    key = f"{cfg.method}.loss"
    if loss not in LOSSES:
        raise ValueError(f"{key}: unknown loss '{loss}'{suggest(loss, LOSSES)} (losses: {', '.join(LOSSES)})")
    if loss == "ce":
        return
    if TASKS[cfg.task.name].KIND != "classification":
        raise ValueError(f"{key}: {loss} needs a classification task, '{cfg.task.name}' is {TASKS[cfg.task.name].KIND}")
    try:
        bias_feature_names(cfg.task)
    except ValueError as err:
        raise ValueError(f"{key}: {loss} needs a bias model, but {err}") from None
    if loss == "conf_reg":
        teacher = (cfg.teacher or {}).get("method")
        if teacher not in TEACHERS:
            raise ValueError(f"{key}: conf_reg needs a teacher stage that predicts the task's labels "
                             f"({', '.join(TEACHERS)}), got teacher method '{teacher}'")


def objective(loss: str, cfg, ctx, state) -> Objective:
    """The loss function of a run's loop; reads the stages it needs once, here."""
    if loss == "ce":
        return lambda logits, labels, index: task_loss(logits, labels)
    from experiments.components.bias import bias_probs

    p_b = bias_probs(cfg, ctx, state.data.train).to(state.device)  # (N, C)
    if loss == "poe":
        log_p_b = p_b.clamp_min(1e-12).log()
        return lambda logits, labels, index: poe_loss(logits, labels, log_p_b[index])
    if loss == "reweight":
        return lambda logits, labels, index: reweight_loss(logits, labels, _of_label(p_b[index], labels))
    teacher = teacher_probs(cfg, ctx, state).to(state.device)  # (N, C)
    return lambda logits, labels, index: conf_reg_loss(logits, labels, teacher[index], _of_label(p_b[index], labels))


def _of_label(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return probs.gather(1, labels[:, None])[:, 0]


@torch.no_grad()
def teacher_probs(cfg, ctx, state) -> torch.Tensor:
    """(N, C) probabilities of the run's ``teacher`` stage on every training example: the
    teacher's encoder and task decoder (its final weights) evaluated in eval mode, on CPU."""
    from experiments.models import load_backbone
    from experiments.training.loop import batches, forward_logits
    from experiments.training.seeding import derive_seed
    from experiments.training.state import RunState, build_decoder, upstream_weights

    encoder, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    decoder = build_decoder(state.task, encoder.config.hidden_size, state.data.num_labels, cfg.seed)
    teacher = RunState(cfg=cfg, task=state.task, data=state.data, encoder=encoder, decoders={"task": decoder})
    teacher.load_weights(upstream_weights(cfg, ctx, "teacher"))
    encoder.to(state.device).eval(), decoder.to(state.device).eval()
    probs = []
    for ids, mask, _ in batches(state.data.train, cfg.train.batch_size, state.device):
        probs.append(forward_logits(encoder, decoder, ids, mask, state.precision).softmax(dim=-1).cpu())
    return torch.cat(probs)
