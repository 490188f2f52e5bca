"""Hard Concrete head gates and their expected-L0 penalty.

Louizos, Welling & Kingma 2018, "Learning Sparse Neural Networks through L0
Regularization"; applied to attention heads by Voita et al. 2019 ("Analyzing
Multi-Head Self-Attention") and He & Choi 2021 ("The Stem Cell Hypothesis").

Every function is pure: tensors in, tensors out; randomness only through an
explicit ``torch.Generator``. Shapes: ``log_alpha`` is ``(L, H)`` (layers,
heads) for a model, but every function except ``init_log_alpha`` and
``l0_penalty`` is elementwise and accepts any shape.

Constants are those of both reference implementations (see PAPERS.md).
"""

from __future__ import annotations

import math

import torch

from base.units import OPEN_THRESHOLD  # one definition, shared with analysis

BETA = 0.33
"""Temperature of the Hard Concrete distribution."""
LIMIT_L = -0.1
"""Left end ``l`` of the stretched interval (``l < 0``)."""
LIMIT_R = 1.1
"""Right end ``r`` of the stretched interval (``r > 1``)."""
EPS = 1e-6
"""Uniform noise is drawn from ``U(EPS, 1 - EPS)`` so that ``log u`` is finite."""


def init_log_alpha(num_layers: int, num_heads: int, generator: torch.Generator) -> torch.Tensor:
    """Xavier-uniform initial ``log_alpha`` of shape ``(L, H)``.

    Voita et al. initialise each layer's ``(1, H)`` gate parameter with
    ``xavier_uniform``: fan_in = H, fan_out = 1, so
    ``log_alpha ~ U(-b, b)`` with ``b = sqrt(6 / (H + 1))`` (0.679 for H = 12).
    The tensor lives on ``generator``'s device.
    """
    bound = math.sqrt(6.0 / (num_heads + 1))
    u = torch.rand(num_layers, num_heads, generator=generator, device=generator.device)  # (L, H)
    return (2.0 * u - 1.0) * bound


def sample_gates(
    log_alpha: torch.Tensor, generator: torch.Generator, beta: float = BETA
) -> torch.Tensor:
    """One training-time Hard Concrete sample per element of ``log_alpha``.

    ``u ~ U(eps, 1 - eps)``,
    ``s = sigmoid((log u - log(1 - u) + log_alpha) / beta)``,
    ``z = clamp(s * (r - l) + l, 0, 1)``.

    The noise is drawn on ``generator``'s device (so a CPU generator gives the
    same numbers whatever device ``log_alpha`` is on) and then moved to
    ``log_alpha``. Differentiable with respect to ``log_alpha``; the result has
    ``log_alpha``'s shape and dtype.
    """
    u = torch.rand(log_alpha.shape, generator=generator, device=generator.device)
    u = (EPS + (1.0 - 2.0 * EPS) * u).to(device=log_alpha.device, dtype=log_alpha.dtype)
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    return torch.clamp(s * (LIMIT_R - LIMIT_L) + LIMIT_L, 0.0, 1.0)


def eval_gates(log_alpha: torch.Tensor) -> torch.Tensor:
    """Deterministic test-time gates ``z = clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1)``.

    Exactly 0 for ``log_alpha <= -ln 11`` (about -2.398), exactly 1 for
    ``log_alpha >= ln 11``, 0.5 at ``log_alpha = 0``. Same shape as the input.
    """
    return torch.clamp(torch.sigmoid(log_alpha) * (LIMIT_R - LIMIT_L) + LIMIT_L, 0.0, 1.0)


def prob_open(log_alpha: torch.Tensor, beta: float = BETA) -> torch.Tensor:
    """Probability that a sampled gate is non-zero, ``P(z != 0)``.

    ``P(z != 0) = sigmoid(log_alpha - beta * ln(-l / r))`` (Louizos et al.,
    eq. 12), i.e. ``sigmoid(log_alpha + 0.7913)``; 0.6881 at ``log_alpha = 0``.
    Elementwise, same shape as the input.
    """
    return torch.sigmoid(log_alpha - beta * math.log(-LIMIT_L / LIMIT_R))


def l0_penalty(log_alpha: torch.Tensor, beta: float = BETA) -> torch.Tensor:
    """Expected number of open heads per layer, averaged over layers (a scalar).

    ``penalty = mean_l sum_h P(z_lh != 0)`` for ``log_alpha`` of shape
    ``(L, H)``. The papers write a sum over all heads; both reference codes
    (Voita et al., He & Choi) sum per layer and take the MEAN over layers, and
    so do we: the loss is ``task_loss + lambda * l0_penalty(log_alpha)``, and
    the published lambdas (0.01 POS/DEP, 0.001 SRL, 2e-4 NER) assume the mean.
    """
    if log_alpha.dim() != 2:
        raise ValueError(f"log_alpha must be (layers, heads), got shape {tuple(log_alpha.shape)}")
    return prob_open(log_alpha, beta).sum(dim=-1).mean()


def open_heads(gates: torch.Tensor, threshold: float = OPEN_THRESHOLD) -> torch.Tensor:
    """Boolean mask of open heads: ``gates > threshold`` (same shape as ``gates``)."""
    return gates > threshold
