"""A sweep's driver: the Ray Job that runs it, and whether it still lives.

Below both who start drivers, the sweep commands (``orchestrator.sweeps``: submit, resume) and
the supervisor (``orchestrator.supervisor``: automatic resumes), so neither imports the other's
way of starting one. Driver liveness is the orchestrator's to record: the supervisor records a
dead driver within seconds, ``status``, ``ls`` and ``wait`` when they look (:func:`driver_gone`),
into the registry, where every reader (the analysis service included) finds it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from orchestrator import cluster, settings
from orchestrator.registry import Registry
from orchestrator.registry.history import ALIVE, history
from orchestrator.status import SWEEP_DONE


def head() -> dict[str, str]:
    """The cluster to use: RAY_ADDRESS + HEADSWEEP_RAY_DASHBOARD if set, else the local head."""
    if os.environ.get("HEADSWEEP_RAY_DASHBOARD"):
        return {"address": os.environ.get("RAY_ADDRESS", "auto"), "dashboard": os.environ["HEADSWEEP_RAY_DASHBOARD"]}
    return cluster.local_head()


def driver_env(head: dict[str, str], track: bool) -> dict[str, str]:
    """Environment of the driver job and its trials: where the registry, MLflow, Ray and the data
    are. The data root is resolved here, where the grid was validated: the trials import the
    shipped code from Ray's package cache, where the default ``../shared/data`` is not beside it."""
    from experiments.tasks._common import default_data_dir

    return {
        "HEADSWEEP_HOME": str(settings.home()),
        "HEADSWEEP_DATA": str(default_data_dir().resolve()),
        "HEADSWEEP_DB": settings.registry_url(),
        "HEADSWEEP_TRACKING_URI": settings.tracking_uri(),
        "HEADSWEEP_TRACK": "1" if track else "0",
        "RAY_ADDRESS": head["address"],
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # plug-in methods: the job ships their modules (cluster.plugin_code); the trials import them by name
        **({"HEADSWEEP_METHODS": os.environ["HEADSWEEP_METHODS"]} if os.environ.get("HEADSWEEP_METHODS") else {}),
    }


def start_driver(registry: Registry, sweep_id: str, where: dict[str, str] | None = None, track: bool = True) -> str | None:
    """Submit the sweep's driver as a Ray Job (None, and the sweep marked finished, if nothing is left)."""
    if not registry.unfinished(sweep_id):
        registry.set_sweep(sweep_id, status="finished")
        return None
    where = where or head()
    submission = cluster.submit_driver(where["dashboard"], sweep_id, driver_env(where, track))
    registry.set_sweep(sweep_id, driver=submission, status="submitted")
    return submission


def job_state(dashboard: str, driver: str) -> tuple[str, datetime | None]:
    """The driver job's state (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED or UNKNOWN) and when it ended."""
    state, ended = cluster.driver_job(dashboard, driver)
    return state, (datetime.fromtimestamp(ended, UTC).replace(tzinfo=None) if ended else None)


STARTING_S = 30.0
"""How long a driver may take to start (Ray's job, its runtime env, its imports) before ``wait`` says why."""


def driver_starting(sweep: dict) -> str | None:
    """Why a submitted sweep runs nothing yet, once its driver's Ray job is ``STARTING_S`` old and has not
    marked the sweep running, e.g. "its driver's Ray job is PENDING 64 s after submission: Job has not
    started yet. It may be waiting for ... the runtime environment to be set up."; None else."""
    if sweep["status"] != "submitted" or not sweep.get("driver"):
        return None
    job = cluster.driver_since(cluster.known_dashboard(), sweep["driver"])
    if job is None or job[0] not in ALIVE or job[1] < STARTING_S:
        return None
    state, age, message = job
    started = {"RUNNING": "is RUNNING but has not started the sweep"}.get(state, f"is {state}")
    return f"its driver's Ray job {started} {age:.0f} s after submission" + (f": {message}" if message else "")


def driver_alive(sweep: dict) -> bool:
    driver = sweep.get("driver") or ""
    return bool(driver) and cluster.driver_status(cluster.known_dashboard(), driver) in ALIVE


def driver_gone(registry: Registry, sweep: dict) -> str | None:
    """Why a sweep that is not done has lost its driver (its Ray job failed, was stopped or is gone
    with its head), after marking the sweep failed and recording it in the sweep's history, so
    ``status``, ``ls`` and the analysis service never show a dead sweep as running; None while the
    driver runs, or when the sweep is done or never had a driver.

    Unlike the supervisor, it also records a driver this cluster does not know (UNKNOWN: gone with
    its head, whose supervisor went with it)."""
    driver = sweep.get("driver") or ""
    if sweep["status"] in SWEEP_DONE or not driver:
        return None
    state, ended = job_state(cluster.known_dashboard(), driver)
    if state in ALIVE or not registry.lose_driver(sweep["id"], driver, state, ended):
        return None  # alive, or it ended after writing the sweep's final status, or was noticed already
    return history(registry.get_sweep(sweep["id"]) | {"events": registry.events(sweep["id"])})[-1]
