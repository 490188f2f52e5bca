"""The life of one run: claim, heartbeat, finish (with its maps), fail, cancel, and orphans.

A run moves pending -> running (``claim``, attempts + 1) -> finished | failed |
cancelled; a worker that stops heartbeating leaves an orphan that ``reset_orphans``
puts back to pending. Every transition checks the status (and the worker, when
given) in its UPDATE, so a stale worker can never overwrite a reclaimed run and a
run is never finished twice. ``finish`` stores every map of the run in the same
transaction as the status change.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import numpy as np
from sqlalchemy import and_, delete, exists, insert, or_, select, update

from base.result import KINDS, UnitMap, check_map_name
from orchestrator.registry.db import Database, NotFound, json_safe, now, retrying
from orchestrator.registry.reader import in_sweep
from orchestrator.registry.schema import Run, RunDep, RunMap, pack_map
from orchestrator.status import RunStatus

STALE_AFTER_S = 300.0
"""A running run whose heartbeat is older than this may be claimed again."""
ORPHAN_ERROR = "orphaned: worker stopped heartbeating"


def map_rows(run_key: str, maps: Mapping[str, UnitMap | np.ndarray]) -> list[dict[str, Any]]:
    """The ``run_maps`` rows of a run's maps; a bare array is a map of the kind its name starts with."""
    rows = []
    for name, value in maps.items():
        kind = value.kind if isinstance(value, UnitMap) else name.partition(".")[0]
        if kind not in KINDS:
            raise ValueError(f"map '{name}': its name must start with a unit kind ({', '.join(KINDS)})")
        check_map_name(name, kind)
        values = value.values if isinstance(value, UnitMap) else np.asarray(value)
        if values.ndim != 2 or 0 in values.shape:
            raise ValueError(f"map '{name}' must be (layers, units), got shape {values.shape}")
        rows.append({"run_key": run_key, "name": name, "kind": kind, **pack_map(values)})
    return rows


class RunLifecycle(Database):
    """Claiming, running and ending runs."""

    @retrying
    def get_config(self, run_key: str) -> dict[str, Any]:
        with self._read() as connection:
            config = connection.execute(select(Run.config).where(Run.run_key == run_key)).scalar()
        if config is None:
            raise NotFound(f"no run '{run_key}'")
        return config

    @retrying
    def get_run(self, run_key: str) -> dict[str, Any]:
        """The run's state without its config (small: for status and tests)."""
        columns = [c for c in Run.__table__.columns if c.key != "config"]
        with self._read() as connection:
            row = connection.execute(select(*columns).where(Run.run_key == run_key)).first()
        if row is None:
            raise NotFound(f"no run '{run_key}'")
        return row._asdict()

    @retrying
    def claim(self, run_key: str, worker: str, stale_after_s: float = STALE_AFTER_S) -> dict[str, Any] | None:
        """Atomically take a run: pending, failed, or running with a heartbeat older than
        ``stale_after_s`` (its worker died) -> running, attempts + 1.

        Returns ``{run_key, config, mlflow_run_id, attempts, upstreams, has_dependants}``
        (a retried attempt reuses its MLflow run; ``upstreams``: ``{role: upstream run key}``
        of its stages; ``has_dependants``: whether some run starts from it, so it must keep
        its final weights; read in the same transaction), or None when the run is finished, cancelled or
        held by a live worker: then the caller must not run it. A Ray trial
        retrying its own crashed attempt may pass ``stale_after_s=0``.
        """
        when = now()
        claimable = or_(
            Run.status.in_((RunStatus.PENDING, RunStatus.FAILED)),
            and_(Run.status == RunStatus.RUNNING,
                 or_(Run.heartbeat_at.is_(None), Run.heartbeat_at <= when - timedelta(seconds=stale_after_s))),
        )
        with self._write() as connection:
            row = connection.execute(
                update(Run)
                .where(Run.run_key == run_key, claimable)
                .values(status=RunStatus.RUNNING, attempts=Run.attempts + 1, started_at=when, heartbeat_at=when,
                        updated_at=when, worker=worker)
                .returning(Run.run_key, Run.config, Run.mlflow_run_id, Run.attempts)
            ).first()
            if row is None:
                return None
            upstreams = connection.execute(
                select(RunDep.role, RunDep.upstream_key).where(RunDep.run_key == run_key)).all()
            has_dependants = connection.execute(select(exists().where(RunDep.upstream_key == run_key))).scalar()
        return row._asdict() | {"upstreams": dict(upstreams), "has_dependants": bool(has_dependants)}

    @retrying
    def heartbeat(self, run_key: str, worker: str | None = None) -> bool:
        """Mark the run alive; False when it is no longer running (by ``worker``, if given)."""
        when = now()
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*_running(run_key, worker)).values(heartbeat_at=when, updated_at=when)
            )
        return result.rowcount == 1

    @retrying
    def set_mlflow_run(self, run_key: str, mlflow_run_id: str) -> None:
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(Run.run_key == run_key).values(mlflow_run_id=mlflow_run_id, updated_at=now())
            )
        if result.rowcount == 0:
            raise NotFound(f"no run '{run_key}'")

    def finish(
        self,
        run_key: str,
        metrics: Mapping[str, Any],
        *,
        worker: str | None = None,
        maps: Mapping[str, UnitMap | np.ndarray] | None = None,
    ) -> bool:
        """Store the result of a running run -> finished, with every map of the run, in one
        transaction. False (nothing written) when the run was not running (by ``worker``,
        if given): a run is never finished twice.

        ``maps``: name -> :class:`UnitMap` (or a bare (L, K) array, of the kind its name
        starts with). Non-finite metric values are stored as null.
        """
        rows = map_rows(run_key, dict(maps or {}))  # validated before the transaction
        return retrying(self._finish)(run_key, json_safe(dict(metrics)), rows, worker)

    def _finish(self, run_key: str, metrics: dict[str, Any], rows: list[dict[str, Any]], worker: str | None) -> bool:
        when = now()
        values = {"status": RunStatus.FINISHED, "metrics": metrics, "finished_at": when, "updated_at": when,
                  "error": None}
        with self._write() as connection:
            result = connection.execute(update(Run).where(*_running(run_key, worker)).values(**values))
            if result.rowcount != 1:
                return False
            connection.execute(delete(RunMap).where(RunMap.run_key == run_key))
            if rows:
                connection.execute(insert(RunMap), rows)
        return True

    @retrying
    def add_metrics(self, run_key: str, metrics: Mapping[str, Any]) -> bool:
        """Merge ``metrics`` into a finished run's: what is known only once its finish is written
        (``cost.finish_s``, ``cost.total_s``). False when the run is not finished."""
        finished = (Run.run_key == run_key, Run.status == RunStatus.FINISHED)
        with self._write() as connection:
            stored = connection.execute(select(Run.metrics).where(*finished).with_for_update()).one_or_none()
            if stored is None:
                return False
            merged = dict(stored.metrics or {}) | json_safe(dict(metrics))
            connection.execute(update(Run).where(*finished).values(metrics=merged, updated_at=now()))
        return True

    @retrying
    def fail(self, run_key: str, error: str, worker: str | None = None) -> bool:
        """A running run -> failed, keeping the traceback; False when it was not running."""
        when = now()
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*_running(run_key, worker))
                .values(status=RunStatus.FAILED, error=error, finished_at=when, updated_at=when)
            )
        return result.rowcount == 1

    @retrying
    def cancel_run(self, run_key: str, worker: str | None = None) -> bool:
        """A running (by ``worker``, if given) or pending run -> cancelled; False otherwise."""
        when = now()
        statuses = (RunStatus.RUNNING,) if worker is not None else (RunStatus.RUNNING, RunStatus.PENDING)
        where = [Run.run_key == run_key, Run.status.in_(statuses)]
        if worker is not None:
            where.append(Run.worker == worker)
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(*where).values(status=RunStatus.CANCELLED, finished_at=when, updated_at=when)
            )
        return result.rowcount == 1

    # ----------------------------------------------------------------------- orphans

    @retrying
    def orphans(self, sweep_id: str, stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """Running runs of the sweep whose worker stopped heartbeating."""
        with self._read() as connection:
            rows = connection.execute(
                select(Run.run_key, Run.worker, Run.heartbeat_at, Run.attempts, Run.mlflow_run_id)
                .where(*_stale(sweep_id, stale_after_s)).order_by(Run.run_key)
            ).all()
        return [row._asdict() for row in rows]

    @retrying
    def reset_orphans(self, sweep_id: str, stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
        """Orphans -> pending (error says why); returns their run_key, mlflow_run_id (so the caller
        can mark those MLflow runs KILLED) and the worker that held them (where it ran)."""
        with self._write() as connection:
            stale = _stale(sweep_id, stale_after_s)
            held = dict(connection.execute(select(Run.run_key, Run.worker).where(*stale)).all())
            rows = connection.execute(
                update(Run).where(*stale, Run.run_key.in_(held))
                .values(status=RunStatus.PENDING, error=ORPHAN_ERROR, worker=None, updated_at=now())
                .returning(Run.run_key, Run.mlflow_run_id)
            ).all()
        return sorted((row._asdict() | {"worker": held[row.run_key]} for row in rows), key=lambda row: row["run_key"])


def _running(run_key: str, worker: str | None) -> list[Any]:
    where = [Run.run_key == run_key, Run.status == RunStatus.RUNNING]
    return where if worker is None else [*where, Run.worker == worker]


def _stale(sweep_id: str, stale_after_s: float) -> list[Any]:
    cutoff = now() - timedelta(seconds=stale_after_s)
    return [in_sweep(sweep_id), Run.status == RunStatus.RUNNING,
            or_(Run.heartbeat_at.is_(None), Run.heartbeat_at < cutoff)]
