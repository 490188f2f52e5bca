"""The states of runs and sweeps: one enum each, shared by the registry, the CLI and analysis.

``StrEnum`` members compare equal to their text (``RunStatus.FINISHED == "finished"``), so
the registry stores plain strings and callers may still write the text. No imports beyond
the standard library: the CLI reads these without loading SQLAlchemy.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "pending"
    """Waiting for a worker (new, requeued, or reset after its worker died)."""
    RUNNING = "running"
    """Claimed by a worker that heartbeats."""
    FINISHED = "finished"
    """Done, with its metrics and maps stored."""
    FAILED = "failed"
    """Its last attempt raised; the traceback is kept."""
    CANCELLED = "cancelled"
    """Its sweep (or the run alone, ``Registry.cancel_run``) was cancelled before it finished."""
    BLOCKED = "blocked"
    """An upstream run it starts from (a stage) failed, was cancelled or is blocked itself; the
    error names it. Not failed: it never ran. Resume or resubmit tries it again."""


RUN_DONE = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BLOCKED)
"""Statuses no worker will change again without a resubmit: progress counts these."""


class SweepStatus(StrEnum):
    SUBMITTED = "submitted"
    RUNNING = "running"
    FINISHED = "finished"
    """Every run finished."""
    FAILED = "failed"
    """The driver stopped with runs failed or left over."""
    CANCELLED = "cancelled"
    """Cancelled, or every run that did not finish was cancelled one by one."""


SWEEP_DONE = (SweepStatus.FINISHED, SweepStatus.FAILED, SweepStatus.CANCELLED)
"""Statuses of a sweep whose driver has ended."""
