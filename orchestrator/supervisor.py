"""The supervisor: resumes a sweep whose driver died, and reconciles runs whose worker died.

One per registry on each cluster: a Ray Job (``python -m orchestrator.supervisor``) that
``submit`` and ``resume`` start when none runs (``ensure``). It lives as long as the head
(``python -m orchestrator.cluster stop`` ends it with the head's other processes), holds no
CPU (a job's entrypoint asks for none), opens no port, and talks only to the registry and to
the head's Jobs API (HTTP, as the CLI does). Every ``HEADSWEEP_SUPERVISOR_POLL_S`` seconds
(default 5) it looks at the sweeps with automatic resumes (``Registry.supervised_sweeps``)
and does what ``decide`` says:

- a live sweep whose driver job FAILED or was STOPPED (killed, crashed): the driver is lost
  (``Registry.lose_driver``: the sweep failed, a ``driver_lost`` event), as ``status`` says;
- a sweep with a lost driver and automatic resumes left: resumed as ``headsweep resume``
  does (``sweeps.start_driver``: a new driver over what is not finished; it reconciles the
  dead driver's runs), recorded as ``resumed`` (attempt n of the sweep's ``auto_resumes``,
  ``settings.auto_resumes()`` at submit, 0 with ``--no-auto-resume``); used up: ``gave_up``,
  and the sweep stays failed;
- a live sweep whose driver runs: its orphans, RUNNING runs whose heartbeat stopped
  ``ORPHAN_AFTER_S`` ago, go back to pending (``reconcile``, the driver's own), so they do
  not wait for the next driver start.

A driver whose job this cluster does not know (its head stopped, or another cluster's driver
in a shared registry) is never resumed automatically: ``status`` says so and names
``headsweep resume``. A manual resume gives the sweep its automatic resumes back.

    python -m orchestrator.supervisor SUBMISSION_ID DASHBOARD ADDRESS
"""

from __future__ import annotations

import hashlib
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any, NamedTuple

from orchestrator import cluster, settings, sweeps
from orchestrator.registry import Registry
from orchestrator.registry.db import now
from orchestrator.registry.history import DRIVER_LOST, GAVE_UP, ORPHANED, RESUMED, WORKER_LOST
from orchestrator.status import SweepStatus

ALIVE = ("PENDING", "RUNNING")
DIED = ("FAILED", "STOPPED")  # the job ended without its driver writing the sweep's final status
LIVE = (SweepStatus.SUBMITTED, SweepStatus.RUNNING)
ORPHAN_AFTER_S = 60.0
"""A run whose heartbeat (every 5 s) is this old while its driver runs: its worker died. Longer than
the driver's own 20 s: Tune retries a dead worker's trial itself, the supervisor catches the rest."""
JOB_PREFIX = "headsweep-supervisor-"


# --------------------------------------------------------------------------- what to do (pure)


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
    cancel_requested, events) and, for a live sweep, its driver job's state."""
    of = sweep["auto_resumes"] or 0
    if sweep["cancel_requested"] or of <= 0:
        return None
    if sweep["status"] in LIVE:
        if state in ALIVE:
            return Action("reconcile")
        return Action("lose") if state in DIED else None  # SUCCEEDED: it wrote the final status
    events = sweep["events"]
    if sweep["status"] != SweepStatus.FAILED or not events or events[-1]["kind"] != DRIVER_LOST:
        return None
    if events[-1]["detail"].get("state") not in DIED:
        return None  # gone with its head, or not this cluster's: by hand
    used = resumes_used(events)
    return Action("resume", used + 1, of) if used < of else Action("give_up", used, of)


def history(sweep: dict[str, Any]) -> list[str]:
    """``status``'s lines for the sweep's events (``sweep`` with ``events``), oldest first:
    'driver failed at 14:02; resumed automatically (1/3)'."""
    lines: list[str] = []
    open_lost = False  # the last line is a lost driver nothing answered yet
    for event in sweep["events"]:
        kind, detail = event["kind"], event["detail"]
        if kind == DRIVER_LOST:
            word = {"UNKNOWN": "gone (with its Ray head?)"}.get(detail["state"], detail["state"].lower())
            orphaned = detail.get("orphaned")
            lines.append(f"driver {word} at {_clock(event['at'])}"
                         + (f"; {_runs(orphaned)} orphaned" if orphaned else ""))
            open_lost = True
            continue
        if kind in (WORKER_LOST, ORPHANED):  # about runs, not the driver: a line of its own
            lines.append(run_event(kind, detail, _clock(event["at"])))
            continue
        if kind == RESUMED:
            text = f"resumed automatically ({detail['attempt']}/{detail['of']})" if detail.get("auto") else "resumed by hand"
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
            lines.append(f"{text} at {_clock(event['at'])}")
        open_lost = False
    if open_lost:
        action = decide(sweep)
        lines[-1] += ("; the supervisor resumes it within seconds" if action and action.kind == "resume"
                      else f"; `headsweep resume {sweep['id']}` runs what is left")
    return lines


def run_event(kind: str, detail: dict[str, Any], clock: str) -> str:
    """One line for a run's lost worker ('worker of run 3f2a9c01d4e5 died at 14:02 (attempt 1): Tune
    retried it') or for runs reconciled while the driver lived."""
    if kind == ORPHANED:
        keys = detail["run_keys"]
        return (f"{_runs(len(keys))} orphaned at {clock} (worker stopped heartbeating): back to pending "
                f"({', '.join(key[:12] for key in keys[:5])}{', ...' if len(keys) > 5 else ''})")
    then = {"retried": "Tune retried it",
            "failed": "no retry left (max_failures), the run failed; --rerun-failed requeues it"}
    return (f"worker of run {detail['run_key'][:12]} died at {clock} (attempt {detail['attempt']}): "
            f"{then.get(detail['then'], detail['then'])}")


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _clock(at: datetime) -> str:
    """A registry time (naive UTC) as this machine's local HH:MM."""
    return at.replace(tzinfo=UTC).astimezone().strftime("%H:%M")


def resume_pending(registry: Registry, sweep_id: str, within_s: float = 120.0) -> bool:
    """The sweep lost its driver less than ``within_s`` ago and the supervisor is to resume it
    (``wait`` keeps following it)."""
    sweep = registry.get_sweep(sweep_id) | {"events": registry.events(sweep_id)}
    action = decide(sweep)
    return (action is not None and action.kind == "resume"
            and (now() - sweep["events"][-1]["at"]).total_seconds() < within_s)


# --------------------------------------------------------------------------- doing it


def reconcile(registry: Registry, sweep_id: str, stale_after_s: float, tracking_uri: str | None) -> list[str]:
    """Runs left RUNNING by a dead worker or driver: back to pending, their MLflow runs KILLED.
    (The driver's, at every start and while it waits; the supervisor's while a driver runs.)"""
    orphans = registry.reset_orphans(sweep_id, stale_after_s)
    if orphans and tracking_uri:
        from orchestrator import tracking

        mlflow = tracking.client(tracking_uri)
        for orphan in orphans:
            if orphan.get("mlflow_run_id"):
                mlflow.set_tag(orphan["mlflow_run_id"], "error", "orphaned: worker stopped heartbeating")
                mlflow.set_terminated(orphan["mlflow_run_id"], status="KILLED")
    return [orphan["run_key"] for orphan in orphans]


def job_state(dashboard: str, driver: str) -> tuple[str, datetime | None]:
    """The driver job's state (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED or UNKNOWN) and when it ended."""
    state, ended = cluster.driver_job(dashboard, driver)
    return state, (datetime.fromtimestamp(ended, UTC).replace(tzinfo=None) if ended else None)


def tick(registry: Registry, head: dict[str, str], job=job_state, start=sweeps.start_driver) -> list[str]:
    """One look at every supervised sweep; returns what it did, one line each.

    ``job(dashboard, driver) -> (state, ended_at)`` and ``start(registry, sweep_id, head, track)``
    are the Jobs API calls (tests pass their own)."""
    done = []
    for sweep in registry.supervised_sweeps():
        sweep_id, tracked = sweep["id"], bool(sweep["mlflow_parent_run_id"])
        state, ended = job(head["dashboard"], sweep["driver"]) if sweep["status"] in LIVE else (None, None)
        action = decide(sweep, state)
        if action and action.kind == "reconcile":
            orphans = reconcile(registry, sweep_id, ORPHAN_AFTER_S, settings.tracking_uri() if tracked else None)
            if orphans:
                registry.add_event(sweep_id, ORPHANED, {"run_keys": orphans})
                done.append(f"{sweep_id}: {len(orphans)} orphaned runs back to pending: {', '.join(orphans)}")
            continue
        if action and action.kind == "lose":
            if not registry.lose_driver(sweep_id, sweep["driver"], state, ended):
                continue  # its driver wrote the final status meanwhile, or `status` noticed first
            done.append(f"{sweep_id}: driver {sweep['driver']} {state.lower()}")
            sweep = sweep | {"status": SweepStatus.FAILED, "events": registry.events(sweep_id)}
            action = decide(sweep)
        if action and action.kind == "resume":
            detail: dict[str, Any] = {"auto": True, "attempt": action.attempt, "of": action.of}
            try:
                detail["driver"] = start(registry, sweep_id, head, tracked)
            except Exception as err:  # noqa: BLE001 - recorded: status shows it
                detail["error"] = f"{type(err).__name__}: {err}"[:500]
            registry.add_event(sweep_id, RESUMED, detail)
            done.append(f"{sweep_id}: resumed automatically ({action.attempt}/{action.of}): {detail}")
        elif action and action.kind == "give_up":
            registry.add_event(sweep_id, GAVE_UP, {"used": action.attempt, "of": action.of})
            if tracked:
                from orchestrator import tracking

                tracking.client().set_terminated(sweep["mlflow_parent_run_id"], status="FAILED")
            done.append(f"{sweep_id}: {action.of} automatic resumes used up; failed")
    return done


# --------------------------------------------------------------------------- the job


def job_prefix(registry_url: str) -> str:
    """Submission ids of the supervisor jobs of this registry start with this."""
    return f"{JOB_PREFIX}{hashlib.sha256(registry_url.encode()).hexdigest()[:12]}-"


def running(dashboard: str, registry_url: str | None = None) -> list[str]:
    """Submission ids of this registry's supervisor jobs that are pending or running, oldest first."""
    prefix = job_prefix(registry_url or settings.registry_url())
    jobs = cluster.job_client(dashboard).list_jobs()
    return sorted(job.submission_id for job in jobs
                  if (job.submission_id or "").startswith(prefix) and str(job.status.value) in ALIVE)


def ensure(head: dict[str, str]) -> str:
    """The submission id of this registry's supervisor on ``head``'s cluster, started if none runs."""
    found = running(head["dashboard"])
    if found:
        return found[0]
    submission_id = f"{job_prefix(settings.registry_url())}{time.time_ns() // 1_000_000}"
    env = sweeps.driver_env(head, track=True) | {"HEADSWEEP_SUPERVISOR_POLL_S": str(settings.supervisor_poll_s())}
    cluster.job_client(head["dashboard"]).submit_job(
        entrypoint=f"{sys.executable} -m orchestrator.supervisor {submission_id} {head['dashboard']} {head['address']}",
        submission_id=submission_id, runtime_env=cluster.job_runtime_env(env), entrypoint_num_cpus=0,
    )
    return submission_id


def stop(dashboard: str, registry_url: str | None = None) -> list[str]:
    """Stop this registry's supervisor jobs on the cluster (tests; the head's stop ends them too)."""
    found = running(dashboard, registry_url)
    for submission_id in found:
        cluster.stop_driver(dashboard, submission_id)
    return found


def main(argv: list[str] | None = None) -> int:
    submission_id, dashboard, address = (argv if argv is not None else sys.argv[1:])[:3]
    head = {"dashboard": dashboard, "address": address}
    registry = Registry(settings.registry_url())
    poll_s = settings.supervisor_poll_s()
    first = running(dashboard)[:1]
    if first and first[0] != submission_id:  # two submits raced: the older supervisor stays
        print(f"supervisor {first[0]} already watches {registry.url}; exiting", flush=True)
        return 0
    print(f"supervisor {submission_id}: watching {registry.url} every {poll_s:g} s", flush=True)
    while True:
        try:
            for line in tick(registry, head):
                print(f"{datetime.now():%H:%M:%S} {line}", flush=True)
        except Exception:  # noqa: BLE001 - a database or Jobs API hiccup: the next look tries again
            traceback.print_exc()
        time.sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main())
