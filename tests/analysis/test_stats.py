"""analysis.stats against scipy / statsmodels / hand-computed values, and known answers on synthetic gates."""

import math

import numpy as np
import pytest
import scipy.stats
import statsmodels.api as sm

from analysis import stats


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _shared_gates(rng, n_runs=3, layers=6, heads=12, flip=0.05):
    """Runs that keep (almost) the same heads: one random base mask, a few flips per run."""
    base = rng.random((layers, heads)) < 0.4  # (L, H)
    flips = rng.random((n_runs, layers, heads)) < flip  # (N, L, H)
    return (base[None] ^ flips).astype(np.float64)


# --- Pearson / Spearman -----------------------------------------------------------------


def test_pearson_matrix_matches_corrcoef():
    x = _rng().random((7, 20))
    np.testing.assert_allclose(stats.pearson_matrix(x), np.corrcoef(x), atol=1e-12)


def test_pearson_matrix_hand_example():
    x = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 4.0]])
    # run 3 vs run 1: centred (-1, 0, 1) and (-4/3, -1/3, 5/3); r = 3 / (sqrt 2 * sqrt(42/9))
    r13 = 3.0 / (math.sqrt(2.0) * math.sqrt(42.0 / 9.0))
    expected = np.array([[1.0, -1.0, r13], [-1.0, 1.0, -r13], [r13, -r13, 1.0]])
    np.testing.assert_allclose(stats.pearson_matrix(x), expected, atol=1e-12)


def test_pearson_matrix_accepts_layer_head_stacks_and_keeps_float32():
    x = _rng(1).random((5, 6, 12)).astype(np.float32)
    r = stats.pearson_matrix(x)
    assert r.shape == (5, 5) and r.dtype == np.float32
    expected = np.corrcoef(x.reshape(5, -1).astype(np.float64))
    np.testing.assert_allclose(r, expected, atol=1e-6)
    assert stats.pearson_matrix(x, dtype=np.float64).dtype == np.float64
    assert stats.pearson_matrix(x.astype(np.float64)).dtype == np.float64


def test_pearson_matrix_identical_runs_and_constant_rows():
    run = _rng(2).random(144)
    x = np.stack([run, run, np.ones(144), 1.0 - run])
    r = stats.pearson_matrix(x)
    assert r[0, 1] == pytest.approx(1.0) and r[0, 3] == pytest.approx(-1.0)
    assert np.isnan(r[2]).all() and np.isnan(r[:, 2]).all()  # every head open: undefined
    assert np.all(np.abs(r[~np.isnan(r)]) <= 1.0)
    np.testing.assert_array_equal(np.diag(r)[[0, 1, 3]], 1.0)


def test_rank_rows_average_ties():
    x = np.array([[0.0, 1.0, 1.0, 0.5], [3.0, 3.0, 3.0, 3.0]])
    np.testing.assert_array_equal(stats.rank_rows(x), [[1.0, 3.5, 3.5, 2.0], [2.5, 2.5, 2.5, 2.5]])


def test_spearman_matrix_matches_scipy_with_ties():
    # Gates rounded to 0 / 0.5 / 1: heavy ties, as real Hard Concrete gates have.
    x = np.round(_rng(3).random((6, 30)) * 2) / 2
    expected = scipy.stats.spearmanr(x, axis=1).statistic
    np.testing.assert_allclose(stats.spearman_matrix(x), expected, atol=1e-12)


def test_spearman_between_matches_scipy_block():
    rng = _rng(4)
    a, b = np.round(rng.random((4, 6, 12)), 1), np.round(rng.random((3, 6, 12)), 1)
    full = scipy.stats.spearmanr(np.vstack([a.reshape(4, -1), b.reshape(3, -1)]), axis=1).statistic
    np.testing.assert_allclose(stats.spearman_between(a, b), full[:4, 4:], atol=1e-12)


def test_spearman_between_rejects_different_head_counts():
    with pytest.raises(ValueError, match="different numbers of heads"):
        stats.spearman_between(np.zeros((2, 10)), np.zeros((2, 12)))


def test_spearman_groups_is_spearman_of_group_means():
    a = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # mean (1, .5, 0, .5)
    b = np.array([[0.9, 0.6, 0.1, 0.2]])  # ranks (4, 3, 1, 2); a's mean ranks (4, 2.5, 1, 2.5)
    expected = np.corrcoef([4.0, 2.5, 1.0, 2.5], [4.0, 3.0, 1.0, 2.0])[0, 1]
    assert stats.spearman_groups(a, b) == pytest.approx(expected)
    assert stats.spearman_groups(a, a) == pytest.approx(1.0)


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
    np.testing.assert_allclose(stats.multiple_correlation(z), expected, atol=1e-10)


def test_multiple_correlation_for_three_runs_is_run3_on_run1_run2():
    z = np.clip(_shared_gates(_rng(5), 3, flip=0.15), 0, 1).reshape(3, -1)
    fit = sm.OLS(z[2], sm.add_constant(np.column_stack([z[0], z[1]]))).fit()
    assert stats.multiple_correlation(z)[2] == pytest.approx(math.sqrt(fit.rsquared_adj), abs=1e-12)


def test_multiple_correlation_identical_runs_is_one():
    run = _rng(6).random((6, 12))
    np.testing.assert_allclose(stats.multiple_correlation(np.stack([run] * 3)), 1.0, atol=1e-12)
    assert stats.mean_multiple_correlation(np.stack([run] * 3)) == pytest.approx(1.0)


def test_multiple_correlation_clips_negative_adjusted_r2_to_zero():
    rng = _rng(7)
    x = rng.random((2, 40))
    design = np.column_stack([np.ones(40), x.T])  # (P, 3)
    y = rng.random(40)
    y -= design @ np.linalg.lstsq(design, y, rcond=None)[0]  # orthogonal to run 1, run 2: R^2 = 0
    z = np.vstack([x, y])
    assert sm.OLS(z[2], sm.add_constant(z[:2].T)).fit().rsquared_adj < 0
    assert stats.multiple_correlation(z)[2] == 0.0


def test_multiple_correlation_constant_response_is_nan_and_bad_shapes_raise():
    z = np.vstack([np.ones(20), _rng(8).random((2, 20))])
    assert np.isnan(stats.multiple_correlation(z)[0])
    with pytest.raises(ValueError, match="at least 2"):
        stats.multiple_correlation(np.ones((1, 20)))
    with pytest.raises(ValueError, match="more heads than runs"):
        stats.multiple_correlation(np.ones((4, 4)))


def test_independent_runs_have_low_multiple_correlation():
    z = (_rng(9).random((3, 6, 12)) < 0.5).astype(float)
    assert stats.mean_multiple_correlation(z) < 0.3


def test_task_correlation_matches_corrcoef():
    means = _rng(11).random((4, 6, 12))
    np.testing.assert_allclose(
        stats.task_correlation(means), np.corrcoef(means.reshape(4, -1)), atol=1e-12
    )


# --- top-k overlap ----------------------------------------------------------------------


def test_topk_overlap_hand_example():
    a = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # top 3: {0, 1, 2}
    b = np.array([0.0, 4.0, 3.0, 5.0, 1.0, 2.0])  # top 3: {3, 1, 2}
    result = stats.topk_overlap(a, b, 0.5)
    assert result == {"jaccard": pytest.approx(2 / 4), "overlap": pytest.approx(2 / 3), "k": 3}
    assert stats.topk_overlap(a, a, 0.2) == {"jaccard": 1.0, "overlap": 1.0, "k": 2}  # ceil(1.2)


def test_topk_overlap_k_is_ceil_without_float_noise_and_ties_by_index():
    a = np.arange(30.0)
    assert stats.topk_overlap(a, a, 0.1)["k"] == 3  # 0.1 * 30 = 3.0000000000000004
    ties = np.array([1.0, 1.0, 1.0, 0.0])
    flipped = np.array([0.0, 1.0, 1.0, 1.0])
    # k = 2: ties go to the lower index, {0, 1} vs {1, 2}
    assert stats.topk_overlap(ties, flipped, 0.5) == {"jaccard": 1 / 3, "overlap": 0.5, "k": 2}
    with pytest.raises(ValueError):
        stats.topk_overlap(a, a, 0.0)


# --- permutation null -------------------------------------------------------------------


def test_shuffle_within_layers_keeps_each_runs_layer_values():
    x = _rng(12).random((3, 6, 12))
    shuffled = stats.shuffle_within_layers(x, 50, _rng(13))  # (50, 3, 6, 12)
    assert shuffled.shape == (50, 3, 6, 12)
    np.testing.assert_array_equal(
        np.sort(shuffled, axis=-1), np.broadcast_to(np.sort(x, -1), shuffled.shape)
    )
    # independent per run and per copy: the head order differs between runs and copies
    order = np.argsort(shuffled, axis=-1)
    assert not np.array_equal(order[0, 0], order[0, 1]) and not np.array_equal(order[0], order[1])
    assert not np.array_equal(shuffled[0], np.broadcast_to(x, shuffled.shape)[0])


def test_permutation_null_shared_gates_are_significant():
    x = _shared_gates(_rng(14))
    result = stats.permutation_null(stats.mean_multiple_correlation, x, 1000, _rng(15))
    assert result.observed > 0.6
    assert result.p_value < 0.01 and result.p_value == pytest.approx(1 / 1001)
    assert result.observed > result.band_hi
    assert result.null.shape == (1000,)


def test_permutation_null_independent_gates_are_not():
    # Calibration over 40 independent data sets: any single one falls outside
    # its 95 % band 5 % of the time, so test the rate, not one seed.
    rng = _rng(16)
    inside, small_p = 0, 0
    for _ in range(40):
        x = (rng.random((3, 6, 12)) < 0.5).astype(float)
        result = stats.permutation_null(stats.mean_pairwise_pearson, x, 200, rng)
        assert abs(result.observed) < 0.25  # near 0
        assert result.band_lo < 0 < result.band_hi
        inside += result.band_lo <= result.observed <= result.band_hi
        small_p += result.p_value < 0.05
    assert inside >= 34 and small_p <= 6


def test_permutation_null_p_value_counts_ties_and_is_reproducible():
    x = np.repeat(np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])[None, :, None], 12, axis=2)
    x = np.stack([x[0], x[0], x[0] * 0.5 + 0.2])  # every layer uniform: shuffling changes nothing
    result = stats.permutation_null(stats.mean_pairwise_pearson, x, 200, _rng(18))
    assert result.p_value == 1.0  # (1 + 200) / (1 + 200), despite float noise in the reordering
    again = stats.permutation_null(stats.mean_pairwise_pearson, x, 200, _rng(18))
    np.testing.assert_array_equal(result.null, again.null)
    with pytest.raises(ValueError, match="Generator"):
        stats.permutation_null(stats.mean_pairwise_pearson, x, 10, None)
    with pytest.raises(ValueError, match=r"\(N, L, H\)"):
        stats.permutation_null(stats.mean_pairwise_pearson, x.reshape(3, -1), 10, _rng())


# --- aggregate --------------------------------------------------------------------------


def test_aggregate_mean_std_exact_and_ci_contains_mean():
    values = np.array([0.71, 0.84, 0.78, 0.90, 0.66])
    agg = stats.aggregate(values, _rng(19))
    assert agg.n == 5
    assert agg.mean == pytest.approx(values.mean(), abs=1e-15)
    assert agg.std == pytest.approx(np.std(values, ddof=1), abs=1e-15)
    assert values.min() <= agg.ci_lo <= agg.mean <= agg.ci_hi <= values.max()


def test_aggregate_ci_shrinks_with_n():
    rng = _rng(20)
    small = stats.aggregate(rng.normal(size=5), _rng(21))
    large = stats.aggregate(rng.normal(size=500), _rng(21))
    assert (large.ci_hi - large.ci_lo) < 0.5 * (small.ci_hi - small.ci_lo)
    # ~ 2 * 1.96 / sqrt(500) = 0.175 for the large sample
    assert large.ci_hi - large.ci_lo == pytest.approx(
        2 * 1.96 * large.std / math.sqrt(500), rel=0.15
    )


def test_aggregate_small_n_and_nan_policy():
    one = stats.aggregate(np.array([0.8]), _rng())
    assert (one.mean, one.n, one.ci_lo, one.ci_hi) == (0.8, 1, 0.8, 0.8) and math.isnan(one.std)
    none = stats.aggregate(np.array([]), _rng())
    assert none.n == 0 and math.isnan(none.mean)
    with_nan = np.array([0.5, np.nan, 0.7])
    assert math.isnan(stats.aggregate(with_nan, _rng()).mean)
    omitted = stats.aggregate(with_nan, _rng(), nan_policy="omit")
    assert omitted.n == 2 and omitted.mean == pytest.approx(0.6)
    assert stats.aggregate(with_nan, _rng(3), nan_policy="omit") == stats.aggregate(
        np.array([0.5, 0.7]), _rng(3)
    )
