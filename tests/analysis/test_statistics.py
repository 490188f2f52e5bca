"""The registry of statistics (analysis/statistics/__init__.py): every module found, every statistic
well formed and in the answers' schemas (a statistic's maths is tested in its own test file)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

import analysis.statistics as package
from analysis.questions.agreement import result
from analysis.statistics import STATISTICS, asked
from analysis.statistics.base import QUESTIONS, Statistic, pair_matrix, pair_stack
from analysis.statistics.pearson import pearson_rows
from analysis.views.service import models


def test_every_module_of_the_package_is_discovered():
    # beside the statistics: what a statistic is (base), what chance gives (nulls), how sure a mean is (intervals)
    files = {p.stem for p in Path(package.__file__).parent.glob("*.py")} - {"__init__", "base", "nulls", "intervals"}
    assert {"pearson", "spearman", "stem_cell", "topk", "rbo"} <= files
    found = []
    for name in sorted(files):  # each file is a statistic (or two), every one of them registered
        module = importlib.import_module(f"analysis.statistics.{name}")
        assert module.STATISTICS and all(STATISTICS[stat.name] is stat for stat in module.STATISTICS)
        found += module.STATISTICS
    assert len(found) == len(STATISTICS) >= 7
    assert list(STATISTICS) == [s.name for s in sorted(STATISTICS.values(), key=lambda s: s.order)]


def test_each_question_asks_its_statistics_and_its_matrix_first():
    assert asked("agreement")[0].name == result.R and asked("compare_maps")[0].name == result.RHO
    assert all(any(q in s.asked_in for q in QUESTIONS) for s in STATISTICS.values())
    with pytest.raises(ValueError, match="unknown question"):
        asked("transfer")


def test_every_statistic_is_a_field_of_the_service_answers():
    """Names are answer keys: none may shadow a fixed field, and each one is in the response models."""
    fixed = {"across", "map", "labels", "matrix", "n_runs", "mean_offdiag", "n_cells", "matched_on", "pooled_axes",
             "notes", "sweep", "maps", "kind", "shape", "pairs", "top", "k", "models", "tasks", "a", "b",
             "n_pairs", "n_same_run", "pooled", "nulls"}
    assert not fixed & set(STATISTICS) - {result.RHO}
    for stat in asked("agreement"):
        assert stat.name == result.R or stat.name in models.AgreementOut.model_fields
    for stat in asked("compare_maps"):
        assert stat.name in models.ComparedPairOut.model_fields
        chance = f"chance_{stat.name}" if stat.shape == "top_k" else stat.name
        assert stat.name == result.RHO or chance in models.CompareMapsOut.model_fields


def test_a_statistic_carries_one_kind_of_maths():
    with pytest.raises(ValueError, match="exactly one of pairs, cells, top_k"):
        Statistic("x", "x", "x", "x", ("agreement",), 0)
    with pytest.raises(ValueError, match="comes with its chance"):
        Statistic("x", "x", "x", "x", ("compare_maps",), 0, top_k=lambda shared, k: shared / k)
    assert STATISTICS["rbo"].text(0.12345) == "0.123" and STATISTICS["rbo"].text(float("nan")) == "-"


def test_pair_matrices_from_pairs_equal_the_fast_ones():
    """A statistic with only ``pairs`` gets its matrices pair by pair, a chunk at a time."""
    x = np.random.default_rng(0).random((2, 5, 30))
    slow = Statistic("slow", "r", "Pearson r", "-", ("agreement",), 0, pairs=pearson_rows)
    np.testing.assert_allclose(pair_stack(slow, x), pair_stack(STATISTICS["r"], x), atol=1e-12)
    np.testing.assert_allclose(pair_matrix(slow, x[0]), pair_matrix(STATISTICS["r"], x[0]), atol=1e-6)


def test_rows_come_with_between_or_copies():
    with pytest.raises(ValueError, match="rows comes with between or copies"):
        Statistic("x", "r", "Pearson r", "-", ("agreement",), 0, pairs=pearson_rows, rows=np.asarray)
    with pytest.raises(ValueError, match="rows comes with between or copies"):
        Statistic("x", "r", "Pearson r", "-", ("agreement",), 0, pairs=pearson_rows, between=np.multiply)
    with pytest.raises(ValueError, match="between goes with pairs"):
        Statistic("x", "x", "x", "-", ("agreement",), 0, cells=lambda x, c: 0.0, rows=np.asarray,
                  between=np.multiply)


def _maps_with_ties_and_a_constant(rng: np.random.Generator, n: int, p: int) -> np.ndarray:
    x = rng.normal(size=(n, p))
    x[::3] = np.round(x[::3])  # ties
    x[1] = 0.5  # a constant map: undefined for every statistic
    return x


@pytest.mark.parametrize("name", [s.name for s in STATISTICS.values() if s.rows is not None])
def test_rows_shuffle_with_the_units_and_give_the_statistic(name):
    """What a permutation null relies on: a map's rows, shuffled, are the rows of the shuffled map,
    and ``between`` of two maps' rows (``copies`` of every copy's rows) is the statistic of the maps."""
    stat, rng = STATISTICS[name], np.random.default_rng(1)
    x = _maps_with_ties_and_a_constant(rng, 12, 24)
    perm = np.argsort(rng.random(x.shape), axis=1)
    np.testing.assert_allclose(stat.rows(np.take_along_axis(x, perm, axis=1)),
                               np.take_along_axis(stat.rows(x), perm, axis=1), atol=1e-12)
    copies = np.stack([np.take_along_axis(x, np.argsort(rng.random(x.shape), axis=1), axis=1)
                       for _ in range(5)])  # (5, N, P)
    rows = np.stack([stat.rows(copy) for copy in copies])
    if stat.between is not None:
        i, j = np.triu_indices(len(x), k=1)
        expected = np.stack([stat.pairs(copy[i], copy[j]) for copy in copies])  # (5, Q)
        np.testing.assert_allclose(stat.between(rows[:, i], rows[:, j]), expected, atol=1e-12)
        assert np.isnan(expected).any() and not np.isnan(expected).all()
    else:
        cells = [np.array([0, 1, 2]), np.array([3, 4, 5, 6]), np.array([7, 8]), np.array([9, 10, 11])]
        expected = [stat.cells(copy, cells) for copy in copies]
        np.testing.assert_allclose(stat.copies(rows, cells), expected, atol=1e-12)
        assert np.isnan(stat.copies(rows, [np.array([7, 8])])).all()  # no cell of 3 runs: NaN, as cells
