"""Spearman rho between maps: do two maps rank the units alike?

``rho_ij = pearson(rank(x_i), rank(x_j))``, ties given their average rank (as
``scipy.stats.spearmanr``). Compare-maps' matrix between methods' maps (``heads.log_alpha`` vs
``heads.importance``) or one map across tasks; the score of Wang et al. (2022)'s neuron rankings.
Only the order of the units counts, so maps on different scales compare. A constant map ranks
no unit above another: NaN.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from analysis.statistics.base import Statistic, as_rows
from analysis.statistics.pearson import (
    correlation_from_standardised,
    output_dtype,
    standardise_rows,
)


def rank_rows(x: np.ndarray) -> np.ndarray:
    """Rank each row's values, 1..P, ties given their average rank (float64, ``(N, P)``).

    The same as ``scipy.stats.rankdata(x, method="average", axis=1)`` at a fraction of its
    time: blocks of rows (see :func:`_sorted_ranks`) written into one output.
    """
    x = as_rows(x)
    ranks = np.empty(x.shape)
    for rows in _row_blocks(*x.shape):
        order, sorted_ranks = _sorted_ranks(x[rows])
        np.put_along_axis(ranks[rows], order, sorted_ranks, axis=1)
    return ranks


_RANK_BLOCK_ELEMENTS = 1 << 19
"""Values ranked at once: each temporary of a block (~4 MB) stays in cache; whole-array
temporaries of 2,000 x 9,216 ranks (150 MB each) cost more in fresh pages than in sorting."""


def _row_blocks(n: int, p: int) -> list[slice]:
    rows = max(1, _RANK_BLOCK_ELEMENTS // max(p, 1))
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


def _sorted_ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, ranks)`` of a block of rows: ``order`` sorts each row (argsort) and
    ``ranks[i, k]`` is the average rank (1-based) of the row's ``k``-th smallest value.

    One float64 argsort per row, then each run of equal values gets the mean of its ranks."""
    x = x.astype(np.float64, copy=False)
    n, p = x.shape
    order = np.argsort(x, axis=1)
    ordered = np.take_along_axis(x, order, axis=1)
    starts = np.empty((n, p), dtype=bool)  # True where a run of equal values begins
    starts[:, :1] = True
    np.not_equal(ordered[:, 1:], ordered[:, :-1], out=starts[:, 1:])
    flat = starts.ravel()
    first = np.flatnonzero(flat)  # flat index of each run's first element
    sizes = np.diff(first, append=n * p)
    mean_rank = first % p + (sizes + 1) / 2.0  # 1-based mean rank of each run
    return order, mean_rank[np.cumsum(flat) - 1].reshape(n, p)


def _standardised_rank_sum(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``(sum_i u_i, n)`` over the ``n`` non-constant rows of ``x``, ``u_i`` its standardised
    ranks (centred, unit norm), without the ``(N, P)`` ranks: each block's values are summed
    straight into the units they rank (``bincount``). Blocks run on up to 4 threads (numpy's
    sort releases the GIL)."""
    x = as_rows(x)
    p = x.shape[1]

    def block(rows: slice) -> tuple[np.ndarray, int]:
        order, ranks = _sorted_ranks(x[rows])
        ranks -= (p + 1) / 2.0  # the mean of 1..P, ties or not
        norm = np.sqrt(np.einsum("ij,ij->i", ranks, ranks))
        varied = norm > 0  # a constant row's ranks are all equal: its correlations are undefined
        u = ranks[varied] / norm[varied, None]
        return np.bincount(order[varied].ravel(), weights=u.ravel(), minlength=p), int(varied.sum())

    blocks = _row_blocks(*x.shape)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(blocks) or 1)) as pool:
        parts = list(pool.map(block, blocks))
    return sum((part for part, _ in parts), np.zeros(p)), sum(count for _, count in parts)


def spearman_between(a: np.ndarray, b: np.ndarray, dtype=None) -> np.ndarray:
    """Spearman correlation of every run of group ``a`` with every run of group ``b``.

    ``rho_ij = pearson(rank(a_i), rank(b_j))``.

    Args:
        a: ``(Na, P)`` or ``(Na, L, H)``; b: ``(Nb, P)`` or ``(Nb, L, H)``.

    Returns:
        ``(Na, Nb)``; rows of constant runs are NaN. ``dtype`` as in ``pearson_matrix``.
    """
    a, b = as_rows(a), as_rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"groups have different numbers of heads: {a.shape[1]} vs {b.shape[1]}")
    out_dtype = output_dtype([a.dtype, b.dtype], dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        u, v = standardise_rows(rank_rows(a)), standardise_rows(rank_rows(b))
    return correlation_from_standardised(u, v, out_dtype)


def mean_spearman_between(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of ``spearman_between(a, b)`` over its defined entries, without the ``(Na, Nb)`` matrix.

    ``mean_ij u_i . v_j = (sum_i u_i) . (sum_j v_j) / (na nb)`` over the na, nb runs that are
    not constant (``u``, ``v``: standardised ranks). NaN when either group has none.
    """
    a, b = as_rows(a), as_rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"groups have different numbers of heads: {a.shape[1]} vs {b.shape[1]}")
    (su, na), (sv, nb) = _standardised_rank_sum(a), _standardised_rank_sum(b)
    if not na or not nb:
        return math.nan
    return float(np.clip(su @ sv / (na * nb), -1.0, 1.0))


def standardised_ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ranks, u, defined)`` of rows ``(R, P)``: the average ranks, the ranks centred to unit norm
    (``rho = u_i . u_j``) and whether each row ranks anything (a constant row's ``u`` is 0)."""
    ranks = rank_rows(x)  # (R, P)
    p = ranks.shape[1]
    centred = ranks - (p + 1) / 2.0
    norm = np.sqrt(np.einsum("ij,ij->i", centred, centred))
    defined = norm > 0  # a constant map ranks every unit alike: its correlation is undefined
    return ranks, centred / np.where(defined, norm, 1.0)[:, None], defined


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman rho of each row of ``a`` with the same row of ``b``: ``(Q, P), (Q, P) -> (Q,)``."""
    (_, u, ok_a), (_, v, ok_b) = standardised_ranks(as_rows(a)), standardised_ranks(as_rows(b))
    rho = np.clip(np.einsum("qp,qp->q", u, v), -1.0, 1.0)
    return np.where(ok_a & ok_b, rho, math.nan)


STATISTICS = (
    Statistic(
        name="rho", label="rho", computes="Spearman rho", order=20, asked_in=("compare_maps",),
        null="each map's units relabelled at random (within each layer, or across all units), one "
             "relabelling per map shared by its runs: the mean rho of the relabelled maps",
        pairs=spearman_rows,
    ),
)
