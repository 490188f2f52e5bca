"""Sweeps: submitting a grid (dedup by run key), sweep fields, progress, cancellation.

Every method is one transaction and returns plain dicts and lists, never ORM objects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, String, bindparam, delete, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql

from orchestrator.registry.db import (
    NotFound,
    gc_paused,
    insert_ignore_batches,
    key_in,
    now,
    retrying,
)
from orchestrator.registry.reader import in_sweep
from orchestrator.registry.schema import Run, RunDep, RunMap, Sweep, SweepRun
from orchestrator.registry.stages import StageGraph, dag_summary, edge_rows, with_upstreams
from orchestrator.status import RunStatus, SweepStatus

if TYPE_CHECKING:  # type hints only: parsing configs (and importing the methods) is the caller's
    from experiments.harness.config import RunConfig

_LIVE_SWEEP = (SweepStatus.SUBMITTED, SweepStatus.RUNNING)
_BATCH = 2_500
"""Rows per insert when registering a grid: the next batch is built while the last one is written."""


def _run_row(cfg: RunConfig, run_key: str, when: datetime) -> dict[str, Any]:
    """The insert row of a new run (column names as keys): its labels stored whole, unset ones left out."""
    return {
        "run_key": run_key,
        "group_key": cfg.group_key,
        "config": cfg.to_dict(),
        "labels": {name: value for name, value in cfg.labels().items() if value is not None},
        "status": RunStatus.PENDING,
        "attempts": 0,
        "created_at": when,
        "updated_at": when,
    }


def _keyed(configs: Iterable[RunConfig]) -> dict[str, RunConfig]:
    """run_key -> config, first occurrence wins, in order."""
    keyed: dict[str, RunConfig] = {}
    with gc_paused():
        for cfg in configs:
            keyed.setdefault(cfg.run_key, cfg)
    return keyed


def _insert_members(connection: Connection, sweep_id: str, keys: Sequence[str]) -> None:
    """The new sweep's cells, in order. A new sweep id has no rows to conflict with, so a plain
    INSERT: on PostgreSQL one ``INSERT ... SELECT FROM unnest(keys) WITH ORDINALITY``, the keys as one
    array (ON CONFLICT's speculative insertion and the rows as JSON took 0.64 s of a 10,000-run
    resubmit; this 0.22 s); executemany on SQLite."""
    if connection.dialect.name != "postgresql":
        connection.execute(insert(SweepRun), [{"sweep_id": sweep_id, "run_key": key, "position": position}
                                              for position, key in enumerate(keys)])
        return
    cells = func.unnest(bindparam(None, list(keys), type_=postgresql.ARRAY(String))).table_valued(
        "run_key", with_ordinality="position").render_derived()
    connection.execute(insert(SweepRun).from_select(
        ["sweep_id", "run_key", "position"], select(literal(sweep_id), cells.c.run_key, cells.c.position - 1)))


class SweepStore(StageGraph):
    """Submitting grids and reading and changing sweeps."""

    # ----------------------------------------------------------------------- submit

    @staticmethod
    def _statuses(connection: Connection, keys: Sequence[str]) -> dict[str, str]:
        """run_key -> status of those ``keys`` that exist."""
        return dict(connection.execute(select(Run.run_key, Run.status).where(key_in(connection, Run.run_key, keys))).all())

    def _read_statuses(self, keys: Sequence[str]) -> dict[str, str]:
        with self._read() as connection:
            return self._statuses(connection, keys)

    def finished_among(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` that are finished."""
        statuses = retrying(self._read_statuses)(list(keys))
        return [key for key in keys if statuses.get(key) == RunStatus.FINISHED]

    def plan(self, configs: Iterable[RunConfig]) -> dict[str, Any]:
        """What submitting ``configs`` would do (no writes): total (cells and the upstream runs
        they start from), new, finished, other, and ``dag`` (``stages.dag_summary``)."""
        keyed, edges = with_upstreams(_keyed(configs).values())
        keys = list(keyed)
        statuses = retrying(self._read_statuses)(keys)
        finished = sum(status == RunStatus.FINISHED for status in statuses.values())
        return {"total": len(keys), "new": len(keys) - len(statuses), "finished": finished,
                "other": len(statuses) - finished, "dag": dag_summary(keyed, edges)}

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
        rerun: Sequence[str] = (),
    ) -> tuple[str, dict[str, int]]:
        """Record a sweep, its cells and the upstream runs they start from; insert only new runs.

        Finished runs are skipped unless ``force`` (then pending again, their
        result, maps and MLflow run cleared). Failed and cancelled runs go back to
        pending with ``rerun_failed`` or ``force`` (keeping their MLflow run,
        so a retry continues it); so are blocked runs, always. The run keys in
        ``rerun`` go back to pending whatever their state (an upstream whose
        checkpoint is gone). Running and pending runs are left alone.
        Returns the sweep id and counts: total, new, finished (skipped),
        requeued, other (already pending, running, or failed and not requeued).
        """
        # once, outside the retried transaction (configs may be an iterator): cells + upstreams
        keyed, edges = with_upstreams(_keyed(configs).values())
        requeue_from = {RunStatus.BLOCKED}
        if rerun_failed or force:
            requeue_from |= {RunStatus.FAILED, RunStatus.CANCELLED}
        if force:
            requeue_from.add(RunStatus.FINISHED)
        sweep = {"name": name, "grid": grid_text, "resources": dict(resources),
                 "max_concurrent": max_concurrent, "max_failures": max_failures}
        return retrying(self._store_sweep)(sweep, keyed, edges, requeue_from, set(rerun))

    def _store_sweep(
        self, sweep: dict[str, Any], keyed: dict[str, RunConfig], edges: list, requeue_from: set[str],
        rerun: set[str],
    ) -> tuple[str, dict[str, int]]:
        """create_sweep's one transaction."""
        keys = list(keyed)
        when = now()
        sweep_id = f"sw-{when:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        with gc_paused(), self._write() as connection:  # 10,000s of small objects: see gc_paused
            statuses = self._statuses(connection, keys)
            connection.execute(insert(Sweep), {
                **sweep, "id": sweep_id, "created_at": when, "updated_at": when,
                "cancel_requested": False, "status": SweepStatus.SUBMITTED,
            })
            new = sorted(key for key in keys if key not in statuses)  # sorted: no PG insert deadlocks

            def batches() -> Iterator[tuple[Any, list[dict[str, Any]]]]:  # runs before what refers to them
                for start in range(0, len(new), _BATCH):
                    yield Run, [_run_row(keyed[key], key, when) for key in new[start:start + _BATCH]]
                yield RunDep, edge_rows(edges)

            insert_ignore_batches(connection, batches())
            _insert_members(connection, sweep_id, keys)
            requeue = sorted(key for key, status in statuses.items() if status in requeue_from)
            self._requeue(connection, requeue, requeue_from, when)
            forced = sorted(key for key in rerun if key in statuses and key not in requeue)
            self._requeue(connection, forced, set(RunStatus) - {RunStatus.PENDING, RunStatus.RUNNING}, when)
            requeue += forced
        requeued = set(requeue)
        finished = sum(status == RunStatus.FINISHED and key not in requeued for key, status in statuses.items())
        counts = {"total": len(keys), "new": len(new), "finished": finished, "requeued": len(requeue)}
        counts["other"] = len(keys) - sum(counts[k] for k in ("new", "finished", "requeued"))
        return sweep_id, counts

    @staticmethod
    def _requeue(connection: Connection, keys: Sequence[str], from_statuses: set[str], when: datetime) -> None:
        """Failed/cancelled -> pending (attempts reset); finished also drops its result and maps."""
        if not keys:
            return
        where = (key_in(connection, Run.run_key, keys), Run.status.in_(from_statuses))
        connection.execute(
            update(Run).where(*where, Run.status != RunStatus.FINISHED)
            .values(status=RunStatus.PENDING, attempts=0, updated_at=when)
        )
        if RunStatus.FINISHED in from_statuses:
            finished = select(Run.run_key).where(*where, Run.status == RunStatus.FINISHED)
            connection.execute(delete(RunMap).where(RunMap.run_key.in_(finished)))
        connection.execute(
            update(Run).where(*where, Run.status == RunStatus.FINISHED)
            .values(status=RunStatus.PENDING, attempts=0, updated_at=when, metrics=None,
                    mlflow_run_id=None, finished_at=None, error=None)
        )

    # ----------------------------------------------------------------------- sweeps

    @retrying
    def set_sweep(self, sweep_id: str, **fields: Any) -> None:
        """Update sweep columns, e.g. ``status="running", driver="raysubmit_..."``."""
        allowed = {c.key for c in Sweep.__table__.columns} - {"id", "created_at", "updated_at"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"set_sweep: unknown field(s) {sorted(unknown)}; fields: {sorted(allowed)}")
        if "status" in fields and fields["status"] not in set(SweepStatus):
            raise ValueError(f"set_sweep: status must be one of {[str(s) for s in SweepStatus]}, "
                             f"got {fields['status']!r}")
        with self._write() as connection:
            result = connection.execute(update(Sweep).where(Sweep.id == sweep_id).values(**fields, updated_at=now()))
        if result.rowcount == 0:
            raise NotFound(f"no sweep '{sweep_id}'")

    @retrying
    def unfinished(self, sweep_id: str) -> list[str]:
        """Run keys of the sweep that are neither finished nor cancelled, in cell order."""
        with self._read() as connection:
            return list(connection.execute(
                select(Run.run_key)
                .join(SweepRun, SweepRun.run_key == Run.run_key)
                .where(SweepRun.sweep_id == sweep_id,
                       Run.status.not_in((RunStatus.FINISHED, RunStatus.CANCELLED)))
                .order_by(SweepRun.position)
            ).scalars())

    @retrying
    def cancel_sweep(self, sweep_id: str) -> list[dict[str, Any]]:
        """Request cancellation; pending runs become cancelled. Returns the running runs.

        A pending run that also belongs to another live sweep (not cancelled,
        submitted or running) stays pending: that sweep still wants it. The
        sweep's own ``status`` is left to its driver (``set_sweep``).
        """
        when = now()
        others_live = (
            select(SweepRun.run_key)
            .join(Sweep, Sweep.id == SweepRun.sweep_id)
            .where(SweepRun.sweep_id != sweep_id, Sweep.cancel_requested.is_(False), Sweep.status.in_(_LIVE_SWEEP))
        )
        with self._write() as connection:
            result = connection.execute(
                update(Sweep).where(Sweep.id == sweep_id).values(cancel_requested=True, updated_at=when)
            )
            if result.rowcount == 0:
                raise NotFound(f"no sweep '{sweep_id}'")
            connection.execute(
                update(Run)
                .where(in_sweep(sweep_id), Run.status == RunStatus.PENDING, Run.run_key.not_in(others_live))
                .values(status=RunStatus.CANCELLED, updated_at=when)
            )
            running = connection.execute(
                select(Run.run_key, Run.worker, Run.mlflow_run_id)
                .where(in_sweep(sweep_id), Run.status == RunStatus.RUNNING)
            ).all()
        return [row._asdict() for row in running]

    @retrying
    def cancel_requested(self, sweep_id: str) -> bool:
        with self._read() as connection:
            value = connection.execute(select(Sweep.cancel_requested).where(Sweep.id == sweep_id)).scalar()
        if value is None:
            raise NotFound(f"no sweep '{sweep_id}'")
        return bool(value)
