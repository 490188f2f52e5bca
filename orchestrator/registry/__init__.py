"""The registry: the source of truth for sweeps and runs (DESIGN.md, decisions 1, 2, 4 and 9).

Split along its seams, each part one file:

- ``schema``: the tables (sweeps, runs, sweep_runs, run_maps, run_deps, sweep_events);
- ``db``: engine, retries, migrations (``orchestrator/migrations``), shared transactions;
- ``store``: submitting grids and the sweeps' fields, progress and cancellation;
- ``lifecycle``: one run's claim, heartbeat, finish (with its maps), fail, orphans;
- ``read_model``: the read model analysis uses (run columns in one query, one query per map);
- ``reader``: :class:`RegistryReader`, the reads only (sweeps, counts, events and the read model),
  never migrating: what analysis opens;
- ``stages``: the DAG of runs that start from other runs, and the driver's waves over it;
- ``events``: each sweep's events (driver lost, resumed, automatic resumes used up, workers lost);
- ``supervision``: the supervisor's policy over them, given a driver's Ray job state;
- ``history``: the events as ``status`` says them.

:class:`Registry` is all of them over one database; open one per process by URL.
"""

from __future__ import annotations

from orchestrator.registry.db import (
    NotFound,
    SchemaBehind,
    alembic_config,
    downgrade,
    head_revision,
    upgrade,
)
from orchestrator.registry.events import SweepEvents
from orchestrator.registry.lifecycle import ORPHAN_ERROR, STALE_AFTER_S, RunLifecycle
from orchestrator.registry.read_model import MapInfo, MapStack, ReadModel, Version
from orchestrator.registry.reader import LAST, RegistryReader
from orchestrator.registry.schema import (
    Base,
    Run,
    RunDep,
    RunMap,
    Sweep,
    SweepEvent,
    SweepRun,
)
from orchestrator.registry.store import SweepStore
from orchestrator.status import RunStatus, SweepStatus


class Registry(SweepStore, RunLifecycle, SweepEvents, RegistryReader):
    """Sweeps and runs in one SQL database (SQLite file or PostgreSQL), by SQLAlchemy URL.

    Safe to use from several processes at once (each opens its own Registry);
    every public method is one transaction, retried on "database is locked".
    Opening it upgrades the schema to the newest revision; its reads are the reader's.
    """


__all__ = [
    "LAST", "ORPHAN_ERROR", "STALE_AFTER_S", "Base", "MapInfo", "MapStack", "NotFound", "ReadModel", "Registry", "RegistryReader",
    "Run", "RunDep", "RunLifecycle", "RunMap", "RunStatus", "Sweep", "SweepEvent", "SweepEvents", "SweepRun",
    "SchemaBehind", "SweepStatus", "SweepStore", "Version",
    "alembic_config", "downgrade", "head_revision", "upgrade",
]
