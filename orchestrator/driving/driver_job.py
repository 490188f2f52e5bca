"""A sweep's driver: the Ray Job that runs it, and whether it still lives.

Below both who start drivers, the sweep commands (``orchestrator.driving.sweeps``: submit, resume)
and the supervisor (``orchestrator.driving.supervisor``: automatic resumes), so neither imports the other's
way of starting one. Driver liveness is the orchestrator's to record: the supervisor records a
dead driver within seconds, ``status``, ``ls`` and ``wait`` when they look (:func:`driver_gone`),
into the registry, where every reader (the analysis service included) finds it.
"""

from __future__ import annotations

import os
import sys
import time

from orchestrator import hub, settings
from orchestrator.cluster import jobs
from orchestrator.cluster.head import cluster_in_use, known_dashboard
from orchestrator.cluster.packaging import job_runtime_env
from orchestrator.driving.writer import lease_path
from orchestrator.registry import Registry
from orchestrator.registry.history import history
from orchestrator.registry.supervision import ALIVE
from orchestrator.status import SWEEP_DONE


def driver_env(head: dict[str, str], track: bool) -> dict[str, str]:
    """Environment of the driver job and its trials: where the registry, MLflow, Ray and the data
    are. The data root is resolved here, where the grid was validated: the trials import the
    shipped code from Ray's package cache, where the default ``../shared/data`` is not beside it."""
    from experiments.tasks.parts import default_data_dir

    return {
        "HEADSWEEP_HOME": str(settings.home()),
        "HEADSWEEP_DATA": str(default_data_dir().resolve()),
        "HEADSWEEP_DB": settings.registry_url(),
        "HEADSWEEP_TRACKING_URI": settings.tracking_uri(),
        "HEADSWEEP_TRACK": "1" if track else "0",
        "RAY_ADDRESS": head["address"],
        **hub.trial_env(),  # the caches the submit filled, read offline (orchestrator/hub.py)
        "TOKENIZERS_PARALLELISM": "false",
        # plug-in methods: the job ships their modules (packaging.plugin_code); the trials import them by name
        **({"HEADSWEEP_METHODS": os.environ["HEADSWEEP_METHODS"]} if os.environ.get("HEADSWEEP_METHODS") else {}),
    }


def start_driver(registry: Registry, sweep_id: str, head: dict[str, str] | None = None, track: bool = True) -> str | None:
    """Submit the sweep's driver as a Ray Job (None, and the sweep marked finished, if nothing is left)."""
    if not registry.unfinished(sweep_id):
        registry.set_sweep(sweep_id, status="finished")
        return None
    head = head or cluster_in_use()
    submission = submit_driver(head["dashboard"], sweep_id, driver_env(head, track))
    registry.set_sweep(sweep_id, driver=submission, status="submitted")
    return submission


def submit_driver(dashboard: str, sweep_id: str, env: dict[str, str]) -> str:
    """Start the sweep's Ray Job (``python -m headsweep.sweep_job SWEEP``: the driver, then the sweep's
    report); return the job's submission id.
    Ray's own INFO lines go to ``$HEADSWEEP_HOME/logs/<sweep>.log``."""
    client = jobs.job_client(dashboard)  # imports Ray, which sets up its loggers: redirect them after
    with jobs.ray_logs_to(settings.home() / "logs" / f"{sweep_id}.log"):
        return _submit_driver(client, sweep_id, env)


def _submit_driver(client, sweep_id: str, env: dict[str, str]) -> str:
    submission_id = f"{sweep_id}-driver-{int(time.time())}"
    for attempt in range(10):  # a just-started node's job agent may not be up yet
        try:
            client.submit_job(
                # the driver, then the sweep's report (headsweep/sweep_job.py: the top level joins the
                # orchestrator's driver and analysis's report); the job's status is the driver's
                entrypoint=f"{sys.executable} -m headsweep.sweep_job {sweep_id}",
                submission_id=submission_id,
                runtime_env=job_runtime_env(env),
            )
            return submission_id
        except RuntimeError as err:
            if "No available agent" not in str(err) or attempt == 9:
                raise
            time.sleep(1)
    return submission_id


STARTING_S = 30.0
"""How long a driver may take to start (Ray's job, its runtime env, its imports) before ``wait`` says why."""


def driver_starting(sweep: dict) -> str | None:
    """Why a submitted sweep runs nothing yet, once its driver's Ray job is ``STARTING_S`` old and has not
    marked the sweep running, e.g. "its driver's Ray job is PENDING 64 s after submission: Job has not
    started yet. It may be waiting for ... the runtime environment to be set up."; None else."""
    if sweep["status"] != "submitted" or not sweep.get("driver"):
        return None
    job = jobs.job_since(known_dashboard(), sweep["driver"])
    if job is None or job[0] not in ALIVE or job[1] < STARTING_S:
        return None
    state, age, message = job
    started = {"RUNNING": "is RUNNING but has not started the sweep"}.get(state, f"is {state}")
    return f"its driver's Ray job {started} {age:.0f} s after submission" + (f": {message}" if message else "")


def driver_alive(sweep: dict) -> bool:
    driver = sweep.get("driver") or ""
    return bool(driver) and jobs.job_state(known_dashboard(), driver)[0] in ALIVE


def driver_gone(registry: Registry, sweep: dict) -> str | None:
    """Why a sweep that is not done has lost its driver (its Ray job failed, was stopped or is gone
    with its head), after marking the sweep failed and recording it in the sweep's history, so
    ``status``, ``ls`` and the analysis service never show a dead sweep as running; None while the
    driver runs, or when the sweep is done or never had a driver.

    Unlike the supervisor, it also records a driver this cluster does not know (UNKNOWN: gone with
    its head, whose supervisor went with it)."""
    driver = sweep.get("driver") or ""
    if sweep["status"] in SWEEP_DONE or not driver or lease_path(registry.url) is not None:
        # a SQLite registry on a network filesystem is written from the sweep's host alone: there its
        # supervisor and its SLURM allocation record a lost driver; another host (a login node, which
        # does not see the cluster's jobs) only reads it
        return None
    state, ended = jobs.job_state(known_dashboard(), driver)
    if state in ALIVE or not registry.lose_driver(sweep["id"], driver, state, ended):
        return None  # alive, or it ended after writing the sweep's final status, or was noticed already
    return history(registry.get_sweep(sweep["id"]) | {"events": registry.events(sweep["id"])})[-1]
