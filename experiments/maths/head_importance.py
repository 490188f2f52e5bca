"""Michel et al. (2019)'s head importance and iterative pruning schedule, as pure tensor maths.

- ``normalize_per_layer``: ``I[l] / ||I[l]||_2`` (Michel et al. normalise importance within each
  layer by its L2 norm, after Molchanov et al. 2017; a layer of zeros stays zero).
- ``pruning_counts``: how many of all ``N`` heads are removed after each step of ``step``
  (a fraction of ALL heads, not of those left): ``round(t * step * N)``, t = 0, 1, ..., up to N.
- ``least_important``: which still-kept heads to remove next.
"""

from __future__ import annotations

import torch

EPS = 1e-20
"""Added to each layer's norm so a layer whose heads are all pruned (all zeros) stays zero."""


def normalize_per_layer(importance: torch.Tensor) -> torch.Tensor:
    """``(L, H)`` importance with each layer's row divided by its L2 norm (+ ``EPS``)."""
    return importance / (importance.norm(dim=-1, keepdim=True) + EPS)


def pruning_counts(num_heads: int, step: float) -> list[int]:
    """Heads removed after each pruning step, starting with 0: ``[round(t * step * N)]`` for
    t = 0 .. ceil(1 / step), the last capped at ``num_heads``. Non-decreasing; two steps may
    remove the same count when ``step * N < 1``."""
    steps = round(1 / step) if abs(1 / step - round(1 / step)) < 1e-9 else int(1 / step) + 1
    return [min(num_heads, round(t * step * num_heads)) for t in range(steps + 1)]


def least_important(importance: torch.Tensor, keep: torch.Tensor, count: int) -> torch.Tensor:
    """Bool ``(L, H)``: the ``count`` kept heads (``keep`` True) with the lowest importance;
    ties go to the lower index (layer-major order)."""
    flat = importance.flatten().double().masked_fill(~keep.flatten(), float("inf"))  # pruned: never chosen again
    if count > int(keep.sum()):
        raise ValueError(f"cannot remove {count} heads: only {int(keep.sum())} are left")
    order = torch.sort(flat, stable=True).indices[:count]
    chosen = torch.zeros_like(keep.flatten())
    chosen[order] = True
    return chosen.view_as(keep)
