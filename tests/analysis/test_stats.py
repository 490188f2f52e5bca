"""analysis.statistics (Pearson, Spearman, stem cell, top-k) and analysis.statistics.nulls and .intervals (nulls, CIs) against scipy /
statsmodels / hand-computed values, and known answers on synthetic gates."""

import math

import numpy as np
import pytest
import scipy.stats
import statsmodels.api as sm

from analysis.statistics import intervals, pearson, spearman, stem_cell
from analysis.statistics import nulls as permutations


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _mean_pairwise_r(runs: np.ndarray) -> float:
    """Mean Pearson r over the distinct pairs of runs: a statistic to test the nulls with."""
    r = pearson.pearson_matrix(runs, dtype=np.float64)
    i, j = np.triu_indices(len(r), k=1)
    return float(r[i, j].mean())


def _shared_gates(rng, n_runs=3, layers=6, heads=12, flip=0.05):
    """Runs that keep (almost) the same heads: one random base mask, a few flips per run."""
    base = rng.random((layers, heads)) < 0.4  # (L, H)
    flips = rng.random((n_runs, layers, heads)) < flip  # (N, L, H)
    return (base[None] ^ flips).astype(np.float64)


# --- Pearson / Spearman -----------------------------------------------------------------


def test_pearson_matrix_matches_corrcoef():
    x = _rng().random((7, 20))
    np.testing.assert_allclose(pearson.pearson_matrix(x), np.corrcoef(x), atol=1e-12)


def test_pearson_matrix_hand_example():
    x = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 4.0]])
    # run 3 vs run 1: centred (-1, 0, 1) and (-4/3, -1/3, 5/3); r = 3 / (sqrt 2 * sqrt(42/9))
    r13 = 3.0 / (math.sqrt(2.0) * math.sqrt(42.0 / 9.0))
    expected = np.array([[1.0, -1.0, r13], [-1.0, 1.0, -r13], [r13, -r13, 1.0]])
    np.testing.assert_allclose(pearson.pearson_matrix(x), expected, atol=1e-12)


def test_pearson_matrix_accepts_layer_head_stacks_and_keeps_float32():
    x = _rng(1).random((5, 6, 12)).astype(np.float32)
    r = pearson.pearson_matrix(x)
    assert r.shape == (5, 5) and r.dtype == np.float32
    expected = np.corrcoef(x.reshape(5, -1).astype(np.float64))
    np.testing.assert_allclose(r, expected, atol=1e-6)
    assert pearson.pearson_matrix(x, dtype=np.float64).dtype == np.float64
    assert pearson.pearson_matrix(x.astype(np.float64)).dtype == np.float64


def test_pearson_matrix_identical_runs_and_constant_rows():
    run = _rng(2).random(144)
    x = np.stack([run, run, np.ones(144), 1.0 - run])
    r = pearson.pearson_matrix(x)
    assert r[0, 1] == pytest.approx(1.0) and r[0, 3] == pytest.approx(-1.0)
    assert np.isnan(r[2]).all() and np.isnan(r[:, 2]).all()  # every head open: undefined
    assert np.all(np.abs(r[~np.isnan(r)]) <= 1.0)
    np.testing.assert_array_equal(np.diag(r)[[0, 1, 3]], 1.0)


def test_rank_rows_average_ties():
    x = np.array([[0.0, 1.0, 1.0, 0.5], [3.0, 3.0, 3.0, 3.0]])
    np.testing.assert_array_equal(spearman.rank_rows(x), [[1.0, 3.5, 3.5, 2.0], [2.5, 2.5, 2.5, 2.5]])


def test_spearman_rows_match_scipy_with_ties():
    # Gates rounded to 0 / 0.5 / 1: heavy ties, as real Hard Concrete gates have.
    x = np.round(_rng(3).random((6, 30)) * 2) / 2
    expected = [scipy.stats.spearmanr(x[i], x[i + 1]).statistic for i in range(5)]
    np.testing.assert_allclose(spearman.spearman_rows(x[:-1], x[1:]), expected, atol=1e-12)
    assert np.isnan(spearman.spearman_rows(np.ones((1, 30)), x[:1])[0])  # a constant map ranks nothing


def test_spearman_between_matches_scipy_block():
    rng = _rng(4)
    a, b = np.round(rng.random((4, 6, 12)), 1), np.round(rng.random((3, 6, 12)), 1)
    full = scipy.stats.spearmanr(np.vstack([a.reshape(4, -1), b.reshape(3, -1)]), axis=1).statistic
    np.testing.assert_allclose(spearman.spearman_between(a, b), full[:4, 4:], atol=1e-12)


def test_spearman_between_rejects_different_head_counts():
    with pytest.raises(ValueError, match="different numbers of heads"):
        spearman.spearman_between(np.zeros((2, 10)), np.zeros((2, 12)))


def test_mean_spearman_between_is_the_mean_of_the_defined_pairs():
    rng = _rng(8)
    a, b = np.round(rng.random((7, 6, 12)), 1), np.round(rng.random((5, 6, 12)), 1)  # with ties
    a[2] = 0.5  # a constant run: its rhos are undefined and left out
    expected = np.nanmean(spearman.spearman_between(a, b, dtype=np.float64))
    assert spearman.mean_spearman_between(a, b) == pytest.approx(expected, abs=1e-12)
    assert math.isnan(spearman.mean_spearman_between(np.ones((2, 6, 12)), b))


def test_ranks_are_the_same_in_blocks_of_rows(monkeypatch):
    """Rows are ranked (and summed) a block at a time, on threads: any block size gives the same."""
    rng = _rng(10)
    a, b = np.round(rng.random((9, 6, 12)), 1), np.round(rng.random((7, 6, 12)), 1)
    a[4] = 0.3
    whole_ranks, whole_mean = spearman.rank_rows(a), spearman.mean_spearman_between(a, b)
    monkeypatch.setattr(spearman, "_RANK_BLOCK_ELEMENTS", 2 * 72)  # 2 rows a block: 5 and 4 blocks
    np.testing.assert_array_equal(spearman.rank_rows(a), whole_ranks)
    np.testing.assert_array_equal(whole_ranks, scipy.stats.rankdata(a.reshape(9, -1), axis=1))
    assert spearman.mean_spearman_between(a, b) == pytest.approx(whole_mean, abs=1e-12)


def test_pearson_to_matches_pearson_matrix():
    rng = _rng(9)
    v, x = rng.random((6, 12)), rng.random((4, 6, 12))
    expected = pearson.pearson_matrix(np.concatenate([v[None], x]), dtype=np.float64)[0, 1:]
    np.testing.assert_allclose(pearson.pearson_to(v, x), expected, atol=1e-12)


def test_spearman_rows_hand_example():
    a = np.array([[1.0, 0.5, 0.0, 0.5]])  # ranks (4, 2.5, 1, 2.5)
    b = np.array([[0.9, 0.6, 0.1, 0.2]])  # ranks (4, 3, 1, 2)
    expected = np.corrcoef([4.0, 2.5, 1.0, 2.5], [4.0, 3.0, 1.0, 2.0])[0, 1]
    assert spearman.spearman_rows(a, b)[0] == pytest.approx(expected)
    assert spearman.spearman_rows(a, a)[0] == pytest.approx(1.0)


# --- multiple correlation ("correlation across runs") ----------------------------------


def _statsmodels_multiple_correlation(z: np.ndarray, i: int) -> float:
    others = np.delete(z, i, axis=0).T
    fit = sm.OLS(z[i], sm.add_constant(others)).fit()
    return math.sqrt(max(fit.rsquared_adj, 0.0))


@pytest.mark.parametrize("n_runs", [2, 3, 5])
def test_multiple_correlation_matches_statsmodels(n_runs):
    rng = _rng(10 + n_runs)
    z = np.clip(_shared_gates(rng, n_runs, flip=0.2) + 0.3 * rng.random((n_runs, 6, 12)), 0, 1)
    z = z.reshape(n_runs, -1)
    expected = [_statsmodels_multiple_correlation(z, i) for i in range(n_runs)]
    np.testing.assert_allclose(stem_cell.multiple_correlation(z), expected, atol=1e-10)


def test_multiple_correlation_for_three_runs_is_run3_on_run1_run2():
    z = np.clip(_shared_gates(_rng(5), 3, flip=0.15), 0, 1).reshape(3, -1)
    fit = sm.OLS(z[2], sm.add_constant(np.column_stack([z[0], z[1]]))).fit()
    assert stem_cell.multiple_correlation(z)[2] == pytest.approx(math.sqrt(fit.rsquared_adj), abs=1e-12)


def test_multiple_correlation_identical_runs_is_one():
    run = _rng(6).random((6, 12))
    np.testing.assert_allclose(stem_cell.multiple_correlation(np.stack([run] * 3)), 1.0, atol=1e-12)
    assert stem_cell.multiple_correlation(np.stack([run] * 3)).mean() == pytest.approx(1.0)


def test_multiple_correlation_clips_negative_adjusted_r2_to_zero():
    rng = _rng(7)
    x = rng.random((2, 40))
    design = np.column_stack([np.ones(40), x.T])  # (P, 3)
    y = rng.random(40)
    y -= design @ np.linalg.lstsq(design, y, rcond=None)[0]  # orthogonal to run 1, run 2: R^2 = 0
    z = np.vstack([x, y])
    assert sm.OLS(z[2], sm.add_constant(z[:2].T)).fit().rsquared_adj < 0
    assert stem_cell.multiple_correlation(z)[2] == 0.0


def test_multiple_correlation_constant_response_is_nan_and_bad_shapes_raise():
    z = np.vstack([np.ones(20), _rng(8).random((2, 20))])
    assert np.isnan(stem_cell.multiple_correlation(z)[0])
    with pytest.raises(ValueError, match="at least 2"):
        stem_cell.multiple_correlation(np.ones((1, 20)))
    with pytest.raises(ValueError, match="more heads than runs"):
        stem_cell.multiple_correlation(np.ones((4, 4)))


def test_independent_runs_have_low_multiple_correlation():
    z = (_rng(9).random((3, 6, 12)) < 0.5).astype(float)
    assert stem_cell.stem_cell(z) < 0.3


# --- permutation nulls ------------------------------------------------------------------


def test_shuffle_within_layers_keeps_each_runs_layer_values():
    x = _rng(12).random((3, 6, 12))
    shuffled = permutations.shuffle_units(x, 50, _rng(13), "within_layers")  # (50, 3, 6, 12)
    assert shuffled.shape == (50, 3, 6, 12)
    np.testing.assert_array_equal(
        np.sort(shuffled, axis=-1), np.broadcast_to(np.sort(x, -1), shuffled.shape)
    )
    # independent per run and per copy: the head order differs between runs and copies
    order = np.argsort(shuffled, axis=-1)
    assert not np.array_equal(order[0, 0], order[0, 1]) and not np.array_equal(order[0], order[1])
    assert not np.array_equal(shuffled[0], np.broadcast_to(x, shuffled.shape)[0])


def test_shuffle_all_units_moves_values_between_layers_but_keeps_each_run():
    x = np.zeros((2, 6, 12))
    x[:, 0, :] = 1.0  # every open head in layer 0
    shuffled = permutations.shuffle_units(x, 20, _rng(14), "all_units")
    np.testing.assert_array_equal(shuffled.sum(axis=(2, 3)), np.full((20, 2), 12.0))
    assert (shuffled[:, :, 1:, :].sum(axis=(2, 3)) > 0).all()  # layer profile destroyed
    with pytest.raises(ValueError, match="unknown null"):
        permutations.shuffle_units(x, 2, _rng(), "within_heads")


def test_permutation_null_shared_gates_are_significant_under_both_nulls():
    x = _shared_gates(_rng(14))
    nulls = permutations.both_nulls(stem_cell.stem_cell, x, 1000, _rng(15))
    for result in nulls.values():
        assert result.observed > 0.6
        assert result.p_value == pytest.approx(1 / 1001) and result.at_floor
        assert result.p_text == "p < 0.001"
        assert result.observed > result.band_hi and result.excess > 0.5
        assert result.null.shape == (1000,)


def test_p_text_never_prints_the_floor_as_an_exact_value():
    """Defect 9: p = 1 / (n_perm + 1) is a bound, not a value."""
    x = _shared_gates(_rng(14))
    at_200 = permutations.permutation_null(_mean_pairwise_r, x, 200, _rng(1))
    assert at_200.p_text == "p < 0.005"
    indep = (_rng(2).random((3, 6, 12)) < 0.5).astype(float)
    plain = permutations.permutation_null(_mean_pairwise_r, indep, 200, _rng(3))
    assert not plain.at_floor and plain.p_text == f"p = {plain.p_value:.2g}"


def test_permutation_null_independent_gates_are_not():
    # Calibration over 40 independent data sets: any single one falls outside
    # its 95 % band 5 % of the time, so test the rate, not one seed.
    rng = _rng(16)
    inside, small_p = 0, 0
    for _ in range(40):
        x = (rng.random((3, 6, 12)) < 0.5).astype(float)
        result = permutations.permutation_null(_mean_pairwise_r, x, 200, rng)
        assert abs(result.observed) < 0.25  # near 0
        assert result.band_lo < 0 < result.band_hi
        inside += result.band_lo <= result.observed <= result.band_hi
        small_p += result.p_value < 0.05
    assert inside >= 34 and small_p <= 6


def test_permutation_null_p_value_counts_ties_and_is_reproducible():
    x = np.repeat(np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])[None, :, None], 12, axis=2)
    x = np.stack([x[0], x[0], x[0] * 0.5 + 0.2])  # every layer uniform: shuffling changes nothing
    result = permutations.permutation_null(_mean_pairwise_r, x, 200, _rng(18))
    assert result.p_value == 1.0  # (1 + 200) / (1 + 200), despite float noise in the reordering
    assert result.excess == pytest.approx(0.0, abs=1e-9)
    again = permutations.permutation_null(_mean_pairwise_r, x, 200, _rng(18))
    np.testing.assert_array_equal(result.null, again.null)
    with pytest.raises(ValueError, match="Generator"):
        permutations.permutation_null(_mean_pairwise_r, x, 10, None)
    with pytest.raises(ValueError, match=r"\(N, L, K\)"):
        permutations.permutation_null(_mean_pairwise_r, x.reshape(3, -1), 10, _rng())


# --- known answers: what the two nulls tell apart (defect 3) ------------------------------


def _same_layer_profile(rng, n_runs=3, counts=(1, 2, 3, 4, 8, 10)):
    """Runs that share only how many heads each layer keeps; which heads is random per run."""
    x = np.zeros((n_runs, len(counts), 12))
    for i in range(n_runs):
        for layer, c in enumerate(counts):
            x[i, layer, rng.choice(12, c, replace=False)] = 1.0
    return x


def test_a_shared_layer_profile_alone_is_not_agreement_beyond_the_layer_profile():
    rng = _rng(40)
    excess_within, excess_all, small_p = [], [], 0
    for _ in range(20):
        x = _same_layer_profile(rng)
        nulls = permutations.both_nulls(_mean_pairwise_r, x, 200, rng)
        excess_within.append(nulls["within_layers"].excess)
        excess_all.append(nulls["all_units"].excess)
        small_p += nulls["within_layers"].p_value < 0.05
    assert abs(np.mean(excess_within)) < 0.03  # ~0 beyond the profile ...
    assert small_p <= 3  # ... and not significant (5 % expected)
    assert np.mean(excess_all) > 0.2  # ... but the raw r (and the all-units excess) is high


def test_identical_runs_score_one():
    x = np.stack([(_rng(41).random((6, 12)) < 0.3).astype(float)] * 3)
    assert stem_cell.stem_cell(x) == pytest.approx(1.0)


def test_a_planted_shared_set_of_k_heads_grows_the_excess_with_k():
    rng = _rng(42)
    excess = []
    for k in (0, 4, 8, 16):
        values = []
        for _ in range(5):
            x = _same_layer_profile(rng).reshape(3, -1)
            planted = rng.choice(72, k, replace=False)
            x[:, planted] = 1.0  # the same k heads open in every run
            nulls = permutations.both_nulls(stem_cell.stem_cell, x.reshape(3, 6, 12), 100, rng)
            values.append(nulls["within_layers"].excess)
        excess.append(np.mean(values))
    assert excess[0] == pytest.approx(0.0, abs=0.05)
    assert excess[0] < excess[1] < excess[2] < excess[3]


# --- stem cell statistic over triples (defect 4) ----------------------------------------


def _ols_triple(y, a, b):
    fit = sm.OLS(y, sm.add_constant(np.column_stack([a, b]), has_constant="add")).fit()
    return math.sqrt(min(max(fit.rsquared_adj, 0.0), 1.0))


def test_triple_statistic_matches_statsmodels_on_every_triple_of_five_runs():
    from itertools import combinations

    z = _shared_gates(_rng(43), n_runs=5, flip=0.15).reshape(5, -1)
    z[4] = _rng(44).random(72)  # one continuous, unrelated run
    expected = [np.mean([_ols_triple(z[i], z[j], z[k]), _ols_triple(z[j], z[i], z[k]),
                         _ols_triple(z[k], z[i], z[j])]) for i, j, k in combinations(range(5), 3)]
    np.testing.assert_allclose(stem_cell.triple_correlations(z), expected, atol=1e-10)
    assert stem_cell.stem_cell(z) == pytest.approx(np.mean(expected), abs=1e-10)


def test_paper_single_fit_is_statsmodels_ols_of_the_last_run_on_the_first_two():
    """He & Choi's reference (corelation_gate_overlap_rgb.py) fits ONE OLS per triple,
    ``z_run3 ~ z_run1 + z_run2``, and reports sqrt(adjusted R^2): recomputed here with
    statsmodels for every triple of five runs, the triple's last run as response."""
    from itertools import combinations

    z = _shared_gates(_rng(45), n_runs=5, flip=0.2).reshape(5, -1)
    z[1] = 0.5 * z[1] + 0.5 * _rng(46).random(72)  # runs unlike each other: the choice of response matters
    expected = [_ols_triple(z[k], z[i], z[j]) for i, j, k in combinations(range(5), 3)]
    np.testing.assert_allclose(stem_cell.triple_correlations(z, response="last"), expected, atol=1e-10)
    assert stem_cell.stem_cell(z, response="last") == pytest.approx(np.mean(expected), abs=1e-10)
    symmetric = stem_cell.triple_correlations(z)
    assert not np.allclose(symmetric, expected, atol=1e-3)  # a different number from the default's
    with pytest.raises(ValueError, match="response must be one of"):
        stem_cell.stem_cell(z, response="first")


def test_paper_statistic_fits_the_first_three_runs_only_as_the_reference():
    """corelation_gate_overlap_rgb.py:115-121 reads gates[0], gates[1], gates[2] of a task's runs,
    whatever their number: one OLS ``z3 ~ z1 + z2`` (statsmodels), sqrt(adjusted R^2). With 5 seeds
    stem_cell_paper is that one fit; stem_cell_triples (from 4 seeds) the mean over every triple, and
    the two differ; at 3 seeds they are the same fit."""
    from itertools import combinations

    z = _shared_gates(_rng(47), n_runs=5, flip=0.2).reshape(5, -1)
    z[3] = 0.3 * z[3] + 0.7 * _rng(48).random(72)  # later seeds unlike the first three
    reference = _ols_triple(z[2], z[0], z[1])
    assert stem_cell.stem_cell_paper(z) == pytest.approx(reference, abs=1e-10)
    cells = [np.arange(5), np.array([0, 1, 2])]
    assert stem_cell.stem_cell_paper(z, cells) == pytest.approx(reference, abs=1e-10)
    every = np.mean([_ols_triple(z[k], z[i], z[j]) for i, j, k in combinations(range(5), 3)])
    triples = next(stat for stat in stem_cell.STATISTICS if stat.name == "stem_cell_triples")
    assert triples.min_runs == 4 and triples.cells(z, [np.arange(5)]) == pytest.approx(every, abs=1e-10)
    assert abs(every - reference) > 0.01
    assert triples.cells(z[:3], [np.arange(3)]) == pytest.approx(stem_cell.stem_cell_paper(z[:3]), abs=1e-12)
    u = pearson.standardised(z)[None]  # the copies' path: one unshuffled copy gives the observed value
    assert stem_cell.stem_cell_paper_copies(u, cells)[0] == pytest.approx(reference, abs=1e-10)


@pytest.mark.filterwarnings("ignore:The design matrix is rank-deficient")
def test_triple_statistic_with_collinear_and_constant_runs_matches_statsmodels():
    z = _shared_gates(_rng(45), n_runs=3, flip=0.2).reshape(3, -1)
    twin = np.stack([z[0], z[1], z[1]])  # predictors 1 and 2 identical in one fit
    expected = np.mean([_ols_triple(twin[0], twin[1], twin[2]), _ols_triple(twin[1], twin[0], twin[2]),
                        _ols_triple(twin[2], twin[0], twin[1])])
    assert stem_cell.triple_correlations(twin)[0] == pytest.approx(expected, abs=1e-10)
    closed = np.stack([z[0], z[1], np.zeros(72)])  # a run with every gate closed
    expected = np.mean([_ols_triple(closed[0], closed[1], closed[2]),
                        _ols_triple(closed[1], closed[0], closed[2])])  # a constant response is undefined
    assert stem_cell.triple_correlations(closed)[0] == pytest.approx(expected, abs=1e-10)


def test_stem_cell_does_not_grow_with_the_number_of_seeds():
    """The joint fit of n runs grew 0.40 -> 0.55 from 3 to 20 runs at the same pairwise r."""
    rng = _rng(46)
    base = rng.normal(size=144)
    by_n = {}
    for n in (3, 5, 10, 20):
        runs = base + rng.normal(size=(n, 144)) * 1.2  # the same pairwise r for every n
        by_n[n] = stem_cell.stem_cell(runs)
        joint = stem_cell.multiple_correlation(runs).mean()
        if n == 20:
            assert joint > by_n[3] + 0.1  # the old statistic grows ...
    assert max(by_n.values()) - min(by_n.values()) < 0.06  # ... the triple one does not


def test_stem_cell_weights_every_cell_once_and_skips_cells_under_three_runs():
    rng = _rng(47)
    a = _shared_gates(rng, n_runs=3, flip=0.02)
    b = (rng.random((10, 6, 12)) < 0.4).astype(float)  # 10 unrelated seeds
    x = np.concatenate([a, b, b[:2]])
    cells = [np.arange(3), np.arange(3, 13), np.arange(13, 15)]
    expected = np.mean([stem_cell.stem_cell(a), stem_cell.stem_cell(b)])
    assert stem_cell.stem_cell(x, cells) == pytest.approx(expected, abs=1e-12)
    assert math.isnan(stem_cell.stem_cell(x[:2]))


# --- aggregate --------------------------------------------------------------------------


def test_aggregate_small_n_uses_a_t_interval_that_can_leave_the_observed_range():
    """Defect 8: a percentile bootstrap of 3 seeds never leaves [min, max]."""
    values = np.array([0.71, 0.84, 0.78])
    agg = intervals.aggregate(values, _rng(19))
    half = scipy.stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / math.sqrt(3)
    assert agg.ci_method == "t"
    assert (agg.ci_lo, agg.ci_hi) == (pytest.approx(values.mean() - half), pytest.approx(values.mean() + half))
    assert agg.ci_lo < values.min() and agg.ci_hi > values.max()
    assert agg.mean == pytest.approx(values.mean(), abs=1e-15)
    assert agg.std == pytest.approx(np.std(values, ddof=1), abs=1e-15)


def test_aggregate_bootstrap_from_ten_values_and_ci_shrinks_with_n():
    rng = _rng(20)
    small = intervals.aggregate(rng.normal(size=12), _rng(21))
    large = intervals.aggregate(rng.normal(size=500), _rng(21))
    assert small.ci_method == large.ci_method == "bootstrap"
    assert (large.ci_hi - large.ci_lo) < 0.5 * (small.ci_hi - small.ci_lo)
    # ~ 2 * 1.96 / sqrt(500) = 0.175 for the large sample
    assert large.ci_hi - large.ci_lo == pytest.approx(
        2 * 1.96 * large.std / math.sqrt(500), rel=0.15
    )


def test_aggregate_small_n_and_nan_policy():
    one = intervals.aggregate(np.array([0.8]), _rng())
    assert (one.mean, one.n, one.ci_lo, one.ci_hi, one.ci_method) == (0.8, 1, 0.8, 0.8, "none")
    assert math.isnan(one.std)
    none = intervals.aggregate(np.array([]), _rng())
    assert none.n == 0 and math.isnan(none.mean)
    with_nan = np.array([0.5, np.nan, 0.7])
    assert math.isnan(intervals.aggregate(with_nan, _rng()).mean)
    omitted = intervals.aggregate(with_nan, _rng(), nan_policy="omit")
    assert omitted.n == 2 and omitted.mean == pytest.approx(0.6)
    assert intervals.aggregate(with_nan, _rng(3), nan_policy="omit") == intervals.aggregate(
        np.array([0.5, 0.7]), _rng(3)
    )


# --- several statistics from one draw (joint_nulls) -----------------------------------------


def test_joint_nulls_of_shuffled_positions_are_each_statistics_both_nulls():
    """Shuffling the runs' positions draws the very shuffles of their maps, chunk size aside: every
    statistic read from them has exactly its ``both_nulls`` with a generator seeded alike."""
    x = _shared_gates(_rng(50), n_runs=6, layers=2, heads=4) + _rng(51).random((6, 2, 4))
    cells = [np.arange(3), np.arange(3, 6)]
    by_name = {"r": _mean_pairwise_r, "stem_cell": lambda z: stem_cell.stem_cell(z, cells)}
    observed = {name: fn(x) for name, fn in by_name.items()}

    def on_copies(order):  # (c, N, L, K) shuffled positions -> each statistic of each copy
        maps = permutations.gather(x.reshape(len(x), -1), order).reshape(order.shape)
        return {name: np.array([fn(copy) for copy in maps]) for name, fn in by_name.items()}

    for chunk in (x.size, 7 * x.size, 10_000):  # a copy at a time, 7 at a time (40 = 5 x 7 + 5), all at once
        joint = permutations.joint_nulls(on_copies, observed, permutations.positions(x.shape), 40, _rng(52), chunk)
        for name, fn in by_name.items():
            alone = permutations.both_nulls(fn, x, 40, _rng(52))
            assert list(joint[name]) == list(permutations.NULLS)
            for null, result in alone.items():
                np.testing.assert_array_equal(joint[name][null].null, result.null)
                assert joint[name][null].p_value == result.p_value
    np.testing.assert_array_equal(permutations.shuffle_units(permutations.positions((2, 3, 4)), 1, _rng(5), "all_units")[0]
                                  .reshape(2, -1) // 12, np.repeat([[0], [1]], 12, axis=1))  # within each run
    with pytest.raises(ValueError, match="n_perm"):
        permutations.joint_nulls(on_copies, observed, permutations.positions(x.shape), 0, _rng())
