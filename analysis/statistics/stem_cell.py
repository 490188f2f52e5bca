"""He & Choi (2021)'s stem cell statistic: do the seeds of one setting keep the same units?

Their "correlation across runs" is the multiple correlation of one run's gate vector ``z`` on the
others' over the units, ``sqrt(max(R2_adj, 0))``, for triples of runs (``triple_correlations``);
a cell's value is the mean over its triples, the statistic the mean over cells (``stem_cell``).
Three variants: ``stem_cell`` takes the mean over the three choices of response run and over every
triple of a cell's runs (symmetric in the runs, headsweep's default); ``stem_cell_paper`` is the
paper's single fit on each cell's first three seeds, ``z_run3 ~ z_run1 + z_run2``
(corelation_gate_overlap_rgb.py:115-121 in emorynlp/stem-cell-hypothesis reads ``gates[0]``,
``gates[1]``, ``gates[2]`` whatever the number of runs); ``stem_cell_triples`` the same fit averaged
over every triple of a cell's seeds (each triple's last as response), reported from 4 seeds, where it
differs from the paper's (at 3 seeds the two are one fit).
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from itertools import combinations

import numpy as np

from analysis.statistics.base import Statistic, as_rows, stack_runs, take_runs
from analysis.statistics.pearson import correlation, pearson_matrix, pearson_stack, standardised


def multiple_correlation(runs: np.ndarray) -> np.ndarray:
    """He & Choi's "correlation across runs", once per choice of response run.

    For each run ``i``, fit by ordinary least squares over the heads
    ``z_i ~ 1 + sum_{j != i} b_j z_j`` and return ``sqrt(max(R2_adj, 0))``, where

    ``R2 = 1 - SSR / SST``,  ``SST = sum_p (z_ip - mean(z_i))^2``,
    ``R2_adj = 1 - (1 - R2) (P - 1) / (P - k - 1)``

    and ``k + 1`` is the rank of the design matrix ``[1, z_j...]`` (as
    statsmodels' ``rsquared_adj``; with linearly independent runs
    ``k = n - 1``). For ``n = 3``, entry 2 is exactly the paper's
    ``z_run3 ~ z_run1 + z_run2``.

    A negative adjusted R^2 (a fit worse than its degrees of freedom pay for,
    typical of unrelated runs) is clipped to 0 before the square root, so
    unrelated runs score 0 rather than NaN.

    Args:
        runs: ``(n, P)`` or ``(n, L, H)``, ``n >= 2`` runs of the same cell.

    Returns:
        ``(n,)`` float64. NaN for a constant response run (``SST = 0``).
    """
    z = as_rows(runs).astype(np.float64)  # (n, P)
    n, p = z.shape
    if n < 2:
        raise ValueError(f"multiple correlation needs at least 2 runs, got {n}")
    if p <= n:
        raise ValueError(f"need more heads than runs for the adjusted R^2, got P={p}, n={n}")
    out = np.empty(n)
    for i in range(n):
        y = z[i]  # (P,)
        design = np.column_stack([np.ones(p), np.delete(z, i, axis=0).T])  # (P, n)
        coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
        resid = y - design @ coef
        yc = y - y.mean()
        sst = yc @ yc
        if sst <= 1e-24 * p * max(np.abs(y).max(), 1.0) ** 2:
            out[i] = np.nan
            continue
        r2 = 1.0 - (resid @ resid) / sst
        r2_adj = 1.0 - (1.0 - r2) * (p - 1) / (p - rank)
        out[i] = math.sqrt(min(max(r2_adj, 0.0), 1.0))
    return out


RESPONSES = ("mean", "last")
"""How a triple's statistic picks its response run: ``mean`` (headsweep's default: the mean over
the three choices of response, symmetric in the runs) or ``last`` (the paper's single fit,
``z_run3 ~ z_run1 + z_run2``: corelation_gate_overlap_rgb.py in emorynlp/stem-cell-hypothesis)."""


def triple_correlations(runs: np.ndarray, response: str = "mean") -> np.ndarray:
    """He & Choi's "correlation across runs" for every triple of runs of one cell.

    For a triple (i, j, k) and each choice of response run, the multiple
    correlation of ``z_y ~ 1 + z_a + z_b`` over the units: ``sqrt(max(R2_adj, 0))``
    with, from the Pearson correlations ``r``,

    ``R2 = (r_ya^2 + r_yb^2 - 2 r_ya r_yb r_ab) / (1 - r_ab^2)``,
    ``R2_adj = 1 - (1 - R2) (P - 1) / (P - 3)``

    (the same number as an OLS fit, ``multiple_correlation``; with collinear or
    constant predictors the design loses rank and ``P - 3`` becomes ``P - 2`` or
    ``P - 1``, as statsmodels' ``rsquared_adj``). A triple's value is the mean
    over its three choices of response (a constant response run is undefined
    and left out of that mean); with ``response="last"`` it is the paper's one
    fit, the triple's last run (in the order of ``runs``) as response.

    Always three runs, as the paper: the statistic of n runs fitted jointly grows
    with n (0.40, 0.48, 0.53, 0.55 for 3, 5, 10, 20 runs at the same pairwise r),
    so cells with 3 and 10 seeds would not be comparable.

    Args:
        runs: ``(n, P)`` or ``(n, L, K)``, ``n >= 3`` runs of one cell.
        response: one of ``RESPONSES``.

    Returns:
        ``(C(n, 3),)`` float64, triples in ``itertools.combinations`` order.
    """
    z = as_rows(runs)
    if len(z) < 3:
        raise ValueError(f"the stem cell statistic needs at least 3 runs, got {len(z)}")
    return _triple_values(pearson_matrix(z, dtype=np.float64)[None], z.shape[1], response)[0]


def stem_cell(x: np.ndarray, cells: list[np.ndarray] | None = None, response: str = "mean") -> float:
    """Mean over cells of the mean over every triple of the cell's runs (``triple_correlations``).

    Every cell counts once, whatever its number of seeds; cells with fewer than
    3 runs are skipped. Cells of the same size are computed together (one
    batched Pearson), so a permutation null over thousands of cells stays fast.

    Args:
        x: ``(N, P)`` or ``(N, L, K)`` runs.
        cells: index arrays into ``x``, one per cell; default: all runs are one cell. With
            ``response="last"`` each cell's indices run in seed order (the last is the response).
        response: one of ``RESPONSES``.

    Returns:
        NaN when no cell has 3 runs or no triple is defined.
    """
    z = as_rows(x)
    cells = [np.arange(len(z))] if cells is None else cells
    values = [_cell_values(pearson_stack(z[np.stack(members)]), z.shape[1], response)  # (C,) each
              for members in _cells_by_size(cells).values()]
    cell_values = np.concatenate(values) if values else np.array([])
    return _nanmean_or_nan(cell_values)


def stem_cell_copies(u: np.ndarray, cells: list[np.ndarray], response: str = "mean") -> np.ndarray:
    """``stem_cell`` of many shuffled copies of the runs at once, from their standardised maps.

    Args:
        u: ``(c, N, P)``: every run's standardised map (``pearson.standardised``) in each of c
            copies (shuffled: standardising commutes with shuffling a map's units).
        cells: as ``stem_cell``.
        response: one of ``RESPONSES``.

    Returns:
        ``(c,)``: ``stem_cell`` of each copy (to rounding; NaN where it is).
    """
    copies, _, p = u.shape
    by_size = _cells_by_size(cells)
    if not by_size:
        return np.full(copies, math.nan)
    per_cell = []
    for members in by_size.values():
        idx = stack_runs(members)  # (C, n)
        n = idx.shape[1]
        r = _pearson_within(u, idx).reshape(copies * len(idx), n, n)
        per_cell.append(_cell_values(r, p, response).reshape(copies, len(idx)))
    values = np.concatenate(per_cell, axis=1)  # (c, cells)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        return np.where(finite, values, 0.0).sum(axis=1) / finite.sum(axis=1)


def first_three(cells: list[np.ndarray]) -> list[np.ndarray]:
    """Each cell's first three runs (in seed order): the runs the paper's fit reads."""
    return [np.asarray(idx)[:3] for idx in cells]


def stem_cell_paper(x: np.ndarray, cells: list[np.ndarray] | None = None) -> float:
    """The paper's statistic: per cell one fit ``z3 ~ z1 + z2`` of its first three seeds
    (``sqrt(max(R2_adj, 0))``), the mean over cells."""
    cells = [np.arange(len(as_rows(x)))] if cells is None else cells
    return stem_cell(x, first_three(cells), response="last")


def stem_cell_paper_copies(u: np.ndarray, cells: list[np.ndarray]) -> np.ndarray:
    """``stem_cell_paper`` of many shuffled copies at once (``stem_cell_copies``)."""
    return stem_cell_copies(u, first_three(cells), response="last")


def _pearson_within(u: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``(c, N, P)`` standardised maps, ``(C, n)`` cells of runs -> ``(c, C, n, n)`` Pearson r among
    each cell's runs in each copy (diagonal 1; only the pairs are computed)."""
    n = idx.shape[1]
    runs = [take_runs(u, idx[:, i]) for i in range(n)]  # n x (c, C, P)
    r = np.ones((u.shape[0], len(idx), n, n))
    for i, j in combinations(range(n), 2):
        r[:, :, i, j] = r[:, :, j, i] = correlation(runs[i], runs[j])
    return r


def _cells_by_size(cells: list[np.ndarray]) -> dict[int, list[np.ndarray]]:
    """The cells of 3 or more runs, by their number of runs (in order of first appearance)."""
    by_size: dict[int, list[np.ndarray]] = {}
    for idx in cells:
        if len(idx) >= 3:
            by_size.setdefault(len(idx), []).append(np.asarray(idx))
    return by_size


_TRIPLE_BLOCK = 1 << 15
"""Triples of cells worked on at once: each temporary (~30 of them) stays in cache (256 KB)."""


def _cell_values(r: np.ndarray, p: int, response: str) -> np.ndarray:
    """``(C, n, n)`` Pearson matrices of cells -> ``(C,)``: each cell's mean over its triples, a
    block of cells at a time."""
    step = max(1, _TRIPLE_BLOCK // math.comb(r.shape[1], 3))
    out = np.empty(len(r))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for start in range(0, len(r), step):
            out[start:start + step] = np.nanmean(_triple_values(r[start:start + step], p, response), axis=1)
    return out


def _triple_values(r: np.ndarray, p: int, response: str = "mean") -> np.ndarray:
    """``(C, n, n)`` Pearson matrices -> ``(C, T)`` triple statistic (see ``triple_correlations``)."""
    if response not in RESPONSES:
        raise ValueError(f"response must be one of {RESPONSES}, got {response!r}")
    n = r.shape[1]
    triples = np.array(list(combinations(range(n), 3)), dtype=np.int64).reshape(-1, 3)  # (T, 3)
    per_response = []
    choices = ((2, 0, 1),) if response == "last" else ((0, 1, 2), (1, 0, 2), (2, 0, 1))
    for y, a, b in choices:
        ty, ta, tb = triples[:, y], triples[:, a], triples[:, b]
        per_response.append(_r_multiple(r[:, ty, ta], r[:, ty, tb], r[:, ta, tb], p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.stack(per_response), axis=0)  # (C, T)


def _r_multiple(r_ya: np.ndarray, r_yb: np.ndarray, r_ab: np.ndarray, p: int) -> np.ndarray:
    """``sqrt(max(R2_adj, 0))`` of ``y ~ 1 + a + b`` from the three Pearson r (elementwise).

    A NaN ``r`` means a constant run. Constant ``y``: NaN. Constant ``a`` or
    ``b`` (or both), or ``|r_ab| = 1``: the fit keeps only the predictors that
    add a dimension to the design, as a least-squares fit would.
    """
    nan_ya, nan_yb = np.isnan(r_ya), np.isnan(r_yb)
    const_y = nan_ya & nan_yb
    const_a, const_b = nan_ya & ~const_y, nan_yb & ~const_y
    # r is in [-1, 1] or NaN: NaN -> 0 as np.nan_to_num, without its checks for infinities
    ya, yb, ab = np.where(nan_ya, 0.0, r_ya), np.where(nan_yb, 0.0, r_yb), np.where(np.isnan(r_ab), 0.0, r_ab)
    collinear = (1.0 - ab * ab <= 1e-12) & ~const_a & ~const_b
    both = ~(const_a | const_b | collinear)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2_two = (ya * ya + yb * yb - 2.0 * ya * yb * ab) / (1.0 - ab * ab)
    # one predictor left: the other one (a constant one drops out; collinear ones are one)
    r2_one = np.where(const_a, yb * yb, ya * ya)
    r2 = np.where(both, r2_two, r2_one)
    k = np.where(both, 2, np.where(const_a & const_b, 0, 1))
    r2 = np.where(k == 0, 0.0, np.clip(r2, 0.0, 1.0))
    r2_adj = 1.0 - (1.0 - r2) * (p - 1) / (p - k - 1)
    return np.where(const_y, np.nan, np.sqrt(np.clip(r2_adj, 0.0, 1.0)))


def _nanmean_or_nan(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


_NULL = "each run's units shuffled (within each layer, or across all units): the statistic of the shuffled copies"


STATISTICS = (
    Statistic(
        name="stem_cell", label="stem cell", computes="He & Choi's multiple correlation of 3 seeds", order=30,
        asked_in=("agreement",), null=_NULL, cells=stem_cell, min_runs=3, rows=standardised,
        copies=stem_cell_copies, per_cell="the mean over their triples of the three choices of response",
    ),
    Statistic(
        name="stem_cell_paper", label="stem cell (paper)",
        computes="He & Choi's single fit z3 ~ z1 + z2 of each cell's first three seeds", order=31,
        asked_in=("agreement",), null=_NULL, cells=stem_cell_paper, min_runs=3, rows=standardised,
        copies=stem_cell_paper_copies,
        per_cell="one fit of their first three seeds, the third as response (the paper's: later seeds unread)",
    ),
    Statistic(
        name="stem_cell_triples", label="stem cell (paper's fit, every triple)",
        computes="He & Choi's fit z3 ~ z1 + z2 averaged over every triple of a cell's seeds, from 4 seeds "
        "(at 3 it is the paper's one fit)", order=32, asked_in=("agreement",), null=_NULL,
        cells=partial(stem_cell, response="last"), min_runs=4, rows=standardised,
        copies=partial(stem_cell_copies, response="last"),
        per_cell="the mean over their triples of one fit, the triple's last seed as response",
    ),
)
