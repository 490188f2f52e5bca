"""A metric per group: ``headsweep results``, the service's ``/results``, ``Sweep.results()``.

Pure over a loaded :class:`SweepData`; every random answer (the bootstrap CIs) comes from
``np.random.default_rng(seed)`` with a fixed default ``seed``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.data.select import (
    Filters,
    check_axis,
    check_metric,
    column,
    default_metric,
    group_indices,
    groups_in_cell_order,
    py,
    select,
)
from analysis.data.sweep import CELL_LABELS, SweepData
from analysis.statistics import intervals
from base import outputs
from base.collapse import COLLAPSED


def aggregate(data: SweepData, group_by: Sequence[str], metric: str, filters: Filters | None = None,
              n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Mean, std, n and 95 % CI of ``metric`` per group (``intervals.aggregate``: a t interval
    below 10 runs, a bootstrap from 10 on; ``ci_method`` says which).

    ``group_by`` = [] groups by cell (``group_key``: the spread is over seeds)
    and each row also names the cell's axes. Runs without the metric (not
    finished) are left out of n; a group with none has n = 0 and NaN stats.
    Runs of different methods are never pooled: when the selection has several,
    ``method`` is added to ``group_by`` (a fine-tune stage and the head-gate runs
    that start from it are different experiments). Where runs report the collapse check
    (``base.collapse``), ``collapsed`` counts each group's collapsed runs: they
    stay in its n and stats, the count says how many.
    """
    by = [check_axis(a, data) for a in group_by] or ["group_key"]
    sel = select(data, filters)
    if group_by and "method" not in by and len(set(sel.method.tolist())) > 1:
        by.append("method")
    values = check_metric(sel, metric)
    collapsed = sel.metrics.get(COLLAPSED)
    shown = by if group_by else ["group_key", *CELL_LABELS]
    groups = group_indices(sel, by) if group_by else groups_in_cell_order(sel)
    rows = []
    for idx in groups:
        # one generator per group, seeded by the group's runs: a group's CI does not depend on
        # which other groups were asked for, or in which order
        rng = np.random.default_rng([seed, *(int(k[:8], 16) for k in sorted(sel.run_key[idx].tolist()))])
        agg = intervals.aggregate(values[idx], rng, n_boot=n_boot, nan_policy="omit")
        row = {axis: py(column(sel, axis)[idx[0]]) for axis in shown}
        row.update(metric=metric, mean=py(agg.mean), std=py(agg.std), n=agg.n,
                   ci_lo=py(agg.ci_lo), ci_hi=py(agg.ci_hi), ci_method=agg.ci_method, runs=len(idx))
        if collapsed is not None:
            row[COLLAPSED] = int(np.nansum(collapsed[idx]))
        rows.append(row)
    return rows


def results(data: SweepData, group_by: Sequence[str], metric: str | None = None,
            filters: Filters | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(the metric, its ``aggregate`` rows) as ``headsweep results`` and the Python API show them:
    ``metric`` None is ``default_metric``; beside ``open_heads``, each group's mean expected open
    heads (``expected_open``: what the L0 penalty counts), when the runs report them."""
    metric = metric or default_metric(data)
    rows = aggregate(data, group_by, metric, filters)
    if metric == outputs.OPEN_HEADS.name and outputs.EXPECTED_OPEN_HEADS.name in data.metrics:
        expected = aggregate(data, group_by, outputs.EXPECTED_OPEN_HEADS.name, filters)  # the same groups, in order
        rows = [row | {"expected_open": e["mean"]} for row, e in zip(rows, expected, strict=True)]
    return metric, rows
