"""A sweep's runs as numpy arrays, read from the registry once and cached.

``load_sweep`` turns ``Registry.results`` (ONE query over every run of the
sweep, DESIGN.md decision 2) into a frozen :class:`SweepData`. Loads are
cached in memory, keyed by (registry URL, sweep id); before a cached copy is
reused, one cheap query checks that nothing changed: ``sweep_version`` (the
latest ``updated_at`` of the sweep's runs and their count; ~4 ms for 10,000
runs on SQLite). Any write to a run of the sweep (claim, heartbeat, finish,
requeue) bumps ``updated_at`` and so invalidates the copy. On a SQLite file
the check is first ``PRAGMA data_version`` on a connection of our own (it
changes exactly when another connection commits to the file, ~20 us): while
it is unchanged nothing at all was written and the version query is skipped.

Cached arrays are shared between callers (and threads of the query
service): they are made read-only, and query functions return new arrays.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from orchestrator.registry import Registry, Run, SweepRun

AXES = ("task", "model", "method", "pipeline", "seed", "sparsity", "lambda",
        "status", "group_key", "run_key")
"""Per-run columns a query can filter or group by (``lambda`` is ``SweepData.lambda_``)."""
STRING_AXES = frozenset({"task", "model", "method", "pipeline", "status", "group_key", "run_key"})

_CACHE_SIZE = 8  # sweeps kept in memory (a 10,000-run sweep of 144 gates is ~6 MB)

Version = tuple[datetime | None, int]


@dataclass(frozen=True)
class SweepData:
    """Every run of one sweep, in cell order, as parallel ``(N,)`` arrays."""

    sweep_id: str
    version: Version
    """(latest ``updated_at`` of the sweep's runs, number of runs): the cache key."""
    run_key: np.ndarray
    group_key: np.ndarray
    """``(N,)`` str; the run's cell without its seed (the unit of mean +- std over seeds)."""
    status: np.ndarray
    task: np.ndarray
    model: np.ndarray
    method: np.ndarray
    pipeline: np.ndarray
    """``(N,)`` str; "" when the run has none."""
    seed: np.ndarray
    """``(N,)`` int64."""
    sparsity: np.ndarray
    """``(N,)`` float64, NaN = unset."""
    lambda_: np.ndarray
    """``(N,)`` float64, the L0 penalty weight (``gates.lambda``)."""
    metrics: Mapping[str, np.ndarray] = field(repr=False)
    """name -> ``(N,)`` float64 final value, NaN where a run has none (yet)."""
    gates: np.ndarray = field(repr=False)
    """``(N, L, H)`` float32 final gates; NaN rows for runs without gates."""
    has_gates: np.ndarray = field(repr=False)
    """``(N,)`` bool: the run is finished with a gate vector."""
    scores: np.ndarray | None = field(default=None, repr=False)
    """``(N, L, H)`` float32 per-head scores (log_alpha, importance), NaN where
    missing; None when the registry does not return them."""

    def __len__(self) -> int:
        return len(self.run_key)

    def axis(self, name: str) -> np.ndarray:
        """The ``(N,)`` column of axis ``name`` (one of ``AXES``)."""
        return self.lambda_ if name == "lambda" else getattr(self, name)

    def subset(self, mask: np.ndarray) -> SweepData:
        """The runs where ``mask`` (``(N,)`` bool or an index array) selects them."""
        columns = {name: getattr(self, name)[mask] for name in (
            "run_key", "group_key", "status", "task", "model", "method", "pipeline", "seed",
            "sparsity", "lambda_", "gates", "has_gates")}
        return replace(
            self, **columns,
            metrics=MappingProxyType({k: v[mask] for k, v in self.metrics.items()}),
            scores=None if self.scores is None else self.scores[mask],
        )


def sweep_version(registry: Registry, sweep_id: str) -> Version:
    """(latest ``updated_at`` of the sweep's runs, number of runs), in ONE aggregate query.

    Read only, on the registry's own engine (its pool, busy timeout and WAL
    settings). ``(None, 0)`` both for an empty and for an unknown sweep.
    """
    query = (
        select(func.max(Run.updated_at), func.count())
        .select_from(SweepRun)
        .join(Run, Run.run_key == SweepRun.run_key)
        .where(SweepRun.sweep_id == sweep_id)
    )
    with registry._engine.connect() as connection:  # noqa: SLF001 - read only; see module doc
        latest, count = connection.execute(query).one()
    return latest, int(count)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _metric_columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """List of per-run metric dicts -> name -> ``(N,)`` float64 (NaN where missing or null)."""
    names = sorted({name for row in rows for name in row})
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        columns[name] = _frozen(np.array(
            [v if isinstance(v, int | float) and not isinstance(v, bool) else math.nan for v in values],
            dtype=np.float64,
        ))
    return columns


def from_results(results: dict[str, Any], version: Version | None = None) -> SweepData:
    """``Registry.results(...)`` -> :class:`SweepData` (arrays made read-only)."""
    n = len(results["run_key"])
    arrays = {name: _frozen(np.asarray(results[name])) for name in (
        "run_key", "group_key", "status", "task", "model", "method", "pipeline", "seed",
        "sparsity", "gates", "has_gates")}
    scores = results.get("scores")  # not yet returned by Registry.results (see module doc)
    return SweepData(
        sweep_id=results["sweep_id"],
        version=version if version is not None else (results["updated_at"], n),
        lambda_=_frozen(np.asarray(results["lambda"], dtype=np.float64)),
        metrics=MappingProxyType(_metric_columns(results["metrics"])),
        scores=None if scores is None else _frozen(np.asarray(scores, dtype=np.float32)),
        **arrays,
    )


class _CommitCounter:
    """``PRAGMA data_version`` of a SQLite file, on one read-only connection per file."""

    def __init__(self):
        self.connections: dict[str, tuple[sqlite3.Connection, threading.Lock]] = {}
        self.guard = threading.Lock()

    def stamp(self, url: str) -> int | None:
        """A number that changes whenever another connection commits; None unless a SQLite file."""
        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
            return None
        with self.guard:
            if url not in self.connections:
                uri = f"file:{parsed.database}?mode=rw"  # rw: a WAL file may need its -shm created; we never write
                connection = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
                self.connections[url] = (connection, threading.Lock())
            connection, lock = self.connections[url]
        with lock:
            return connection.execute("PRAGMA data_version").fetchone()[0]


class _Cache:
    """LRU of loaded sweeps with the commit stamp at their last check; one lock per sweep
    so concurrent misses load it once."""

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[tuple[str, str], tuple[SweepData, int | None]] = OrderedDict()
        self.locks: dict[tuple[str, str], threading.Lock] = {}
        self.guard = threading.Lock()

    def get(self, key: tuple[str, str], stamp: int | None, version: Version | None) -> SweepData | None:
        """The cached data if nothing was committed since its check (same ``stamp``) or
        its ``version`` is still current (then ``stamp`` is recorded as checked)."""
        with self.guard:
            data, checked = self.entries.get(key, (None, None))
            if data is None:
                return None
            if version is None:
                if stamp is None or stamp != checked:
                    return None
            elif data.version != version:
                return None
            self.entries[key] = (data, stamp)
            self.entries.move_to_end(key)
            return data

    def put(self, key: tuple[str, str], data: SweepData, stamp: int | None) -> None:
        with self.guard:
            self.entries[key] = (data, stamp)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def lock(self, key: tuple[str, str]) -> threading.Lock:
        with self.guard:
            return self.locks.setdefault(key, threading.Lock())

    def clear(self) -> None:
        with self.guard:
            self.entries.clear()


_cache = _Cache(_CACHE_SIZE)
_commits = _CommitCounter()


def load_sweep(registry: Registry, sweep_id: str) -> SweepData:
    """Every run of the sweep, from the cache when its runs did not change since.

    Raises ``orchestrator.registry.NotFound`` for an unknown sweep.
    """
    key = (registry.url, sweep_id)
    stamp = _commits.stamp(registry.url)  # read BEFORE the version: a later commit changes it
    data = _cache.get(key, stamp, None) if stamp is not None else None
    if data is not None:
        return data
    data = _cache.get(key, stamp, sweep_version(registry, sweep_id))
    if data is not None:
        return data
    with _cache.lock(key):
        data = _cache.get(key, stamp, sweep_version(registry, sweep_id))  # another thread loaded it
        if data is not None:
            return data
        results = registry.results(sweep_id)
        # The version of the data itself, from the same query: a write that lands
        # between the check above and results() is either in both or in neither.
        data = from_results(results, (results["updated_at"], len(results["run_key"])))
        _cache.put(key, data, stamp)
        return data


def clear_cache() -> None:
    """Forget every loaded sweep (tests, or to free memory)."""
    _cache.clear()
