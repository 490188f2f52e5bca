"""Run-to-run and task-to-task agreement of head gates, as pure array maths.

Everything here takes numpy arrays and returns numpy arrays or small frozen
records: no I/O, no registry, no global RNG (pass a ``np.random.Generator``).

Shapes: one run's gates are ``(L, H)`` (layers x heads, e.g. 6 x 12 = 144
heads, ``P = L * H``). Many runs are stacked as ``(N, L, H)``; every function
that takes runs also accepts them flattened to ``(N, P)`` (except
``permutation_null``, which needs the layers).

Names follow He & Choi (2021, "stem cell hypothesis"): ``z`` is a run's gate
vector; "correlation across runs" is the multiple correlation over triples of
runs (``triple_correlations``, ``stem_cell``); task-to-task agreement is
Pearson between the tasks' seed-mean gate vectors. Every agreement is
reported against two permutation nulls (``NULLS``): units shuffled within
layers and across all units.

Any unit map works, not only gates: ``(L, K)`` per run, e.g. heads ``(6, 12)``
or FFN neurons ``(6, 1536)``; "layer" is a row of the map.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy.stats import hypergeom
from scipy.stats import t as student_t

# Largest permuted stack (n_perm * N * P elements) held at once in permutation_null.
_PERM_CHUNK_ELEMENTS = 4_000_000


def _as_rows(x: np.ndarray) -> np.ndarray:
    """``(N, L, H)`` or ``(N, P)`` -> ``(N, P)`` (a view where possible)."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"expected runs stacked as (N, P) or (N, L, H), got shape {x.shape}")
    return x.reshape(x.shape[0], -1)


def _standardise_rows(x: np.ndarray) -> np.ndarray:
    """Centre each row and scale it to unit L2 norm, in float64.

    ``u_i = (x_i - mean(x_i)) / ||x_i - mean(x_i)||``, so that
    ``pearson(x_i, x_j) = u_i . u_j``. A constant row has norm 0 and becomes a
    row of NaN (its correlation with anything is undefined).
    """
    centred = x - x.mean(axis=1, keepdims=True, dtype=np.float64)  # (N, P) float64
    norm = np.sqrt(np.einsum("ij,ij->i", centred, centred))  # (N,)
    # Centring leaves ~1e-17 of rounding in a constant row: call it constant
    # when the spread is at rounding level relative to the values themselves.
    scale = np.abs(x).max(axis=1) if x.size else np.zeros(len(x))
    constant = norm <= 1e-12 * np.maximum(scale, 1e-300) * math.sqrt(max(x.shape[1], 1))
    norm[constant] = np.nan
    return centred / norm[:, None]


def _output_dtype(in_dtypes: list[np.dtype], dtype) -> np.dtype:
    """``dtype`` if given, else float32 when every input is float32, else float64."""
    if dtype is not None:
        return np.dtype(dtype)
    all_f32 = all(d == np.float32 for d in in_dtypes)
    return np.dtype(np.float32) if all_f32 else np.dtype(np.float64)


def _correlation_from_standardised(
    u: np.ndarray, v: np.ndarray | None, dtype: np.dtype
) -> np.ndarray:
    """``u @ v.T`` (``u @ u.T`` when ``v`` is None) clipped to [-1, 1]."""
    u = u.astype(dtype, copy=False)  # (N, P)
    # A separate contiguous (P, M) right operand: for u @ u.T on one buffer numpy
    # picks BLAS syrk and then mirrors the triangle element by element; at
    # 10,000 x 144 that measured 0.85 s on a first call against 0.32 s for gemm.
    vt = np.ascontiguousarray((u if v is None else v.astype(dtype, copy=False)).T)  # (P, M)
    r = u @ vt  # (N, M)
    np.clip(r, -1.0, 1.0, out=r)
    return r


def pearson_matrix(x: np.ndarray, dtype=None) -> np.ndarray:
    """Run x run Pearson correlation.

    ``r_ij = sum_p (x_ip - xbar_i)(x_jp - xbar_j) / (||x_i - xbar_i|| ||x_j - xbar_j||)``

    Args:
        x: ``(N, P)`` or ``(N, L, H)`` gate vectors, one row per run.
        dtype: dtype of the result. Default: float32 for float32 input (half
            the memory of a 10,000 x 10,000 matrix, ~1e-7 error), float64
            otherwise. Centring and normalising are always done in float64.

    Returns:
        ``(N, N)`` matrix, values clipped to [-1, 1], diagonal exactly 1.
        A constant row (e.g. a run with every head open) has no defined
        correlation: its row and column are NaN, its diagonal entry too.
    """
    x = _as_rows(x)
    out_dtype = _output_dtype([x.dtype], dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = _standardise_rows(x)  # (N, P)
    r = _correlation_from_standardised(u, None, out_dtype)  # (N, N)
    defined = ~np.isnan(u).any(axis=1)  # (N,)
    r[np.diag_indices_from(r)] = np.where(defined, 1.0, np.nan)
    return r


def rank_rows(x: np.ndarray) -> np.ndarray:
    """Rank each row's values, 1..P, ties given their average rank (float64, ``(N, P)``).

    The same as ``scipy.stats.rankdata(x, method="average", axis=1)`` at a fraction of its
    time: blocks of rows (see :func:`_sorted_ranks`) written into one output.
    """
    x = _as_rows(x)
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
    x = _as_rows(x)
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


def spearman_matrix(x: np.ndarray, dtype=None) -> np.ndarray:
    """Run x run Spearman correlation: Pearson of the rows' average ranks.

    Equals ``scipy.stats.spearmanr(x, axis=1)`` (ties included) at a fraction
    of its time and memory. ``dtype`` and constant rows as in ``pearson_matrix``.
    """
    x = _as_rows(x)
    return pearson_matrix(rank_rows(x), dtype=_output_dtype([x.dtype], dtype))


def spearman_between(a: np.ndarray, b: np.ndarray, dtype=None) -> np.ndarray:
    """Spearman correlation of every run of group ``a`` with every run of group ``b``.

    ``rho_ij = pearson(rank(a_i), rank(b_j))``.

    Args:
        a: ``(Na, P)`` or ``(Na, L, H)``; b: ``(Nb, P)`` or ``(Nb, L, H)``.

    Returns:
        ``(Na, Nb)``; rows of constant runs are NaN. ``dtype`` as in ``pearson_matrix``.
    """
    a, b = _as_rows(a), _as_rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"groups have different numbers of heads: {a.shape[1]} vs {b.shape[1]}")
    out_dtype = _output_dtype([a.dtype, b.dtype], dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        u, v = _standardise_rows(rank_rows(a)), _standardise_rows(rank_rows(b))
    return _correlation_from_standardised(u, v, out_dtype)


def mean_spearman_between(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of ``spearman_between(a, b)`` over its defined entries, without the ``(Na, Nb)`` matrix.

    ``mean_ij u_i . v_j = (sum_i u_i) . (sum_j v_j) / (na nb)`` over the na, nb runs that are
    not constant (``u``, ``v``: standardised ranks). NaN when either group has none.
    """
    a, b = _as_rows(a), _as_rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"groups have different numbers of heads: {a.shape[1]} vs {b.shape[1]}")
    (su, na), (sv, nb) = _standardised_rank_sum(a), _standardised_rank_sum(b)
    if not na or not nb:
        return math.nan
    return float(np.clip(su @ sv / (na * nb), -1.0, 1.0))


def pearson_to(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Pearson r of one fixed map ``v`` with each of many: ``(...)``, ``(C, ...)`` -> ``(C,)``.

    For a permutation null of a two-run statistic only one run needs shuffling: r of
    ``(pi_1 a, pi_2 b)`` equals r of ``(a, pi_1^-1 pi_2 b)``, itself a uniform shuffle."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = _standardise_rows(np.asarray(v).reshape(1, -1))[0]  # (P,)
        w = _standardise_rows(x.reshape(len(x), -1))  # (C, P)
    return np.clip(w @ u, -1.0, 1.0)


def spearman_groups(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman correlation between two groups' mean score vectors.

    ``rho = spearman(mean_i a_i, mean_j b_j)``: each head's score (gate) is
    averaged over the runs of its group first, then the two ``(P,)`` mean
    vectors are rank-correlated. This is how Wang et al. (2022) compare
    neuron rankings (score = mean over runs). It is not the mean of the
    pairwise ``spearman_between(a, b)``, which is lower because it also
    counts each single run's seed noise. NaN if either mean vector is constant.
    """
    a, b = _as_rows(a), _as_rows(b)
    means = np.stack([a.mean(axis=0, dtype=np.float64), b.mean(axis=0, dtype=np.float64)])
    return float(spearman_matrix(means)[0, 1])


def mean_pairwise_pearson(runs: np.ndarray) -> float:
    """Mean Pearson r over the ``n (n - 1) / 2`` distinct pairs of runs (NaN pairs propagate)."""
    r = pearson_matrix(runs, dtype=np.float64)
    i, j = np.triu_indices(len(r), k=1)
    return float(r[i, j].mean()) if len(i) else math.nan


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
    z = _as_rows(runs).astype(np.float64)  # (n, P)
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
    z = _as_rows(runs)
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
    z = _as_rows(x)
    cells = [np.arange(len(z))] if cells is None else cells
    by_size: dict[int, list[np.ndarray]] = {}
    for idx in cells:
        if len(idx) >= 3:
            by_size.setdefault(len(idx), []).append(np.asarray(idx))
    values = []
    for members in by_size.values():
        r = pearson_stack(z[np.stack(members)])  # (C, n, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            values.append(np.nanmean(_triple_values(r, z.shape[1], response), axis=1))  # (C,)
    cell_values = np.concatenate(values) if values else np.array([])
    return _nanmean_or_nan(cell_values)


def pearson_stack(x: np.ndarray) -> np.ndarray:
    """``(C, n, P)`` -> ``(C, n, n)``: Pearson among the n runs of each of C groups at once
    (one einsum instead of C calls; NaN rows for constant runs)."""
    c, n, p = x.shape
    with np.errstate(invalid="ignore", divide="ignore"):
        u = _standardise_rows(x.reshape(c * n, p)).reshape(c, n, p)
    return np.clip(np.einsum("cip,cjp->cij", u, u), -1.0, 1.0)


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
    const_y = np.isnan(r_ya) & np.isnan(r_yb)
    const_a, const_b = np.isnan(r_ya) & ~const_y, np.isnan(r_yb) & ~const_y
    ya, yb = np.nan_to_num(r_ya), np.nan_to_num(r_yb)
    ab = np.nan_to_num(r_ab)
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


def task_correlation(means: np.ndarray) -> np.ndarray:
    """Task x task Pearson r between the tasks' seed-mean gate vectors.

    Args:
        means: ``(T, P)`` or ``(T, L, H)``, row t = mean gate over task t's runs.

    Returns:
        ``(T, T)`` float64 (see ``pearson_matrix`` for constant rows).
    """
    return pearson_matrix(means, dtype=np.float64)


def topk_overlap(a: np.ndarray, b: np.ndarray, k_frac: float, rng: np.random.Generator) -> dict:
    """Agreement of the top-k units of two score vectors, next to what chance gives.

    ``k = ceil(k_frac * P)``; ``A``, ``B`` = indices of the k highest scores.
    Ties are broken at random (``rng``), independently in ``a`` and ``b``: with
    binary gates most units tie, and breaking ties by index in both vectors
    would make two unrelated runs share the low-index units (8 of 72 heads open
    in each run, k = 15: overlap ~0.55 by index against ~0.21 by chance).

    Returns ``jaccard = |A & B| / |A | B|``, ``overlap = |A & B| / k`` (the
    overlap coefficient; ``|A| = |B| = k``), ``k``, and their chance levels for
    two independent random k-sets of P units: ``|A & B|`` is hypergeometric
    (P, k, k), so ``chance_overlap = k / P`` and ``chance_jaccard = E[s / (2k - s)]``.
    """
    a, b = np.ravel(a), np.ravel(b)  # (P,)
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in length: {a.shape} vs {b.shape}")
    if not 0.0 < k_frac <= 1.0:
        raise ValueError(f"k_frac must be in (0, 1], got {k_frac}")
    p = a.size
    # The tolerance keeps 0.1 * 30 = 3.0000000000000004 from becoming k = 4.
    k = min(p, max(1, math.ceil(k_frac * p - 1e-9)))
    top_a, top_b = (set(_top_k(v, k, rng).tolist()) for v in (a, b))
    shared = len(top_a & top_b)
    return {"jaccard": shared / len(top_a | top_b), "overlap": shared / k, "k": k,
            **topk_chance(p, k)}


def _top_k(scores: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the k largest ``scores``, ties in random order (a random secondary key)."""
    order = np.lexsort((rng.random(scores.size), -scores))  # last key is the primary one
    return order[:k]


def topk_chance(p: int, k: int) -> dict[str, float]:
    """Expected overlap coefficient and Jaccard of two independent random k-subsets of p units."""
    shared = np.arange(max(0, 2 * k - p), k + 1)  # possible |A & B|
    pmf = hypergeom.pmf(shared, p, k, k)
    return {"chance_overlap": k / p, "chance_jaccard": float(pmf @ (shared / (2 * k - shared)))}


NULLS = {
    "within_layers": "units shuffled within each layer: the same units beyond how many each layer keeps?",
    "all_units": "units shuffled across all layers: the same units at all?",
}
"""The two permutation nulls, and the question each answers. ``within_layers``
keeps every run's per-layer profile (how many heads each layer keeps), so its
excess is agreement on *which* units beyond the layer profile; ``all_units``
keeps only each run's set of values, so its excess also counts a shared layer
profile. (For a ``(L, K)`` map "layer" is a row of the map.)"""


@dataclass(frozen=True)
class NullResult:
    """Observed statistic against one permutation null distribution."""

    observed: float
    """The statistic on the unshuffled runs."""
    null_name: str
    """Which null: a key of ``NULLS``."""
    p_value: float
    """One-sided ``(1 + #{null >= observed}) / (1 + n_perm)``; never below ``1 / (1 + n_perm)``."""
    band_lo: float
    """2.5th percentile of the null."""
    band_hi: float
    """97.5th percentile of the null (the 95 % band is ``[band_lo, band_hi]``)."""
    null: np.ndarray
    """``(n_perm,)`` the statistic on each shuffled copy."""

    @property
    def n_perm(self) -> int:
        return len(self.null)

    @property
    def null_mean(self) -> float:
        """What chance gives: the mean of the finite null values."""
        finite = self.null[np.isfinite(self.null)]
        return float(finite.mean()) if finite.size else math.nan

    @property
    def excess(self) -> float:
        """``observed - null_mean``: the agreement chance does not explain."""
        return self.observed - self.null_mean

    @property
    def at_floor(self) -> bool:
        """No shuffled copy reached the observed value: p is only known to be below its floor."""
        return math.isfinite(self.p_value) and self.p_value <= 1.0 / (1 + self.n_perm) + 1e-15

    @property
    def p_text(self) -> str:
        """``"p = 0.034"``, or ``"p < 0.001"`` at the floor ``1 / (n_perm + 1)`` (never a false exact value)."""
        if not math.isfinite(self.p_value):
            return "p undefined"
        if self.at_floor:
            return f"p < {_round_up(1.0 / self.n_perm)}"
        return f"p = {self.p_value:.2g}"


def _round_up(x: float) -> str:
    """1/200 -> '0.005', 1/1000 -> '0.001', 1/300 -> '0.004' (a bound that stays true when printed)."""
    digits = max(0, -math.floor(math.log10(x)))
    return f"{math.ceil(x * 10 ** digits) / 10 ** digits:.{digits}f}"


def shuffle_units(x: np.ndarray, n_perm: int, rng: np.random.Generator, within: str) -> np.ndarray:
    """``n_perm`` copies of ``x`` with units shuffled, each (copy, run[, layer]) independently.

    ``within="within_layers"``: each layer's units are permuted among themselves,
    so each run keeps its per-layer values (how many heads each layer keeps);
    ``within="all_units"``: all ``L * K`` units of a run are permuted together.

    Args:
        x: ``(N, L, K)``.

    Returns:
        ``(n_perm, N, L, K)``.
    """
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"expected maps as (N, L, K), got shape {x.shape}")
    if within not in NULLS:
        raise ValueError(f"unknown null '{within}' (one of {', '.join(NULLS)})")
    flat = x if within == "within_layers" else x.reshape(x.shape[0], 1, -1)  # (N, L or 1, K or L*K)
    # Fisher-Yates per row in C: measured 2.2x (144 heads) to 2.4x (9,216 neurons) faster than
    # the argsort of uniform keys
    shuffled = np.broadcast_to(flat, (n_perm, *flat.shape)).copy()  # (n_perm, N, ., .)
    rng.permuted(shuffled, axis=-1, out=shuffled)
    return shuffled.reshape(n_perm, *x.shape)


def permutation_null(
    stat_fn: Callable[[np.ndarray], float],
    x: np.ndarray,
    n_perm: int = 1000,
    rng: np.random.Generator | None = None,
    within: str = "within_layers",
    observed: float | None = None,
    batch_fn: Callable[[np.ndarray], np.ndarray] | None = None,
) -> NullResult:
    """Permutation test of an agreement statistic against exchangeable units (``NULLS``).

    The statistic is recomputed on ``n_perm`` copies of ``x`` whose units are
    shuffled independently per run (``shuffle_units``): which units agree is
    destroyed, what each run keeps (overall, or per layer) is not.

    Args:
        stat_fn: ``(N, L, K) -> float``, e.g. ``stem_cell``.
        x: ``(N, L, K)`` maps of the runs being compared.
        n_perm: number of shuffled copies.
        rng: source of the shuffles (required; no global RNG).
        within: ``"within_layers"`` or ``"all_units"`` (see ``NULLS``).
        observed: ``stat_fn(x)`` when already computed.
        batch_fn: the statistic of many shuffled copies at once, ``(c, N, L, K) -> (c,)``
            (equal to ``stat_fn`` on each copy; faster for statistics that vectorise).

    Returns:
        ``NullResult``. ``p_value = (1 + #{null >= observed}) / (1 + n_perm)``
        (one-sided, upper tail; null values within 1e-9 relative of the
        observed count as ties, so floating-point noise from reordering the
        units cannot make an unchanged statistic look significant; NaN null
        values never count). Band = 2.5 / 97.5 percentiles of the finite null
        values.
    """
    if rng is None:
        raise ValueError("pass an np.random.Generator: permutation_null uses no global RNG")
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    x = np.asarray(x)
    observed = float(stat_fn(x)) if observed is None else float(observed)
    null = np.empty(n_perm)
    chunk = max(1, _PERM_CHUNK_ELEMENTS // max(x.size, 1))
    for start in range(0, n_perm, chunk):
        stop = min(start + chunk, n_perm)
        shuffled = shuffle_units(x, stop - start, rng, within)  # (c, N, L, K)
        if batch_fn is not None:
            null[start:stop] = batch_fn(shuffled)
            continue
        for j, copy in enumerate(shuffled):
            null[start + j] = stat_fn(copy)
    return null_result(observed, null, within)


def null_result(observed: float, null: np.ndarray, null_name: str) -> NullResult:
    """``NullResult`` of an observed statistic and its ``(n_perm,)`` values on shuffled copies,
    however they were shuffled: p, band and ties exactly as ``permutation_null`` reports them."""
    observed, null = float(observed), np.asarray(null, dtype=np.float64)
    tol = 1e-9 * max(abs(observed), 1.0)
    exceed = int(np.count_nonzero(null >= observed - tol)) if math.isfinite(observed) else 0
    p_value = (1 + exceed) / (1 + len(null)) if not math.isnan(observed) else math.nan
    finite = null[np.isfinite(null)]
    band_lo, band_hi = (
        np.percentile(finite, [2.5, 97.5]).tolist() if finite.size else (math.nan, math.nan)
    )
    return NullResult(observed, null_name, p_value, band_lo, band_hi, null)


def both_nulls(stat_fn: Callable[[np.ndarray], float], x: np.ndarray, n_perm: int,
               rng: np.random.Generator, batch_fn: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> dict[str, NullResult]:
    """``{null name: permutation_null(...)}`` for every null of ``NULLS``, one observed value."""
    observed = float(stat_fn(np.asarray(x)))
    return {name: permutation_null(stat_fn, x, n_perm, rng, within=name, observed=observed, batch_fn=batch_fn)
            for name in NULLS}


T_INTERVAL_BELOW = 10
"""Below this many values the CI of a mean is Student's t interval, from this many on a bootstrap."""


@dataclass(frozen=True)
class Aggregate:
    """Mean of per-run values with spread and a 95 % confidence interval of the mean."""

    mean: float
    std: float
    """Sample standard deviation (ddof = 1); NaN for n < 2."""
    n: int
    """Number of values used."""
    ci_lo: float
    """Lower end of the 95 % CI of the mean."""
    ci_hi: float
    """Upper end of the 95 % CI of the mean."""
    ci_method: str = "none"
    """How the CI was made: ``"t"`` (n < 10), ``"bootstrap"`` (n >= 10) or ``"none"`` (n < 2)."""


def aggregate(
    values: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = 1000,
    nan_policy: str = "propagate",
) -> Aggregate:
    """Mean, std and a 95 % confidence interval of the mean of ``values``.

    With ``n < T_INTERVAL_BELOW`` (10) values the CI is Student's t interval
    ``mean +- t_{0.975, n-1} * std / sqrt(n)``: a percentile bootstrap of 3 seeds
    can never leave the range of the 3 values and badly under-covers. From 10
    values on it is the 2.5 / 97.5 percentiles of ``n_boot`` bootstrap means
    (resampled with replacement, all at once as an ``(n_boot, n)`` index array),
    which does not assume normal values. With n = 1 the CI is ``(mean, mean)``
    and ``ci_method`` is ``"none"``; with n = 0 everything is NaN.

    Args:
        values: ``(n,)``, e.g. one accuracy per seed.
        rng: source of the resamples (used only for the bootstrap).
        n_boot: number of bootstrap resamples.
        nan_policy: "propagate" (any NaN makes every field NaN; n counts all
            values) or "omit" (drop NaN first; n counts the rest).
    """
    v = np.ravel(np.asarray(values, dtype=np.float64))  # (n,)
    if nan_policy == "omit":
        v = v[~np.isnan(v)]
    elif nan_policy != "propagate":
        raise ValueError(f"nan_policy must be 'propagate' or 'omit', got {nan_policy!r}")
    n = v.size
    if n == 0:
        return Aggregate(math.nan, math.nan, 0, math.nan, math.nan)
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if n > 1 else math.nan
    if n == 1 or math.isnan(mean):
        return Aggregate(mean, std, n, mean, mean)
    if n < T_INTERVAL_BELOW:
        half = float(student_t.ppf(0.975, n - 1)) * std / math.sqrt(n)
        return Aggregate(mean, std, n, mean - half, mean + half, "t")
    idx = rng.integers(0, n, size=(n_boot, n))  # (n_boot, n)
    boot_means = v[idx].mean(axis=1)  # (n_boot,)
    ci_lo, ci_hi = np.percentile(boot_means, [2.5, 97.5]).tolist()
    return Aggregate(mean, std, n, ci_lo, ci_hi, "bootstrap")
