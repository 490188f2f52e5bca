"""A sweep's events as the registry records them: their kinds and the writes and queries over them.

Kinds (``detail`` in brackets): ``driver_lost`` {driver, state, orphaned}: the sweep's Ray job
ended without the driver writing the sweep's final status (killed, crashed, its head gone), with
``orphaned`` runs still RUNNING then; ``worker_lost`` {run_key, worker, attempt, then}: a trial's
worker process died mid-run (killed, out of memory, its Ray node lost) and Tune ``retried`` the
run or ``failed`` it (no retry left); the worker (``orchestrator.driving.trial.worker_name``) names
its Ray node, and the runs lost with one node at once are one line of ``status``; ``orphaned``
{run_keys}: runs whose worker stopped heartbeating while the driver lived, back to pending;
``resumed`` {driver, auto, attempt, of, by}: a new driver, by hand (``headsweep resume``; ``by``
names who, e.g. the SLURM job that resumed it) or by the supervisor; ``gave_up`` {used, of}: the
automatic resumes are used up.

What the supervisor does with them is ``supervision``'s; how ``status`` and ``GET /sweeps/{id}``
say them is ``history``'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update

from orchestrator.registry.db import Database, now, retrying
from orchestrator.registry.reader import in_sweep
from orchestrator.registry.schema import Run, Sweep, SweepEvent
from orchestrator.status import RunStatus, SweepStatus

DRIVER_LOST, RESUMED, GAVE_UP = "driver_lost", "resumed", "gave_up"
WORKER_LOST, ORPHANED = "worker_lost", "orphaned"
LIVE = (SweepStatus.SUBMITTED, SweepStatus.RUNNING)
"""A sweep's statuses while its driver is to run it."""
ALLOCATION_ENDED = "ALLOCATION_ENDED"
"""The state of a driver that ended with its SLURM allocation (``orchestrator/slurm/``): not
resumed by the supervisor (its Ray goes too), but by the job's next allocation."""
_FIELDS = (Sweep.id, Sweep.status, Sweep.driver, Sweep.auto_resumes, Sweep.cancel_requested,
           Sweep.mlflow_parent_run_id)


class SweepEvents(Database):
    """Recording and reading sweep events; the supervisor's two queries."""

    @retrying
    def add_event(self, sweep_id: str, kind: str, detail: dict[str, Any], at: datetime | None = None) -> None:
        with self._write() as connection:
            connection.execute(insert(SweepEvent).values(sweep_id=sweep_id, kind=kind, detail=detail, at=at or now()))

    @retrying
    def lose_driver(self, sweep_id: str, driver: str, state: str, at: datetime | None = None) -> bool:
        """The sweep's driver ``driver`` is dead: a live sweep -> failed, and a ``driver_lost`` event,
        in one transaction, with how many of its runs it left RUNNING (orphans: their heartbeats have
        stopped or soon will). False (nothing written) when the sweep has another driver by now or is
        no longer live (its driver wrote the final status, or someone noticed first)."""
        with self._write() as connection:
            changed = connection.execute(
                update(Sweep).where(Sweep.id == sweep_id, Sweep.driver == driver, Sweep.status.in_(LIVE))
                .values(status=SweepStatus.FAILED, updated_at=now())).rowcount
            if changed:
                orphaned = connection.execute(select(func.count()).select_from(Run).where(
                    in_sweep(sweep_id), Run.status == RunStatus.RUNNING)).scalar()
                connection.execute(insert(SweepEvent).values(
                    sweep_id=sweep_id, kind=DRIVER_LOST, at=at or now(),
                    detail={"driver": driver, "state": state, "orphaned": orphaned}))
        return changed == 1

    @retrying
    def supervised_sweeps(self) -> list[dict[str, Any]]:
        """The sweeps the supervisor looks at (each with ``events``): every live (submitted or
        running) sweep with a driver, whose driver's death it records whatever the sweep's
        automatic resumes; and, with auto-resume on and not cancelled, the failed ones whose latest
        event is a lost driver (to resume)."""
        latest = (select(SweepEvent.sweep_id, func.max(SweepEvent.id).label("last"))
                  .group_by(SweepEvent.sweep_id).subquery())
        resumable = (Sweep.auto_resumes > 0, Sweep.cancel_requested.is_(False))
        with self._read() as connection:
            live = connection.execute(
                select(*_FIELDS).where(Sweep.driver.is_not(None), Sweep.status.in_(LIVE))).all()
            lost = connection.execute(
                select(*_FIELDS).join(latest, latest.c.sweep_id == Sweep.id)
                .join(SweepEvent, SweepEvent.id == latest.c.last)
                .where(*resumable, Sweep.driver.is_not(None), Sweep.status == SweepStatus.FAILED,
                       SweepEvent.kind == DRIVER_LOST)).all()
        sweeps = [row._asdict() for row in (*live, *lost)]
        return [sweep | {"events": self.events(sweep["id"])} for sweep in sorted(sweeps, key=lambda s: s["id"])]
