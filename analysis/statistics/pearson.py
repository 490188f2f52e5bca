"""Pearson r between maps: how linearly two runs' unit maps go together.

``r_ij = sum_p (x_ip - xbar_i)(x_jp - xbar_j) / (||x_i - xbar_i|| ||x_j - xbar_j||)`` over the
``P = L * K`` units of the maps (flattened). Agreement's matrix across seeds, tasks or any axis
(He & Choi 2021's task-to-task agreement is Pearson between the tasks' seed-mean gate vectors).
A constant map (a run with every head open) has no defined correlation: NaN.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.statistics.base import Statistic, as_rows


def standardise_rows(x: np.ndarray) -> np.ndarray:
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


def output_dtype(in_dtypes: list[np.dtype], dtype) -> np.dtype:
    """``dtype`` if given, else float32 when every input is float32, else float64."""
    if dtype is not None:
        return np.dtype(dtype)
    all_f32 = all(d == np.float32 for d in in_dtypes)
    return np.dtype(np.float32) if all_f32 else np.dtype(np.float64)


def correlation_from_standardised(
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
    x = as_rows(x)
    out_dtype = output_dtype([x.dtype], dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = standardise_rows(x)  # (N, P)
    r = correlation_from_standardised(u, None, out_dtype)  # (N, N)
    defined = ~np.isnan(u).any(axis=1)  # (N,)
    r[np.diag_indices_from(r)] = np.where(defined, 1.0, np.nan)
    return r


def pearson_to(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Pearson r of one fixed map ``v`` with each of many: ``(...)``, ``(C, ...)`` -> ``(C,)``.

    For a permutation null of a two-run statistic only one run needs shuffling: r of
    ``(pi_1 a, pi_2 b)`` equals r of ``(a, pi_1^-1 pi_2 b)``, itself a uniform shuffle."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = standardise_rows(np.asarray(v).reshape(1, -1))[0]  # (P,)
        w = standardise_rows(x.reshape(len(x), -1))  # (C, P)
    return np.clip(w @ u, -1.0, 1.0)


def pearson_stack(x: np.ndarray) -> np.ndarray:
    """``(C, n, P)`` -> ``(C, n, n)``: Pearson among the n runs of each of C groups at once
    (one einsum instead of C calls; NaN rows for constant runs)."""
    c, n, p = x.shape
    with np.errstate(invalid="ignore", divide="ignore"):
        u = standardise_rows(x.reshape(c * n, p)).reshape(c, n, p)
    return np.clip(np.einsum("cip,cjp->cij", u, u), -1.0, 1.0)


def standardised(x: np.ndarray) -> np.ndarray:
    """``(N, P)`` or ``(N, L, K)`` maps -> ``(N, P)`` float64 ``standardise_rows`` (NaN rows for
    constant maps, without a warning): Pearson's ``rows``, so that ``r = correlation(u_i, u_j)``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return standardise_rows(as_rows(x))


def correlation(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pearson r from standardised maps (``standardised``): ``(..., P), (..., P) -> (...)``, clipped
    to [-1, 1]; NaN where either map is constant."""
    return np.clip(np.einsum("...p,...p->...", u, v), -1.0, 1.0)


def pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson r of each row of ``a`` with the same row of ``b``: ``(Q, P), (Q, P) -> (Q,)``."""
    a, b = as_rows(a), as_rows(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        u, v = standardise_rows(a), standardise_rows(b)  # (Q, P) each
    return np.clip(np.einsum("qp,qp->q", u, v), -1.0, 1.0)


STATISTICS = (
    Statistic(
        name="r", label="r", computes="Pearson r", order=10, asked_in=("agreement",),
        null="each run's units shuffled (within each layer, or across all units): the mean r of the shuffled copies",
        pairs=pearson_rows, stack=pearson_stack, matrix=pearson_matrix, rows=standardised, between=correlation,
    ),
)
