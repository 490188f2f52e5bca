"""The one top-k of analysis (``statistics.topk``): k, the top sets with ties broken at random, overlap,
Jaccard and their chance levels. (The exact within-layer chance of the removed ``neuron_overlap``
lives on only in ``experiments/maths/transfer.py``, the prompt_transfer runs' own.)"""

import numpy as np
import pytest

from analysis.statistics import spearman
from analysis.statistics.topk import in_top_k, top_k_size, topk_overlap


def test_hand_example_of_a_layers_x_units_map():
    a = np.array([[5.0, 4.0, 3.0], [2.0, 1.0, 0.0]])  # top 3: (0,0) (0,1) (0,2)
    b = np.array([[0.0, 4.0, 3.0], [5.0, 1.0, 2.0]])  # top 3: (1,0) (0,1) (0,2)
    result = topk_overlap(a, b, 0.5, np.random.default_rng(0))
    assert result["k"] == 3
    assert result["overlap"] == pytest.approx(2 / 3) and result["jaccard"] == pytest.approx(2 / 4)
    assert result["chance_overlap"] == pytest.approx(0.5)  # k / P


def test_identical_maps_overlap_fully():
    scores = np.random.default_rng(0).random((6, 200))
    result = topk_overlap(scores, scores, 0.2, np.random.default_rng(1))
    assert result["k"] == 240 and result["overlap"] == 1.0 and result["jaccard"] == 1.0


def test_k_is_the_ceiling_of_the_fraction_without_float_noise():
    assert top_k_size(0.1, 30) == 3  # 0.1 * 30 = 3.0000000000000004
    assert top_k_size(0.2, 72) == 15 and top_k_size(1.0, 7) == 7 and top_k_size(1e-9, 7) == 1
    with pytest.raises(ValueError, match="k_frac"):
        top_k_size(0.0, 10)


def test_bad_input():
    with pytest.raises(ValueError, match="k_frac"):
        topk_overlap(np.zeros(6), np.zeros(6), 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="differ in length"):
        topk_overlap(np.zeros(6), np.zeros(5), 0.2, np.random.default_rng(0))


def test_topk_overlap_hand_example():
    a = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # top 3: {0, 1, 2}
    b = np.array([0.0, 4.0, 3.0, 5.0, 1.0, 2.0])  # top 3: {3, 1, 2}
    result = topk_overlap(a, b, 0.5, np.random.default_rng(0))
    assert (result["jaccard"], result["overlap"], result["k"]) == (pytest.approx(2 / 4), pytest.approx(2 / 3), 3)
    assert result["chance_overlap"] == pytest.approx(3 / 6)
    # |A & B| ~ Hypergeom(6, 3, 3): P(0..3) = (1, 9, 9, 1) / 20; E[s / (6 - s)] by hand
    assert result["chance_jaccard"] == pytest.approx((9 * 1 / 5 + 9 * 2 / 4 + 1 * 1) / 20)
    same = topk_overlap(a, a, 0.2, np.random.default_rng(0))  # k = ceil(1.2) = 2
    assert (same["jaccard"], same["overlap"], same["k"]) == (1.0, 1.0, 2)


def test_topk_overlap_k_is_ceil_without_float_noise():
    a = np.arange(30.0)
    assert topk_overlap(a, a, 0.1, np.random.default_rng(0))["k"] == 3  # 0.1 * 30 = 3.0000000000000004
    with pytest.raises(ValueError):
        topk_overlap(a, a, 0.0, np.random.default_rng(0))


def test_topk_overlap_of_independent_binary_runs_is_at_chance_not_biased_by_ties():
    """Defect 2: ties broken by index made two unrelated runs (8 of 72 heads open, k = 15)
    overlap at ~0.55 where chance is 15 / 72 ~ 0.21."""
    rng = np.random.default_rng(30)
    overlaps = []
    for _ in range(300):
        a, b = np.zeros(72), np.zeros(72)
        a[rng.choice(72, 8, replace=False)] = 1.0
        b[rng.choice(72, 8, replace=False)] = 1.0
        result = topk_overlap(a, b, 0.2, rng)
        overlaps.append(result["overlap"])
    assert result["k"] == 15 and result["chance_overlap"] == pytest.approx(15 / 72)
    assert np.mean(overlaps) == pytest.approx(15 / 72, abs=0.03)


def test_topk_ties_are_broken_at_random_but_reproducibly():
    ties = np.array([1.0, 1.0, 1.0, 0.0])
    ranks = spearman.rank_rows(ties[None])
    picks = {tuple(np.flatnonzero(in_top_k(ranks, 2, np.random.default_rng(seed))[0])) for seed in range(30)}
    assert picks == {(0, 1), (0, 2), (1, 2)}  # every tied pair comes up, never the 0-scored unit
    assert topk_overlap(ties, ties[::-1], 0.5, np.random.default_rng(5)) == topk_overlap(ties, ties[::-1], 0.5, np.random.default_rng(5))
