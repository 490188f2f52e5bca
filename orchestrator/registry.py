"""The registry: the source of truth for sweeps and runs (DESIGN.md, decisions 1, 2 and 4).

One row per run key in ``runs``; ``sweep_runs`` says which sweeps hold which
runs (a run can belong to several); ``sweeps`` holds one submission of a grid.
SQLite (a file, WAL, safe with several writing processes) by default,
PostgreSQL by URL. Opening a :class:`Registry` upgrades the schema to the
newest Alembic revision (``orchestrator/migrations``).

Every method opens and closes its own transaction and returns plain dicts,
lists or numpy arrays, never ORM objects. Times are naive UTC, written by the
caller's clock (heartbeats and the orphan cut-off compare clocks across
nodes: keep them in sync).
"""

from __future__ import annotations

import functools
import json
import math
import random
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    DateTime,
    Double,
    Engine,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    column,
    create_engine,
    event,
    func,
    insert,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import StaticPool

from experiments.config import RunConfig
from orchestrator.grid import gc_paused

RUN_STATUSES = ("pending", "running", "finished", "failed", "cancelled")
SWEEP_STATUSES = ("submitted", "running", "finished", "cancelled", "failed")
STALE_AFTER_S = 300.0
"""A running run whose heartbeat is older than this may be claimed again."""
ORPHAN_ERROR = "orphaned: worker stopped heartbeating"

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_RETRIES = 5
_PG_MIGRATION_LOCK = 0x68656164  # pg_advisory_xact_lock key: one migrator at a time


# --------------------------------------------------------------------------- schema


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

    __tablename__ = "sweeps"

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
    status: Mapped[str] = mapped_column(String(16))


class Run(Base):
    """One cell: one config, one seed, keyed by the hash of its config."""

    __tablename__ = "runs"

    run_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_key: Mapped[str] = mapped_column(String(64), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    task: Mapped[str] = mapped_column(String(200), index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    method: Mapped[str] = mapped_column(String(64), index=True)
    pipeline: Mapped[str | None] = mapped_column(String(64), index=True)
    seed: Mapped[int] = mapped_column(Integer, index=True)
    sparsity: Mapped[float | None] = mapped_column(Double, index=True)
    lambda_: Mapped[float] = mapped_column("lambda", Double, index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
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
    gates: Mapped[bytes | None] = mapped_column(LargeBinary)  # float32, C order
    gates_shape: Mapped[list[int] | None] = mapped_column(JSON)  # [layers, heads]
    scores: Mapped[bytes | None] = mapped_column(LargeBinary)  # float32, C order


class SweepRun(Base):
    """Membership: run ``run_key`` is cell ``position`` of sweep ``sweep_id``."""

    __tablename__ = "sweep_runs"

    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    run_key: Mapped[str] = mapped_column(ForeignKey("runs.run_key"), primary_key=True, index=True)
    position: Mapped[int] = mapped_column(Integer)


class NotFound(LookupError):
    """No sweep or run with that id."""


# --------------------------------------------------------------------------- engine

_T = TypeVar("_T")


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _is_transient(err: DBAPIError) -> bool:
    """SQLite busy/locked, PostgreSQL deadlock or serialization failure: worth a retry."""
    text = str(err.orig).lower()
    sqlstate = getattr(err.orig, "sqlstate", None)
    return "database is locked" in text or "database is busy" in text or sqlstate in ("40001", "40P01")


def _retrying(method: Callable[..., _T]) -> Callable[..., _T]:
    """Re-run the whole transaction on a transient error, with jittered exponential backoff."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        for attempt in range(_RETRIES):
            try:
                return method(*args, **kwargs)
            except DBAPIError as err:
                if attempt == _RETRIES - 1 or not _is_transient(err):
                    raise
                time.sleep(min(2.0, 0.02 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    return wrapper


def _make_engine(url: str) -> Engine:
    """An engine; for SQLite: WAL, busy_timeout, foreign keys, and BEGIN emitted by us.

    pysqlite starts a transaction only at the first write, so a read-then-write
    transaction can fail with "database is locked" without waiting; we turn
    its own BEGIN off and emit ``BEGIN`` (reads) or ``BEGIN IMMEDIATE``
    (writes, see ``Registry._write``) ourselves.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"registry: SQLite or PostgreSQL URLs only, got '{parsed.get_backend_name()}'")
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":  # the default driver would be psycopg2
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_pre_ping=True)
    memory = parsed.database in (None, "", ":memory:")
    engine = create_engine(
        url,
        connect_args={"timeout": 20, "check_same_thread": False},
        **({"poolclass": StaticPool} if memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 20000")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
        if not memory:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _alembic_config(connection: Connection | None = None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations in orchestrator/migrations/versions"
    return head


def _current_revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (one migrator at a time; a no-op when current)."""
    from alembic import command

    target = _head_revision() if revision == "head" else revision
    with engine.connect() as connection:
        if _current_revision(connection) == target:
            return
    with engine.execution_options(sqlite_begin="IMMEDIATE").begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(select(func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
        command.upgrade(_alembic_config(connection), revision)


# --------------------------------------------------------------------------- rows


def _run_row(cfg: RunConfig, run_key: str, now: datetime) -> dict[str, Any]:
    """The insert row of a new run (column names as keys)."""
    return {
        "run_key": run_key,
        "group_key": cfg.group_key,
        "config": cfg.to_dict(),
        "task": cfg.task.name,
        "model": cfg.model,
        "method": cfg.method,
        "pipeline": cfg.pipeline,
        "seed": cfg.seed,
        "sparsity": cfg.sparsity,
        "lambda": cfg.gates.lambda_,
        "status": "pending",
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
    }


def _keyed(configs: Iterable[RunConfig]) -> dict[str, RunConfig]:
    """run_key -> config, first occurrence wins, in order."""
    keyed: dict[str, RunConfig] = {}
    with gc_paused():
        for cfg in configs:
            keyed.setdefault(cfg.run_key, cfg)
    return keyed


def _isoformat(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _key_in(connection: Connection, column: Any, keys: Sequence[str]) -> Any:
    """``column IN keys`` with the keys as ONE bound value (a PostgreSQL array, a JSON
    list for SQLite's json_each): no parameter limits, no 10,000-placeholder statements."""
    if connection.dialect.name == "postgresql":
        return column == any_(bindparam(None, list(keys), type_=postgresql.ARRAY(String)))
    each = func.json_each(bindparam(None, json.dumps(list(keys)), type_=String)).table_valued("value")
    return column.in_(select(each.c.value))


def _json_safe(value: Any) -> Any:
    """numpy scalars -> Python; NaN/inf -> None (PostgreSQL's JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _float32_bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array, dtype=np.float32).tobytes()


def _in_sweep(sweep_id: str) -> Any:
    """``runs.run_key IN (the sweep's run keys)``."""
    return Run.run_key.in_(select(SweepRun.run_key).where(SweepRun.sweep_id == sweep_id))


# --------------------------------------------------------------------------- the registry


class Registry:
    """Sweeps and runs in one SQL database, by SQLAlchemy URL.

    Safe to use from several processes at once (each opens its own
    Registry); every public method is one transaction, retried on
    "database is locked".
    """

    def __init__(self, url: str):
        self.url = url
        self._engine = _make_engine(url)
        self._writer = self._engine.execution_options(sqlite_begin="IMMEDIATE")
        _retrying(upgrade)(self._engine)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (Registry, (self.url,))  # picklable: a Ray trial reopens it by URL

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._engine.begin() as connection:
            yield connection

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._writer.begin() as connection:
            yield connection

    def _insert_ignore(self, connection: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
        """Bulk INSERT ... ON CONFLICT DO NOTHING (a concurrent submit may insert the same keys).

        SQLite: executemany. PostgreSQL: ``INSERT ... SELECT FROM
        json_to_recordset(:rows)``, the rows as ONE JSON document, because
        psycopg parses many-row VALUES lists and escapes text arrays
        client-side (measured: several times slower for 10,000 rows).
        """
        if not rows:
            return
        if connection.dialect.name == "sqlite":
            connection.execute(sqlite.insert(table).on_conflict_do_nothing(), rows)
            return
        table = inspect(table).local_table
        names = list(rows[0])
        payload = cast(bindparam(None, json.dumps(rows, default=_isoformat), type_=Text), postgresql.JSON)
        source = func.json_to_recordset(payload).table_valued(
            *(column(name, table.c[name].type) for name in names)
        ).render_derived(with_types=True)
        statement = postgresql.insert(table).from_select(names, select(*source.c))
        connection.execute(statement.on_conflict_do_nothing())

    def _read_statuses(self, keys: Sequence[str]) -> dict[str, str]:
        with self._read() as connection:
            return self._statuses(connection, keys)

    @staticmethod
    def _statuses(connection: Connection, keys: Sequence[str]) -> dict[str, str]:
        """run_key -> status of those ``keys`` that exist."""
        rows = connection.execute(
            select(Run.run_key, Run.status).where(_key_in(connection, Run.run_key, keys))
        )
        return {key: status for key, status in rows}

    # ----------------------------------------------------------------------- submit

    def plan(self, configs: Iterable[RunConfig]) -> dict[str, int]:
        """What submitting ``configs`` would do (no writes): total, new, finished, other."""
        keys = list(_keyed(configs))
        statuses = _retrying(self._read_statuses)(keys)
        finished = sum(status == "finished" for status in statuses.values())
        return {"total": len(keys), "new": len(keys) - len(statuses), "finished": finished,
                "other": len(statuses) - finished}

    def create_sweep(
        self,
        name: str,
        grid_text: str,
        configs: Iterable[RunConfig],
        resources: dict[str, float],
        max_concurrent: int | None,
        max_failures: int,
        force: bool = False,
        rerun_failed: bool = False,
    ) -> tuple[str, dict[str, int]]:
        """Record a sweep and its cells; insert only new runs.

        Finished runs are skipped unless ``force`` (then pending again, their
        result and MLflow run cleared). Failed and cancelled runs go back to
        pending with ``rerun_failed`` or ``force`` (keeping their MLflow run,
        so a retry continues it). Running and pending runs are left alone.
        Returns the sweep id and counts: total, new, finished (skipped),
        requeued, other (already pending, running, or failed and not requeued).
        """
        keyed = _keyed(configs)  # once, outside the retried transaction (configs may be an iterator)
        requeue_from = {"failed", "cancelled"} if (rerun_failed or force) else set()
        if force:
            requeue_from.add("finished")
        sweep = {"name": name, "grid": grid_text, "resources": dict(resources),
                 "max_concurrent": max_concurrent, "max_failures": max_failures}
        return _retrying(self._store_sweep)(sweep, keyed, requeue_from)

    def _store_sweep(
        self, sweep: dict[str, Any], keyed: dict[str, RunConfig], requeue_from: set[str]
    ) -> tuple[str, dict[str, int]]:
        """create_sweep's one transaction."""
        keys = list(keyed)
        now = _now()
        sweep_id = f"sw-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        with gc_paused(), self._write() as connection:  # 10,000s of small objects: see gc_paused
            statuses = self._statuses(connection, keys)
            connection.execute(insert(Sweep), {
                **sweep, "id": sweep_id, "created_at": now, "updated_at": now,
                "cancel_requested": False, "status": "submitted",
            })
            new = sorted(key for key in keys if key not in statuses)  # sorted: no PG insert deadlocks
            self._insert_ignore(connection, Run, [_run_row(keyed[key], key, now) for key in new])
            self._insert_ignore(connection, SweepRun, [
                {"sweep_id": sweep_id, "run_key": key, "position": position}
                for position, key in enumerate(keys)
            ])
            requeue = sorted(key for key, status in statuses.items() if status in requeue_from)
            self._requeue(connection, requeue, requeue_from, now)
        finished = sum(status == "finished" and status not in requeue_from for status in statuses.values())
        counts = {"total": len(keys), "new": len(new), "finished": finished, "requeued": len(requeue)}
        counts["other"] = len(keys) - sum(counts[k] for k in ("new", "finished", "requeued"))
        return sweep_id, counts

    @staticmethod
    def _requeue(connection: Connection, keys: Sequence[str], from_statuses: set[str], now: datetime) -> None:
        """Failed/cancelled -> pending (attempts reset); finished also drops its result."""
        if not keys:
            return
        where = (_key_in(connection, Run.run_key, keys), Run.status.in_(from_statuses))
        connection.execute(
            update(Run).where(*where, Run.status != "finished")
            .values(status="pending", attempts=0, updated_at=now)
        )
        connection.execute(
            update(Run).where(*where, Run.status == "finished")
            .values(status="pending", attempts=0, updated_at=now, metrics=None, gates=None,
                    gates_shape=None, scores=None, mlflow_run_id=None, finished_at=None, error=None)
        )

    # ----------------------------------------------------------------------- sweeps

    @_retrying
    def set_sweep(self, sweep_id: str, **fields: Any) -> None:
        """Update sweep columns, e.g. ``status="running", driver="raysubmit_..."``."""
        allowed = {column.key for column in Sweep.__table__.columns} - {"id", "created_at", "updated_at"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"set_sweep: unknown field(s) {sorted(unknown)}; fields: {sorted(allowed)}")
        if "status" in fields and fields["status"] not in SWEEP_STATUSES:
            raise ValueError(f"set_sweep: status must be one of {SWEEP_STATUSES}, got {fields['status']!r}")
        with self._write() as connection:
            result = connection.execute(
                update(Sweep).where(Sweep.id == sweep_id).values(**fields, updated_at=_now())
            )
        if result.rowcount == 0:
            raise NotFound(f"no sweep '{sweep_id}'")

    @_retrying
    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        """Every column of the sweep (``grid`` is the YAML text) plus ``counts`` (as ``sweep_counts``)."""
        with self._read() as connection:
            row = connection.execute(select(*Sweep.__table__.columns).where(Sweep.id == sweep_id)).first()
            if row is None:
                raise NotFound(f"no sweep '{sweep_id}'")
            return {**row._asdict(), "counts": self._counts(connection, sweep_id)}

    @_retrying
    def list_sweeps(self) -> list[dict[str, Any]]:
        """Every sweep, newest first, without the grid text, with ``counts`` (as ``sweep_counts``)."""
        columns = [c for c in Sweep.__table__.columns if c.key != "grid"]
        with self._read() as connection:
            sweeps = connection.execute(select(*columns).order_by(Sweep.created_at.desc(), Sweep.id)).all()
            tallies = connection.execute(
                select(SweepRun.sweep_id, Run.status, func.count())
                .join(Run, Run.run_key == SweepRun.run_key)
                .group_by(SweepRun.sweep_id, Run.status)
            ).all()
        counts: dict[str, dict[str, int]] = {}
        for sweep_id, status, n in tallies:
            counts.setdefault(sweep_id, {})[status] = n
        return [
            {**row._asdict(), "counts": counts.get(row.id, {})}
            for row in sweeps
        ]

    @_retrying
    def sweep_counts(self, sweep_id: str) -> dict[str, int]:
        """{status: number of the sweep's runs} for the statuses present (use ``.get(s, 0)``)."""
        with self._read() as connection:
            return self._counts(connection, sweep_id)

    @staticmethod
    def _counts(connection: Connection, sweep_id: str) -> dict[str, int]:
        rows = connection.execute(
            select(Run.status, func.count())
            .join(SweepRun, SweepRun.run_key == Run.run_key)
            .where(SweepRun.sweep_id == sweep_id)
            .group_by(Run.status)
        )
        return {status: n for status, n in rows}

    @_retrying
    def unfinished(self, sweep_id: str) -> list[str]:
        """Run keys of the sweep that are neither finished nor cancelled, in cell order."""
        with self._read() as connection:
            return list(connection.execute(
                select(Run.run_key)
                .join(SweepRun, SweepRun.run_key == Run.run_key)
                .where(SweepRun.sweep_id == sweep_id, Run.status.not_in(("finished", "cancelled")))
                .order_by(SweepRun.position)
            ).scalars())

    @_retrying
    def cancel_sweep(self, sweep_id: str) -> list[dict[str, Any]]:
        """Request cancellation; pending runs become cancelled. Returns the running runs.

        A pending run that also belongs to another live sweep (not cancelled,
        submitted or running) stays pending: that sweep still wants it. The
        sweep's own ``status`` is left to its driver (``set_sweep``).
        """
        now = _now()
        others_live = (
            select(SweepRun.run_key)
            .join(Sweep, Sweep.id == SweepRun.sweep_id)
            .where(SweepRun.sweep_id != sweep_id, Sweep.cancel_requested.is_(False),
                   Sweep.status.in_(("submitted", "running")))
        )
        with self._write() as connection:
            result = connection.execute(
                update(Sweep).where(Sweep.id == sweep_id).values(cancel_requested=True, updated_at=now)
            )
            if result.rowcount == 0:
                raise NotFound(f"no sweep '{sweep_id}'")
            connection.execute(
                update(Run)
                .where(_in_sweep(sweep_id), Run.status == "pending", Run.run_key.not_in(others_live))
                .values(status="cancelled", updated_at=now)
            )
            running = connection.execute(
                select(Run.run_key, Run.worker, Run.mlflow_run_id)
                .where(_in_sweep(sweep_id), Run.status == "running")
            ).all()
        return [row._asdict() for row in running]

    @_retrying
    def cancel_requested(self, sweep_id: str) -> bool:
        with self._read() as connection:
            value = connection.execute(select(Sweep.cancel_requested).where(Sweep.id == sweep_id)).scalar()
        if value is None:
            raise NotFound(f"no sweep '{sweep_id}'")
        return bool(value)

    # ----------------------------------------------------------------------- runs

    @_retrying
    def get_config(self, run_key: str) -> dict[str, Any]:
        with self._read() as connection:
            config = connection.execute(select(Run.config).where(Run.run_key == run_key)).scalar()
        if config is None:
            raise NotFound(f"no run '{run_key}'")
        return config

    @_retrying
    def get_run(self, run_key: str) -> dict[str, Any]:
        """The run's state, without config, gates or scores (small: for status and tests)."""
        columns = [c for c in Run.__table__.columns if c.key not in ("config", "gates", "scores")]
        with self._read() as connection:
            row = connection.execute(select(*columns).where(Run.run_key == run_key)).first()
        if row is None:
            raise NotFound(f"no run '{run_key}'")
        return {("lambda" if k == "lambda_" else k): v for k, v in row._asdict().items()}

    @_retrying
    def claim(self, run_key: str, worker: str, stale_after_s: float = STALE_AFTER_S) -> dict[str, Any] | None:
        """Atomically take a run: pending, failed, or running with a heartbeat older than
        ``stale_after_s`` (its worker died) -> running, attempts + 1.

        Returns ``{run_key, config, mlflow_run_id, attempts}`` (a retried attempt
        reuses its MLflow run), or None when the run is finished, cancelled or
        held by a live worker: then the caller must not run it. A Ray trial
        retrying its own crashed attempt may pass ``stale_after_s=0``.
        """
        now = _now()
        claimable = or_(
            Run.status.in_(("pending", "failed")),
            and_(Run.status == "running",
                 or_(Run.heartbeat_at.is_(None), Run.heartbeat_at <= now - timedelta(seconds=stale_after_s))),
        )
        with self._write() as connection:
            row = connection.execute(
                update(Run)
                .where(Run.run_key == run_key, claimable)
                .values(status="running", attempts=Run.attempts + 1, started_at=now, heartbeat_at=now,
                        updated_at=now, worker=worker)
                .returning(Run.run_key, Run.config, Run.mlflow_run_id, Run.attempts)
            ).first()
        return None if row is None else row._asdict()

    @_retrying
    def heartbeat(self, run_key: str, worker: str | None = None) -> bool:
        """Mark the run alive; False when it is no longer running (by ``worker``, if given)."""
        now = _now()
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*self._running(run_key, worker)).values(heartbeat_at=now, updated_at=now)
            )
        return result.rowcount == 1

    @_retrying
    def set_mlflow_run(self, run_key: str, mlflow_run_id: str) -> None:
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(Run.run_key == run_key).values(mlflow_run_id=mlflow_run_id, updated_at=_now())
            )
        if result.rowcount == 0:
            raise NotFound(f"no run '{run_key}'")

    @_retrying
    def finish(
        self,
        run_key: str,
        metrics: dict[str, Any],
        gates: np.ndarray,
        scores: np.ndarray | None = None,
        worker: str | None = None,
    ) -> bool:
        """Store the result of a running run -> finished. False (nothing written) when the
        run was not running (by ``worker``, if given): a run is never finished twice.

        ``gates`` and ``scores`` are (layers, heads), stored as float32;
        non-finite metric values are stored as null.
        """
        gates = np.asarray(gates)
        if gates.ndim != 2:
            raise ValueError(f"gates must be (layers, heads), got shape {gates.shape}")
        if scores is not None and np.shape(scores) != gates.shape:
            raise ValueError(f"scores must have the gates' shape {gates.shape}, got {np.shape(scores)}")
        now = _now()
        values = {
            "status": "finished", "metrics": _json_safe(dict(metrics)), "gates": _float32_bytes(gates),
            "gates_shape": list(gates.shape), "scores": None if scores is None else _float32_bytes(scores),
            "finished_at": now, "updated_at": now, "error": None,
        }
        with self._write() as connection:
            result = connection.execute(update(Run).where(*self._running(run_key, worker)).values(**values))
        return result.rowcount == 1

    @_retrying
    def fail(self, run_key: str, error: str, worker: str | None = None) -> bool:
        """A running run -> failed, keeping the traceback; False when it was not running."""
        now = _now()
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*self._running(run_key, worker))
                .values(status="failed", error=error, finished_at=now, updated_at=now)
            )
        return result.rowcount == 1

    @_retrying
    def cancel_run(self, run_key: str, worker: str | None = None) -> bool:
        """A running (by ``worker``, if given) or pending run -> cancelled; False otherwise."""
        now = _now()
        statuses = ("running",) if worker is not None else ("running", "pending")
        where = [Run.run_key == run_key, Run.status.in_(statuses)]
        if worker is not None:
            where.append(Run.worker == worker)
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*where).values(status="cancelled", finished_at=now, updated_at=now)
            )
        return result.rowcount == 1

    @staticmethod
    def _running(run_key: str, worker: str | None) -> list[Any]:
        where = [Run.run_key == run_key, Run.status == "running"]
        return where if worker is None else [*where, Run.worker == worker]

    @_retrying
    def failures(self, sweep_id: str) -> list[dict[str, Any]]:
        """The sweep's failed runs in cell order: run_key, attempts, error (traceback), worker, finished_at."""
        with self._read() as connection:
            rows = connection.execute(
                select(Run.run_key, Run.attempts, Run.error, Run.worker, Run.finished_at)
                .join(SweepRun, SweepRun.run_key == Run.run_key)
                .where(SweepRun.sweep_id == sweep_id, Run.status == "failed")
                .order_by(SweepRun.position)
            ).all()
        return [row._asdict() for row in rows]

    @_retrying
    def eta_seconds(self, sweep_id: str) -> float | None:
        """Seconds until the sweep's pending and running runs are done, at the rate its runs
        finished so far (since the sweep was created); None before the first one finishes."""
        with self._read() as connection:
            created = connection.execute(select(Sweep.created_at).where(Sweep.id == sweep_id)).scalar()
            if created is None:
                raise NotFound(f"no sweep '{sweep_id}'")
            done, first, last = connection.execute(
                select(func.count(), func.min(Run.started_at), func.max(Run.finished_at))
                .where(_in_sweep(sweep_id), Run.status == "finished", Run.finished_at >= created)
            ).one()
            counts = self._counts(connection, sweep_id)
        remaining = counts.get("pending", 0) + counts.get("running", 0)
        if not done or first is None or last is None:
            return None
        if remaining == 0:
            return 0.0
        elapsed = max((last - max(first, created)).total_seconds(), 1e-3)
        return remaining * elapsed / done

    # ----------------------------------------------------------------------- orphans

    @staticmethod
    def _stale(sweep_id: str, stale_after_s: float) -> list[Any]:
        cutoff = _now() - timedelta(seconds=stale_after_s)
        return [_in_sweep(sweep_id), Run.status == "running",
                or_(Run.heartbeat_at.is_(None), Run.heartbeat_at < cutoff)]

    @_retrying
    def orphans(self, sweep_id: str, stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """Running runs of the sweep whose worker stopped heartbeating."""
        with self._read() as connection:
            rows = connection.execute(
                select(Run.run_key, Run.worker, Run.heartbeat_at, Run.attempts, Run.mlflow_run_id)
                .where(*self._stale(sweep_id, stale_after_s)).order_by(Run.run_key)
            ).all()
        return [row._asdict() for row in rows]

    @_retrying
    def reset_orphans(self, sweep_id: str, stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """Orphans -> pending (error says why); returns their run_key and mlflow_run_id so
        the caller can mark those MLflow runs KILLED."""
        with self._write() as connection:
            rows = connection.execute(
                update(Run).where(*self._stale(sweep_id, stale_after_s))
                .values(status="pending", error=ORPHAN_ERROR, worker=None, updated_at=_now())
                .returning(Run.run_key, Run.mlflow_run_id)
            ).all()
        return sorted((row._asdict() for row in rows), key=lambda row: row["run_key"])

    # ----------------------------------------------------------------------- analysis

    @_retrying
    def results(self, sweep_id: str) -> dict[str, Any]:
        """Every run of the sweep, in cell order, from ONE query (what analysis reads).

        Keys: ``run_key``, ``group_key``, ``status``, ``task``, ``model``,
        ``method``, ``pipeline`` (str arrays), ``seed`` (int64), ``sparsity``,
        ``lambda`` (float64, NaN = unset), ``metrics`` (list of dicts, {} when
        none), ``gates`` and ``scores`` (N, L, H) float32 with NaN rows for
        runs without them (and NaN padding where models differ in size),
        ``has_gates`` and ``has_scores`` (N,) bool, ``gates_shape`` (N, 2)
        int ((0, 0) when none), ``updated_at`` (latest change, for cache
        keys; None when empty) and ``sweep_id``.
        """
        query = (
            select(Run.run_key, Run.group_key, Run.status, Run.task, Run.model, Run.method, Run.pipeline,
                   Run.seed, Run.sparsity, Run.lambda_, Run.metrics, Run.gates, Run.scores,
                   Run.gates_shape, Run.updated_at)
            .join(SweepRun, SweepRun.run_key == Run.run_key)
            .where(SweepRun.sweep_id == sweep_id)
            .order_by(SweepRun.position)
        )
        with self._read() as connection:
            rows = connection.execute(query).all()
            if not rows and connection.execute(select(Sweep.id).where(Sweep.id == sweep_id)).first() is None:
                raise NotFound(f"no sweep '{sweep_id}'")
        columns = list(zip(*rows, strict=True)) if rows else [()] * 15
        (run_key, group_key, status, task, model, method, pipeline, seed, sparsity, lambda_,
         metrics, gates, scores, shapes, updated_at) = columns
        out: dict[str, Any] = {
            "sweep_id": sweep_id,
            **{name: np.array(values, dtype=str) for name, values in (
                ("run_key", run_key), ("group_key", group_key), ("status", status), ("task", task),
                ("model", model), ("method", method), ("pipeline", [p or "" for p in pipeline]))},
            "seed": np.array(seed, dtype=np.int64),
            "sparsity": np.array([np.nan if s is None else s for s in sparsity], dtype=np.float64),
            "lambda": np.array(lambda_, dtype=np.float64),
            "metrics": [m or {} for m in metrics],
            "updated_at": max(updated_at, default=None),
        }
        shape = np.array([s if s is not None else (0, 0) for s in shapes], dtype=np.int64).reshape(-1, 2)
        out["gates"], out["has_gates"] = _stack(gates, shape)
        out["scores"], out["has_scores"] = _stack(scores, shape)
        out["gates_shape"] = shape
        return out


def _stack(blobs: Sequence[bytes | None], shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, L, H) float32 from per-run float32 blobs of ``shapes`` (N, 2), and the (N,) mask of
    runs that have one; NaN elsewhere (whole rows, or the padding of smaller models)."""
    n = len(blobs)
    has = np.array([blob is not None for blob in blobs], dtype=bool)
    layers, heads = (int(v) for v in shapes.max(axis=0)) if n else (0, 0)
    out = np.full((n, layers, heads), np.nan, dtype=np.float32)
    rows = np.flatnonzero(has)
    if rows.size and (shapes[rows] == (layers, heads)).all():  # one size: one frombuffer
        out[rows] = np.frombuffer(b"".join(blobs[i] for i in rows), dtype=np.float32).reshape(-1, layers, heads)
    else:
        for i in rows:
            l_i, h_i = shapes[i]
            out[i, :l_i, :h_i] = np.frombuffer(blobs[i], dtype=np.float32).reshape(l_i, h_i)
    return out, has
