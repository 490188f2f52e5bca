"""The registry's tables (SQLAlchemy 2 declarative); ``orchestrator/migrations`` builds them.

``sweeps``: one submission of a grid. ``runs``: one row per run key (DESIGN.md
decision 1). ``sweep_runs``: which sweeps hold which runs, in cell order (a run
can belong to several sweeps). ``run_maps``: every unit map of every finished
run (decision 9), one row per run and map name, the values as zlib-compressed
float32 bytes. ``run_deps``: the stage edges, run -> the upstream run it starts
from (decision 10). ``sweep_events``: each sweep's history (its driver lost, resumed
by hand or by the supervisor, the automatic resumes used up). A test checks that these
models and the migrations agree.

Every table's name starts with :data:`PREFIX` and Alembic keeps the schema revision in
:data:`VERSION_TABLE`, so the registry and MLflow (whose tables include ``runs``, ``experiments``
and ``alembic_version``) can share one database, PostgreSQL or SQLite (migration 0006).
"""

from __future__ import annotations

import zlib
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PREFIX = "hs_"
"""The registry's namespace in a database it may share with MLflow. A prefix rather than a
PostgreSQL schema: it works the same on SQLite (which has no schemas), needs no CREATE SCHEMA
right and leaves the URL's search_path alone."""
VERSION_TABLE = f"{PREFIX}alembic_version"
"""Alembic's version table for the registry (MLflow keeps its own revision in ``alembic_version``)."""


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Sweep(Base):
    """One submission of a grid."""

    __tablename__ = f"{PREFIX}sweeps"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    grid: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    resources: Mapped[dict[str, Any]] = mapped_column(JSON)
    max_concurrent: Mapped[int | None] = mapped_column(Integer)
    max_failures: Mapped[int] = mapped_column(Integer)
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64))
    mlflow_parent_run_id: Mapped[str | None] = mapped_column(String(64))
    driver: Mapped[str | None] = mapped_column(String(200))
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))  # orchestrator.status.SweepStatus
    auto_resumes: Mapped[int] = mapped_column(Integer, server_default="0")
    """How many times the supervisor may resume the sweep after its driver died (0: never)."""


class SweepEvent(Base):
    """One entry of a sweep's history (``orchestrator.driving.supervisor`` writes and reads them):
    ``driver_lost`` {driver, state}, ``resumed`` {driver, auto, attempt, of}, ``gave_up`` {used, of}.
    ``at``: when it happened (a lost driver: when its Ray job ended)."""

    __tablename__ = f"{PREFIX}sweep_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}sweeps.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class Run(Base):
    """One cell: one config, one seed, keyed by the hash of its config.

    ``labels`` is ``RunConfig.labels()``, the one place every label of a run is stored and read:
    task, model, method, seed and its method's labels (pipeline, short names: lambda, sparsity,
    verbalizer, ...), unset ones left out (migration 0007). No query filters on a label: runs are
    read by key, by sweep or by status, and analysis selects in memory.
    """

    __tablename__ = f"{PREFIX}runs"

    run_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_key: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)  # orchestrator.status.RunStatus
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    worker: Mapped[str | None] = mapped_column(String(200))
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class SweepRun(Base):
    """Membership: run ``run_key`` is cell ``position`` of sweep ``sweep_id``."""

    __tablename__ = f"{PREFIX}sweep_runs"

    sweep_id: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}sweeps.id", ondelete="CASCADE"), primary_key=True)
    run_key: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}runs.run_key"), primary_key=True, index=True)
    position: Mapped[int] = mapped_column(Integer)


class RunMap(Base):
    """One unit map of a finished run: ``rows x cols`` float32, C order, zlib-compressed.

    The primary key (run_key, name) is also the index the read model uses: it
    joins a sweep's cells to the rows of ONE map name.
    """

    __tablename__ = f"{PREFIX}run_maps"

    run_key: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}runs.run_key", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)  # e.g. heads.gate
    kind: Mapped[str] = mapped_column(String(32))  # heads, neurons, layers, ...
    rows: Mapped[int] = mapped_column(Integer)  # layers
    cols: Mapped[int] = mapped_column(Integer)  # units per layer
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunDep(Base):
    """A stage edge (DESIGN.md decision 10): run ``run_key`` starts from, or uses, the final
    state of run ``upstream_key`` in ``role`` (init_from, teacher, bias_model)."""

    __tablename__ = f"{PREFIX}run_deps"

    run_key: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}runs.run_key", ondelete="CASCADE"), primary_key=True)
    role: Mapped[str] = mapped_column(String(32), primary_key=True)
    upstream_key: Mapped[str] = mapped_column(ForeignKey(f"{PREFIX}runs.run_key"), index=True)


def pack_map(values: np.ndarray) -> dict[str, Any]:
    """(L, K) array -> the ``rows``, ``cols`` and ``data`` columns of a ``run_maps`` row.

    zlib level 1 where that saves at least a fifth (0/1 gate maps, rounded scores: half
    or less); otherwise zlib level 0, stored blocks, still read by ``zlib.decompress``:
    inflating 10,000 maps of 6 x 1536 full-precision floats costs ~1.8 s and saves ~10 %,
    reading stored blocks ~0.2 s (measured).
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"a map must be (layers, units), got shape {values.shape}")
    raw = values.tobytes()
    data = zlib.compress(raw, 1)
    if len(data) > 0.8 * len(raw):
        data = zlib.compress(raw, 0)
    return {"rows": values.shape[0], "cols": values.shape[1], "data": data}


def unpack_map(data: bytes, rows: int, cols: int) -> np.ndarray:
    """The ``(rows, cols)`` float32 array of a ``run_maps`` row (read only: a view of its bytes)."""
    return np.frombuffer(zlib.decompress(data), dtype=np.float32).reshape(rows, cols)
