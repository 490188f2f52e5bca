"""Top skill-neuron overlap of two (L, I) maps and its exact chance levels."""

import numpy as np
import pytest
from scipy.stats import hypergeom

from analysis.neuron_overlap import shared_count_pmf, top_neuron_overlap


def test_hand_example():
    a = np.array([[5.0, 4.0, 3.0], [2.0, 1.0, 0.0]])  # top 3: (0,0) (0,1) (0,2)
    b = np.array([[0.0, 4.0, 3.0], [5.0, 1.0, 2.0]])  # top 3: (1,0) (0,1) (0,2)
    result = top_neuron_overlap(a, b, k_frac=0.5)
    assert (result["k"], result["shared"]) == (3, 2)
    assert result["overlap"] == pytest.approx(2 / 3) and result["jaccard"] == pytest.approx(2 / 4)
    # all units: Hypergeom(6, 3, 3), P(0..3) = (1, 9, 9, 1) / 20, so P(S >= 2) = 10 / 20
    assert result["chance_overlap"] == pytest.approx(0.5)
    assert result["p_all_units"] == pytest.approx(0.5)
    # within layers: A holds (3, 0), B (2, 1): layer 0 shares exactly 2 of 3 whatever the shuffle
    assert result["chance_overlap_within_layers"] == pytest.approx((3 * 2 / 3) / 3)
    assert result["p_within_layers"] == pytest.approx(1.0)


def test_identical_maps_overlap_fully_and_beat_both_chances():
    scores = np.random.default_rng(0).random((6, 200))
    result = top_neuron_overlap(scores, scores)
    assert result["k"] == 240 and result["overlap"] == 1.0
    assert result["p_all_units"] < 1e-50 and result["p_within_layers"] < 1e-50


def test_pmf_is_the_convolution_of_per_layer_hypergeometrics():
    pmf = shared_count_pmf([3, 0, 5], [2, 4, 5], inner=10)
    assert pmf.sum() == pytest.approx(1.0)
    layer0 = hypergeom.pmf(np.arange(3), 10, 3, 2)
    layer2 = hypergeom.pmf(np.arange(6), 10, 5, 5)
    np.testing.assert_allclose(pmf, np.convolve(layer0, layer2), atol=1e-12)
    assert (np.arange(pmf.size) * pmf).sum() == pytest.approx(3 * 2 / 10 + 5 * 5 / 10)


def test_within_layer_chance_matches_shuffling_b_within_layers():
    """The exact null against a Monte Carlo one: shuffle B's map within each layer."""
    rng = np.random.default_rng(1)
    a, b = rng.random((3, 40)), rng.random((3, 40))
    a[2] += 1.0  # A's top units sit in layer 2 ...
    b[2] += 0.5  # ... and most of B's too
    observed = top_neuron_overlap(a, b, 0.2)
    top_a, top_b = _top(a, observed["k"]), _top(b, observed["k"])
    assert observed["shared"] == (top_a & top_b).sum()
    shuffles = rng.permuted(np.broadcast_to(top_b, (4000, 3, 40)), axis=2)  # B shuffled in each layer
    shuffled = (shuffles & top_a).sum(axis=(1, 2))  # (4000,)
    pmf = shared_count_pmf(top_a.sum(axis=1), top_b.sum(axis=1), inner=40)
    expected = (np.arange(pmf.size) * pmf).sum()
    assert np.mean(shuffled) == pytest.approx(expected, abs=0.15)
    assert observed["chance_overlap_within_layers"] * observed["k"] == pytest.approx(expected)
    tail = np.mean(np.array(shuffled) >= observed["shared"])
    assert observed["p_within_layers"] == pytest.approx(tail, abs=0.03)


def _top(m, k):
    """Top-k mask of a map (no ties in continuous random maps)."""
    top = np.zeros(m.size, dtype=bool)
    top[np.argsort(-m, axis=None)[:k]] = True
    return top.reshape(m.shape)


def test_unrelated_maps_with_a_shared_layer_profile():
    """Two independent maps whose top units both sit in the upper layers: beyond all-unit chance
    (the layer profile is shared) but at within-layer chance (the neurons are not)."""
    rng = np.random.default_rng(2)
    p_all, p_within, overlaps, chances = [], [], [], []
    for _ in range(200):
        a, b = rng.random((6, 100)), rng.random((6, 100))
        a[3:] += 0.6
        b[3:] += 0.6
        result = top_neuron_overlap(a, b, 0.2, rng)
        p_all.append(result["p_all_units"])
        p_within.append(result["p_within_layers"])
        overlaps.append(result["overlap"])
        chances.append(result["chance_overlap_within_layers"])
    assert np.mean(np.array(p_all) < 0.05) > 0.9
    assert np.mean(np.array(p_within) < 0.05) <= 0.08  # a valid (discrete, conservative) test
    assert np.mean(overlaps) == pytest.approx(np.mean(chances), abs=0.02)
    assert np.mean(chances) > 1.5 * 0.2  # well above the all-unit chance k / P = 0.2


def test_bad_input():
    with pytest.raises(ValueError, match="k_frac"):
        top_neuron_overlap(np.zeros((2, 3)), np.zeros((2, 3)), 0.0)
    with pytest.raises(ValueError, match="maps"):
        top_neuron_overlap(np.zeros((2, 3)), np.zeros((3, 2)))
