"""What the sweep commands do (submit, follow, resume, cancel), apart from how the CLI prints it.

``submit`` validates the whole grid before anything is written, registers
the sweep (dedup by run key), creates its MLflow parent run and starts the
driver as a Ray Job on the cluster, so the sweep outlives the command, and the
supervisor (``orchestrator.driving.supervisor``), which resumes it if its driver dies.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from base.sections import ConfigError
from orchestrator import hub, settings
from orchestrator.cluster.head import cluster_in_use
from orchestrator.cluster.jobs import cluster_nodes
from orchestrator.driving import supervisor, writer
from orchestrator.driving.driver_job import (
    driver_alive,
    driver_env,
    driver_gone,
    driver_starting,
    start_driver,
)
from orchestrator.driving.grid import GridSpec, check_resources, expand, grid_text, load_grid
from orchestrator.registry import Registry, RegistryReader
from orchestrator.registry.events import RESUMED
from orchestrator.registry.supervision import resume_pending
from orchestrator.status import SWEEP_DONE

DONE = SWEEP_DONE  # a sweep whose driver has ended


@dataclass(frozen=True)
class Submitted:
    sweep_id: str
    counts: dict[str, int]
    driver: str | None  # Ray Job submission id, None when nothing needed running
    supervisor: str | None = None  # the supervisor's Ray Job (None when no driver started)


def plan(grid_path: str, sets: Sequence[str] = ()) -> tuple[str, list, dict[str, int]]:
    """Validate and expand a grid (with ``--set`` overrides, ``grid.with_sets``); count what is new,
    without writing anything."""
    spec = load_grid(grid_path, sets)
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


def submit(grid_path: str, *, force: bool = False, rerun_failed: bool = False, track: bool = True,
           auto_resume: bool = True, sets: Sequence[str] = ()) -> Submitted:
    """Validate, resolve the hub models (``hub.resolve``), check resources against the cluster, register,
    start the driver and the supervisor,
    which records the driver's death and (``auto_resume``: up to ``settings.auto_resumes()``
    times) resumes the sweep. ``sets``: ``--set`` overrides (``grid.with_sets``); the sweep records
    the grid they make (``grid.grid_text``)."""
    spec = load_grid(grid_path, sets)
    configs = expand(spec)
    hub.resolve(configs)  # hub models into the cache the trials read, or one line naming what cannot be had
    head = cluster_in_use()
    resources = spec.resources.model_dump()
    nodes = cluster_nodes(head["dashboard"])
    check_resources(resources, nodes)
    check_shared(configs, head, track, len(nodes))
    writer.refuse_if_written_elsewhere(settings.registry_url(), "submit")
    registry = Registry(settings.registry_url())
    sweep_id, counts = registry.create_sweep(
        spec.name, grid_text(grid_path, sets), configs, resources,
        spec.max_concurrent, spec.max_failures, force=force, rerun_failed=rerun_failed,
        rerun=upstreams_without_weights(registry, configs),
    )
    auto_resumes = settings.auto_resumes() if auto_resume else 0
    registry.set_sweep(sweep_id, auto_resumes=auto_resumes)
    if track:
        track_sweep(registry, sweep_id, spec, Path(grid_path).name, configs, counts["total"])
    driver = start_driver(registry, sweep_id, head, track)
    return Submitted(sweep_id, counts, driver, supervisor.ensure(head) if driver else None)


def check_shared(configs: list, head: dict[str, str], track: bool, nodes: int) -> None:
    """On a cluster of several nodes, every node sees the files the sweep keeps on disk
    (``orchestrator.cluster.shared``), or one line naming the node and the path."""
    from base.sections import STAGE_ROLES
    from orchestrator.cluster import shared
    from orchestrator.cluster.packaging import job_runtime_env

    env = driver_env(head, track)
    dumped = [config.model_dump() if hasattr(config, "model_dump") else config for config in configs]
    staged = any(config.get(role) for config in dumped for role in STAGE_ROLES)
    written, read = shared.local_paths(env, track=track, artifacts=settings.artifact_root(),
                                       checkpoints=settings.checkpoint_root(), staged=staged,
                                       hub_models=hub.hub_models(configs))
    shared.unseen_on_nodes(head["dashboard"], job_runtime_env(env), written, read, nodes)


def track_sweep(registry: Registry, sweep_id: str, spec: GridSpec, grid_name: str, configs: list, runs: int) -> str:
    """The sweep's MLflow parent run (returned): the grid's tags and ``description`` (the run's
    description, above the links to its children, ``tracking.sweep_note``), the DAG at a glance
    in its parameters; recorded in the registry."""
    from orchestrator import tracking

    mlflow = tracking.client()
    experiment_id = tracking.ensure_experiment(mlflow, spec.name)
    parent = tracking.start_run(mlflow, experiment_id, sweep_id, tags=tracking.parent_tags(sweep_id, grid_name, spec.tags))
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)
    dag = registry.sweep_dag(sweep_id)
    tracking.MlflowTracker(mlflow, parent).log_params({
        "runs": runs, "cells": len(configs), "upstream_runs": dag["upstream"], "runs_with_stages": dag["dependants"]})
    keys = tracking.name_keys(registry.sweep_runs(sweep_id)["config"])  # as the driver names the children
    mlflow.set_tag(parent, tracking.NOTE_TAG, tracking.sweep_note(experiment_id, sweep_id, runs, configs, keys,
                                                                  spec.description))
    return parent


def resume(sweep_id: str, track: bool = True, by: str | None = None) -> str | None:
    """Start a new driver over what is not finished (their hub models resolved again, as at submit);
    refuses while the old driver still runs.
    Recorded in the sweep's history (``by``: who, when not a person, e.g. "SLURM job 4242"); its
    automatic resumes start again from 0 (and its supervisor is started if none runs)."""
    writer.refuse_if_written_elsewhere(settings.registry_url(), "resume")
    registry = Registry(settings.registry_url())
    sweep = registry.get_sweep(sweep_id)
    if driver_alive(sweep):
        raise ConfigError(f"sweep {sweep_id} is still running (driver {sweep['driver']}); cancel it first")
    registry.set_sweep(sweep_id, cancel_requested=False)
    runs = registry.sweep_runs(sweep_id)
    # its unfinished runs' hub models into this host's cache again (a resume elsewhere, or after a cache clean)
    unfinished = [config for status, config in zip(runs["status"], runs["config"], strict=True)
                  if status not in ("finished", "cancelled")]
    hub.resolve(unfinished)
    head = cluster_in_use()
    check_shared(unfinished, head, track, len(cluster_nodes(head["dashboard"])))
    driver = start_driver(registry, sweep_id, head, track=track)
    registry.add_event(sweep_id, RESUMED, {"driver": driver, "auto": False} | ({"by": by} if by else {}))
    if driver:
        supervisor.ensure(head)
    return driver


def cancel(sweep_id: str) -> dict[str, int]:
    """Stop scheduling; running trials stop at their next check (within seconds) and are marked cancelled.
    A registry that another host's writer holds (a SQLite file on a network filesystem) is not written
    from here: the request is left beside it, and that writer records it within seconds."""
    if writer.lease_holder(settings.registry_url()):
        writer.cancel_flag(settings.registry_url(), sweep_id).touch()
        return RegistryReader(settings.registry_url()).sweep_counts(sweep_id)
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
    resume it); return the sweep row. ``on_update(sweep, counts)`` each poll; while its driver is slow
    to start, the sweep has a "starting" note once a minute (:func:`driver_job.driver_starting`)."""
    registry = writer.for_looking(settings.registry_url())
    last_driver_check, starting, noted = 0.0, None, float("-inf")
    while True:
        sweep = registry.get_sweep(sweep_id)
        counts = registry.sweep_counts(sweep_id)
        if starting and sweep["status"] == "submitted" and time.monotonic() - noted >= 60:
            sweep, starting, noted = sweep | {"starting": starting}, None, time.monotonic()
        if on_update is not None:
            on_update(sweep, counts)
        if sweep["status"] in DONE and not (resume_pending(sweep | {"events": registry.events(sweep_id)})
                                            and supervisor.watching()):
            return sweep
        if time.monotonic() - last_driver_check > 10:
            last_driver_check = time.monotonic()
            driver_gone(registry, sweep)  # a dead driver: the sweep failed (the next round decides)
            starting = driver_starting(sweep)
        time.sleep(poll_s)
