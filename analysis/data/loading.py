"""A sweep's runs loaded from the registry's reader once (:class:`~analysis.data.sweep.SweepData`) and cached.

``load_sweep`` reads ``RegistryReader.sweep_runs`` (ONE query over every run of the sweep:
labels, metrics, stored configs; DESIGN.md decision 2) into a frozen :class:`SweepData`.
Unit maps are loaded by name on first use, ONE query per map (``RegistryReader.sweep_map``),
and kept with the sweep.

Loads are cached in memory, keyed by (registry URL, sweep id); before a cached copy is
reused, one cheap query checks that nothing changed: ``RegistryReader.sweep_version`` (the
latest ``updated_at`` of the sweep's runs and their count; ~4 ms for 10,000 runs on
SQLite). Any write to a run of the sweep (claim, heartbeat, finish, requeue) bumps
``updated_at`` and so invalidates the copy. On a SQLite file the check is first
``PRAGMA data_version`` on a connection of our own (it changes exactly when another
connection commits to the file, ~20 us): while it is unchanged nothing at all was
written and the version query is skipped.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict

import numpy as np
from sqlalchemy.engine import make_url

from analysis.data.errors import QueryError, did_you_mean
from analysis.data.sweep import SweepData, from_runs, frozen
from orchestrator.registry.read_model import Version
from orchestrator.registry.reader import LAST, NotFound, RegistryReader
from orchestrator.status import RunStatus

_CACHE_SIZE = 8  # sweeps kept in memory (a 10,000-run sweep of 144 gates is ~6 MB; of 6 x 1536 neurons ~370 MB)


class _MapSource:
    """The maps of one loaded sweep: each loaded on first use (ONE query), then kept.

    A map is read after the run columns, in another transaction: a run counts as having
    it only where the loaded columns say the run is finished, so maps and statuses agree.
    """

    def __init__(self, registry: RegistryReader, sweep_id: str, finished: np.ndarray):
        self.registry, self.sweep_id, self.finished = registry, sweep_id, finished
        self.loaded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.lock = threading.Lock()  # concurrent first uses load a map once

    def get(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        with self.lock:
            if name not in self.loaded:
                stack = self.registry.sweep_map(self.sweep_id, name)
                if len(stack.has) != len(self.finished):
                    raise RuntimeError(f"sweep {self.sweep_id} changed size while loading map {name}")
                values, has = stack.values, stack.has & self.finished
                if (stack.has & ~self.finished).any():  # finished after the columns were read
                    values[stack.has & ~self.finished] = np.nan
                self.loaded[name] = (frozen(values), frozen(has))
            return self.loaded[name]

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

def load_sweep(registry: RegistryReader, sweep_id: str) -> SweepData:
    """Every run of the sweep, from the cache when its runs did not change since.

    Raises ``orchestrator.registry.reader.NotFound`` for an unknown sweep.
    """
    key = (registry.url, sweep_id)
    stamp = _commits.stamp(registry.url)  # read BEFORE the version: a later commit changes it
    data = _cache.get(key, stamp, None) if stamp is not None else None
    if data is not None:
        return data
    data = _cache.get(key, stamp, registry.sweep_version(sweep_id))
    if data is not None:
        return data
    with _cache.lock(key):
        data = _cache.get(key, stamp, registry.sweep_version(sweep_id))  # another thread loaded it
        if data is not None:
            return data
        runs = registry.sweep_runs(sweep_id)
        # The version of the data itself, from the same query: a write that lands
        # between the check above and sweep_runs() is either in both or in neither.
        finished = runs["status"] == RunStatus.FINISHED.value
        data = from_runs(runs, _MapSource(registry, sweep_id, finished), (runs["updated_at"], len(runs["run_key"])))
        _cache.put(key, data, stamp)
        return data

def clear_cache() -> None:
    """Forget every loaded sweep (tests, or to free memory)."""
    _cache.clear()

def open_sweep(registry: RegistryReader, sweep_id: str) -> SweepData:
    """``load_sweep`` of a sweep id or ``last`` (the newest sweep), as the CLI and the Python API name
    one; an unknown id is a ``QueryError`` naming the nearest known sweep."""
    try:
        return load_sweep(registry, registry.resolve_sweep(sweep_id))
    except NotFound as err:
        if sweep_id == LAST:  # no sweeps at all
            raise QueryError(str(err)) from None
        raise unknown_sweep(registry, sweep_id) from None


class UnknownSweep(QueryError):
    """A sweep id the registry does not know (the service answers 404)."""


def unknown_sweep(registry: RegistryReader, sweep_id: str) -> UnknownSweep:
    """"unknown sweep 'x'; did you mean 'y'?", the nearest of the registry's sweeps named (or that it has
    none): the one message of every surface (the CLI's writers pass the orchestrator's reader)."""
    known = [s["id"] for s in registry.list_sweeps()]
    return UnknownSweep(f"unknown sweep '{sweep_id}'{did_you_mean(sweep_id, known) or ' (the registry has no sweeps)'}")
