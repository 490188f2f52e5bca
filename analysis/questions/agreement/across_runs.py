"""What the runs say: tables, agreement and overlaps over a loaded :class:`SweepData`.

The CLI and the HTTP service both call these; they translate their input
into these arguments and the answers into tables, JSON or PNG. No I/O, no
global RNG: every random answer (CIs, permutation nulls, tie-breaks) comes
from ``np.random.default_rng(seed)`` with a fixed default ``seed``, so the
same question on the same data always gets the same answer. Selecting runs
and naming things is ``analysis.select``; figures are ``analysis.figure_plan``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from analysis import statistics, stats
from analysis.loading import AXES, CELL_LABELS, SweepData
from analysis.select import (
    DEFAULT_MAP,
    Filters,
    QueryError,
    as_codes,
    axis_values,
    check_axis,
    check_metric,
    column,
    config_columns,
    config_keys_of,
    default_metric,
    describe,
    did_you_mean,
    group_indices,
    groups_in_cell_order,
    list_choices,
    map_runs,
    py,
    select,
    value_label,
    varying_config,
)
from analysis.statistics import pearson, spearman, topk
from analysis.statistics.base import Statistic, pair_matrix, pair_stack, stack_runs, take_runs

ACROSS = ("seed", "task", "pipeline", "model", "run")
MATRIX = "r"
"""The statistic of agreement's matrix (``statistics.STATISTICS``): Pearson r."""
_COPY_CHUNK_ELEMENTS = 1_000_000
"""Shuffled copies x runs x units handed to the statistics at once in a permutation null (each
array of a chunk is ~8 MB; RBO's temporaries are a few of them)."""
MAX_PAIR_WORK = 50_000_000
"""Largest work of a pairwise statistic beside the matrix's, in compared pairs x units x copies (the
maps and ``len(stats.NULLS) * n_perm`` shuffles): larger questions leave it out. Pearson's matrix
is one product per copy; RBO sorts every map of every pair, ~0.2 us per pair and unit (seconds at
this bound)."""


def runs(data: SweepData, filters: Filters | None = None, offset: int = 0,
         limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
    """(number of matching runs, one page of them as dicts with their metrics)."""
    sel = select(data, filters)
    page = range(len(sel))[offset:offset + limit]
    rows = []
    for i in page:
        row = {axis: py(sel.axis(axis)[i]) for axis in AXES}
        row["metrics"] = {name: py(col[i]) for name, col in sel.metrics.items() if not np.isnan(col[i])}
        row["maps"] = list(sel.run_maps[i])
        rows.append(row)
    return len(sel), rows


def aggregate(data: SweepData, group_by: Sequence[str], metric: str, filters: Filters | None = None,
              n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Mean, std, n and 95 % CI of ``metric`` per group (``stats.aggregate``: a t interval
    below 10 runs, a bootstrap from 10 on; ``ci_method`` says which).

    ``group_by`` = [] groups by cell (``group_key``: the spread is over seeds)
    and each row also names the cell's axes. Runs without the metric (not
    finished) are left out of n; a group with none has n = 0 and NaN stats.
    Runs of different methods are never pooled: when the selection has several,
    ``method`` is added to ``group_by`` (a fine-tune stage and the head-gate runs
    that start from it are different experiments).
    """
    by = [check_axis(a, data) for a in group_by] or ["group_key"]
    sel = select(data, filters)
    if group_by and "method" not in by and len(set(sel.method.tolist())) > 1:
        by.append("method")
    values = check_metric(sel, metric)
    shown = by if group_by else ["group_key", *CELL_LABELS]
    groups = group_indices(sel, by) if group_by else groups_in_cell_order(sel)
    rows = []
    for idx in groups:
        # one generator per group, seeded by the group's runs: a group's CI does not depend on
        # which other groups were asked for, or in which order
        rng = np.random.default_rng([seed, *(int(k[:8], 16) for k in sorted(sel.run_key[idx].tolist()))])
        agg = stats.aggregate(values[idx], rng, n_boot=n_boot, nan_policy="omit")
        row = {axis: py(column(sel, axis)[idx[0]]) for axis in shown}
        row.update(metric=metric, mean=py(agg.mean), std=py(agg.std), n=agg.n,
                   ci_lo=py(agg.ci_lo), ci_hi=py(agg.ci_hi), ci_method=agg.ci_method, runs=len(idx))
        rows.append(row)
    return rows


def results(data: SweepData, group_by: Sequence[str], metric: str | None = None,
            filters: Filters | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(the metric, its ``aggregate`` rows) as ``headsweep results`` and the Python API show them:
    ``metric`` None is ``default_metric``; beside ``open_heads``, each group's mean expected open
    heads (``expected_open``: what the L0 penalty counts), when the runs report them."""
    metric = metric or default_metric(data)
    rows = aggregate(data, group_by, metric, filters)
    if metric == "open_heads" and "expected_open_heads" in data.metrics:
        expected = aggregate(data, group_by, "expected_open_heads", filters)  # the same groups, in order
        rows = [row | {"expected_open": e["mean"]} for row, e in zip(rows, expected, strict=True)]
    return metric, rows


@dataclass(frozen=True)
class Tested:
    """A statistic with its permutation nulls (``stats.NULLS``; empty when n_perm = 0)."""

    observed: float
    nulls: Mapping[str, stats.NullResult]
    pooled: str
    """What was pooled into the number, in words (e.g. "mean over 8 cells of 3 seeds")."""


@dataclass(frozen=True)
class Agreement:
    """Agreement of a selection's unit maps: a Pearson matrix over labels, and the tested statistics."""

    across: str
    map_name: str
    """The unit map compared (e.g. ``heads.gate``); may be the continuous companion of the map
    asked for, when that one is constant in some run (see ``notes``)."""
    labels: list[str]
    matrix: np.ndarray
    """``(K, K)`` Pearson r between the labels' maps (see ``agreement``)."""
    n_runs: list[int]
    """Runs behind each label."""
    statistics: dict[str, Tested]
    """Every statistic agreement asks (``statistics.asked("agreement")``) by name, tested; also
    ``result.<name>``. The matrix's (``MATRIX``, r) is the mean off-diagonal entry of ``matrix``; a
    pairwise one the same mean of its own matrix; a cells one (``stem_cell``: He & Choi's multiple
    correlation, ``stem_cell_paper``: their single fit, the triple's last seed as response) the
    mean over the cells with enough seeds. Not computed (not asked for, no cell with enough seeds,
    too many pairs): NaN, and ``pooled`` says why."""
    n_cells: int
    """Cells (group keys) with at least 3 seeds behind ``stem_cell``."""
    matched_on: list[str] = field(default_factory=list)
    """Axes (config keys) on which every compared pair of runs agrees: labels are compared
    only within runs equal on all of them."""
    pooled_axes: list[str] = field(default_factory=list)
    """Axes that vary in the selection but were pooled (averaged over) on request."""
    notes: list[str] = field(default_factory=list)
    """One-line remarks a reader must see (a map switched, runs left out)."""

    @property
    def mean_offdiag(self) -> Tested:
        """The matrix's statistic: the mean off-diagonal entry of ``matrix``, tested."""
        return self.statistics[MATRIX]

    def __getattr__(self, name: str) -> Tested:
        """``result.stem_cell``, ``result.rbo``: the statistic of that name."""
        tested = self.__dict__.get("statistics", {})
        if name in tested:
            return tested[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or statistic {name!r}")


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


_OnCopies = Callable[[np.ndarray], dict[str, np.ndarray]]


def _on_copies(stats_: list[Statistic], x: np.ndarray, fast: Callable[[Statistic, np.ndarray], np.ndarray] | None,
               slow: Callable[[Statistic, np.ndarray], float]) -> tuple[np.ndarray, _OnCopies]:
    """Every statistic on every shuffled copy of the runs ``x`` ``(N, L, K)``: ``(what to shuffle,
    (N, L, K); its shuffled copies (c, N, L, K) -> {name: (c,)})``.

    A statistic with ``rows`` (when ``fast`` is given) reads its rows, computed once and
    shuffled: ``fast(stat, (c, N, P) rows)``; any other one the shuffled maps, one copy at a time:
    ``slow(stat, (N, L, K) copy)``. When every statistic reads the same rows, those are shuffled;
    else the runs' ``stats.positions``, and each statistic gathers what it reads."""
    flat = x.reshape(len(x), -1)
    rows = {stat.rows: stat.rows(flat) for stat in stats_ if fast is not None and stat.rows is not None}
    if len(rows) == 1 and all(stat.rows in rows for stat in stats_):
        shared = next(iter(rows.values()))
        return shared.reshape(x.shape), lambda copies: {
            stat.name: fast(stat, copies.reshape(len(copies), len(x), -1)) for stat in stats_}

    def on_copies(order: np.ndarray) -> dict[str, np.ndarray]:
        shuffled = {fn: stats.gather(r, order) for fn, r in rows.items()}
        out = {}
        for stat in stats_:
            if stat.rows in shuffled:
                out[stat.name] = fast(stat, shuffled[stat.rows])
            else:
                out[stat.name] = np.array([slow(stat, copy) for copy in stats.gather(flat, order).reshape(
                    len(order), *x.shape)])
        return out

    return stats.positions(x.shape), on_copies


def _test_together(observed: dict[str, float], x: np.ndarray, n_perm: int, seed: int, pooled: dict[str, str],
                   on_copies: tuple[np.ndarray, _OnCopies]) -> dict[str, Tested]:
    """Statistics of the same runs ``x`` ``(N, L, K)``, each tested as ``_test`` tests it alone (a
    generator seeded ``seed``: the same shuffles), the shuffles drawn once for all of them
    (``on_copies``: what to shuffle and the statistics of its copies, ``_on_copies``)."""
    if n_perm == 0 or len(x) == 0 or not observed:
        return {name: Tested(value, {}, pooled[name]) for name, value in observed.items()}
    shuffled, batch_fn = on_copies
    nulls = stats.joint_nulls(batch_fn, observed, shuffled, n_perm, np.random.default_rng(seed),
                              _COPY_CHUNK_ELEMENTS)
    return {name: Tested(value, nulls[name], pooled[name]) for name, value in observed.items()}


def _test(stat_fn: Callable[[np.ndarray], float], x: np.ndarray, n_perm: int, seed: int,
          pooled: str, batch_fn: Callable[[np.ndarray], np.ndarray] | None = None) -> Tested:
    if n_perm == 0 or len(x) == 0:
        return Tested(float(stat_fn(x)) if len(x) else math.nan, {}, pooled)
    nulls = stats.both_nulls(stat_fn, x, n_perm, np.random.default_rng(seed), batch_fn=batch_fn)
    return Tested(next(iter(nulls.values())).observed, nulls, pooled)


def check_across(across: str, data: SweepData) -> str:
    choices = [*ACROSS, *(a for a in AXES if a not in ACROSS and a not in ("status", "run_key", "group_key")),
               *sorted(config_columns(data))]
    if across not in choices:
        raise QueryError(f"unknown across '{across}'{did_you_mean(across, choices)} (one of {list_choices(choices)})")
    return across


def strata(data: SweepData, across: str, pool: Sequence[str] = ()) -> tuple[list[np.ndarray], dict[str, list[str]]]:
    """Groups of runs that may be compared across ``across``: equal on every other axis.

    The axes are the dotted config keys that vary in ``data`` (from the stored
    configs, so any hyper-parameter counts, not a fixed list), less ``seed``,
    less the keys tied to ``across`` (constant within each of its values, so they
    cannot be matched: e.g. ``task.name`` for tasks, or a method's own keys for
    methods), less the axes in ``pool`` (averaged over on request) and the keys they
    decide (pooling ``pipeline`` pools ``init_from.method`` too, which only SP runs set).

    Returns:
        (the strata as index arrays, ``{"matched": [...], "tied": [...], "pooled": [...]}``).
    """
    across_col = column(data, across)
    varying = {key: col for key, col in varying_config(data).items() if key != "seed"}
    varying = {key: col for key, col in varying.items() if key not in config_keys_of(data, across)}
    unknown = [a for a in pool if not config_keys_of(data, a) & set(varying)]
    if unknown:
        raise QueryError(f"pool: '{unknown[0]}' is not an axis that varies here"
                         f"{did_you_mean(unknown[0], list(varying))} (varying: {list_choices(sorted(varying))})")
    pool_keys = set().union(*(config_keys_of(data, a) for a in pool)) if pool else set()
    pool_keys = {k for k in pool_keys if k in varying}
    if pool_keys:  # a key that the pooled axes decide (init_from.method for pipeline) is pooled with them
        pooled_codes = _joint_codes([varying[k] for k in sorted(pool_keys)])
        pool_keys |= {k for k, col in varying.items() if _decided_by(as_codes(col), pooled_codes)}
    _, across_codes = np.unique(as_codes(across_col), return_inverse=True)
    tied, matched = [], []
    for key, col in sorted(varying.items()):
        if key in pool_keys:
            continue
        if _decided_by(as_codes(col), across_codes):
            tied.append(key)
        else:
            matched.append(key)
    if matched:
        inverse = _joint_codes([varying[k] for k in matched])
        order = np.argsort(inverse, kind="stable")
        blocks = np.split(order, np.flatnonzero(np.diff(inverse[order])) + 1)
    else:
        blocks = [np.arange(len(data))]
    return blocks, {"matched": matched, "tied": tied, "pooled": sorted(pool_keys & set(varying))}


def _joint_codes(columns: list[np.ndarray]) -> np.ndarray:
    """``(N,)`` int: one code per distinct combination of the columns' values."""
    keys = np.stack([np.unique(as_codes(col), return_inverse=True)[1].ravel() for col in columns], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel()


def _decided_by(codes: np.ndarray, by: np.ndarray) -> bool:
    """Each value of ``by`` goes with one value of ``codes``."""
    return all(len(np.unique(codes[by == b])) == 1 for b in np.unique(by))


def agreement(data: SweepData, across: str, filters: Filters | None = None, n_perm: int = 1000,
              seed: int = 0, asked: Sequence[str] | None = None, max_run_perms: int | None = None,
              map_name: str = DEFAULT_MAP, pool: Sequence[str] = ()) -> Agreement:
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

    Beside the matrix, every statistic of ``statistics.asked("agreement")``: a pairwise one
    between the same labels, averaged the same way; a cells one over the cells (seeds of one
    setting) with enough seeds. ``asked``: the names of those to compute (default: all; the
    others are NaN, "not asked for"). Every statistic is tested against both nulls of
    ``stats.NULLS`` (units shuffled within layers / across all units) with ``n_perm``
    permutations each (0 = none). ``max_run_perms`` refuses questions above that many (runs x
    permutations).
    """
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    check_across(across, data)
    wanted = _asked_statistics(asked)
    sel, x, notes, map_used = map_runs(select(data, filters), map_name)
    if len(sel) == 0:
        raise QueryError(f"no finished run with map {map_name} in the selection")
    if max_run_perms is not None and len(sel) * n_perm > max_run_perms:
        raise QueryError(f"{len(sel)} runs with {n_perm} permutations is more than this service answers "
                         f"({max_run_perms:,} runs x permutations): lower n_perm (to "
                         f"{max(max_run_perms // len(sel), 0)} or less) or filter the runs")
    cells = group_indices(sel, ["group_key"])
    seeded = [idx for idx in cells if len(idx) >= 2]
    # seed order within a cell: the paper's single fit takes the triple's last seed as response
    in_seed_order = [idx[np.argsort(sel.seed[idx], kind="stable")] for idx in cells]
    matched, pooled_axes = [], []

    if across == "seed":
        if not seeded:
            raise QueryError("agreement across seed needs a cell with at least 2 finished seeds")
        labels = sorted(set(sel.seed[np.concatenate(seeded)].tolist()))
        pos = {s: i for i, s in enumerate(labels)}
        at = np.array([pos.get(s, 0) for s in sel.seed.tolist()])

        def matrix_of(stat: Statistic, z: np.ndarray) -> np.ndarray:
            return _label_matrix(stat, z, at, seeded, len(labels))

        n_runs = [int(sum((sel.seed[idx] == s).sum() for idx in seeded)) for s in labels]
        stat_x, compared, label_pairs = x, seeded, _label_pairs(at, seeded, len(labels))

        def pooled_for(stat: Statistic) -> str:
            return f"mean over {len(seeded)} cells of their seeds' pairwise {stat.label}"
    elif across == "run":
        x = x.astype(np.float32)  # ~1e-7 error: 10,000 runs give a 400 MB matrix instead of 800 MB
        labels, n_runs = sel.run_key.tolist(), [1] * len(sel)

        def matrix_of(stat: Statistic, z: np.ndarray) -> np.ndarray:
            return pair_matrix(stat, z.reshape(len(z), -1))

        stat_x, compared, label_pairs = x, [np.arange(len(sel))], None

        def pooled_for(stat: Statistic) -> str:
            return f"every pair of {len(sel)} runs"
    else:
        across_col = column(sel, across)
        labels = axis_values(sel, across)
        if len(labels) < 2:
            raise QueryError(f"agreement across {across} needs at least 2 values of {across} in the "
                             f"selection, found {len(labels)}: {list_choices([value_label(v) for v in labels])}")
        blocks, axes = strata(sel, across, pool)
        matched, pooled_axes = axes["matched"], axes["pooled"]
        codes, label_codes = as_codes(across_col), [value_label(v) for v in labels]
        means, at, groups = [], [], []
        for block in blocks:
            present = [i for i, c in enumerate(label_codes) if (codes[block] == c).any()]
            if len(present) < 2:
                continue
            groups.append(np.arange(len(means), len(means) + len(present)))
            for i in present:
                means.append(x[block[codes[block] == label_codes[i]]].mean(axis=0))
                at.append(i)
        if not groups:
            raise QueryError(f"no two values of {across} share a setting of the other axes "
                             f"({', '.join(matched)}); pool some with pool=...")
        left_out = len(blocks) - len(groups)
        if left_out:
            notes.append(f"{left_out} of {len(blocks)} settings of {', '.join(matched)} have only one "
                         f"value of {across} and were left out")
        at = np.array(at)
        stat_x = np.stack(means)  # (M, L, K): one mean map per (stratum, label)
        n_runs = [int((codes == c).sum()) for c in label_codes]

        def matrix_of(stat: Statistic, z: np.ndarray) -> np.ndarray:
            return _label_matrix(stat, z, at, groups, len(labels))

        compared, label_pairs = groups, _label_pairs(at, groups, len(labels))
        pooled = (f"mean over {len(groups)} settings of {', '.join(matched)}" if matched
                  else "one setting") + f" of the seed-mean maps of each {across}"

        def pooled_for(stat: Statistic) -> str:
            return pooled

    matrix = matrix_of(statistics.STATISTICS[MATRIX], stat_x)
    # compared pairs x units x copies (the maps and every shuffle): what a pairwise statistic costs
    work = sum(len(idx) * (len(idx) - 1) // 2 for idx in compared) * x[0].size * (1 + len(stats.NULLS) * n_perm)
    tested, pairs, cell_stats = {}, [], []
    for stat in statistics.asked("agreement"):
        if stat.name != MATRIX and stat.name not in wanted:
            tested[stat.name] = Tested(math.nan, {}, "not asked for")
        elif stat.shape == "pairs" and stat.name != MATRIX and work > MAX_PAIR_WORK:
            tested[stat.name] = Tested(math.nan, {}, f"left out: {work:,} pairs x units x copies is more than "
                                                      f"{MAX_PAIR_WORK:,}; filter the runs or lower n_perm")
        elif stat.shape == "pairs":
            pairs.append(stat)
        elif stat.shape == "cells":
            cell_stats.append(stat)
    # every pairwise statistic reads the same shuffles (a generator seeded `seed`), the cells ones theirs
    # (`seed + 1`), drawn meanwhile on another thread: numpy draws and sums without the GIL
    with ThreadPoolExecutor(max_workers=1) as pool:
        cells_tested = pool.submit(_cells_tested, cell_stats, x, in_seed_order, n_perm, seed + 1)
        observed = {stat.name: _offdiag_mean(matrix if stat.name == MATRIX else matrix_of(stat, stat_x))
                    for stat in pairs}
        # across=run compares every pair of runs: one matrix per copy (a product for r) beats pair by pair
        fast = None if label_pairs is None else partial(_pairs_of_copies, pairs=label_pairs)
        on_copies = _on_copies(pairs, stat_x, fast, lambda stat, copy: _offdiag_mean(matrix_of(stat, copy)))
        tested |= _test_together(observed, stat_x, n_perm, seed, {stat.name: pooled_for(stat) for stat in pairs},
                                 on_copies)
        tested |= cells_tested.result()
    tested = {stat.name: tested[stat.name] for stat in statistics.asked("agreement") if stat.name in tested}
    n_cells = sum(len(idx) >= 3 for idx in cells)
    return Agreement(across, map_used, [value_label(v) for v in labels], matrix, n_runs, tested, n_cells,
                     matched, pooled_axes, notes)


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
    on_copies = _on_copies(testable, x, lambda stat, rows: stat.copies(rows, cells[stat.name]),
                           lambda stat, copy: stat.cells(copy, cells[stat.name]))
    return tested | _test_together(observed, x, n_perm, seed, pooled, on_copies)


def spearman_overlap(data: SweepData, a: Filters, b: Filters, map_name: str = DEFAULT_MAP,
                     k_frac: float = 0.2, filters: Filters | None = None, n_perm: int = 1000,
                     seed: int = 0) -> dict[str, Any]:
    """Do two groups of runs rank the units of ``map_name`` alike?

    ``spearman``: Spearman rho between the groups' mean maps
    (``spearman.spearman_rows`` of the two means), tested against both nulls (each mean map's
    units shuffled within layers / across all units): ``nulls`` holds each
    null's mean, excess, band and p; ``mean_pairwise``: mean rho over every
    (run of a, run of b) pair (``spearman.spearman_between``, lower: it also
    counts single-run noise); ``jaccard`` / ``overlap`` / ``k``: agreement of
    the two mean maps' top ``k_frac`` units (``topk.topk_overlap``, ties broken
    at random), beside ``chance_jaccard`` / ``chance_overlap``.
    """
    if not (isinstance(k_frac, int | float) and 0.0 < k_frac <= 1.0):
        raise QueryError(f"k must be a fraction in (0, 1], got {k_frac}")
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    base = select(data, filters)
    stacks, notes = [], []
    for name, group in (("a", a), ("b", b)):
        sel, x, _, _ = map_runs(select(base, group), map_name, switch=False)
        if len(sel) == 0:
            raise QueryError(f"group {name} ({describe(group)}) has no finished run with map {map_name}")
        stacks.append(x)
    xa, xb = stacks
    if xa.shape[1:] != xb.shape[1:]:
        raise QueryError(f"groups a and b have different map shapes: {xa.shape[1:]} vs {xb.shape[1:]}")
    means = np.stack([xa.mean(axis=0), xb.mean(axis=0)])  # (2, L, K)
    # Spearman of the mean maps = Pearson of their ranks; ranks shuffle like the values they rank,
    # and shuffling b's alone gives the same null as shuffling both (pearson.pearson_to)
    ranks = spearman.rank_rows(means).reshape(means.shape)  # (2, L, K)
    with ThreadPoolExecutor(max_workers=1) as pool:  # ranking every run (sorts release the GIL) meanwhile
        pairwise = pool.submit(spearman.mean_spearman_between, xa, xb)
        rho = _test(lambda m: pearson.pearson_to(ranks[0], m)[0], ranks[1:], n_perm, seed,
                    "the two groups' mean maps", batch_fn=lambda c: pearson.pearson_to(ranks[0], c[:, 0]))
        top = topk.topk_overlap(means[0], means[1], float(k_frac), np.random.default_rng([seed, 7]))
        mean_pairwise = pairwise.result()
    return {"map": map_name, "n_a": len(xa), "n_b": len(xb), "spearman": py(rho.observed),
            "nulls": null_summaries(rho), "mean_pairwise": py(mean_pairwise),
            "k_frac": float(k_frac), **top, "notes": notes}


def null_summaries(tested: Tested) -> list[dict[str, Any]]:
    """One dict per null: what it asks, chance (null mean), excess, 95 % band, p and its text."""
    return [{"null": name, "question": stats.NULLS[name], "observed": py(r.observed),
             "null_mean": py(r.null_mean), "excess": py(r.excess), "band_lo": py(r.band_lo),
             "band_hi": py(r.band_hi), "p_value": py(r.p_value), "p_text": r.p_text, "n_perm": r.n_perm}
            for name, r in tested.nulls.items()]


def tested_rows(tested: Mapping[str, Tested]) -> list[dict[str, Any]]:
    """Tested statistics by name (``Agreement.statistics``, ``Comparison.statistics``) as flat rows,
    one per statistic and null (one with empty null fields when it was not tested): its name,
    label, observed value, what was pooled, then ``null_summaries``' fields."""
    blank = dict.fromkeys(("null", "null_mean", "band_lo", "band_hi", "excess", "p_value", "p_text", "n_perm"))
    rows = []
    for name, t in tested.items():
        stat = statistics.STATISTICS[name]
        head = {"statistic": name, "label": stat.label, "observed": py(t.observed), "pooled": t.pooled}
        nulls = [{key: null[key] for key in blank} for null in null_summaries(t)] or [blank]
        rows += [head | null for null in nulls]
    return rows


def tested_json(tested: Tested) -> dict[str, Any]:
    """A ``Tested`` as plain JSON values: observed, what was pooled, each null (``null_summaries``)."""
    return {"observed": py(tested.observed), "pooled": tested.pooled, "nulls": null_summaries(tested)}


def agreement_json(result: Agreement) -> dict[str, Any]:
    """An ``Agreement`` as plain JSON values (the CLI's --format json and the service share it): the
    matrix's statistic as ``mean_offdiag``, every other one under its name."""
    tested = {("mean_offdiag" if name == MATRIX else name): tested_json(t) for name, t in result.statistics.items()}
    return {"across": result.across, "map": result.map_name, "labels": result.labels,
            "matrix": [[py(v) for v in row] for row in result.matrix], "n_runs": result.n_runs, **tested,
            "n_cells": result.n_cells, "matched_on": result.matched_on, "pooled_axes": result.pooled_axes,
            "notes": result.notes}
