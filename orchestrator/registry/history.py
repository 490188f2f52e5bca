"""A sweep's history: the events the supervisor acts on and ``status`` shows.

Kinds (``detail`` in brackets): ``driver_lost`` {driver, state, orphaned}: the sweep's Ray job
ended without the driver writing the sweep's final status (killed, crashed, its head gone), with
``orphaned`` runs still RUNNING then; ``worker_lost`` {run_key, worker, attempt, then}: a trial's
worker process died mid-run (killed, out of memory, its Ray node lost) and Tune ``retried`` the
run or ``failed`` it (no retry left); the worker (:func:`worker_name`) names its Ray node, and the
runs lost with one node at once are one line of ``status``; ``orphaned`` {run_keys}: runs whose
worker stopped heartbeating while the driver lived, back to pending;
``resumed`` {driver, auto, attempt, of, by}: a new driver, by hand (``headsweep resume``; ``by``
names who, e.g. the SLURM job that resumed it) or by the supervisor; ``gave_up`` {used, of}: the automatic resumes are used up.

Reading them is pure and lives here, below the supervisor, the sweep commands and the analysis
service (which read it): :func:`decide` (what the supervisor does with a sweep, given its driver
job's state) and :func:`history` (the lines ``status`` and ``GET /sweeps/{id}`` print).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import takewhile
from typing import Any, NamedTuple

from sqlalchemy import func, insert, select, update

from orchestrator.registry.db import Database, now, retrying
from orchestrator.registry.reader import in_sweep
from orchestrator.registry.schema import Run, Sweep, SweepEvent
from orchestrator.status import RunStatus, SweepStatus

DRIVER_LOST, RESUMED, GAVE_UP = "driver_lost", "resumed", "gave_up"
WORKER_LOST, ORPHANED = "worker_lost", "orphaned"
LIVE = (SweepStatus.SUBMITTED, SweepStatus.RUNNING)
ALIVE = ("PENDING", "RUNNING")
"""States of a driver's Ray job while it lives."""
DIED = ("FAILED", "STOPPED")
"""States of a driver's Ray job that ended without its driver writing the sweep's final status."""
NODE_BURST_S = 60.0
"""Workers of one Ray node lost within this many seconds of the first are one loss of the node."""
ALLOCATION_ENDED = "ALLOCATION_ENDED"
"""The state of a driver that ended with its SLURM allocation (``orchestrator/slurm/``): not
resumed by the supervisor (its Ray goes too), but by the job's next allocation."""
_FIELDS = (Sweep.id, Sweep.status, Sweep.driver, Sweep.auto_resumes, Sweep.cancel_requested,
           Sweep.mlflow_parent_run_id)


class SweepHistory(Database):
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


# --------------------------------------------------------------------------- reading it (pure)


class Action(NamedTuple):
    kind: str  # reconcile | lose | resume | give_up
    attempt: int = 0  # resume: this automatic resume's number; give_up: how many were used
    of: int = 0  # the sweep's auto_resumes


def resumes_used(events: list[dict[str, Any]]) -> int:
    """Automatic resumes since the sweep was submitted or last resumed by hand."""
    used = 0
    for event in events:
        if event["kind"] == RESUMED:
            used = used + 1 if event["detail"].get("auto") else 0
    return used


def decide(sweep: dict[str, Any], state: str | None = None) -> Action | None:
    """What the supervisor does with one sweep: a ``supervised_sweeps`` row (status, auto_resumes,
    cancel_requested, events) and, for a live sweep, its driver job's state.

    A live sweep whose driver died is lost whatever its automatic resumes, so that no reader (the
    analysis service reads only) ever sees it "running"; reconciling a live sweep's orphans and
    resuming a lost one only with automatic resumes on and no cancel."""
    of = sweep["auto_resumes"] or 0
    acts = of > 0 and not sweep["cancel_requested"]
    if sweep["status"] in LIVE:
        if state in DIED:
            return Action("lose")
        return Action("reconcile") if acts and state in ALIVE else None  # SUCCEEDED: it wrote the final status
    events = sweep["events"]
    if not acts or sweep["status"] != SweepStatus.FAILED or not events or events[-1]["kind"] != DRIVER_LOST:
        return None
    if events[-1]["detail"].get("state") not in DIED:
        return None  # gone with its head, or not this cluster's: by hand
    used = resumes_used(events)
    return Action("resume", used + 1, of) if used < of else Action("give_up", used, of)


def resume_pending(sweep: dict[str, Any], within_s: float = 120.0) -> bool:
    """The sweep (with ``events``) lost its driver less than ``within_s`` ago and the supervisor is
    to resume it (``wait`` keeps following it while a supervisor runs)."""
    action = decide(sweep)
    return (action is not None and action.kind == "resume"
            and (now() - sweep["events"][-1]["at"]).total_seconds() < within_s)


def history(sweep: dict[str, Any], supervised: Callable[[], bool] = lambda: True) -> list[str]:
    """``status``'s lines for the sweep's events (``sweep`` with ``events``), oldest first:
    'driver failed at 14:02; resumed automatically (1/3)'. ``supervised``: asked only when a lost driver
    awaits its automatic resume, whether a supervisor runs to do it (not when its Ray job died too,
    e.g. the OOM killer took both)."""
    lines: list[str] = []
    open_lost = False  # the last line is a lost driver nothing answered yet
    for event in _node_losses(sweep["events"]):
        kind, detail = event["kind"], event["detail"]
        if kind == WORKER_LOST and len(event["lost"]) > 1:  # a lost node: one line for its runs
            lines.append(node_lost(event["lost"], clock(event["at"])))
            continue
        if kind == DRIVER_LOST:
            word = {"UNKNOWN": "gone (with its Ray head?)", ALLOCATION_ENDED: "ended with its SLURM allocation"}.get(
                detail["state"], detail["state"].lower())
            orphaned = detail.get("orphaned")
            lines.append(f"driver {word} at {clock(event['at'])}"
                         + (f"; {_runs(orphaned)} orphaned" if orphaned else ""))
            open_lost = True
            continue
        if kind in (WORKER_LOST, ORPHANED):  # about runs, not the driver: a line of its own
            lines.append(run_event(kind, detail, clock(event["at"])))
            continue
        if kind == RESUMED:
            text = (f"resumed automatically ({detail['attempt']}/{detail['of']})" if detail.get("auto")
                    else f"resumed by {detail.get('by') or 'hand'}")
            if detail.get("error"):
                text = f"automatic resume ({detail['attempt']}/{detail['of']}) failed: {detail['error']}"
            elif not detail.get("driver"):
                text += ": nothing was left to run"
        elif kind == GAVE_UP:
            text = (f"not resumed: its {detail['of']} automatic resumes are used up, the sweep failed; "
                    f"`headsweep resume {sweep['id']}` runs what is left")
        else:
            text = f"{kind} {detail}"
        if open_lost:
            lines[-1] += f"; {text}"
        else:
            lines.append(f"{text} at {clock(event['at'])}")
        open_lost = False
    if open_lost:
        action = decide(sweep)
        awaited = action is not None and action.kind == "resume"
        if awaited and supervised():
            lines[-1] += "; the supervisor resumes it within seconds"
        else:
            lines[-1] += ("; no supervisor runs to resume it (its Ray job ended too)" if awaited
                          else "") + f"; `headsweep resume {sweep['id']}` runs what is left"
    return lines


def run_event(kind: str, detail: dict[str, Any], when: str) -> str:
    """One line for a run's lost worker ('worker of run 3f2a9c01d4e5 died at 14:02 (attempt 1): Tune
    retried it') or for runs reconciled while the driver lived."""
    if kind == ORPHANED:
        keys = detail["run_keys"]
        places = sorted({where for where in map(worker_where, detail.get("workers", [])) if where})
        return (f"{_runs(len(keys))} orphaned at {when}{' on ' + ', '.join(places) if places else ''} (worker "
                "stopped heartbeating): back to pending "
                f"({', '.join(key[:12] for key in keys[:5])}{', ...' if len(keys) > 5 else ''})")
    then = {"retried": "Tune retried it",
            "failed": "no retry left (max_failures), the run failed; --rerun-failed requeues it"}
    where = worker_where(detail.get("worker"))
    return (f"worker of run {detail['run_key'][:12]} died at {when} (attempt {detail['attempt']})"
            + (f" on {where}" if where else "") + f": {then.get(detail['then'], detail['then'])}")


def node_lost(lost: list[dict[str, Any]], when: str) -> str:
    """One line for the runs whose workers died together on one Ray node ('workers lost on gpu7 (Ray
    node 3f2a9c01, 10.0.0.7) at 14:02: 37 runs rerun by Tune'); ``lost``: their ``worker_lost`` details."""
    retried = sum(detail["then"] == "retried" for detail in lost)
    parts = [f"{_runs(retried)} rerun by Tune"] if retried else []
    if len(lost) > retried:
        parts.append(f"{_runs(len(lost) - retried)} failed, no retry left (max_failures); --rerun-failed "
                     "requeues them")
    return f"workers lost on {worker_where(lost[0]['worker'])} at {when}: {'; '.join(parts)}"


def _node_losses(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, each ``worker_lost`` with ``node`` (:func:`worker_node`) and ``lost`` (its detail),
    and those of one node that follow each other (other nodes' between them, nothing else) within
    ``NODE_BURST_S`` of the first as one event whose ``lost`` lists them all: Tune tells of every
    trial of a lost node within seconds, and ``status`` says it once."""
    grouped: list[dict[str, Any]] = []
    for event in events:
        if event["kind"] != WORKER_LOST:
            grouped.append(event)
            continue
        node = worker_node(event["detail"].get("worker"))
        burst = next((g for g in takewhile(lambda g: g["kind"] == WORKER_LOST, reversed(grouped))
                      if node and g["node"] == node and (event["at"] - g["at"]).total_seconds() <= NODE_BURST_S), None)
        if burst is None:
            grouped.append(event | {"node": node, "lost": [event["detail"]]})
        else:
            burst["lost"].append(event["detail"])
    return grouped


def worker_name(trial_id: str, node_id: str, node_ip: str) -> str:
    """Who holds a run, for this process (the ``worker`` of its row and of a ``worker_lost`` event):
    ``<Tune trial id>@<host>[<Ray node id, 8 hex> <node IP>]:<pid>``, e.g. ``a1b2c_00003@gpu7[3f2a9c01
    10.0.0.7]:4242``. The trial id first (:func:`worker_trial`: a retry of the same trial takes its
    run over), the pid last; the Ray node tells apart nodes that share a host name (containers,
    nodes simulated on one machine), so ``status`` can say which node was lost."""
    return f"{trial_id}@{socket.gethostname()}[{node_id[:8]} {node_ip}]:{os.getpid()}"


def worker_trial(worker: str | None) -> str:
    """The Tune trial id of a :func:`worker_name` ("" for none)."""
    return (worker or "").split("@", 1)[0]


def worker_node(worker: str | None) -> tuple[str, str] | None:
    """(node id, IP) of a :func:`worker_name`; None for a worker recorded without them (``host:pid``)."""
    found = re.search(r"\[(\w+) ([^\]]+)\]:\d+$", worker or "")
    return (found[1], found[2]) if found else None


def worker_where(worker: str | None) -> str:
    """Where a :func:`worker_name` ran, for a person: 'gpu7 (Ray node 3f2a9c01, 10.0.0.7)' ("" when it
    was recorded without its node)."""
    node = worker_node(worker)
    if node is None:
        return ""
    host = (worker or "").split("@", 1)[-1].split("[", 1)[0]
    return f"{host} (Ray node {node[0]}, {node[1]})"


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def clock(at: datetime) -> str:
    """A registry time (naive UTC) as this machine's local HH:MM."""
    return at.replace(tzinfo=UTC).astimezone().strftime("%H:%M")
