"""The supervisor's policy: what it does with a sweep, given the sweep's recorded events and its
driver's Ray job state (:data:`ALIVE`, :data:`DIED`). Pure; below the supervisor, the sweep
commands (``wait`` follows a sweep whose resume is pending) and ``history`` (which says when the
supervisor is to resume a sweep)."""

from __future__ import annotations

from typing import Any, NamedTuple

from orchestrator.registry.db import now
from orchestrator.registry.events import DRIVER_LOST, LIVE, RESUMED
from orchestrator.status import SweepStatus

ALIVE = ("PENDING", "RUNNING")
"""States of a driver's Ray job while it lives."""
DIED = ("FAILED", "STOPPED")
"""States of a driver's Ray job that ended without its driver writing the sweep's final status."""


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
