"""Agreement across runs: do the selected runs keep the same units? (``headsweep agreement``).

The agreement engine's question over runs (``compare`` asks it over maps): a matrix of Pearson r
over labels (seeds, any axis's values, or runs), every statistic ``statistics.asked("agreement")``
beside it, each tested against both nulls of ``statistics.nulls.NULLS`` (each run's units shuffled,
``shuffles``). No I/O, no global RNG: every random answer comes from ``np.random.default_rng(seed)``
with a fixed default ``seed``, so the same question on the same data always gets the same answer.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from analysis import statistics
from analysis.data.select import (
    Filters,
    QueryError,
    axis_values,
    default_map,
    did_you_mean,
    group_indices,
    list_choices,
    map_runs,
    select,
    value_label,
)
from analysis.data.sweep import SweepData
from analysis.questions.agreement.result import AgreementMatrix, R, Tested
from analysis.questions.agreement.shuffles import (
    MAX_PAIR_WORK,
    statistics_on_copies,
    tested_together,
)
from analysis.questions.agreement.strata import check_across, setting_means
from analysis.statistics import nulls
from analysis.statistics.base import Statistic, pair_matrix, pair_stack, stack_runs, take_runs


def _offdiag_mean(matrix: np.ndarray) -> float:
    """Mean of the off-diagonal entries, NaN entries left out (no copy when there are none)."""
    k = len(matrix)
    if k < 2:
        return math.nan
    total = matrix.sum(dtype=np.float64)  # 10,000 x 10,000: summed in place, not copied
    if math.isfinite(total):
        return float((total - np.trace(matrix, dtype=np.float64)) / (k * (k - 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(matrix[~np.eye(k, dtype=bool)]))


def _label_matrix(stat: Statistic, z: np.ndarray, at: np.ndarray, blocks: list[np.ndarray], k: int) -> np.ndarray:
    """``(k, k)``: for each block of rows of ``z`` (runs or label means that may be compared),
    ``stat`` among the block's rows placed at their label positions ``at``, averaged over
    blocks. Blocks of one size are computed together (``pair_stack``)."""
    total = np.zeros((k, k))
    count = np.zeros_like(total)
    flat = z.reshape(len(z), -1)
    by_size: dict[int, list[np.ndarray]] = {}
    for idx in blocks:
        by_size.setdefault(len(idx), []).append(idx)
    for members in by_size.values():
        idx = np.stack(members)  # (C, n)
        r = pair_stack(stat, flat[idx])  # (C, n, n)
        pos = at[idx]  # (C, n)
        cells = (pos[:, :, None] * k + pos[:, None, :]).ravel()  # flat (row, col) of every pair
        ok = ~np.isnan(r).ravel()
        total += np.bincount(cells, np.where(ok, r.ravel(), 0.0), minlength=k * k).reshape(k, k)
        count += np.bincount(cells, ok, minlength=k * k).reshape(k, k)
    with np.errstate(invalid="ignore"):
        return total / count


_MIN_SEGMENT = 512
"""Pairs of rows a permutation null reads at least at once (``_LabelPairs.segments``)."""


@dataclass(frozen=True)
class _LabelPairs:
    """The pairs of rows behind the off-diagonal cells of a label matrix (``_label_matrix``).

    ``segments``: the pairs as (left rows, right rows) index arrays, for every two places
    ``i < j`` of the blocks of n rows the blocks' rows at i and at j (evenly spaced when the
    blocks are stored in order: ``take_runs`` reads them as views), short ones joined up to
    ``_MIN_SEGMENT`` pairs. Of those pairs, one segment after the other, ``order`` picks the ones
    of two different labels (pairs of one label are its diagonal), the pairs of each label pair
    together, and ``starts`` says where each label pair's begin."""

    segments: tuple[tuple[np.ndarray, np.ndarray], ...]
    order: np.ndarray
    starts: np.ndarray


def _label_pairs(at: np.ndarray, blocks: list[np.ndarray], k: int) -> _LabelPairs:
    """The pairs of each block's rows (``blocks``) by label pair (``at``: each row's of the k
    labels; ``(a, b)`` and ``(b, a)`` are one, the matrix is symmetric)."""
    sizes: dict[int, list[np.ndarray]] = {}
    for idx in blocks:
        sizes.setdefault(len(idx), []).append(idx)
    sides = []  # (the rows at i, the rows at j) of every two places i < j of the blocks of each size
    for n, members in sizes.items():
        idx = stack_runs(members)  # (C, n)
        sides += [(idx[:, i], idx[:, j]) for i, j in zip(*np.triu_indices(n, k=1), strict=True)]
    segments = _joined(sides, _MIN_SEGMENT)
    left, right = (np.concatenate([np.empty(0, dtype=np.int64), *(side[s] for side in segments)]) for s in (0, 1))
    a, b = at[left], at[right]
    keep = np.flatnonzero(a != b)
    cell = (np.minimum(a, b) * k + np.maximum(a, b))[keep]
    by_cell = np.argsort(cell, kind="stable")
    return _LabelPairs(tuple(segments), keep[by_cell], np.flatnonzero(np.diff(cell[by_cell], prepend=-1)))


def _joined(sides: list[tuple[np.ndarray, np.ndarray]], at_least: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``sides`` (left rows, right rows), in order, consecutive short ones joined until they hold
    ``at_least`` pairs (the last one may hold fewer)."""
    joined, pending, held = [], [], 0
    for i, side in enumerate(sides):
        pending.append(side)
        held += len(side[0])
        if held >= at_least or i == len(sides) - 1:
            joined.append((np.concatenate([left for left, _ in pending]), np.concatenate([r for _, r in pending])))
            pending, held = [], 0
    return joined


def _offdiag_means(values: np.ndarray, pairs: _LabelPairs) -> np.ndarray:
    """``(c, Q)`` values of the pairs of ``pairs.order`` in c copies -> ``(c,)``: each copy's
    ``_offdiag_mean`` of its label matrix (``_label_matrix``): the mean over label pairs of the
    mean of their finite values (to rounding). NaN where no label pair has one."""
    if not len(pairs.starts):
        return np.full(len(values), math.nan)
    ok = np.isfinite(values)
    total = np.add.reduceat(np.where(ok, values, 0.0), pairs.starts, axis=1)  # (c, label pairs)
    count = np.add.reduceat(ok.astype(np.int64), pairs.starts, axis=1)
    defined = count > 0
    means = np.where(defined, total / np.maximum(count, 1), 0.0)
    with np.errstate(invalid="ignore"):
        return means.sum(axis=1) / defined.sum(axis=1)


def _pairs_of_copies(stat: Statistic, rows: np.ndarray, pairs: _LabelPairs) -> np.ndarray:
    """``(c, N, P)`` rows (``stat.rows``) of c shuffled copies -> ``(c,)``: each copy's mean
    off-diagonal entry of its label matrix of ``stat`` (``_offdiag_mean`` of ``_label_matrix``)."""
    if not len(pairs.starts):
        return np.full(len(rows), math.nan)
    values = [stat.between(take_runs(rows, i), take_runs(rows, j)) for i, j in pairs.segments]  # (c, Q_s) each
    return _offdiag_means(np.concatenate(values, axis=1)[:, pairs.order], pairs)


def agreement(data: SweepData, across: str, filters: Filters | None = None, n_perm: int = 1000,
              seed: int = 0, asked: Sequence[str] | None = None, max_run_perms: int | None = None,
              map_name: str | None = None, pool: Sequence[str] = (), max_runs: int | None = None) -> AgreementMatrix:
    """How much the selected runs agree on which units (heads, neurons) they keep.

    ``across``:
      - ``seed``: seed x seed, mean over cells of the Pearson r between two seeds'
        runs of the same cell (runs of one cell are equal on every other axis);
      - any other axis (``task``, ``pipeline``, ``model``, a method's short name or a config
        key): Pearson r between the mean maps of each value's runs (He & Choi's
        task-to-task agreement), computed only between runs equal on every other
        axis of the selection (``strata``) and averaged over those strata; the
        axes matched on, tied to ``across`` and pooled on request are reported;
      - ``run``: run x run Pearson r (``pearson_matrix``, float32).

    ``map_name``: the unit map compared (default: the map most runs of the sweep have,
    ``select.default_map``). Beside the matrix, every statistic of ``statistics.asked("agreement")``:
    a pairwise one between the same labels, averaged the same way; a cells one over the cells (seeds
    of one setting) with enough seeds. ``asked``: the names of those to compute (default: all; the
    others are NaN, "not asked for"). Every statistic is tested against both nulls of
    ``nulls.NULLS`` (units shuffled within layers / across all units) with ``n_perm``
    permutations each (0 = none). ``max_run_perms`` refuses questions above that many (runs x
    permutations), ``max_runs`` an across=run matrix of more runs (the service's limits).
    """
    map_name = map_name or default_map(data)
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    check_across(across, data)
    wanted = _asked_statistics(asked)
    sel, x, notes, map_used = _selected(data, filters, map_name, n_perm, max_run_perms,
                                        max_runs if across == "run" else None)
    cells = group_indices(sel, ["group_key"])
    # seed order within a cell: the paper's single fit takes the triple's last seed as response
    in_seed_order = [idx[np.argsort(sel.seed[idx], kind="stable")] for idx in cells]
    if across == "run":
        x = x.astype(np.float32)  # ~1e-7 error: 10,000 runs give a 400 MB matrix instead of 800 MB
    found = _labels(sel, x, across, cells, pool, notes)
    matrix = found.matrix_of(statistics.STATISTICS[R], found.x)
    tested = _tested(found, matrix, x, in_seed_order, wanted, n_perm, seed)
    return AgreementMatrix(R, across, [value_label(v) for v in found.labels], matrix, found.n_runs, tested,
                     found.matched, found.pooled_axes, notes, maps=[map_used],
                     n_cells=sum(len(idx) >= 3 for idx in cells))


def _selected(data: SweepData, filters: Filters | None, map_name: str, n_perm: int, max_run_perms: int | None,
              max_runs: int | None) -> tuple[SweepData, np.ndarray, list[str], str]:
    """``map_runs`` of the selection: the runs with the map, refused when none or above the limits."""
    sel, x, notes, map_used = map_runs(select(data, filters), map_name)
    if len(sel) == 0:
        raise QueryError(f"no finished run with map {map_name} in the selection")
    if max_runs is not None and len(sel) > max_runs:
        raise QueryError(f"across=run answers an N x N matrix: {len(sel)} runs selected, at most "
                         f"{max_runs}; filter them (e.g. task=..., seed=...)")
    if max_run_perms is not None and len(sel) * n_perm > max_run_perms:
        raise QueryError(f"{len(sel)} runs with {n_perm} permutations is more than this service answers "
                         f"({max_run_perms:,} runs x permutations): lower n_perm (to "
                         f"{max(max_run_perms // len(sel), 0)} or less) or filter the runs")
    return sel, x, notes, map_used


@dataclass(frozen=True)
class _Labels:
    """What agreement compares across: the ``labels`` (seeds, runs, an axis's values), the rows
    every statistic reads (``x``: the runs, or one mean map per setting and label), the blocks of
    those rows that may be compared (``compared``) and their label pairs (``pairs``; None: every
    pair of rows), the label matrix of a statistic over rows (``matrix_of``) and what it pools."""

    labels: list
    n_runs: list[int]
    x: np.ndarray
    compared: list[np.ndarray]
    pairs: _LabelPairs | None
    matrix_of: Callable[[Statistic, np.ndarray], np.ndarray]
    pooled: Callable[[Statistic], str]
    matched: list[str] = field(default_factory=list)
    pooled_axes: list[str] = field(default_factory=list)


def _labels(sel: SweepData, x: np.ndarray, across: str, cells: list[np.ndarray], pool: Sequence[str],
            notes: list[str]) -> _Labels:
    if across == "seed":
        return _across_seed(sel, x, [idx for idx in cells if len(idx) >= 2])
    if across == "run":
        return _Labels(sel.run_key.tolist(), [1] * len(sel), x, [np.arange(len(sel))], None,
                       lambda stat, z: pair_matrix(stat, z.reshape(len(z), -1)),
                       lambda stat: f"every pair of {len(sel)} runs")
    return _across_axis(sel, x, across, pool, notes)


def _across_seed(sel: SweepData, x: np.ndarray, seeded: list[np.ndarray]) -> _Labels:
    """seed x seed: the runs of each cell with 2 or more finished seeds, compared within their cell."""
    if not seeded:
        raise QueryError("agreement across seed needs a cell with at least 2 finished seeds")
    labels = sorted(set(sel.seed[np.concatenate(seeded)].tolist()))
    pos = {s: i for i, s in enumerate(labels)}
    at = np.array([pos.get(s, 0) for s in sel.seed.tolist()])
    n_runs = [int(sum((sel.seed[idx] == s).sum() for idx in seeded)) for s in labels]
    return _Labels(labels, n_runs, x, seeded, _label_pairs(at, seeded, len(labels)),
                   partial(_label_matrix, at=at, blocks=seeded, k=len(labels)),
                   lambda stat: f"mean over {len(seeded)} cells of their seeds' pairwise {stat.label}")


def _across_axis(sel: SweepData, x: np.ndarray, across: str, pool: Sequence[str], notes: list[str]) -> _Labels:
    """value x value of ``across``: each setting's seed-mean map per value (``strata.setting_means``)."""
    labels = axis_values(sel, across)
    if len(labels) < 2:
        raise QueryError(f"agreement across {across} needs at least 2 values of {across} in the "
                         f"selection, found {len(labels)}: {list_choices([value_label(v) for v in labels])}")
    found = setting_means(sel, x, across, [value_label(v) for v in labels], pool, notes)
    pooled = (f"mean over {len(found.groups)} settings of {', '.join(found.matched)}" if found.matched
              else "one setting") + f" of the seed-mean maps of each {across}"
    return _Labels(labels, found.n_runs, found.means, found.groups, _label_pairs(found.label, found.groups, len(labels)),
                   partial(_label_matrix, at=found.label, blocks=found.groups, k=len(labels)),
                   lambda stat: pooled, found.matched, found.pooled)


def _tested(found: _Labels, matrix: np.ndarray, x: np.ndarray, in_seed_order: list[np.ndarray], wanted: set[str],
            n_perm: int, seed: int) -> dict[str, Tested]:
    """Every statistic of ``statistics.asked("agreement")`` by name, tested: the pairwise ones between
    the labels (``found``), the cells ones over the cells' runs (``x``, ``in_seed_order``)."""
    # compared pairs x units x copies (the maps and every shuffle): what a pairwise statistic costs
    work = sum(len(idx) * (len(idx) - 1) // 2 for idx in found.compared) * x[0].size * (1 + len(nulls.NULLS) * n_perm)
    tested, pairs, cell_stats = _sorted_statistics(wanted, work)
    # every pairwise statistic reads the same shuffles (a generator seeded `seed`), the cells ones theirs
    # (`seed + 1`), drawn meanwhile on another thread: numpy draws and sums without the GIL
    with ThreadPoolExecutor(max_workers=1) as pool:
        cells_tested = pool.submit(_cells_tested, cell_stats, x, in_seed_order, n_perm, seed + 1)
        observed = {stat.name: _offdiag_mean(matrix if stat.name == R else found.matrix_of(stat, found.x))
                    for stat in pairs}
        # across=run compares every pair of runs: one matrix per copy (a product for r) beats pair by pair
        fast = None if found.pairs is None else partial(_pairs_of_copies, pairs=found.pairs)
        on_copies = statistics_on_copies(pairs, found.x, fast,
                                         lambda stat, copy: _offdiag_mean(found.matrix_of(stat, copy)))
        tested |= tested_together(observed, found.x, n_perm, seed, {stat.name: found.pooled(stat) for stat in pairs},
                                  on_copies)
        tested |= cells_tested.result()
    return {stat.name: tested[stat.name] for stat in statistics.asked("agreement") if stat.name in tested}


def _sorted_statistics(wanted: set[str], work: int) -> tuple[dict[str, Tested], list[Statistic], list[Statistic]]:
    """(the statistics left out, each with why; the pairwise ones to test; the cells ones to test)."""
    tested, pairs, cell_stats = {}, [], []
    for stat in statistics.asked("agreement"):
        if stat.name != R and stat.name not in wanted:
            tested[stat.name] = Tested(math.nan, {}, "not asked for")
        elif stat.shape == "pairs" and stat.name != R and work > MAX_PAIR_WORK:
            tested[stat.name] = Tested(math.nan, {}, f"left out: {work:,} pairs x units x copies is more than "
                                                      f"{MAX_PAIR_WORK:,}; filter the runs or lower n_perm")
        elif stat.shape == "pairs":
            pairs.append(stat)
        elif stat.shape == "cells":
            cell_stats.append(stat)
    return tested, pairs, cell_stats


def _asked_statistics(asked: Sequence[str] | None) -> set[str]:
    """The names of agreement's statistics in ``asked`` (all of them for None); QueryError for another name."""
    names = [stat.name for stat in statistics.asked("agreement")]
    if asked is None:
        return set(names)
    for name in asked:
        if name not in names:
            raise QueryError(f"unknown statistic '{name}'{did_you_mean(name, names)} (one of {list_choices(names)})")
    return set(asked)


def _cells_tested(asked: list[Statistic], x: np.ndarray, in_seed_order: list[np.ndarray], n_perm: int,
                  seed: int) -> dict[str, Tested]:
    """Each cells statistic over the cells (``in_seed_order``) with enough runs, tested (the shuffles
    drawn once for all); NaN where no cell has enough."""
    cells = {stat.name: [idx for idx in in_seed_order if len(idx) >= stat.min_runs] for stat in asked}
    tested = {stat.name: Tested(math.nan, {}, f"no cell has {stat.min_runs} finished seeds")
              for stat in asked if not cells[stat.name]}
    testable = [stat for stat in asked if cells[stat.name]]
    pooled = {}
    for stat in testable:
        sizes = "/".join(map(str, sorted({len(idx) for idx in cells[stat.name]})))
        pooled[stat.name] = f"mean over {len(cells[stat.name])} cells of {sizes} seeds of {stat.per_cell}"
    observed = {stat.name: float(stat.cells(x, cells[stat.name])) for stat in testable}
    on_copies = statistics_on_copies(testable, x, lambda stat, rows: stat.copies(rows, cells[stat.name]),
                           lambda stat, copy: stat.cells(copy, cells[stat.name]))
    return tested | tested_together(observed, x, n_perm, seed, pooled, on_copies)
