"""Sparsity schedules against numbers written out by hand."""

import doctest

import pytest

from experiments.maths import schedules
from experiments.maths.schedules import cubic_sparsity


def test_cubic_sparsity_at_t0_midpoint_and_tf():
    s_i, s_f = 0.7, 0.9
    assert cubic_sparsity(100, s_i, s_f, 100, 300) == s_i
    assert cubic_sparsity(200, s_i, s_f, 100, 300) == pytest.approx(s_f + (s_i - s_f) / 8)  # 0.875
    assert cubic_sparsity(200, s_i, s_f, 100, 300) == pytest.approx(0.875)
    assert cubic_sparsity(300, s_i, s_f, 100, 300) == s_f


def test_cubic_sparsity_quarter_way_and_outside_the_ramp():
    # (1 - 1/4)^3 = 27/64 of the change is left a quarter of the way in
    assert cubic_sparsity(25, 0.0, 0.64, 0, 100) == pytest.approx(0.64 - 0.64 * 27 / 64)  # 0.37
    assert cubic_sparsity(0, 0.7, 0.9, 10, 20) == 0.7  # before t0
    assert cubic_sparsity(10_000, 0.7, 0.9, 10, 20) == 0.9  # after tf


def test_cubic_sparsity_is_monotone_and_constant_when_ends_agree():
    values = [cubic_sparsity(t, 0.5, 0.9, 0, 50) for t in range(60)]
    assert values == sorted(values)
    assert {cubic_sparsity(t, 0.6, 0.6, 0, 10) for t in range(12)} == {0.6}


def test_cubic_sparsity_without_a_ramp_jumps_at_t0():
    assert cubic_sparsity(4, 0.1, 0.8, 5, 5) == 0.1
    assert cubic_sparsity(5, 0.1, 0.8, 5, 5) == 0.8


def test_docstring_examples():
    assert doctest.testmod(schedules).failed == 0
