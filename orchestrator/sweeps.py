"""What the sweep commands do (submit, follow, resume, cancel), apart from how the CLI prints it.

``submit`` validates the whole grid before anything is written, registers
the sweep (dedup by run key), creates its MLflow parent run and starts the
driver as a Ray Job on the cluster, so the sweep outlives the command, and the
supervisor (``orchestrator.supervisor``), which resumes it if its driver dies.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.core.sections import ConfigError
from orchestrator import cluster, settings
from orchestrator.grid import check_resources, expand, load_grid
from orchestrator.registry import NotFound, Registry
from orchestrator.status import SWEEP_DONE

DONE = SWEEP_DONE  # a sweep whose driver has ended
LAST = "last"
"""Stands for the most recently created sweep wherever a sweep id is asked for (CLI and HTTP API)."""


def resolve(registry: Registry, sweep_id: str) -> str:
    """``last`` -> the id of the newest sweep in ``registry``; any other id as given.

    NotFound when ``last`` is asked of a registry with no sweeps."""
    if sweep_id != LAST:
        return sweep_id
    sweeps = registry.list_sweeps()  # newest first
    if not sweeps:
        raise NotFound("no sweeps yet: submit one with `headsweep submit GRID`")
    return sweeps[0]["id"]


@dataclass(frozen=True)
class Submitted:
    sweep_id: str
    counts: dict[str, int]
    driver: str | None  # Ray Job submission id, None when nothing needed running
    supervisor: str | None = None  # the supervisor's Ray Job, None with auto-resume off


def plan(grid_path: str) -> tuple[str, list, dict[str, int]]:
    """Validate and expand a grid; count what is new, without writing anything."""
    spec = load_grid(grid_path)
    configs = expand(spec)
    return spec.name, configs, Registry(settings.registry_url()).plan(configs)


def upstreams_without_weights(registry: Registry, configs: list) -> list[str]:
    """Finished upstream runs whose weights are not in the checkpoint store (it finished when
    nothing started from it, or the store was cleaned): they run again, once, for their dependants."""
    from orchestrator.checkpoints import CheckpointStore
    from orchestrator.registry.stages import with_upstreams

    _, edges = with_upstreams(configs)
    upstream = sorted({up for _, _, up in edges})
    if not upstream:
        return []
    store = CheckpointStore()
    finished = registry.finished_among(upstream)
    return [key for key in finished if not store.exists(key)]


def _cluster() -> dict[str, str]:
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
    }


def submit(grid_path: str, *, force: bool = False, rerun_failed: bool = False, track: bool = True,
           auto_resume: bool = True) -> Submitted:
    """Validate, check resources against the cluster, register, start the driver and (``auto_resume``:
    the sweep may be resumed ``settings.auto_resumes()`` times) the supervisor."""
    spec = load_grid(grid_path)
    configs = expand(spec)
    head = _cluster()
    resources = spec.resources.model_dump()
    check_resources(resources, cluster.cluster_nodes(head["dashboard"]))
    registry = Registry(settings.registry_url())
    sweep_id, counts = registry.create_sweep(
        spec.name, Path(grid_path).read_text(), configs, resources,
        spec.max_concurrent, spec.max_failures, force=force, rerun_failed=rerun_failed,
        rerun=upstreams_without_weights(registry, configs),
    )
    auto_resumes = settings.auto_resumes() if auto_resume else 0
    registry.set_sweep(sweep_id, auto_resumes=auto_resumes)
    if track:
        from orchestrator import tracking

        mlflow = tracking.client()
        experiment_id = tracking.ensure_experiment(mlflow, spec.name)
        parent = tracking.start_run(mlflow, experiment_id, sweep_id, tags={"sweep": sweep_id, "grid": Path(grid_path).name})
        registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)
        dag = registry.sweep_dag(sweep_id)  # the DAG at a glance in the parent run's parameters
        tracking.MlflowTracker(mlflow, parent).log_params({
            "runs": counts["total"], "cells": len(configs), "upstream_runs": dag["upstream"],
            "runs_with_stages": dag["dependants"]})
    driver = start_driver(registry, sweep_id, head, track)
    return Submitted(sweep_id, counts, driver, _supervise(head) if driver and auto_resumes else None)


def _supervise(head: dict[str, str]) -> str:
    """The registry's supervisor on this cluster (started if none runs)."""
    from orchestrator import supervisor

    return supervisor.ensure(head)


def start_driver(registry: Registry, sweep_id: str, head: dict[str, str] | None = None, track: bool = True) -> str | None:
    """Submit the sweep's driver as a Ray Job (None, and the sweep marked finished, if nothing is left)."""
    if not registry.unfinished(sweep_id):
        registry.set_sweep(sweep_id, status="finished")
        return None
    head = head or _cluster()
    submission = cluster.submit_driver(head["dashboard"], sweep_id, driver_env(head, track))
    registry.set_sweep(sweep_id, driver=submission, status="submitted")
    return submission


def driver_alive(sweep: dict) -> bool:
    driver = sweep.get("driver") or ""
    return bool(driver) and cluster.driver_status(cluster.known_dashboard(), driver) in ("PENDING", "RUNNING")


def driver_gone(registry: Registry, sweep: dict) -> str | None:
    """Why a sweep that is not done has lost its driver (its Ray job failed, was stopped or is gone
    with its head), after marking the sweep failed and recording it in the sweep's history, so
    ``status`` and ``ls`` never show a dead sweep as running; None while the driver runs, or when
    the sweep is done or never had a driver."""
    from orchestrator import supervisor

    driver = sweep.get("driver") or ""
    if sweep["status"] in DONE or not driver:
        return None
    state, ended = supervisor.job_state(cluster.known_dashboard(), driver)
    if state in ("PENDING", "RUNNING") or not registry.lose_driver(sweep["id"], driver, state, ended):
        return None  # alive, or it ended after writing the sweep's final status, or was noticed already
    return supervisor.history(registry.get_sweep(sweep["id"]) | {"events": registry.events(sweep["id"])})[-1]


def resume(sweep_id: str, track: bool = True) -> str | None:
    """Start a new driver over what is not finished; refuses while the old driver still runs.
    Recorded in the sweep's history; its automatic resumes start again from 0 (and its supervisor
    is started if none runs)."""
    from orchestrator.registry.history import RESUMED

    registry = Registry(settings.registry_url())
    sweep = registry.get_sweep(sweep_id)
    if driver_alive(sweep):
        raise ConfigError(f"sweep {sweep_id} is still running (driver {sweep['driver']}); cancel it first")
    registry.set_sweep(sweep_id, cancel_requested=False)
    head = _cluster()
    driver = start_driver(registry, sweep_id, head, track=track)
    registry.add_event(sweep_id, RESUMED, {"driver": driver, "auto": False})
    if driver and sweep["auto_resumes"]:
        _supervise(head)
    return driver


def cancel(sweep_id: str) -> dict[str, int]:
    """Stop scheduling; running trials stop at their next check (within seconds) and are marked cancelled."""
    registry = Registry(settings.registry_url())
    sweep = registry.get_sweep(sweep_id)
    running = registry.cancel_sweep(sweep_id)
    if not driver_alive(sweep):  # nobody will stop them: mark them now
        for run in running:
            registry.cancel_run(run["run_key"])
        if sweep["status"] not in DONE:
            registry.set_sweep(sweep_id, status="cancelled")
    return registry.sweep_counts(sweep_id)


def wait(sweep_id: str, on_update=None, poll_s: float = 1.0) -> dict:
    """Poll the registry until the sweep is done (or its driver died and the supervisor will not
    resume it); return the sweep row."""
    from orchestrator.supervisor import resume_pending

    registry = Registry(settings.registry_url())
    last_driver_check = 0.0
    while True:
        sweep = registry.get_sweep(sweep_id)
        counts = registry.sweep_counts(sweep_id)
        if on_update is not None:
            on_update(sweep, counts)
        if sweep["status"] in DONE and not resume_pending(registry, sweep_id):
            return sweep
        if time.monotonic() - last_driver_check > 10:
            last_driver_check = time.monotonic()
            driver_gone(registry, sweep)  # a dead driver: the sweep failed (the next round decides)
        time.sleep(poll_s)
