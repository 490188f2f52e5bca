"""The registry of statistics (analysis/statistics/__init__.py): every module found, every statistic
well formed and in the answers' schemas (a statistic's maths is tested in its own test file)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

import analysis.statistics as package
from analysis import compare, queries, service
from analysis.statistics import STATISTICS, asked
from analysis.statistics.base import QUESTIONS, Statistic, pair_matrix, pair_stack
from analysis.statistics.pearson import pearson_rows


def test_every_module_of_the_package_is_discovered():
    files = {p.stem for p in Path(package.__file__).parent.glob("*.py")} - {"__init__", "base"}
    assert {"pearson", "spearman", "stem_cell", "topk", "rbo"} <= files
    found = []
    for name in sorted(files):  # each file is a statistic (or two), every one of them registered
        module = importlib.import_module(f"analysis.statistics.{name}")
        assert module.STATISTICS and all(STATISTICS[stat.name] is stat for stat in module.STATISTICS)
        found += module.STATISTICS
    assert len(found) == len(STATISTICS) >= 7
    assert list(STATISTICS) == [s.name for s in sorted(STATISTICS.values(), key=lambda s: s.order)]


def test_each_question_asks_its_statistics_and_its_matrix_first():
    assert asked("agreement")[0].name == queries.MATRIX and asked("compare_maps")[0].name == compare.MATRIX
    assert all(any(q in s.asked_in for q in QUESTIONS) for s in STATISTICS.values())
    with pytest.raises(ValueError, match="unknown question"):
        asked("transfer")


def test_every_statistic_is_a_field_of_the_service_answers():
    """Names are answer keys: none may shadow a fixed field, and each one is in the response models."""
    fixed = {"across", "map", "labels", "matrix", "n_runs", "mean_offdiag", "n_cells", "matched_on", "pooled_axes",
             "notes", "sweep", "maps", "kind", "shape", "pairs", "top", "k", "models", "tasks", "a", "b",
             "n_pairs", "n_same_run", "pooled", "nulls"}
    assert not fixed & set(STATISTICS) - {compare.MATRIX}
    for stat in asked("agreement"):
        assert stat.name == queries.MATRIX or stat.name in service.AgreementOut.model_fields
    for stat in asked("compare_maps"):
        assert stat.name in service.ComparedPairOut.model_fields
        chance = f"chance_{stat.name}" if stat.shape == "top_k" else stat.name
        assert stat.name == compare.MATRIX or chance in service.CompareMapsOut.model_fields


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
