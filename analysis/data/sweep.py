"""A sweep's runs as numpy arrays: :class:`SweepData` (read only), built from the reader's run columns.

Its labels come from one place, each run's stored labels (``RunConfig.labels()``, the registry's
``labels``): the common ones (:data:`LABELS`) are columns of every loaded sweep, unset where a run has
none, and any other label its runs carry (a method's short names: verbalizer, prompt_length, ...) is a
column too. Unit maps
(``heads.gate``, ``heads.log_alpha``, ``neurons.predictivity``, ...) come by name from a
:class:`MapSource` (``loading``: one query per map, on first use, kept with the sweep). The stored
configs become flattened columns (``data.config["train.lr"]``), so analysis can name any config key
as an axis. Arrays are shared between callers (and threads of the query service): they are made
read-only, and query functions return new arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from analysis.data.errors import QueryError, did_you_mean
from base import outputs
from orchestrator.registry.read_model import MapInfo, Version

GATE, LOG_ALPHA = outputs.GATE.name, outputs.LOG_ALPHA.name
"""The maps ``gates`` / ``scores`` read (a gate method's)."""


class MapSource(Protocol):
    """Where a loaded sweep's maps come from (``loading``): ``get(name)`` -> (``(N, L, K)`` values, ``(N,)`` has)."""

    def get(self, name: str) -> tuple[np.ndarray, np.ndarray]: ...


LABELS = ("task", "model", "method", "pipeline", "seed", "sparsity", "lambda")
"""The labels every loaded sweep has as columns (the HTTP service's filter parameters): the ones every run
has (task, model, method, seed) and the methods' most common (pipeline, sparsity, lambda), unset where a
run's method has no such setting."""
NUMBER_LABELS = ("sparsity", "lambda")
"""The common labels that are settings on a scale (a curve's x), not names or the seed."""

AXES = (*LABELS, "status", "group_key", "run_key")
"""Per-run columns a query can filter or group by: the registry's labels, the status, the keys."""

CELL_LABELS = tuple(label for label in LABELS if label != "seed")
"""The labels that tell a run's cell (its runs over seeds) apart: every label but the seed."""

SCALE_LABELS = NUMBER_LABELS
"""The labels that are settings on a scale (a curve's x)."""

_COLUMNS = ("run_key", "group_key", "status", "run_maps")
RECORDS = ("started_at", "finished_at", "mlflow_run_id")
"""The registry's record of each run that a loaded sweep keeps (``SweepData.records``)."""

def frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array

@dataclass(frozen=True, eq=False)
class _Runs:
    """The fields of :class:`SweepData` (see there)."""

    sweep_id: str
    version: Version
    """(latest ``updated_at`` of the sweep's runs, number of runs): the cache key."""
    run_key: np.ndarray
    group_key: np.ndarray
    """``(N,)`` str; the run's cell without its seed (the unit of mean +- std over seeds)."""
    status: np.ndarray
    run_maps: np.ndarray = field(repr=False)
    """``(N,)`` object: each run's stored map names, a tuple (empty until it finishes with maps)."""
    labels: Mapping[str, np.ndarray] = field(repr=False)
    """label (``LABELS``) -> ``(N,)`` column: str ("" where unset), int64 (seed) or float64 (NaN where unset)."""
    metrics: Mapping[str, np.ndarray] = field(repr=False)
    """name -> ``(N,)`` float64 final value, NaN where a run has none (yet)."""
    records: Mapping[str, np.ndarray] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """What the registry recorded of each run besides its result (``RECORDS``): ``started_at``,
    ``finished_at`` (``(N,)`` object: datetimes, None where unset) and ``mlflow_run_id`` (None where none)."""
    config: Mapping[str, np.ndarray] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """Every dotted key of the stored configs (``train.lr``, ``task.name``) -> ``(N,)`` column:
    float64 (NaN where a run lacks the key) when every value is a number, else object."""
    map_info: Mapping[str, MapInfo] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """The maps of the loaded sweep by name: kind, number of runs with it, largest shape."""
    _source: MapSource | None = field(default=None, repr=False)
    _rows: np.ndarray | None = field(default=None, repr=False)
    """Indexes of these runs in the loaded sweep (None: all of it, in order)."""
    _overrides: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """Maps given in place of the stored ones (``replace(data, gates=...)``)."""

def _label(name: str) -> property:
    """``data.<name>``: the ``(N,)`` column of label ``name``."""
    return property(lambda self: self.labels[name], doc=f"``(N,)``: each run's {name} (label ``{name}``).")

class SweepData(_Runs):
    """Every run of one sweep, in cell order, as parallel ``(N,)`` arrays, and its maps by name.

    ``data.map("heads.gate")`` -> (``(N, L, K)`` float32, ``(N,)`` bool has). ``gates``,
    ``has_gates`` and ``scores`` are the maps ``heads.gate`` / ``heads.log_alpha``, and
    ``dataclasses.replace(data, gates=...)`` replaces that map.
    """

    def __init__(self, gates: np.ndarray | None = None, has_gates: np.ndarray | None = None,
                 scores: np.ndarray | None = None, **fields: Any):
        super().__init__(**fields)
        object.__setattr__(self, "_memo", {})
        overrides = dict(self._overrides)
        if gates is not None or has_gates is not None:
            stored_values, stored_has = self._legacy(GATE)
            values = stored_values if gates is None else np.asarray(gates)
            if has_gates is None:
                has_gates = stored_has if stored_values.size else _rows_without_nan(values)
            overrides[GATE] = (values, np.asarray(has_gates, dtype=bool))
        if scores is not None:
            overrides[LOG_ALPHA] = (np.asarray(scores), _rows_without_nan(np.asarray(scores)))
        if overrides != dict(self._overrides):
            object.__setattr__(self, "_overrides", MappingProxyType(overrides))
            object.__setattr__(self, "_memo", {})

    def __len__(self) -> int:
        return len(self.run_key)

    def axis(self, name: str) -> np.ndarray:
        """The ``(N,)`` column of axis ``name`` (one of ``AXES``)."""
        return self.labels[name] if name in self.labels else getattr(self, name)

    # the labels every run has (base.sections.SharedConfig's), by name
    task = _label("task")
    model = _label("model")
    method = _label("method")
    seed = _label("seed")

    @property
    def maps(self) -> list[str]:
        """Names of the maps these runs may have (of the loaded sweep, plus replaced ones)."""
        return sorted({*self.map_info, *self._overrides})

    def map(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(``(N, L, K)`` float32 values, ``(N,)`` bool: the run has the map) of map ``name``.

        NaN rows where a run has none (not finished, or a method that learns no such map).
        Loaded with one query on first use and kept with the sweep; read only.
        """
        if name in self._overrides:
            return self._overrides[name]
        if name not in self._memo:
            if name not in self.map_info or self._source is None:
                raise _unknown_map(name, self.maps)
            values, has = self._source.get(name)
            if self._rows is not None:
                values, has = frozen(values[self._rows]), frozen(has[self._rows])
            self._memo[name] = (values, has)
        return self._memo[name]

    def _legacy(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``map(name)``, or (N, 0, 0) NaN and all False when no run has it."""
        if name in self._overrides or name in self.map_info:
            return self.map(name)
        return frozen(np.full((len(self), 0, 0), np.nan, np.float32)), frozen(np.zeros(len(self), dtype=bool))

    @property
    def gates(self) -> np.ndarray:
        """``(N, L, H)`` float32 final gates (map ``heads.gate``); NaN rows for runs without gates."""
        return self._legacy(GATE)[0]

    @property
    def has_gates(self) -> np.ndarray:
        """``(N,)`` bool: the run is finished with a gate map."""
        return self._legacy(GATE)[1]

    @property
    def scores(self) -> np.ndarray | None:
        """``(N, L, H)`` float32 per-head scores (map ``heads.log_alpha``), NaN where missing;
        None when no run of the sweep has them."""
        if LOG_ALPHA not in self._overrides and LOG_ALPHA not in self.map_info:
            return None
        return self.map(LOG_ALPHA)[0]

    def subset(self, mask: np.ndarray) -> SweepData:
        """The runs where ``mask`` (``(N,)`` bool or an index array) selects them."""
        index = np.arange(len(self))[mask]
        return replace(
            self, **{name: getattr(self, name)[index] for name in _COLUMNS},
            labels=MappingProxyType({k: v[index] for k, v in self.labels.items()}),
            metrics=MappingProxyType({k: v[index] for k, v in self.metrics.items()}),
            config=MappingProxyType({k: v[index] for k, v in self.config.items()}),
            records=MappingProxyType({k: v[index] for k, v in self.records.items()}),
            _rows=index if self._rows is None else self._rows[index],
            _overrides=MappingProxyType({k: (v[index], h[index]) for k, (v, h) in self._overrides.items()}),
        )

def _rows_without_nan(values: np.ndarray) -> np.ndarray:
    return ~np.isnan(values).reshape(len(values), -1).any(axis=1) if values.size else np.zeros(len(values), bool)

def _unknown_map(name: str, known: list[str]) -> Exception:
    """The query layer's one-line error."""
    if not known:
        return QueryError(f"unknown map '{name}': no run of this sweep has stored a map yet")
    return QueryError(f"unknown map '{name}'{did_you_mean(name, known)} (maps: {', '.join(known)})")

def _metric_columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """List of per-run metric dicts -> name -> ``(N,)`` float64 (NaN where missing or null)."""
    names = sorted({name for row in rows for name in row})
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        columns[name] = frozen(np.array(
            [v if isinstance(v, int | float) and not isinstance(v, bool) else math.nan for v in values],
            dtype=np.float64,
        ))
    return columns

def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"train.lr": 5e-05, ...}; lists become tuples (hashable, comparable)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return flat

def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

def config_columns(configs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Stored configs -> every dotted key -> ``(N,)`` column: float64 (NaN where missing)
    when every present value is a number, else object (None where missing)."""
    flat = [_flatten(c) for c in configs]
    keys = sorted({key for row in flat for key in row})
    columns = {}
    for key in keys:
        values = [row.get(key) for row in flat]
        if all(v is None or _is_number(v) for v in values):
            column = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
        else:
            column = np.fromiter(values, dtype=object, count=len(values))
        columns[key] = frozen(column)
    return columns

def _objects(values: list[Any]) -> np.ndarray:
    """A list as a read-only ``(N,)`` object array (values kept as they are: datetimes, None)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return frozen(out)

def label_columns(labels: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Each run's stored labels -> ``{label: (N,) column}``: :data:`LABELS` always, then every other label a
    run has, in name order; the seed int64, numbers float64 (NaN where unset), text str ("" where unset)."""
    names = [*LABELS, *sorted({name for found in labels for name in found} - set(LABELS))]
    columns = {}
    for name in names:
        values = [found.get(name) for found in labels]
        if name == "seed":
            column = np.array(values, dtype=np.int64)
        elif name in NUMBER_LABELS or any(v is not None for v in values) and all(
                v is None or _is_number(v) for v in values):
            column = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
        else:
            column = np.array(["" if v is None else str(v) for v in values], dtype=str)
        columns[name] = frozen(column)
    return columns


def from_runs(runs: dict[str, Any], source: MapSource | None, version: Version | None = None) -> SweepData:
    """``RegistryReader.sweep_runs(...)`` (+ where its maps come from) -> :class:`SweepData` (read only)."""
    arrays = {name: frozen(np.asarray(runs[name])) for name in ("run_key", "group_key", "status")}
    run_maps = np.empty(len(runs["run_key"]), dtype=object)
    for i, names in enumerate(runs["run_maps"]):  # one by one: numpy would read equal tuples as a 2-d array
        run_maps[i] = tuple(names)
    return SweepData(
        sweep_id=runs["sweep_id"],
        version=version if version is not None else (runs["updated_at"], len(runs["run_key"])),
        run_maps=frozen(run_maps),
        labels=MappingProxyType(label_columns(runs["labels"])),
        metrics=MappingProxyType(_metric_columns(runs["metrics"])),
        config=MappingProxyType(config_columns(runs["config"])),
        records=MappingProxyType({name: _objects(runs.get(name, [None] * len(runs["run_key"]))) for name in RECORDS}),
        map_info=MappingProxyType({info.name: info for info in runs["maps"]}),
        _source=source,
        **arrays,
    )
