"""Michel et al. (2019)'s head importance and iterative pruning schedule, as pure tensor maths.

Importance of head h (the paper's section 4.1; reference ``examples/classifier_eval.py:230-253``, paul branch
of pmichel31415/pytorch-pretrained-BERT): ``I_h = E_x |dL(x)/dxi_h|`` with the absolute value
taken per example AND per token, ``dL/dxi_{h,b,t} = dL/dctx_{b,h,t} . ctx_{b,h,t}``:

- ``abs_token_sum``: ``sum_{b,t} |dL/dxi_{h,b,t}|`` over one batch's real tokens (the
  reference's ``einsum("bhli,bhli->bhl", grad_ctx, ctx).abs().sum(-1).sum(0)``);
- ``per_token``: the sums over all batches divided by the tokens they cover; the last layer by
  the examples instead when only the first token reaches the loss (the reference's
  ``head_importance[:-1] /= tot_tokens; head_importance[-1] /= subset_size``);
- ``normalize_per_layer``: ``I[l] / ||I[l]||_2`` (Michel et al. normalise importance within each
  layer by its L2 norm, after Molchanov et al. 2017; a layer of zeros stays zero).

Pruning:

- ``pruning_counts``: how many of all ``N`` heads are removed after each step of ``step``
  (a fraction of ALL heads, not of those left): ``floor(pct * N / 100)`` at pct = 0, step, ...,
  100 percent, as the reference's ``int(total_heads * prune_percent / 100)``
  (``examples/pruning.py:50``).
- ``least_important``: which still-kept heads to remove next (``pruning.py:what_to_prune``).
"""

from __future__ import annotations

import torch

EPS = 1e-20
"""Added to each layer's norm so a layer whose heads are all pruned (all zeros) stays zero."""


def abs_token_sum(token_gradients: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(H,)``: ``sum_{b,t} |dL/dxi[b, t, h]|`` over the real tokens of one batch.

    ``token_gradients`` (B, T, H) is ``dL/dxi`` per example, token and head; ``attention_mask``
    (B, T) is 1 on real tokens. The reference sums over padding too, where the gradient is
    exactly 0 (a padded position reaches the loss only as a masked key); the mask makes that hold
    whatever the decoder."""
    return (token_gradients.abs() * attention_mask[..., None].to(token_gradients.dtype)).sum(dim=(0, 1))


def per_token(totals: torch.Tensor, tokens: int, examples: int, last_layer_per_example: bool) -> torch.Tensor:
    """``(L, H)`` sums of ``|dL/dxi|`` divided by the ``tokens`` they cover; with
    ``last_layer_per_example`` the last layer's row by ``examples`` instead.

    The reference divides its last layer by the number of examples: its classifier reads the
    first token only, so there the last layer's gradient is zero at every other token and the
    per-example mean is the mean over the tokens that reach the loss."""
    importance = totals / tokens
    if last_layer_per_example:
        importance[-1] = totals[-1] / examples
    return importance


def normalize_per_layer(importance: torch.Tensor) -> torch.Tensor:
    """``(L, H)`` importance with each layer's row divided by its L2 norm (+ ``EPS``)."""
    return importance / (importance.norm(dim=-1, keepdim=True) + EPS)


def pruning_counts(num_heads: int, step: float) -> list[int]:
    """Heads removed after each pruning step, starting with 0: ``floor(pct * N / 100)`` for
    pct = ``min(100, round(100 * t * step))``, t = 0 .. ceil(1 / step) (the reference's
    ``int(total_heads * prune_percent / 100)``, in integers so that no rounding error moves a
    count). Non-decreasing; two steps may remove the same count when ``step * N < 1``."""
    steps = round(1 / step) if abs(1 / step - round(1 / step)) < 1e-9 else int(1 / step) + 1
    return [min(100, round(100 * t * step)) * num_heads // 100 for t in range(steps + 1)]


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
