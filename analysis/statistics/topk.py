"""Top-k overlap: do two maps put the same units among their k largest?

``k = ceil(k_frac * P)`` (``top_k_size``); ``A``, ``B`` = the units of the k highest scores of each
map, ties broken at random (``in_top_k``: the one top-k of agreement, compare-maps and the service's
overlap). Two statistics of the two sets: the overlap coefficient ``|A & B| / k`` and the Jaccard
index ``|A & B| / |A | B|``. Chance in closed form: for two independent random k-sets of P units
``|A & B|`` is hypergeometric (P, k, k), so the expected overlap is ``k / P`` and the expected
Jaccard ``E[s / (2k - s)]`` (``topk_chance``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import hypergeom

from analysis.statistics import spearman
from analysis.statistics.base import Statistic


def top_k_size(k_frac: float, p: int) -> int:
    """``k = ceil(k_frac * P)``, at least 1 and at most P (``k_frac`` in (0, 1]). The tolerance keeps
    ``0.1 * 30 = 3.0000000000000004`` from becoming k = 4."""
    if not 0.0 < k_frac <= 1.0:
        raise ValueError(f"k_frac must be in (0, 1], got {k_frac}")
    return min(p, max(1, math.ceil(k_frac * p - 1e-9)))


def in_top_k(ranks: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(Q, P)`` average ranks (``spearman.rank_rows``) -> ``(Q, P)`` bool: each row's k highest
    units, ties broken at random (``rng``), independently in every row.

    With binary gates most units tie, and breaking ties by index in both rows would make two
    unrelated runs share the low-index units (8 of 72 heads open in each run, k = 15: overlap ~0.55
    by index against ~0.21 by chance). Distinct average ranks differ by 1 or more, so noise below
    0.5 reorders tied units only.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    key = ranks + 0.5 * rng.random(ranks.shape)
    top = np.zeros(ranks.shape, dtype=bool)
    np.put_along_axis(top, np.argpartition(-key, k - 1, axis=-1)[:, :k], True, axis=-1)
    return top


def topk_overlap(a: np.ndarray, b: np.ndarray, k_frac: float, rng: np.random.Generator) -> dict:
    """Agreement of the top-k units of two score vectors (``in_top_k``), next to what chance gives.

    Returns ``jaccard = |A & B| / |A | B|``, ``overlap = |A & B| / k`` (the overlap coefficient;
    ``|A| = |B| = k``), ``k`` (``top_k_size``), and their chance levels for two independent random
    k-sets of P units (``topk_chance``).
    """
    a, b = np.ravel(a), np.ravel(b)  # (P,)
    if a.shape != b.shape:
        raise ValueError(f"score vectors differ in length: {a.shape} vs {b.shape}")
    p = a.size
    k = top_k_size(k_frac, p)
    top = in_top_k(spearman.rank_rows(np.stack([a, b])), k, rng)  # (2, P)
    shared = int((top[0] & top[1]).sum())
    return {"jaccard": shared / (2 * k - shared), "overlap": shared / k, "k": k, **topk_chance(p, k)}


def topk_chance(p: int, k: int) -> dict[str, float]:
    """Expected overlap coefficient and Jaccard of two independent random k-subsets of p units."""
    shared = np.arange(max(0, 2 * k - p), k + 1)  # possible |A & B|
    pmf = hypergeom.pmf(shared, p, k, k)
    return {"chance_overlap": k / p, "chance_jaccard": float(pmf @ (shared / (2 * k - shared)))}


STATISTICS = (
    Statistic(
        name="overlap", label="top-k", computes="the share of the k largest units both maps have, |A & B| / k",
        order=50, asked_in=("compare_maps",), null="two independent random k-sets: k / P",
        top_k=lambda shared, k: shared / k, chance=lambda p, k: k / p,
    ),
    Statistic(
        name="jaccard", label="top-k Jaccard", computes="the Jaccard index of the k largest units, |A & B| / |A | B|",
        order=51, asked_in=("compare_maps",), null="two independent random k-sets: E[s / (2k - s)], s hypergeometric",
        top_k=lambda shared, k: shared / (2 * k - shared), chance=lambda p, k: topk_chance(p, k)["chance_jaccard"],
    ),
)
