"""Overlap of two tasks' top skill neurons, with exact chance levels (pure numpy/scipy).

Wang et al. 2022 (``../shared/PAPERS.md``) predict prompt transferability from
the overlap of the top 20 % skill neurons of two tasks' prompts. Given two
``(L, I)`` predictivity maps (``neurons.predictivity``), ``top_neuron_overlap``
takes each map's top ``k = ceil(k_frac * L * I)`` neurons over the whole map
(ties broken at random, as ``statistics.topk.topk_overlap``) and reports
``overlap = |A & B| / k`` against two chances:

- ``all_units``: B's top set a random k-set of all ``L * I`` neurons:
  ``|A & B| ~ Hypergeom(L * I, k, k)``, chance ``k / (L * I)``;
- ``within_layers``: B's top neurons shuffled within each layer, keeping how
  many of them each layer holds. Predictivity concentrates in some layers for
  every task, so two unrelated tasks share top neurons beyond ``k / (L * I)``
  merely by sharing a layer profile; this null asks "the same neurons, beyond
  the same layers?". Per layer ``|A_l & B_l| ~ Hypergeom(I, a_l, b_l)``,
  independent across layers, so the total's distribution is the convolution of
  the per-layer ones: exact p-values, no permutations.

The paper's other figure, the overlap of neurons *activated* by the two prompts,
needs the activations themselves and is not computable from the maps.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import hypergeom


def _top_mask(scores: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Bool mask of the k largest ``scores`` (flat), ties in random order; NaN ranks last."""
    flat = np.nan_to_num(np.ravel(scores).astype(np.float64), nan=-np.inf)
    order = np.lexsort((rng.random(flat.size), -flat))  # last key is the primary one
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[:k]] = True
    return mask.reshape(np.shape(scores))


def shared_count_pmf(per_layer_a: np.ndarray, per_layer_b: np.ndarray, inner: int) -> np.ndarray:
    """``P(|A & B| = s)`` for s = 0..k when B is shuffled within each layer of ``inner`` units.

    ``per_layer_a[l]`` / ``per_layer_b[l]``: how many of A's / B's units lie in
    layer l. Layer l contributes ``Hypergeom(inner, a_l, b_l)``; the layers add up
    independently, so the total's pmf is the convolution of theirs.
    """
    pmf = np.ones(1)
    for a_l, b_l in zip(np.asarray(per_layer_a, int), np.asarray(per_layer_b, int), strict=True):
        support = np.arange(min(a_l, b_l) + 1)
        pmf = np.convolve(pmf, hypergeom.pmf(support, inner, a_l, b_l))
    return pmf


def _tail(pmf: np.ndarray, observed: int) -> float:
    """``P(S >= observed)`` from a pmf over 0..len-1 (clipped to [0, 1] against rounding)."""
    return float(min(1.0, max(0.0, pmf[observed:].sum())))


def top_neuron_overlap(a: np.ndarray, b: np.ndarray, k_frac: float = 0.2,
                       rng: np.random.Generator | None = None) -> dict[str, float]:
    """Overlap of the top ``k_frac`` units of two ``(L, I)`` maps, with both chances and p-values.

    Returns ``k``, ``shared = |A & B|``, ``overlap = shared / k``,
    ``jaccard = shared / (2k - shared)``; ``chance_overlap`` and ``p_all_units``
    (``P(shared >= observed)`` under ``Hypergeom(L * I, k, k)``);
    ``chance_overlap_within_layers`` (``sum_l a_l b_l / I / k``) and
    ``p_within_layers`` (exact, ``shared_count_pmf``). ``rng`` breaks ties
    (default: seed 0, so the result is reproducible).
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"expected two (layers, units) maps of one shape, got {a.shape} and {b.shape}")
    if not 0.0 < k_frac <= 1.0:
        raise ValueError(f"k_frac must be in (0, 1], got {k_frac}")
    rng = np.random.default_rng(0) if rng is None else rng
    num_layers, inner = a.shape
    p = num_layers * inner
    k = min(p, max(1, math.ceil(k_frac * p - 1e-9)))  # as topk.topk_overlap: 0.1 * 30 stays 3
    top_a, top_b = _top_mask(a, k, rng), _top_mask(b, k, rng)
    shared = int((top_a & top_b).sum())
    per_a, per_b = top_a.sum(axis=1), top_b.sum(axis=1)  # (L,) top units per layer
    support = np.arange(k + 1)
    return {
        "k": k,
        "shared": shared,
        "overlap": shared / k,
        "jaccard": shared / (2 * k - shared),
        "chance_overlap": k / p,
        "p_all_units": _tail(hypergeom.pmf(support, p, k, k), shared),
        "chance_overlap_within_layers": float((per_a * per_b).sum() / inner / k),
        "p_within_layers": _tail(shared_count_pmf(per_a, per_b, inner), shared),
    }
