"""One row per run, the same columns from ``headsweep runs``, the service's ``/runs`` and ``Sweep.runs()``.

The columns, MLflow's names where MLflow has them (``mlflow.search_runs``):

- ``run_key``, ``group_key``, the labels (``LABELS``: task, model, method, pipeline, seed, sparsity,
  lambda), ``data`` (what the run trained on), ``status``;
- ``started_at``, ``finished_at`` (ISO 8601, UTC, as the registry recorded them) and ``duration_s``;
- ``mlflow_run_id`` and ``artifact_uri`` (the MLflow store's, through an :data:`ArtifactUris` the
  caller passes: analysis never imports MLflow);
- ``params.<key>`` for every config key the sweep's grid sets or varies (``params.train.lr``,
  ``params.task.max_train``; short names resolved: ``lambda`` -> ``params.head_gates.lambda``);
- ``maps`` (the maps the run stored, comma-separated) and ``metrics.<name>``.

The columns come from the whole sweep, so a filtered table has the same ones. Pure over a loaded
:class:`SweepData`, the grid's text and the artifact lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import yaml

from analysis.data.select import (
    METRIC_PREFIX,
    PARAM_PREFIX,
    Filters,
    config_columns,
    config_keys_of,
    py,
    select,
    varying_config,
)
from analysis.data.sweep import LABELS, SweepData

ArtifactUris = Callable[[Sequence[str]], Mapping[str, str]]
"""MLflow run ids -> their artifact URIs (ids the store does not know are left out)."""

RECORD_COLUMNS = ("started_at", "finished_at", "duration_s", "mlflow_run_id", "artifact_uri")
FIRST_COLUMNS = ("run_key", "group_key", *LABELS, "data", "status", *RECORD_COLUMNS)
"""``data``: the run's ``data`` label (its files and their content hash, or the generator and its seed),
so a run on the wrong data shows; None for a run registered before runs had one."""
_GRID_SECTIONS = ("base", "axes", "include")


@dataclass(frozen=True)
class RunTable:
    """``columns`` in order, and one dict per run (every column, None where a run has no value)."""

    columns: list[str]
    rows: list[dict[str, Any]]


def grid_keys(grid_text: str | None) -> list[str]:
    """The dotted keys a grid's text sets or varies (``base``, ``axes``, ``include``), as written
    (short names unresolved): ``{base: {train: {lr: 3e-4}}, axes: {lambda: [...]}}`` -> train.lr, lambda."""
    grid = yaml.safe_load(grid_text or "") or {}
    if not isinstance(grid, dict):
        return []
    keys: set[str] = set()
    for section in _GRID_SECTIONS:
        parts = grid.get(section) or {}
        for part in parts if isinstance(parts, list) else [parts]:
            if isinstance(part, dict):
                keys |= set(_dotted(part, flatten_values=section != "axes"))
    return sorted(keys)


def _dotted(config: dict[str, Any], prefix: str = "", flatten_values: bool = True) -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, dict) and flatten_values:
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def param_keys(data: SweepData, grid_text: str | None) -> list[str]:
    """The stored config keys the grid sets or varies (its keys resolved to what they stand for in
    each method's runs), and every key that varies among the runs (stages' keys included)."""
    stored = config_columns(data)
    keys = {key for name in grid_keys(grid_text) for key in config_keys_of(data, name) if key in stored}
    return sorted(keys | set(varying_config(data)))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _duration(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def _param(value: Any) -> Any:
    """A config value as a cell: text as it is, whole numbers as integers (a numeric config column is
    float64), lists as their text (as MLflow logs them)."""
    value = py(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return str(list(value)) if isinstance(value, tuple) else value


def run_table(data: SweepData, filters: Filters | str | None = None, grid_text: str | None = None,
              artifact_uris: ArtifactUris | None = None) -> RunTable:
    """The runs ``filters`` select (``--where``), one row each, in cell order (see the module)."""
    params = param_keys(data, grid_text)
    metrics = sorted(data.metrics)
    columns = [*FIRST_COLUMNS, *(PARAM_PREFIX + key for key in params), "maps", *(METRIC_PREFIX + m for m in metrics)]
    sel = select(data, filters)
    records = {name: sel.records.get(name, np.full(len(sel), None, dtype=object)) for name in
               ("started_at", "finished_at", "mlflow_run_id")}
    ids = [run_id for run_id in records["mlflow_run_id"] if run_id]
    uris = dict(artifact_uris(ids)) if artifact_uris is not None and ids else {}
    config = config_columns(sel)
    rows = []
    for i in range(len(sel)):
        start, end, run_id = (records[name][i] for name in ("started_at", "finished_at", "mlflow_run_id"))
        row = {"run_key": str(sel.run_key[i]), "group_key": str(sel.group_key[i])}
        row |= {label: py(sel.labels[label][i]) if sel.labels[label][i] != "" else None for label in LABELS}
        row["data"] = py(sel.labels["data"][i]) or None if "data" in sel.labels else None
        row |= {"status": str(sel.status[i]), "started_at": _iso(start), "finished_at": _iso(end),
                "duration_s": _duration(start, end), "mlflow_run_id": run_id, "artifact_uri": uris.get(run_id)}
        row |= {PARAM_PREFIX + key: _param(config[key][i]) for key in params}
        row["maps"] = ",".join(sel.run_maps[i])
        row |= {METRIC_PREFIX + m: py(sel.metrics[m][i]) for m in metrics}
        rows.append(row)
    return RunTable(columns, rows)
