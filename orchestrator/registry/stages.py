"""Stages: the DAG of runs that start from other runs (DESIGN.md decision 10).

A config may name upstream runs (``init_from``, ``teacher``, ``bias_model``;
``RunConfig.upstreams``). ``with_upstreams`` adds every upstream config to a
grid's cells, each distinct one once (by run key, so an upstream shared by 24
cells is one run, and one already finished in an earlier sweep is reused), in an
order where every upstream comes before its dependants, with the edges.

The driver runs a sweep in waves (``next_wave``): the runs whose upstreams
have all finished; a run whose upstream failed, was cancelled or is blocked is
marked ``blocked`` with the reason instead of being run or failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, select, update

from orchestrator.registry.db import Database, now, retrying
from orchestrator.registry.schema import Run, RunDep, SweepRun
from orchestrator.status import RunStatus

if TYPE_CHECKING:  # type hints only: parsing configs (and importing the methods) is the caller's
    from experiments.harness.config import RunConfig

Edge = tuple[str, str, str]
"""(run_key, role, upstream_key)."""

def with_upstreams(configs: Iterable[RunConfig]) -> tuple[dict[str, RunConfig], list[Edge]]:
    """``{run_key: config}`` of the cells and every upstream they need (recursively), each once,
    every upstream before its dependants (cells keep their order otherwise), and the edges."""
    ordered: dict[str, RunConfig] = {}
    edges: list[Edge] = []

    def visit(cfg: RunConfig) -> str:
        key = cfg.run_key
        if key not in ordered:
            for role, upstream in cfg.upstreams.items():
                edges.append((key, role, visit(upstream)))
            ordered[key] = cfg
        return key

    for cfg in configs:
        visit(cfg)
    return ordered, edges


def edge_rows(edges: Sequence[Edge]) -> list[dict[str, str]]:
    """The ``run_deps`` rows of ``edges`` (a run's edges never change: its key hashes its upstreams' keys)."""
    return [{"run_key": run, "role": role, "upstream_key": up} for run, role, up in sorted(set(edges))]


def dag_summary(keyed: dict[str, RunConfig], edges: Sequence[Edge]) -> dict[str, Any]:
    """How the DAG looks: upstream runs (by method), and how many runs start from them."""
    upstream_keys = {up for _, _, up in edges}
    by_method: dict[str, int] = {}
    for key in upstream_keys:
        by_method[keyed[key].method] = by_method.get(keyed[key].method, 0) + 1
    return {"upstream": len(upstream_keys), "dependants": len({run for run, _, _ in edges}),
            "upstream_methods": dict(sorted(by_method.items()))}


def describe_dag(summary: dict[str, Any]) -> str:
    """'3 upstream runs (3 finetune) shared by 24 runs' or '' without stages."""
    if not summary.get("upstream"):
        return ""
    methods = ", ".join(f"{n} {m}" for m, n in summary["upstream_methods"].items())
    return f"{summary['upstream']} upstream runs ({methods}) that {summary['dependants']} runs start from"


class StageGraph(Database):
    """Stage edges in the registry: recording them, the driver's waves, a run's upstreams."""

    @retrying
    def unblock(self, sweep_id: str) -> int:
        """Blocked runs of the sweep back to pending (a new driver retries their upstreams)."""
        member = select(SweepRun.run_key).where(SweepRun.sweep_id == sweep_id)
        with self._write() as connection:
            result = connection.execute(
                update(Run).where(Run.run_key.in_(member), Run.status == RunStatus.BLOCKED)
                .values(status=RunStatus.PENDING, error=None, updated_at=now()))
        return result.rowcount

    @retrying
    def next_wave(self, sweep_id: str, attempted: set[str]) -> list[str]:
        """The sweep's runs to start now, in cell order; blocks the runs that cannot run.

        Ready: pending (or failed, retried once per driver) runs not yet ``attempted``
        by this driver whose upstreams have all finished. Blocked: pending runs with an
        upstream that is failed and already attempted by this driver, cancelled, or
        blocked itself (to a fixed point, so a chain blocks end to end); their error
        names the upstream and its role.
        """
        with self._write() as connection:
            rows = connection.execute(
                select(Run.run_key, Run.status).join(SweepRun, SweepRun.run_key == Run.run_key)
                .where(SweepRun.sweep_id == sweep_id).order_by(SweepRun.position)).all()
            status = {key: st for key, st in rows}
            edges = connection.execute(
                select(RunDep.run_key, RunDep.role, RunDep.upstream_key, Run.status)
                .join(Run, Run.run_key == RunDep.upstream_key)
                .where(RunDep.run_key.in_(select(SweepRun.run_key).where(SweepRun.sweep_id == sweep_id)))).all()
            for _, _, up, st in edges:
                status.setdefault(up, st)  # an upstream outside this sweep still counts
            upstreams: dict[str, list[tuple[str, str]]] = {}
            for run, role, up, _ in edges:
                upstreams.setdefault(run, []).append((role, up))
            blocked = _blocked(status, upstreams, attempted)
            when = now()
            for key, reason in blocked.items():
                connection.execute(update(Run).where(and_(Run.run_key == key, Run.status == RunStatus.PENDING))
                                   .values(status=RunStatus.BLOCKED, error=reason, updated_at=when))
            return [key for key, st in rows
                    if st in (RunStatus.PENDING, RunStatus.FAILED) and key not in attempted and key not in blocked
                    and all(status.get(up) == RunStatus.FINISHED for _, up in upstreams.get(key, ()))]


def _blocked(status: dict[str, str], upstreams: dict[str, list[tuple[str, str]]],
             attempted: set[str]) -> dict[str, str]:
    """{run key: reason} of the pending runs that cannot run (see ``next_wave``), to a fixed point."""
    blocked: dict[str, str] = {}

    def dead(key: str) -> bool:
        if key in blocked:
            return True
        st = status.get(key)
        return st in (RunStatus.CANCELLED, RunStatus.BLOCKED) or (st == RunStatus.FAILED and key in attempted)

    changed = True
    while changed:
        changed = False
        for run, ups in upstreams.items():
            if run in blocked or status.get(run) != RunStatus.PENDING:
                continue
            for role, up in ups:
                if dead(up):
                    why = "blocked" if up in blocked or status.get(up) == RunStatus.BLOCKED else status.get(up)
                    blocked[run] = f"blocked: its {role} run {up} {why}"
                    changed = True
                    break
    return blocked
