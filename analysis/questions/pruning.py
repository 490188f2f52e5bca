"""Pruning curves inside runs: head_importance's ``<metric>_pruned_<pct>`` metrics as curves over seeds.

A ``head_importance`` run (Michel et al. 2019) reports its iterative pruning curve as final
metrics ``<metric>_pruned_<pct>``: ``accuracy_pruned_30`` is the dev accuracy with 30 % of the
heads removed, ``accuracy_pruned_30/ood`` the same on an evaluation set. Here they become one
line per cell (the runs sharing a ``group_key``: every seed of one configuration): x = pct / 100,
the mean over the cell's runs, band = their standard deviation. Pure over a loaded SweepData.
"""

from __future__ import annotations

import numpy as np

from analysis.data.select import (
    Filters,
    QueryError,
    column,
    describe,
    did_you_mean,
    groups_in_cell_order,
    select,
    value_label,
    varying_config,
)
from analysis.data.sweep import SweepData
from base import outputs

CURVE = outputs.PRUNING_CURVE
"""``accuracy_pruned_30`` -> metric ``accuracy``, pct 30; ``accuracy_pruned_30/ood`` -> ``accuracy/ood``."""


def pruned_metrics(names) -> dict[str, dict[int, str]]:
    """``{curve metric: {pct: metric name}}`` of the names that are pruning-curve points."""
    curves: dict[str, dict[int, str]] = {}
    for name in names:
        match = CURVE.parse(name)
        if match:
            metric = match["metric"] + match["where"]
            curves.setdefault(metric, {})[int(match["pct"])] = name
    return curves


def is_curve_point(name: str) -> bool:
    """True for a pruning-curve point (``accuracy_pruned_30``), which is no figure's y by itself."""
    return CURVE.matches(name)


def pruning_points(data: SweepData, metric: str = outputs.ACCURACY.name, filters: Filters | None = None
                   ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{line: (fraction pruned, mean, std)}``: one line per cell with the curve of ``metric``."""
    sel = select(data, filters)
    curves = pruned_metrics(sel.metrics)
    if metric not in curves:
        known = sorted(curves)
        raise QueryError(f"no pruning curve of '{metric}' in {describe(filters)}"
                         + (f"{did_you_mean(metric, known)} (curves: {', '.join(known)})" if known else
                            f" (head_importance runs report them as {CURVE.pattern})"))
    pcts = sorted(curves[metric])
    ys = np.stack([sel.metrics[curves[metric][p]] for p in pcts], axis=1)  # (N, P)
    cells = [idx for idx in groups_in_cell_order(sel) if (~np.isnan(ys[idx])).any()]  # cells with a finished curve
    if not cells:
        raise QueryError(f"no finished run has the pruning curve of '{metric}' in {describe(filters)}")
    labels = cell_labels(sel.subset(np.array([idx[0] for idx in cells])))
    lines: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for idx, label in zip(cells, labels, strict=True):
        runs = ys[idx][~np.isnan(ys[idx]).all(axis=1)]  # (n, P): the finished runs (seeds)
        std = np.nanstd(runs, axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(pcts))
        lines[f"{label} (n={len(runs)})"] = (np.array(pcts) / 100, np.nanmean(runs, axis=0), std)
    return lines


def cell_labels(firsts: SweepData) -> list[str]:
    """A line label per cell (one run each): the labels and config keys that tell the cells apart
    (``recompute=False``), else the method; the group key's start when nothing does."""
    keys = [axis for axis in ("task", "model", "method", "pipeline") if len(set(firsts.axis(axis).tolist())) > 1]
    covered = {"task.name", "model", "method", "seed"}
    keys += sorted(k for k in varying_config(firsts) if k not in covered and not k.startswith("init_from"))
    labels = [", ".join(f"{key.rsplit('.', 1)[-1]}={value_label(column(firsts, key)[i])}" for key in keys)
              or str(firsts.method[i]) for i in range(len(firsts))]
    if len(set(labels)) < len(labels):
        labels = [f"{label} {str(key)[:8]}" for label, key in zip(labels, firsts.group_key, strict=True)]
    return labels


