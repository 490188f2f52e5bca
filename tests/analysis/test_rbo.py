"""Rank-biased overlap (analysis/statistics/rbo.py): hand-computed values from Webber, Moffat &
Zobel (2010)'s definition, its permutation null, and its way from one file to every consumer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from analysis.questions.agreement import across_runs, compare
from analysis.statistics import STATISTICS, rbo
from analysis.statistics import nulls as permutations
from analysis.views import answers
from analysis.views.service.app import build_app
from analysis.views.summary import summary_metrics
from headsweep.cli import common
from headsweep.cli import main as headsweep

P_ = 0.9  # the persistence of the hand computations


def _rbo_ext(agreements: list[float], p: float = P_) -> float:
    """The paper's extrapolated RBO from the agreements A_1..A_k: A_k p^k + (1 - p) / p sum_d A_d p^d."""
    k = len(agreements)
    return agreements[-1] * p ** k + (1 - p) / p * sum(a * p ** d for d, a in enumerate(agreements, start=1))


def _depths(ranking: str, items: str) -> np.ndarray:
    """Each of ``items``' depth in ``ranking`` (1 = its top), ``len(ranking) + 1`` where it is absent."""
    return np.array([ranking.index(i) + 1 if i in ranking else len(ranking) + 1 for i in items])


# --------------------------------------------------------------------------- the definition


def test_two_swaps_by_hand():
    """S = a b c d, T = b a d c: X_d = 0, 2, 2, 4, so A_d = 0, 1, 2/3, 1 and
    RBO_ext = 0.9^4 + (0.1 / 0.9) (0.9^2 + 2/3 0.9^3 + 0.9^4) = 0.873."""
    value = rbo.rbo_ext(_depths("abcd", "abcd"), _depths("badc", "abcd"))
    assert value == pytest.approx(0.9 ** 4 + 0.1 / 0.9 * (0.81 + 2 / 3 * 0.729 + 0.6561), abs=1e-12)
    assert value == pytest.approx(0.873, abs=1e-12)


def test_prefixes_with_items_only_one_ranking_holds():
    """S = a b c, T = a c d to depth 3: X_d = 1, 1, 2, so A_d = 1, 1/2, 2/3; a lower persistence
    weighs the top more."""
    items = "abcd"
    s, t = _depths("abc", items), _depths("acd", items)
    assert rbo.rbo_ext(s, t, k=3) == pytest.approx(_rbo_ext([1, 1 / 2, 2 / 3]), abs=1e-12)
    assert rbo.rbo_ext(s, t, p=0.5, k=3) == pytest.approx(_rbo_ext([1, 1 / 2, 2 / 3], p=0.5), abs=1e-12)
    assert rbo.rbo_ext(s, t, p=0.5, k=3) > rbo.rbo_ext(s, t, k=3)  # they agree at the very top


def test_identical_rankings_score_one_and_disjoint_ones_zero():
    assert rbo.rbo_ext(_depths("abcde", "abcde"), _depths("abcde", "abcde")) == pytest.approx(1.0, abs=1e-12)
    items = "abcdef"
    assert rbo.rbo_ext(_depths("abc", items), _depths("def", items), k=3) == 0.0
    x = np.random.default_rng(0).random((4, 6, 12))  # maps: each the same as itself
    np.testing.assert_allclose(rbo.rbo_maps(x, x), 1.0, atol=1e-12)


def test_maps_are_ranked_largest_first():
    """A map of distinct values is the ranking of its units by value, largest first."""
    a = np.array([[0.9, 0.1, 0.5, 0.3]])  # units 0, 2, 3, 1
    b = np.array([[0.2, 0.8, 0.6, 0.1]])  # units 1, 2, 0, 3
    np.testing.assert_array_equal(rbo.entry_depths(a), [[1, 4, 2, 3]])
    # X_d = 0 ({0} vs {1}), 1 ({0, 2} vs {1, 2}), 2 ({0, 2, 3} vs {1, 2, 0}), 4
    assert rbo.rbo_maps(a, b)[0] == pytest.approx(_rbo_ext([0, 1 / 2, 2 / 3, 1]), abs=1e-12)
    assert rbo.rbo_maps(a, b)[0] == pytest.approx(rbo.rbo_ext(rbo.entry_depths(a)[0], rbo.entry_depths(b)[0]))


def test_tied_units_enter_together_at_their_first_place():
    """a = (1, 1, 0, 0), b = (1, 0, 1, 0): each prefix holds 2 units from depth 1 and all 4 from depth 3;
    they share unit 0 until then: A_d = 2 X_d / (|S_:d| + |T_:d|) = 2/4, 2/4, 1, 1."""
    a, b = np.array([[1.0, 1.0, 0.0, 0.0]]), np.array([[1.0, 0.0, 1.0, 0.0]])
    np.testing.assert_array_equal(rbo.entry_depths(a), [[1, 1, 3, 3]])
    assert rbo.rbo_maps(a, b)[0] == pytest.approx(_rbo_ext([1 / 2, 1 / 2, 1, 1]), abs=1e-12)
    assert rbo.rbo_maps(a, a)[0] == pytest.approx(1.0)


def test_a_constant_map_ranks_nothing_and_p_is_checked():
    x = np.random.default_rng(1).random((2, 10))
    values = rbo.rbo_maps(np.vstack([np.ones(10), x[0]]), x)
    assert math.isnan(values[0]) and math.isfinite(values[1])
    with pytest.raises(ValueError, match="persistence"):
        rbo.rbo_ext(np.arange(1, 4), np.arange(1, 4), p=1.0)


@pytest.mark.parametrize("units", [1, 2, 8, 72])
def test_rbo_of_many_pairs_of_depths_is_rbo_ext(units):
    """The null's form (``rbo_of_depths``: many pairs of shuffled depths at once, any leading shape)
    gives ``rbo_maps``' values: ties, a constant map (NaN), distinct values."""
    rng = np.random.default_rng(units)
    a, b = rng.normal(size=(2, 60, units))
    a[::2], b[::3] = np.round(a[::2]), np.round(b[::3])  # ties
    a[5], b[7] = 1.0, 0.0  # constant maps
    depth_a, depth_b = rbo.entry_depths(a), rbo.entry_depths(b)
    expected = rbo.rbo_maps(a, b)
    np.testing.assert_allclose(rbo.rbo_of_depths(depth_a, depth_b), expected, rtol=0, atol=1e-12)
    got = rbo.rbo_of_depths(depth_a.reshape(3, 20, units), depth_b.reshape(3, 20, units), p=0.5)
    np.testing.assert_allclose(got.ravel(), np.where(np.isnan(expected), np.nan, rbo.rbo_ext(depth_a, depth_b, 0.5)),
                               rtol=0, atol=1e-12)
    assert np.isnan(expected[[5, 7]]).all() and rbo.rbo_of_depths(depth_a[:0], depth_b[:0]).shape == (0,)
    with pytest.raises(ValueError, match="persistence"):
        rbo.rbo_of_depths(depth_a, depth_b, p=0.0)


# --------------------------------------------------------------------------- the null


def _mean_pairwise_rbo(x: np.ndarray) -> float:
    """Mean RBO over the distinct pairs of runs ``x`` (N, L, K)."""
    i, j = np.triu_indices(len(x), k=1)
    flat = x.reshape(len(x), -1)
    return float(rbo.rbo_maps(flat[i], flat[j]).mean())


def test_unrelated_maps_are_at_chance_shared_ones_far_above():
    """Units in random order: E[X_d] = d^2 / P, so chance is about 1 / ((1 - p) P) (0.069 for 144
    units); the null recovers it, and shared rankings sit above its band under both nulls."""
    rng = np.random.default_rng(2)
    unrelated = rng.random((3, 12, 12))
    nulls = permutations.both_nulls(_mean_pairwise_rbo, unrelated, 300, rng)
    for result in nulls.values():
        assert result.null_mean == pytest.approx(1 / ((1 - rbo.PERSISTENCE) * 144), abs=0.01)
        assert result.band_lo < result.observed < result.band_hi
    shared = rng.random((12, 12)) + 0.05 * rng.random((3, 12, 12))  # one ranking, a little noise per run
    for result in permutations.both_nulls(_mean_pairwise_rbo, shared, 300, rng).values():
        assert result.observed > 0.5 and result.observed > result.band_hi and result.at_floor


def test_a_shared_layer_profile_is_chance_within_layers():
    """Runs that keep the same number of units per layer but random ones: within layers that
    profile is chance (excess ~0), across all units it is not."""
    rng = np.random.default_rng(3)
    excess_within, excess_all = [], []
    for _ in range(10):
        x = np.zeros((3, 6, 12))
        for run in range(3):
            for layer, count in enumerate((10, 8, 4, 2, 1, 1)):
                x[run, layer, rng.choice(12, count, replace=False)] = 1.0 + rng.random(count)
        nulls = permutations.both_nulls(_mean_pairwise_rbo, x, 100, rng)
        excess_within.append(nulls["within_layers"].excess)
        excess_all.append(nulls["all_units"].excess)
    assert abs(np.mean(excess_within)) < 0.03 and np.mean(excess_all) > 0.04


# --------------------------------------------------------------------------- every consumer


def test_rbo_reaches_every_consumer_from_its_one_file(sweep, data, capsys, monkeypatch):
    """Registered by its module alone, RBO is in the Python answers (across_runs.agreement,
    compare.compare_maps), the CLI's agreement and compare-maps tables, the service's JSON and the
    MLflow summary."""
    assert STATISTICS["rbo"].pairs is rbo.rbo_maps
    result = across_runs.agreement(data, "seed", n_perm=20)
    assert result.rbo is result.statistics["rbo"] and result.rbo.observed > result.rbo.nulls["within_layers"].band_hi
    compared = compare.compare_maps(data, ["heads.log_alpha", "heads.gate"], n_perm=20)
    (pair,) = compared.pairs
    assert pair.rbo.observed > pair.rbo.nulls["within_layers"].band_hi and set(pair.rbo.nulls) == set(permutations.NULLS)

    monkeypatch.setattr(common.out, "_width", 200)
    assert headsweep(["agreement", sweep.sweep_id, "--across", "seed", "--n-perm", "20", "--db", sweep.url]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"RBO {result.rbo.observed:.3f} in layers" in text and "RBO: rank-biased overlap" in text
    assert headsweep(["compare-maps", sweep.sweep_id, "heads.log_alpha", "heads.gate", "--n-perm", "20",
                      "--db", sweep.url]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"heads.log_alpha heads.gate 24 {pair.rbo.observed:.3f} in layers" in text

    with TestClient(build_app(sweep.url)) as client:
        answer = client.get(f"/sweeps/{sweep.sweep_id}/agreement", params={"across": "seed", "n_perm": 20}).json()
        assert answer["rbo"] == answers.tested_json(result.rbo)
        answer = client.get(f"/sweeps/{sweep.sweep_id}/compare-maps",
                            params={"maps": "heads.log_alpha,heads.gate", "n_perm": 20}).json()
        assert answer["pairs"][0]["rbo"]["observed"] == pytest.approx(pair.rbo.observed)
        assert answer["rbo"]["observed"] == pytest.approx(compared.rbo.observed)
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert "rank-biased overlap" in schema["AgreementOut"]["properties"]["rbo"]["description"]

    summary = summary_metrics(data, n_perm=20)
    assert summary["agreement/seed/heads.gate/rbo"] == pytest.approx(result.rbo.observed)
    assert summary["agreement/seed/heads.gate/rbo_chance"] < summary["agreement/seed/heads.gate/rbo"]
