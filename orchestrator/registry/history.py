"""A sweep's history as a person reads it: the lines ``status`` and ``GET /sweeps/{id}`` print
for the sweep's events (``events``: their kinds and how they are recorded), e.g. 'driver failed at
14:02; resumed automatically (1/3)'. Pure; the analysis service reads it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import takewhile
from typing import Any

from orchestrator.registry.events import (
    ALLOCATION_ENDED,
    DRIVER_LOST,
    GAVE_UP,
    ORPHANED,
    RESUMED,
    WORKER_LOST,
)
from orchestrator.registry.supervision import decide

NODE_BURST_S = 60.0
"""Workers of one Ray node lost within this many seconds of the first are one loss of the node."""


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


def worker_node(worker: str | None) -> tuple[str, str] | None:
    """(node id, IP) of a worker as ``orchestrator.driving.trial.worker_name`` names it; None for a worker recorded without them (``host:pid``)."""
    found = re.search(r"\[(\w+) ([^\]]+)\]:\d+$", worker or "")
    return (found[1], found[2]) if found else None


def worker_where(worker: str | None) -> str:
    """Where a worker (``trial.worker_name``) ran, for a person: 'gpu7 (Ray node 3f2a9c01, 10.0.0.7)' ("" when it
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
