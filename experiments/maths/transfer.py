"""Overlap of two prompts' neurons, and what chance gives (prompt transferability; ../shared/PAPERS.md).

Wang et al. (2022) predict how well a soft prompt transfers between tasks from the overlap of
the two prompts' top 20 % skill neurons, and compare it with Su et al. (2022)'s overlapping
rate of the neurons the two prompts *activate*. Both are overlaps of two sets of units, given
as boolean masks of one shape (``(L, I)`` neurons, or ``(P, L, I)`` neurons at prompt positions):

    overlap(A, B) = |A & B| / sqrt(|A| |B|)

the cosine similarity of the two indicator vectors (Su et al.'s measure). For two sets of one
size ``k`` (the top 20 % of two rankings) it is the shared fraction ``|A & B| / k``; for sets of
different sizes (what each prompt activates) it stays in ``[0, 1]``, 1 only for equal sets.

Chance: B's members shuffled within each row of the last axis (a layer's neurons, at one
position), keeping how many each row holds. Row ``r`` then shares ``a_r b_r / I`` in
expectation, so

    chance_overlap(A, B) = sum_r a_r b_r / I / sqrt(|A| |B|).

(Shuffled across all ``N`` units instead it is ``sqrt(|A| |B|) / N``: exactly 0.2 for two top
20 % sets, whatever the tasks.) Skill neurons concentrate in some layers for every task, so two
sets ranked across all neurons would share top neurons beyond 0.2 merely by sharing a layer
profile; the within-row chance is the baseline that asks for the same neurons, not only the same
layers. The skill neurons are
selected per layer (the reference's ``finfo``: the same number in every layer), so for them the
two chances agree; the activated neurons' sets differ per row.
"""

from __future__ import annotations

import math

import torch


def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|A & B| / sqrt(|A| |B|)`` of two bool masks of one shape; NaN when either set is empty."""
    _check(a, b)
    size = math.sqrt(float(a.sum()) * float(b.sum()))
    return float((a & b).sum()) / size if size > 0 else math.nan


def chance_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The expected :func:`overlap` when B's members are shuffled within each row of the last axis
    (``sum_r a_r b_r / I / sqrt(|A| |B|)``); NaN when either set is empty."""
    _check(a, b)
    size = math.sqrt(float(a.sum()) * float(b.sum()))
    if size == 0:
        return math.nan
    inner = a.shape[-1]
    per_row_a, per_row_b = (m.reshape(-1, inner).sum(dim=-1).double() for m in (a, b))  # (rows,)
    return float((per_row_a * per_row_b).sum()) / inner / size


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != torch.bool or b.dtype != torch.bool or a.shape != b.shape:
        raise ValueError(f"expected two bool masks of one shape, got {a.dtype} {tuple(a.shape)} "
                         f"and {b.dtype} {tuple(b.shape)}")
