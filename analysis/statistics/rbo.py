"""Rank-biased overlap: do two maps agree on their top units, the top weighted most?

Webber, Moffat & Zobel (2010), "A similarity measure for indefinite rankings". Seen to depth
``d``, rankings S and T have the prefixes ``S_:d`` and ``T_:d``; their overlap is
``X_d = |S_:d & T_:d|`` and their agreement ``A_d = X_d / d``. RBO is the mean agreement a reader
sees who, having compared depth d, goes on to depth d + 1 with probability ``p`` (the
persistence): depth d weighs ``(1 - p) p^(d - 1)``, so the top ``1 / (1 - p)`` units (10 at the
default p = 0.9) carry most of it. Evaluated to depth ``k``, the extrapolated score (their
eq. 32) takes the agreement at k to hold below it::

    RBO_ext = A_k p^k + (1 - p) / p * sum_{d=1..k} A_d p^d

Identical rankings score 1, rankings with no item in common 0. Two maps of the same P units are
two complete rankings of them (k = P), the units ordered by value, largest first.

Ties (a binary gate map ties most of its units): tied units enter a prefix together, at their
group's first place, and the agreement is ``A_d = 2 X_d / (|S_:d| + |T_:d|)``, the paper's
agreement for tied ranks; without ties ``|S_:d| = |T_:d| = d`` and it is ``X_d / d``. A constant
map ranks no unit above another: NaN, as Pearson and Spearman.

Its null is the other statistics': units shuffled (``agreement``: each run's; ``compare_maps``:
each map's relabelled), within each layer or across all units. For P units in random order
``E[X_d] = d^2 / P``, so chance is about ``1 / ((1 - p) P)``: 0.07 for 144 heads at p = 0.9.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.statistics.base import Statistic, as_rows

PERSISTENCE = 0.9
"""``p``: the chance of going on to the next depth; the expected depth compared is ``1 / (1 - p)``."""


def entry_depths(x: np.ndarray) -> np.ndarray:
    """``(Q, P)`` maps -> ``(Q, P)`` int: the depth (1-based) at which each unit enters its map's
    ranking, largest value first; tied units share their group's first place."""
    x = as_rows(x).astype(np.float64, copy=False)
    q, p = x.shape
    order = np.argsort(-x, axis=1)  # tied units get their group's first place, in whichever order
    ordered = np.take_along_axis(x, order, axis=1)
    starts = np.ones((q, p), dtype=bool)  # True where a group of equal values begins
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(1, p + 1), 0), axis=1)  # its group's first place
    depths = np.empty((q, p), dtype=np.int64)
    np.put_along_axis(depths, order, first, axis=1)
    return depths


def _entered(depths: np.ndarray, k: int) -> np.ndarray:
    """``(Q, n)`` entry depths -> ``(Q, k)``: how many items have entered by depth d = 1..k."""
    q = len(depths)
    within = np.minimum(depths, k + 1)  # deeper than k: never seen
    counts = np.bincount((within + (k + 2) * np.arange(q)[:, None]).ravel(), minlength=q * (k + 2))
    return np.cumsum(counts.reshape(q, k + 2), axis=1)[:, 1:k + 1]


def rbo_ext(depth_s: np.ndarray, depth_t: np.ndarray, p: float = PERSISTENCE, k: int | None = None):
    """Webber et al.'s extrapolated RBO of rankings S and T evaluated to depth ``k``.

    Args:
        depth_s, depth_t: ``(n,)`` or ``(Q, n)``: for each item of the rankings' union, the depth
            at which it enters S (T): 1 for the top item; tied items share their first place; an
            item the ranking does not hold by depth ``k``, any depth beyond it.
        p: the persistence, in (0, 1).
        k: the evaluation depth; default n (two complete rankings of the same n items).

    Returns:
        A float for ``(n,)`` rankings, ``(Q,)`` for ``(Q, n)``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"the persistence p must be in (0, 1), got {p}")
    s, t = np.atleast_2d(depth_s), np.atleast_2d(depth_t)  # (Q, n)
    k = s.shape[1] if k is None else k
    q = len(s)
    entered = _entered(np.concatenate([np.maximum(s, t), s, t]), k)  # (3Q, k)
    overlap, seen = entered[:q], entered[q:2 * q] + entered[2 * q:]  # X_d: items in both prefixes; |S_:d| + |T_:d|
    with np.errstate(invalid="ignore", divide="ignore"):
        agreement = 2.0 * overlap / seen  # (Q, k): A_d
    weights = p ** np.arange(1, k + 1)  # p^d
    rbo = (1.0 - p) / p * (agreement @ weights) + agreement[:, -1] * p ** k
    return float(rbo[0]) if np.ndim(depth_s) == 1 else rbo


def rbo_maps(a: np.ndarray, b: np.ndarray, p: float = PERSISTENCE) -> np.ndarray:
    """RBO_ext of each row of ``a`` with the same row of ``b``, units ranked by value, largest
    first: ``(Q, P), (Q, P) -> (Q,)``; NaN where a map is constant."""
    depth_a, depth_b = entry_depths(a), entry_depths(b)
    constant = (depth_a == 1).all(axis=1) | (depth_b == 1).all(axis=1)  # every unit tied at the top
    return np.where(constant, math.nan, rbo_ext(depth_a, depth_b, p))


def rbo_of_depths(depth_a: np.ndarray, depth_b: np.ndarray, p: float = PERSISTENCE) -> np.ndarray:
    """``rbo_maps`` from the maps' entry depths (``entry_depths``: two complete rankings of the same P
    units, depths 1..P): ``(..., P), (..., P) -> (...)`` (to rounding), for many pairs at once.

    A unit's entry depth moves with the unit, so the depths of a shuffled map are its depths
    shuffled alike: a permutation null computes them once (RBO's ``rows``). The counts by depth
    are laid out depth-major, ``(P, Q)``, so that summing them over depths runs along the pairs
    (numpy steps row by row through ``rbo_ext``'s rows of a few units)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"the persistence p must be in (0, 1), got {p}")
    shape, units = depth_a.shape[:-1], depth_a.shape[-1]
    depth_a, depth_b = depth_a.reshape(-1, units), depth_b.reshape(-1, units)  # (Q, P)
    q = len(depth_a)
    # X_d (both prefixes), |S_:d| and |T_:d| for d = 1..P: counts of each depth, summed up to d
    bins = np.stack([np.maximum(depth_a, depth_b), depth_a, depth_b]) - 1  # (3, Q, P): depth - 1
    bins *= q
    bins += np.arange(q)[:, None] + (units * q) * np.arange(3)[:, None, None]  # bin (which, depth, pair)
    entered = np.bincount(bins.ravel(), minlength=3 * units * q).reshape(3, units, q)
    for d in range(1, units):  # a cumulative sum over depths, each step one add over every pair
        entered[:, d] += entered[:, d - 1]
    overlap, seen = entered[0], entered[1] + entered[2]  # (P, Q) each
    agreement = 2.0 * overlap / seen  # A_d; seen >= 2 d > 0
    rbo = (1.0 - p) / p * (p ** np.arange(1, units + 1) @ agreement) + agreement[-1] * p ** units
    constant = (entered[1, 0] == units) | (entered[2, 0] == units)  # every unit tied at the top
    return np.where(constant, math.nan, rbo).reshape(shape)


STATISTICS = (
    Statistic(
        name="rbo", label="RBO", order=40, asked_in=("agreement", "compare_maps"),
        computes=f"rank-biased overlap (Webber et al. 2010, RBO_ext at p = {PERSISTENCE}: top-weighted) of the "
                 f"units' rankings",
        null="units shuffled (within each layer, or across all units), as for the other statistics; "
             "for P units in random order about 1 / ((1 - p) P)",
        pairs=rbo_maps, rows=entry_depths, between=rbo_of_depths,
    ),
)
