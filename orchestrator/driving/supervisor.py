"""The supervisor: resumes a sweep whose driver died, and reconciles runs whose worker died.

One per registry on each cluster: a Ray Job (``python -m orchestrator.driving.supervisor``) that
``submit`` and ``resume`` start when none runs (``ensure``). It lives as long as the head
(``python -m orchestrator.cluster.head stop`` ends it with the head's other processes), holds no
CPU (a job's entrypoint asks for none), opens no port, and talks only to the registry and to
the head's Jobs API (HTTP, as the CLI does). Every ``HEADSWEEP_SUPERVISOR_POLL_S`` seconds
(default 5) it looks at the live sweeps and the lost ones with automatic resumes
(``Registry.supervised_sweeps``) and does what ``registry.supervision.decide`` says:

- a live sweep whose driver job FAILED or was STOPPED (killed, crashed), automatic resumes
  or not: the driver is lost (``Registry.lose_driver``: the sweep failed, a ``driver_lost``
  event), as ``status`` says. Driver liveness is recorded here, in the registry, where every
  reader finds it: the analysis service only reads it;
- a sweep with a lost driver and automatic resumes left: resumed as ``headsweep resume``
  does (``driver_job.start_driver``: a new driver over what is not finished; it reconciles the
  dead driver's runs), recorded as ``resumed`` (attempt n of the sweep's ``auto_resumes``,
  ``settings.auto_resumes()`` at submit, 0 with ``--no-auto-resume``); used up: ``gave_up``,
  and the sweep stays failed;
- a live sweep whose driver runs: its orphans, RUNNING runs whose heartbeat stopped
  ``ORPHAN_AFTER_S`` ago, go back to pending (``reconcile``, the driver's own), so they do
  not wait for the next driver start.

A driver whose job this cluster does not know (its head stopped, or another cluster's driver
in a shared registry) is neither lost nor resumed here: ``status`` and ``ls`` record it
(``driver_job.driver_gone``) and name ``headsweep resume``. A manual resume gives the sweep its automatic resumes back.

    python -m orchestrator.driving.supervisor SUBMISSION_ID DASHBOARD ADDRESS
"""

from __future__ import annotations

import hashlib
import sys
import time
import traceback
from datetime import datetime
from typing import Any

from orchestrator import settings
from orchestrator.cluster import jobs
from orchestrator.cluster.head import known_dashboard
from orchestrator.cluster.packaging import job_runtime_env
from orchestrator.driving import writer
from orchestrator.driving.driver_job import driver_env, start_driver
from orchestrator.registry import Registry
from orchestrator.registry.events import GAVE_UP, LIVE, ORPHANED, RESUMED
from orchestrator.registry.supervision import ALIVE, decide
from orchestrator.status import SweepStatus

ORPHAN_AFTER_S = 60.0
"""A run whose heartbeat (every 5 s) is this old while its driver runs: its worker died. Longer than
the driver's own 20 s: Tune retries a dead worker's trial itself, the supervisor catches the rest."""
JOB_PREFIX = "headsweep-supervisor-"


# --------------------------------------------------------------------------- doing it


def tick(registry: Registry, head: dict[str, str], job=jobs.job_state, start=start_driver) -> list[str]:
    """One look at every supervised sweep; returns what it did, one line each.

    ``job(dashboard, driver) -> (state, ended_at)`` and ``start(registry, sweep_id, head, track)``
    are the Jobs API calls (tests pass their own)."""
    done = []
    for sweep in registry.supervised_sweeps():
        sweep_id, tracked = sweep["id"], bool(sweep["mlflow_parent_run_id"])
        state, ended = job(head["dashboard"], sweep["driver"]) if sweep["status"] in LIVE else (None, None)
        action = decide(sweep, state)
        if action and action.kind == "reconcile":
            states = writer.of_sweep(sweep_id, registry, settings.tracking_uri() if tracked else None)
            orphans = states.reset_orphans(sweep_id, ORPHAN_AFTER_S)
            if orphans:
                registry.add_event(sweep_id, ORPHANED, {"run_keys": list(orphans), "workers": list(orphans.values())})
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
            writer.of_sweep(sweep_id, registry, settings.tracking_uri() if tracked else None).sweep_mlflow_status(
                sweep["mlflow_parent_run_id"], SweepStatus.FAILED)
            done.append(f"{sweep_id}: {action.of} automatic resumes used up; failed")
    return done


# --------------------------------------------------------------------------- the job


def job_prefix(registry_url: str) -> str:
    """Submission ids of the supervisor jobs of this registry start with this."""
    return f"{JOB_PREFIX}{hashlib.sha256(registry_url.encode()).hexdigest()[:12]}-"


def running(dashboard: str, registry_url: str | None = None) -> list[str]:
    """Submission ids of this registry's supervisor jobs that are pending or running, oldest first."""
    prefix = job_prefix(registry_url or settings.registry_url())
    found = jobs.job_client(dashboard).list_jobs()
    return sorted(job.submission_id for job in found
                  if (job.submission_id or "").startswith(prefix) and str(job.status.value) in ALIVE)


def watching() -> bool:
    """Whether a supervisor of this registry runs on the cluster in use (``status`` and ``wait`` ask
    before they promise an automatic resume: Ray's OOM killer can take it with the driver). True
    when it cannot tell: no local head on record, or its Jobs API does not answer."""
    dashboard = known_dashboard()
    try:
        return not dashboard or bool(running(dashboard))
    except Exception:  # noqa: BLE001 - a head that is gone or busy: say nothing rather than alarm
        return True


def ensure(head: dict[str, str]) -> str:
    """The submission id of this registry's supervisor on ``head``'s cluster, started if none runs."""
    found = running(head["dashboard"])
    if found:
        return found[0]
    submission_id = f"{job_prefix(settings.registry_url())}{time.time_ns() // 1_000_000}"
    env = driver_env(head, track=True) | {"HEADSWEEP_SUPERVISOR_POLL_S": str(settings.supervisor_poll_s())}
    client = jobs.job_client(head["dashboard"])
    with jobs.ray_logs_to(settings.home() / "logs" / "supervisor.log"):
        client.submit_job(
            entrypoint=f"{sys.executable} -m orchestrator.driving.supervisor {submission_id} {head['dashboard']} {head['address']}",
            submission_id=submission_id, runtime_env=job_runtime_env(env), entrypoint_num_cpus=0,
        )
    return submission_id


def stop(dashboard: str, registry_url: str | None = None) -> list[str]:
    """Stop this registry's supervisor jobs on the cluster (tests; the head's stop ends them too)."""
    found = running(dashboard, registry_url)
    for submission_id in found:
        jobs.stop_job(dashboard, submission_id)
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
