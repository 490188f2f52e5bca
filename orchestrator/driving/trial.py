"""One Ray Tune trial = one run key (DESIGN.md decisions 1-4).

The trial reads its config from the registry by key (Tune's param space holds
only keys), claims the run, seeds itself through the config, logs to MLflow
from inside the trial with explicit run ids, checkpoints through Tune so a
killed worker resumes mid-run, and writes status and results back.
"""

from __future__ import annotations

import logging
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

from experiments.common.costs import Costs
from experiments.common.result import RunResult
from experiments.core.context import RunCancelled, RunContext
from experiments.core.tracking import MemoryTracker
from experiments.keyed.config import parse_config
from orchestrator.registry import Registry
from orchestrator.registry.history import worker_name, worker_trial
from orchestrator.status import RunStatus

HEARTBEAT_S = 5.0
log = logging.getLogger("headsweep.trial")
CANCEL_POLL_S = 2.0
_registries: dict[str, Registry] = {}  # one per worker process; reused actors keep it
_worker_runs = {"started": 0}  # runs this worker process started: its first pays the imports


def registry_for(url: str) -> Registry:
    if url not in _registries:
        _registries[url] = Registry(url)
    return _registries[url]


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

    def __init__(self, registry: Registry, run_key: str, worker: str) -> None:
        super().__init__(daemon=True)
        self.registry, self.run_key, self.worker, self.stopped = registry, run_key, worker, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            try:  # retried through a restarting database (registry.db.retrying)
                self.registry.heartbeat(self.run_key, self.worker)
            except Exception as err:  # noqa: BLE001 - a missed beat is not worth killing the run
                log.warning("run %s: heartbeat missed (%s: %s); beating on", self.run_key,
                            type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")


def _cancel_poll(registry: Registry, sweep_id: str) -> Callable[[], bool]:
    state = {"at": 0.0, "value": False}

    def should_stop() -> bool:
        if time.monotonic() - state["at"] > CANCEL_POLL_S:
            state["at"] = time.monotonic()
            try:  # retried through a restarting database; past that, the run goes on uncancelled
                state["value"] = registry.cancel_requested(sweep_id)
            except Exception as err:  # noqa: BLE001 - asked again at the next poll
                log.warning("sweep %s: could not read its cancel flag: %s", sweep_id, type(err).__name__)
        return state["value"]

    return should_stop


def claim_when_free(registry: Registry, run_key: str, worker: str, stale_after_s: float) -> dict[str, Any] | None:
    """Claim the run, waiting while another live worker holds it; None once it is finished or cancelled.

    A Tune retry of this same trial (its worker was killed) takes the run over at
    once: the worker field starts with this trial's id.
    """
    trial_id = worker_trial(worker)
    while True:
        claimed = registry.claim(run_key, worker, stale_after_s=stale_after_s)
        if claimed is not None:
            return claimed
        run = registry.get_run(run_key)
        if run["status"] in (RunStatus.FINISHED, RunStatus.CANCELLED):
            return None
        if run["status"] == RunStatus.RUNNING and worker_trial(run["worker"]) == trial_id:
            claimed = registry.claim(run_key, worker, stale_after_s=0)
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
    from experiments.keyed.runner import run

    return run(cfg, ctx)


def trial(config: dict[str, Any], run_fn: Callable[..., RunResult] | None = None) -> None:
    """The Tune function trainable. ``config``: run_key, sweep_id and ``env`` (where things live)."""
    costs = Costs(first_in_worker=_worker_runs["started"] == 0)  # cost.<part>_s: see record_costs
    run_key, sweep_id, env = config["run_key"], config["sweep_id"], config["env"]
    with costs.part("claim"):
        registry = registry_for(env["registry_url"])
        context = tune.get_context()
        worker = worker_name(context.get_trial_id(), ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())
        claimed = claim_when_free(registry, run_key, worker, env["stale_after_s"])
    if claimed is None:  # finished or cancelled meanwhile: never run twice
        tune.report({"outcome": "skipped"})
        return
    _worker_runs["started"] += 1

    beat = _Heartbeat(registry, run_key, worker)
    beat.start()
    mlflow_run = None
    try:  # from here, whatever fails (a database gone for longer than the retries wait) fails the run
        cpus = context.get_trial_resources().required_resources.get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))  # a reused worker keeps its first trial's threads otherwise
        with costs.part("claim"):
            cfg = parse_config(claimed["config"], check_files=False)
        tracker = MemoryTracker()
        if env.get("tracking_uri"):
            with costs.part("mlflow"):
                from orchestrator import tracking

                mlflow = tracking.client(env["tracking_uri"])
                retried = claimed.get("mlflow_run_id")  # an earlier attempt's MLflow run, reused
                run_id = retried or tracking.start_run(
                    mlflow, env["experiment_id"], tracking.run_name(cfg, env.get("name_keys", ())),
                    tags={"sweep": sweep_id, "cell": tracking.run_name(cfg, env.get("name_keys", ()), seed=False)},
                    parent_run_id=env.get("parent_run_id"),
                )
                tracker = mlflow_run = tracking.MlflowTracker(mlflow, run_id)
                if retried:  # FAILED or KILLED by that attempt; a new run starts RUNNING (one write less)
                    mlflow.update_run(run_id, status="RUNNING")
                else:
                    registry.set_mlflow_run(run_key, run_id)

        device = "cuda" if torch.cuda.is_available() and context.get_trial_resources().required_resources.get("GPU") else "cpu"
        ctx = RunContext(
            tracker=tracker, checkpointer=TuneCheckpointer(env["checkpoint_every_s"]),
            should_stop=_cancel_poll(registry, sweep_id), device=device, costs=costs,
            **stage_hooks(claimed, env.get("checkpoints")),
        )
        result = (run_fn or _default_run)(cfg, ctx)
        # MLflow first: should the registry write then fail, the run is retried and its MLflow run
        # reused; the other way round, a lost MLflow write would leave a finished run RUNNING there
        with costs.part("finish"):
            if mlflow_run:
                mlflow_run.finish("FINISHED")
            registry.finish(run_key, result.metrics | costs.metrics(), worker=worker, maps=result.maps)
        costs.end()
        record_costs(registry, run_key, mlflow_run, costs)
    except RunCancelled:
        registry.cancel_run(run_key, worker)
        if mlflow_run:
            mlflow_run.finish("KILLED")
        tune.report({"outcome": "cancelled"})
        return
    except Exception as err:
        _record_failure(registry, run_key, worker, mlflow_run, err)
        raise  # Tune retries it (FailureConfig.max_failures), from the last checkpoint
    finally:
        beat.stopped.set()
    # the outcome only: the registry holds the metrics, and every metric Tune gets costs its driver a
    # running min/max/mean and ~0.5 KB of experiment-state JSON per trial
    tune.report({"outcome": "finished"})


def record_costs(registry: Registry, run_key: str, mlflow_run: Any, costs: Costs) -> None:
    """A finished run's ``cost.<part>_s``, once it is done: ``cost.finish_s`` and ``cost.total_s``
    (entered -> its result in the registry) join the parts its registry finish already holds, and
    MLflow gets them all as metrics. These two writes (one UPDATE, one MLflow batch) are the one
    cost the numbers leave out; a failed one is logged, never fails the finished run."""
    metrics = costs.metrics()
    try:
        registry.add_metrics(run_key, {k: v for k, v in metrics.items() if k in ("cost.finish_s", "cost.total_s")})
        if mlflow_run:
            mlflow_run.log_metrics(metrics, 0)
    except Exception as err:  # noqa: BLE001 - the run is finished; its costs are not worth more
        log.warning("run %s: could not record its costs (%s)", run_key, type(err).__name__)


def _record_failure(registry: Registry, run_key: str, worker: str, mlflow_run: Any, err: Exception) -> None:
    """The run -> failed with its traceback, its MLflow run FAILED; each as far as it goes (the
    database may be what failed: then the run stays RUNNING and is reconciled as an orphan)."""
    try:
        registry.fail(run_key, traceback.format_exc(), worker)
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        log.exception("run %s: could not record its failure in the registry", run_key)
    if mlflow_run:
        try:
            mlflow_run.set_tags({"error": "".join(traceback.format_exception_only(err)).strip()[:4000]})
            mlflow_run.finish("FAILED")
        except Exception:  # noqa: BLE001
            log.exception("run %s: could not mark its MLflow run FAILED", run_key)
