"""The registry's read side: what analysis (the CLI's analysis commands, the HTTP service, the Python
API) opens. :class:`RegistryReader` has the reads only (sweeps, their counts and events, and the read
model of ``results``: run columns, maps, versions) and never migrates: opening it checks that the
schema is there and current, and raises a one-line ``SchemaBehind`` otherwise (``headsweep ls``
creates or migrates it). The writable ``Registry`` builds on it: one implementation of each read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from orchestrator.registry.db import NotFound, retrying
from orchestrator.registry.read_model import ReadModel
from orchestrator.registry.schema import Run, RunDep, Sweep, SweepEvent, SweepRun
from orchestrator.status import RunStatus

__all__ = ["LAST", "NotFound", "RegistryReader", "sweep_counts_in"]

LAST = "last"
"""Stands for the most recently created sweep wherever a sweep id is asked for (CLI and HTTP API)."""


def in_sweep(sweep_id: str) -> Any:
    """``runs.run_key IN (the sweep's run keys)``."""
    return Run.run_key.in_(select(SweepRun.run_key).where(SweepRun.sweep_id == sweep_id))


def sweep_counts_in(connection: Connection, sweep_id: str) -> dict[str, int]:
    """{status: number of the sweep's runs} for the statuses present."""
    rows = connection.execute(
        select(Run.status, func.count())
        .join(SweepRun, SweepRun.run_key == Run.run_key)
        .where(SweepRun.sweep_id == sweep_id)
        .group_by(Run.status)
    )
    return {status: n for status, n in rows}


class RegistryReader(ReadModel):
    """Reads of sweeps and runs by SQLAlchemy URL: every public method is one read transaction,
    retried on transient errors; nothing here writes, and opening it never migrates."""

    @retrying
    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        """Every column of the sweep (``grid`` is the YAML text) plus ``counts`` (as ``sweep_counts``)."""
        with self._read() as connection:
            row = connection.execute(select(*Sweep.__table__.columns).where(Sweep.id == sweep_id)).first()
            if row is None:
                raise NotFound(f"no sweep '{sweep_id}'")
            return {**row._asdict(), "counts": sweep_counts_in(connection, sweep_id)}

    def resolve_sweep(self, sweep_id: str) -> str:
        """``last`` -> the id of the newest sweep; any other id as given.

        NotFound when ``last`` is asked of a registry with no sweeps."""
        if sweep_id != LAST:
            return sweep_id
        sweeps = self.list_sweeps()  # newest first
        if not sweeps:
            raise NotFound("no sweeps yet: submit one with `headsweep submit GRID`")
        return sweeps[0]["id"]

    @retrying
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
        return [{**row._asdict(), "counts": counts.get(row.id, {})} for row in sweeps]

    @retrying
    def sweep_counts(self, sweep_id: str) -> dict[str, int]:
        """{status: number of the sweep's runs} for the statuses present (use ``.get(s, 0)``)."""
        with self._read() as connection:
            return sweep_counts_in(connection, sweep_id)

    @retrying
    def events(self, sweep_id: str) -> list[dict[str, Any]]:
        """The sweep's events, oldest first: kind, at (naive UTC), detail."""
        with self._read() as connection:
            rows = connection.execute(
                select(SweepEvent.kind, SweepEvent.at, SweepEvent.detail)
                .where(SweepEvent.sweep_id == sweep_id).order_by(SweepEvent.id)).all()
        return [row._asdict() for row in rows]

    @retrying
    def sweep_dag(self, sweep_id: str) -> dict[str, int]:
        """{"upstream": runs of the sweep that others start from, "dependants": runs with stages}."""
        member = select(SweepRun.run_key).where(SweepRun.sweep_id == sweep_id)
        with self._read() as connection:
            edges = connection.execute(
                select(RunDep.run_key, RunDep.upstream_key).where(RunDep.run_key.in_(member))).all()
        return {"upstream": len({up for _, up in edges}), "dependants": len({run for run, _ in edges})}

    @retrying
    def failures(self, sweep_id: str) -> list[dict[str, Any]]:
        """The sweep's failed and blocked runs in cell order: run_key, status, attempts, error
        (a traceback, or which upstream blocked it), worker, finished_at."""
        with self._read() as connection:
            rows = connection.execute(
                select(Run.run_key, Run.status, Run.attempts, Run.error, Run.worker, Run.finished_at)
                .join(SweepRun, SweepRun.run_key == Run.run_key)
                .where(SweepRun.sweep_id == sweep_id, Run.status.in_((RunStatus.FAILED, RunStatus.BLOCKED)))
                .order_by(SweepRun.position)
            ).all()
        return [row._asdict() for row in rows]

    @retrying
    def eta_seconds(self, sweep_id: str) -> float | None:
        """Seconds until the sweep's pending and running runs are done, at the rate its runs
        finished so far (since the sweep was created); None before the first one finishes."""
        with self._read() as connection:
            created = connection.execute(select(Sweep.created_at).where(Sweep.id == sweep_id)).scalar()
            if created is None:
                raise NotFound(f"no sweep '{sweep_id}'")
            done, first, last = connection.execute(
                select(func.count(), func.min(Run.started_at), func.max(Run.finished_at))
                .where(in_sweep(sweep_id), Run.status == RunStatus.FINISHED, Run.finished_at >= created)
            ).one()
            counts = sweep_counts_in(connection, sweep_id)
        remaining = counts.get(RunStatus.PENDING, 0) + counts.get(RunStatus.RUNNING, 0)
        if not done or first is None or last is None:
            return None
        if remaining == 0:
            return 0.0
        elapsed = max((last - max(first, created)).total_seconds(), 1e-3)
        return remaining * elapsed / done
