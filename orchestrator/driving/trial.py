"""One Ray Tune trial = one run key (DESIGN.md decisions 1-4).

The trial reads its config from the registry by key (Tune's param space holds
only keys), claims the run, seeds itself through the config, logs to MLflow
from inside the trial with explicit run ids, checkpoints through Tune so a
killed worker resumes mid-run, and writes status and results back.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from base.costs import Costs
from base.result import RunResult
from experiments.harness.config import parse_config
from experiments.training.context import RunCancelled, RunContext
from experiments.training.tracking import MemoryTracker
from orchestrator.driving.writer import Remote, Tracker, Writer
from orchestrator.status import RunStatus

HEARTBEAT_S = 5.0
log = logging.getLogger("headsweep.trial")
CANCEL_POLL_S = 2.0
_writers: dict[tuple, Writer | Remote] = {}  # one per worker process; reused actors keep it
_worker_runs = {"started": 0}  # runs this worker process started: its first pays the imports


def worker_name(trial_id: str, node_id: str, node_ip: str) -> str:
    """Who holds a run, for this process (the ``worker`` of its row and of a ``worker_lost`` event;
    ``registry.history.worker_node`` reads its node back for ``status``):
    ``<Tune trial id>@<host>[<Ray node id, 8 hex> <node IP>]:<pid>``, e.g. ``a1b2c_00003@gpu7[3f2a9c01
    10.0.0.7]:4242``. The trial id first (:func:`worker_trial`: a retry of the same trial takes its
    run over), the pid last; the Ray node tells apart nodes that share a host name (containers,
    nodes simulated on one machine), so ``status`` can say which node was lost."""
    return f"{trial_id}@{socket.gethostname()}[{node_id[:8]} {node_ip}]:{os.getpid()}"


def worker_trial(worker: str | None) -> str:
    """The Tune trial id of a :func:`worker_name` ("" for none)."""
    return (worker or "").split("@", 1)[0]



def writer_for(env: dict[str, Any]) -> Writer | Remote:
    """Where this trial's state changes go: the sweep's writer over Ray (``env["writer"]``, its actor's
    name), or a :class:`Writer` of this worker process's own on the sweep's stores."""
    key = (env.get("writer"), env["registry_url"], env.get("tracking_uri"))
    if key not in _writers:
        _writers[key] = Remote(env["writer"]) if env.get("writer") else Writer(env["registry_url"], env.get("tracking_uri"))
    return _writers[key]


class TuneCheckpointer:
    """experiments' Checkpointer on Tune checkpoints, at most one per ``min_interval_s``."""

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self._last = time.monotonic()

    def save(self, state: dict[str, Any]) -> None:
        if time.monotonic() - self._last < self.min_interval_s:
            return
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(state, Path(tmp) / "state.pt")
            tune.report({"checkpoint_step": state["step"]}, checkpoint=tune.Checkpoint.from_directory(tmp))
        self._last = time.monotonic()

    def load(self) -> dict[str, Any] | None:
        checkpoint = tune.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            return torch.load(Path(folder) / "state.pt", weights_only=False)


class _Heartbeat(threading.Thread):
    """Touches the run's heartbeat so a reconciler can tell a live run from an orphan."""

    def __init__(self, writer: Writer | Remote, run_key: str, worker: str) -> None:
        super().__init__(daemon=True)
        self.writer, self.run_key, self.worker, self.stopped = writer, run_key, worker, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            try:  # retried through a restarting database (registry.db.retrying) or writer
                self.writer.heartbeat(self.run_key, self.worker)
            except Exception as err:  # noqa: BLE001 - a missed beat is not worth killing the run
                log.warning("run %s: heartbeat missed (%s: %s); beating on", self.run_key,
                            type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")


def cancel_poll(states: Writer | Remote, sweep_id: str) -> Callable[[], bool]:
    """``should_stop()``: the sweep's cancel flag (``Writer.cancel_requested``), read at most every
    ``CANCEL_POLL_S`` seconds."""
    state = {"at": 0.0, "value": False}

    def should_stop() -> bool:
        if time.monotonic() - state["at"] > CANCEL_POLL_S:
            state["at"] = time.monotonic()
            try:  # retried through a restarting database; past that, the run goes on uncancelled
                state["value"] = states.cancel_requested(sweep_id)
            except Exception as err:  # noqa: BLE001 - asked again at the next poll
                log.warning("sweep %s: could not read its cancel flag: %s", sweep_id, type(err).__name__)
        return state["value"]

    return should_stop


def claim_when_free(writer: Writer | Remote, run_key: str, worker: str, stale_after_s: float) -> dict[str, Any] | None:
    """Claim the run, waiting while another live worker holds it; None once it is finished or cancelled.

    A Tune retry of this same trial (its worker was killed) takes the run over at
    once: the worker field starts with this trial's id.
    """
    trial_id = worker_trial(worker)
    while True:
        claimed = writer.claim(run_key, worker, stale_after_s)
        if claimed is not None:
            return claimed
        run = writer.registry.get_run(run_key)
        if run["status"] in (RunStatus.FINISHED, RunStatus.CANCELLED):
            return None
        if run["status"] == RunStatus.RUNNING and worker_trial(run["worker"]) == trial_id:
            claimed = writer.claim(run_key, worker, 0)
            if claimed is not None:
                return claimed
        time.sleep(HEARTBEAT_S / 2)


def stage_hooks(claimed: dict[str, Any], checkpoints: str | None) -> dict[str, Any]:
    """``save_artifact`` / ``load_upstream`` / ``save_weights`` of a claimed run's context: its large
    artifacts (a mask) go to the checkpoint store under its run key; (DESIGN.md decision 10) its
    upstream runs' weights come from the checkpoint store, by the run keys the registry recorded
    at submit (``claimed["upstreams"]``); it keeps its own final weights there only when some run
    starts from it (``claimed["has_dependants"]``)."""
    from orchestrator.checkpoints import CheckpointStore

    store, upstreams, run_key = CheckpointStore(checkpoints), claimed["upstreams"], claimed["run_key"]
    hooks: dict[str, Any] = {"save_artifact": lambda name, data: store.put(run_key, name, data)}
    if upstreams:
        hooks["load_upstream"] = lambda role: store.load(upstreams[role])
    if claimed["has_dependants"]:
        hooks["save_weights"] = lambda weights: store.save(run_key, weights)
    return hooks


def _default_run(cfg, ctx) -> RunResult:
    from experiments.harness.runner import run

    return run(cfg, ctx)


def trial(config: dict[str, Any], run_fn: Callable[..., RunResult] | None = None) -> None:
    """The Tune function trainable. ``config``: run_key, sweep_id and ``env`` (where things live)."""
    costs = Costs(first_in_worker=_worker_runs["started"] == 0)  # cost.<part>_s: see record_costs
    run_key, sweep_id, env = config["run_key"], config["sweep_id"], config["env"]
    with costs.part("claim"):
        writer = writer_for(env)
        context = tune.get_context()
        worker = worker_name(context.get_trial_id(), ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
        claimed = claim_when_free(writer, run_key, worker, env["stale_after_s"])
    if claimed is None:  # finished or cancelled meanwhile: never run twice
        tune.report({"outcome": "skipped"})
        return
    _worker_runs["started"] += 1

    beat = _Heartbeat(writer, run_key, worker)
    beat.start()
    run_id = None
    try:  # from here, whatever fails (a database gone for longer than the retries wait) fails the run
        cpus = context.get_trial_resources().required_resources.get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))  # a reused worker keeps its first trial's threads otherwise
        with costs.part("claim"):
            cfg = parse_config(claimed["config"], check_files=False)
        tracker = MemoryTracker()
        if env.get("tracking_uri"):
            with costs.part("mlflow"):
                from orchestrator import tracking

                name_keys = env.get("name_keys", ())
                run_id = writer.track(  # an earlier attempt's MLflow run is reused
                    run_key, claimed.get("mlflow_run_id"), env["experiment_id"], tracking.run_name(cfg, name_keys),
                    {"sweep": sweep_id, "cell": tracking.run_name(cfg, name_keys, seed=False)}, env.get("parent_run_id"))
                tracker = Tracker(writer, run_id)

        device = "cuda" if torch.cuda.is_available() and context.get_trial_resources().required_resources.get("GPU") else "cpu"
        ctx = RunContext(
            tracker=tracker, checkpointer=TuneCheckpointer(env["checkpoint_every_s"]),
            should_stop=cancel_poll(writer, sweep_id), device=device, costs=costs,
            **stage_hooks(claimed, env.get("checkpoints")),
        )
        result = (run_fn or _default_run)(cfg, ctx)
        with costs.part("finish"):  # the registry, then MLflow (the writer's one order)
            writer.finish(run_key, result.metrics | costs.metrics(), worker, result.maps, run_id)
        costs.end()
        record_costs(writer, run_key, run_id, costs)
    except RunCancelled:
        writer.cancel(run_key, worker, run_id)
        tune.report({"outcome": "cancelled"})
        return
    except Exception as err:
        _record_failure(writer, run_key, worker, run_id, err)
        raise  # Tune retries it (FailureConfig.max_failures), from the last checkpoint
    finally:
        beat.stopped.set()
    # the outcome only: the registry holds the metrics, and every metric Tune gets costs its driver a
    # running min/max/mean and ~0.5 KB of experiment-state JSON per trial
    tune.report({"outcome": "finished"})


def record_costs(writer: Writer | Remote, run_key: str, run_id: str | None, costs: Costs) -> None:
    """A finished run's ``cost.<part>_s``, once it is done: ``cost.finish_s`` and ``cost.total_s``
    (entered -> its result in the registry) join the parts its registry finish already holds, and
    MLflow gets them all as metrics. These two writes (one UPDATE, one MLflow batch) are the one
    cost the numbers leave out; a failed one is logged, never fails the finished run."""
    metrics = costs.metrics()
    try:
        writer.add_metrics(run_key, {k: v for k, v in metrics.items() if k in ("cost.finish_s", "cost.total_s")},
                           run_id, metrics)
    except Exception as err:  # noqa: BLE001 - the run is finished; its costs are not worth more
        log.warning("run %s: could not record its costs (%s)", run_key, type(err).__name__)


def _record_failure(writer: Writer | Remote, run_key: str, worker: str, run_id: str | None, err: Exception) -> None:
    """The run -> failed with its traceback, then its MLflow run FAILED with the error (the writer's
    order); as far as it goes (the database may be what failed: then the run stays RUNNING and is
    reconciled as an orphan)."""
    try:
        writer.fail(run_key, traceback.format_exc(), worker, run_id,
                    "".join(traceback.format_exception_only(err)).strip())
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        log.exception("run %s: could not record its failure", run_key)
