"""A sweep's answer as metrics of its MLflow parent run, so MLflow's chart view of the sweep is
not empty: each cell's seed-mean of every metric, and whether the seeds keep the same units, with
what chance gives beside it. Pure over a loaded :class:`SweepData`; ``orchestrator.report`` logs it
after the sweep (with the figures)."""

from __future__ import annotations

import math
import re

import numpy as np

from analysis.data.select import QueryError, group_indices, groups_in_cell_order
from analysis.data.sweep import SweepData
from analysis.questions.agreement.across_runs import agreement
from analysis.views.figure_plan import cell_names

MAX_CELLS = 50
"""Per-cell means only up to this many cells (a grid of thousands would swamp the chart view)."""


def metric_key(name: str) -> str:
    """``name`` with what MLflow refuses in a metric name (anything but letters, digits, ``_ - . / :``
    and spaces) as ``_``."""
    return re.sub(r"[^/\w.\- :]", "_", name)


def summary_metrics(data: SweepData, n_perm: int = 200, max_cells: int = MAX_CELLS) -> dict[str, float]:
    """The sweep's summary, a flat ``{metric name: value}``:

    - ``runs_finished``, ``runs_failed``;
    - ``<metric>/<cell>``: the mean over a cell's finished seeds (cells named as the figures name
      them), when the sweep has at most ``max_cells`` cells;
    - per unit map that some cell has 2 finished seeds of, each statistic of agreement across seeds
      (``statistics.asked("agreement")``) where defined, ``agreement/seed/<map>/<statistic>``:
      ``r`` (Pearson r between seeds, mean over cells), ``stem_cell`` and ``stem_cell_paper`` (He &
      Choi's, where a cell has 3 seeds), ``rbo``, ..., each with ``.../<statistic>_chance`` (the
      within-layer null's mean: what chance gives) and ``.../<statistic>_p`` (its p at ``n_perm``
      permutations).
    """
    finished = data.subset(data.status == "finished")
    out = {"runs_finished": float(len(finished)), "runs_failed": float((data.status == "failed").sum())}
    cells = groups_in_cell_order(finished) if len(finished) else []
    if 0 < len(cells) <= max_cells:
        for name, idx in zip(cell_names(finished, cells), cells, strict=True):
            for metric, values in sorted(finished.metrics.items()):
                seen = values[idx][~np.isnan(values[idx])]
                if seen.size:
                    out[metric_key(f"{metric}/{name}")] = float(seen.mean())
    done: set[str] = set()
    for map_name in finished.maps if len(finished) else []:
        has = finished.map(map_name)[1]
        if not any(len(idx) >= 2 for idx in group_indices(finished.subset(has), ["group_key"])):
            continue
        try:
            result = agreement(finished, "seed", n_perm=n_perm, map_name=map_name)
        except QueryError:  # e.g. constant maps with no continuous companion
            continue
        if result.map_name in done:  # asked for a constant map, answered with its continuous companion
            continue
        done.add(result.map_name)
        prefix = metric_key(f"agreement/seed/{result.map_name}")
        for name, tested in result.statistics.items():
            if math.isnan(tested.observed):
                continue
            out[f"{prefix}/{name}"] = float(tested.observed)
            within = tested.nulls.get("within_layers")
            if within is not None:
                out[f"{prefix}/{name}_chance"] = float(within.null.mean())
                out[f"{prefix}/{name}_p"] = float(within.p_value)
    return out
