"""The sweep driver: Tune runs over the sweep's unfinished run keys, in waves of ready runs.

Runs wherever Ray runs it: as a Ray Job on the cluster (``submit``), or in
the calling process (``submit --wait --local`` and tests). Resume does not use
``Tuner.restore`` (it cannot add or drop trials): every start of the driver
reconciles orphans and launches a new Tuner over what is not finished. Runs that
start from other runs (stages) wait for them: each wave is the runs whose upstream
runs have finished (``Registry.next_wave``).

    python -m orchestrator.driving.driver SWEEP_ID
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no per-trial CSV/JSON/TBX files
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# Tune's experiment-state snapshots (every trial's state as JSON, rewritten every ~10 s: O(trials) each
# time) are for Tuner.restore, which resume never uses (the registry is the state): one at the end.
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1000000")

from ray import tune  # noqa: E402
from ray.tune.execution import tune_controller  # noqa: E402
from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.experiment import trial as tune_trial  # noqa: E402
from ray.tune.schedulers import FIFOScheduler  # noqa: E402
from ray.tune.search.basic_variant import BasicVariantGenerator  # noqa: E402
from ray.tune.utils.object_cache import _ObjectCache  # noqa: E402

from orchestrator import settings  # noqa: E402
from orchestrator.driving import trial, writer  # noqa: E402
from orchestrator.driving.trial import worker_trial  # noqa: E402
from orchestrator.driving.writer import Remote, Writer  # noqa: E402
from orchestrator.registry.events import WORKER_LOST  # noqa: E402
from orchestrator.status import RunStatus, SweepStatus  # noqa: E402

STALE_AFTER_S = 4 * trial.HEARTBEAT_S
# we turned Tune's result files off (the registry holds results); its analysis complains per trial
logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)


class _Stopper(tune.Stopper):
    """Ends a trial at its final report, and the whole Tuner once the sweep's cancel flag is set
    (polled at most every 2 s). A trial reports its ``outcome`` once, as its last act (the registry
    has its result by then): without stopping it there, Tune asks the worker for one more result
    only to learn that the function returned, a round trip per trial."""

    def __init__(self, states: Writer | Remote, sweep_id: str) -> None:
        self.poll = trial.cancel_poll(states, sweep_id)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return "outcome" in result

    def stop_all(self) -> bool:
        return self.poll()


class _Fifo(FIFOScheduler):
    """Tune's first-in first-out order without its scan: FIFOScheduler walks every trial of the wave,
    finished ones too, at each step of the driver's loop to find a pending one (O(trials) a step:
    0.8 s of a 1,000-trial wave, over a minute at 10,000). Here the trials wait in a queue; one
    pending again after a failure is started by Tune from its own pending list."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Trial] = deque()

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._queue.append(trial)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        while self._queue and self._queue[0].status != Trial.PENDING:
            self._queue.popleft()
        return self._queue[0] if self._queue else None


class _WorkerLost(tune.Callback):
    """A trial whose worker process died (SIGKILL, the OOM killer, a lost node) leaves its run RUNNING
    with no error written. Tune tells the driver: the sweep's history records it (``status`` names
    it) and, when Tune has no retry left (``max_failures``), the run fails here with what happened,
    so it shows in the failures and ``--rerun-failed`` requeues it instead of it waiting for the
    orphan reset and then never running."""

    def __init__(self, states: Writer | Remote, sweep: dict[str, Any]) -> None:
        self.states, self.registry, self.sweep = states, states.registry, sweep

    def _held(self, trial) -> dict[str, Any] | None:
        """The trial's run when its (dead) attempt still holds it: a raised error has failed it already."""
        run = self.registry.get_run(trial.config["run_key"])
        held = run["status"] == RunStatus.RUNNING and worker_trial(run["worker"]) == trial.trial_id
        return run if held else None

    def _record(self, trial, then: str) -> None:
        try:
            run = self._held(trial)
            if run is None:
                return
            if then == "failed":
                error = (f"worker {run['worker']} died during attempt {run['attempts']} without a result or "
                         f"traceback (killed: out of memory?); no retry left (max_failures "
                         f"{self.sweep['max_failures']})")
                if not self.states.fail(run["run_key"], error, run["worker"], run["mlflow_run_id"]):
                    return  # taken over meanwhile (an orphan reset, another sweep)
            self.registry.add_event(self.sweep["id"], WORKER_LOST, {
                "run_key": run["run_key"], "worker": run["worker"], "attempt": run["attempts"], "then": then})
        except Exception:  # noqa: BLE001 - never take Tune down; the orphan reset catches the run
            logging.getLogger("headsweep.driver").exception("run %s: could not record its lost worker",
                                                            trial.config.get("run_key"))

    def on_trial_recover(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._record(trial, "retried")

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self._record(trial, "failed")


class _WaveTrials(tune.Callback):
    """The ids of the wave's trials, as Tune starts them: a run held by one of them is this wave's."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def on_trial_start(self, iteration: int, trials: list, trial, **info: Any) -> None:
        self.ids.add(trial.trial_id)


def _cancel_held(states: Writer | Remote, keys: list[str], trial_ids: set[str]) -> None:
    """After a cancelled wave, the wave's runs still RUNNING under one of its (now ended) trials ->
    cancelled. Two polls race after ``headsweep cancel``: the trial's (it cancels its own run) and the
    driver's ``_Stopper.stop_all`` (Tune then ends every trial). When the driver's wins, the trial
    never reaches its ``cancel_run`` and nothing else would mark the run: it would show "running"
    in a cancelled sweep (seen on a loaded machine, 2 of 4 runs). A run held by another driver's
    trial (a run shared with a live sweep) is left to that driver."""
    for key in keys:
        run = states.registry.get_run(key)
        if run["status"] != RunStatus.RUNNING or worker_trial(run["worker"]) not in trial_ids:
            continue
        states.cancel(key, run["worker"], run["mlflow_run_id"])


@contextlib.contextmanager
def _trainable_looked_up_once() -> Iterator[None]:
    """Tune looks a wave's trainable up by name in Ray's GCS key-value store, and unpickles it, three
    times per trial (validate at the trial's creation, its placement group, its actor): ~5 KV reads,
    2.5 ms of the driver's time per trial on 2 cores (bench_orchestration, profiled). Within one wave
    the name always means the same trainable (the Tuner registered it before the first trial), so
    the wave asks once; the next wave registers its own and asks again."""
    get, validate = tune_trial.get_trainable_cls, tune_trial.validate_trainable
    tune_trial.get_trainable_cls = functools.cache(get)
    tune_trial.validate_trainable = functools.cache(validate)
    try:
        yield
    finally:
        tune_trial.get_trainable_cls, tune_trial.validate_trainable = get, validate


class _WarmActors(_ObjectCache):
    """Tune's cache of finished trials' actors (``reuse_actors``), keeping up to ``keep`` of them.

    Tune keeps a finished trial's actor only for a trial already staged, or one actor when none is.
    With the sweep's ``max_concurrent`` in the search algorithm the next trial exists only once one
    has ended, so of the trials that end close together one actor is kept; their successors ask Ray
    for new actors (a worker process each, importing torch and Tune: ~4 s of CPU, ~300 MiB), and
    Tune drops each new actor again as soon as an older one comes free. On 8 simulated nodes (64
    logical GPUs, 27 trials at once: tests/benchmarks/scale_gpus.py) up to ~12 GiB of such workers
    were starting at a time and the memory monitor killed the driver after 194 of 2,000 trials; with
    the actors kept, 2,000 and then 10,000 trials ran on the same 27 worker processes, every trial
    once. Keeping up to ``max_concurrent`` actors costs nothing: each
    holds the resources of a slot the next trial takes, a kept actor is always reused before a new
    one is asked for (Tune's ``_schedule_trial_actor``), and once the search has generated its last
    trial Tune flushes them all."""

    def __init__(self, may_keep_one: bool = True, keep: int = 1):
        super().__init__(may_keep_one=may_keep_one)
        self._keep = keep

    def cache_object(self, key, obj) -> bool:
        if self._num_cached_objects < self._keep:
            self._cached_objects[key].append(obj)
            self._num_cached_objects += 1
            return True
        return super().cache_object(key, obj)

    def flush_cached_objects(self, force_all: bool = False):
        if force_all:
            yield from super().flush_cached_objects(force_all=True)
            return
        for objs in self._cached_objects.values():  # the oldest first, beyond what is kept
            while objs and self._num_cached_objects > max(self._keep, self.total_max_objects):
                self._num_cached_objects -= 1
                yield objs.pop(0)


@contextlib.contextmanager
def _actors_kept(max_concurrent: int) -> Iterator[None]:
    """Within one wave, Tune's actor cache keeps up to ``max_concurrent`` finished trials' actors
    (``_WarmActors``); without a cap Tune stages trials ahead and keeps what they need itself."""
    if not max_concurrent:
        yield
        return
    original = tune_controller._ObjectCache
    tune_controller._ObjectCache = functools.partial(_WarmActors, keep=max_concurrent)
    try:
        yield
    finally:
        tune_controller._ObjectCache = original


@contextlib.contextmanager
def _starting_actors_kept() -> Iterator[None]:
    """Within one wave, a trial whose new actor has started (its worker process is being created)
    keeps it, and the next finished trial's actor goes to another trial.

    Tune hands a freed actor to the first pending trial, even one whose new actor is already
    starting, and drops that starting worker. After a lost worker, its retried trial waits seconds
    for a new process (importing torch) while trials end every fraction of one: each ending gave
    its actor to the waiting trial and left the next trial to ask for a new worker, itself dropped
    at the next ending. On one node, 11 actors were created for 2 slots and 1 lost worker (the
    test); on 8 simulated nodes, ~64 at once after a lost node, and the memory ran out
    (tests/benchmarks/README.md). A trial whose actor is only requested (no placement yet) still
    takes a freed one: dropping the request starts nothing."""
    original = tune_controller.TuneController._maybe_reuse_cached_actor

    def maybe_reuse_cached_actor(controller, trial) -> bool:
        own = controller._trial_to_actor.get(trial)
        if (own is not None and trial not in controller._resetting_trials
                and controller._actor_manager.is_actor_started(own)):
            return False
        return original(controller, trial)

    tune_controller.TuneController._maybe_reuse_cached_actor = maybe_reuse_cached_actor
    try:
        yield
    finally:
        tune_controller.TuneController._maybe_reuse_cached_actor = original


def _trial_name(trial) -> str:
    return trial.config["run_key"]


def _await_running(states: Writer | Remote, sweep_id: str, stale_after_s: float) -> bool:
    """Wait while runs of the sweep are RUNNING outside this driver's Tuner: a killed driver's
    trials (their heartbeats stop, so within ``stale_after_s`` they are orphans, pending again)
    or another sweep's trials of a shared run. True when one of them changed; False when none runs."""
    registry = states.registry
    running = registry.sweep_counts(sweep_id).get("running", 0)
    while running and not states.cancel_requested(sweep_id):
        time.sleep(min(trial.HEARTBEAT_S, stale_after_s / 4))
        if states.reset_orphans(sweep_id, stale_after_s):
            return True
        if registry.sweep_counts(sweep_id).get("running", 0) < running:
            return True
    return False


def _run_wave(sweep: dict[str, Any], keys: list[str], env: dict[str, Any], run_fn: Callable | None,
              states: Writer | Remote) -> None:
    """One Tune run over ``keys`` (a trial per run key), with the sweep's resources and retries; once
    it returns on a cancel, no run of it is left "running"."""
    wave_trials = _WaveTrials()
    resources = sweep["resources"]
    trainable = tune.with_resources(
        tune.with_parameters(trial.trial, run_fn=run_fn),
        {"cpu": resources.get("cpus", 1), "gpu": resources.get("gpus", 0)},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"run_key": None, "sweep_id": sweep["id"], "env": env},
        tune_config=tune.TuneConfig(
            # a trial per key, as points of the variant generator: a grid_search over the keys is deep-copied
            # (a list, whatever it was given) for every trial Tune generates, O(n^2) per wave
            search_alg=BasicVariantGenerator(points_to_evaluate=[{"run_key": key} for key in keys],
                                             max_concurrent=sweep["max_concurrent"] or 0),
            num_samples=len(keys), reuse_actors=True, scheduler=_Fifo(),
            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            name=f"{sweep['id']}-{os.getpid()}-{keys[0][:8]}",  # one Tune experiment per wave
            storage_path=str(settings.home() / "ray_results"),
            failure_config=tune.FailureConfig(max_failures=sweep["max_failures"]),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            stop=_Stopper(states, sweep["id"]),
            callbacks=[_WorkerLost(states, sweep), wave_trials],
            verbose=0,
        ),
    )
    with _trainable_looked_up_once(), _actors_kept(sweep["max_concurrent"] or 0), _starting_actors_kept():
        tuner.fit()
    if states.cancel_requested(sweep["id"]):
        _cancel_held(states, keys, wave_trials.ids)


def _left_pending(registry, sweep_id: str, keys: list[str]) -> list[str]:
    """The wave's runs still pending once its Tuner returned: Tune gave their trial up without the
    run failing, or the orphan reset put them back. Seen with a lost node: both in-flight calls to a
    dead trial actor fail, Tune requeues the trial on the first failure and errors it on the second,
    before the trial ever claimed its run (its worker and the run's attempts never changed)."""
    wave = set(keys)
    left = [key for key in registry.unfinished(sweep_id)  # few after a wave: those failed or left
            if key in wave and registry.get_run(key)["status"] == RunStatus.PENDING]
    if left:
        logging.getLogger("headsweep.driver").warning(
            "%d run(s) left pending by their wave (their trial ended before its run did): %s", len(left),
            ", ".join(key[:12] for key in left[:5]))
    return left


def final_status(counts: dict[str, int], cancel_requested: bool) -> str:
    """The sweep's status once its driver is done: cancelled when asked to, or when every run that
    did not finish was cancelled one by one; finished when every run finished; failed otherwise
    (failed, blocked, or left pending)."""
    finished, cancelled = counts.get(RunStatus.FINISHED, 0), counts.get(RunStatus.CANCELLED, 0)
    if cancel_requested or (cancelled and finished + cancelled == sum(counts.values())):
        return SweepStatus.CANCELLED
    return SweepStatus.FINISHED if finished == sum(counts.values()) else SweepStatus.FAILED


def execute_sweep(
    sweep_id: str,
    *,
    registry_url: str | None = None,
    tracking_uri: str | None = None,
    track: bool = True,
    run_fn: Callable | None = None,
    checkpoint_every_s: float = 60.0,
    stale_after_s: float = STALE_AFTER_S,
) -> dict[str, int]:
    """Run every unfinished run of the sweep on the connected Ray; return counts per status."""
    registry_url = registry_url or settings.registry_url()
    tracking_uri = (tracking_uri or settings.tracking_uri()) if track else None
    states = _writer(sweep_id, registry_url, tracking_uri)
    try:
        return _drive(sweep_id, states, registry_url, tracking_uri, run_fn, checkpoint_every_s, stale_after_s)
    finally:
        if isinstance(states, Remote):
            states.stop()


def _drive(sweep_id: str, states: Writer | Remote, registry_url: str, tracking_uri: str | None, run_fn: Callable | None,
           checkpoint_every_s: float, stale_after_s: float) -> dict[str, int]:
    registry = states.registry
    sweep = registry.get_sweep(sweep_id)
    states.reset_orphans(sweep_id, stale_after_s)  # a dead driver's runs: pending again, their MLflow runs KILLED
    if tracking_uri:  # and the MLflow status of a run it ended in the registry only (its writer cut off)
        states.flush(sweep_id)
    registry.unblock(sweep_id)  # a new driver retries what an upstream's failure blocked
    states.sweep_status(sweep_id, SweepStatus.RUNNING, sweep["mlflow_parent_run_id"] if tracking_uri else None)

    env = {
        "registry_url": registry_url, "tracking_uri": tracking_uri,
        "writer": states.name if isinstance(states, Remote) else None,
        "experiment_id": sweep["mlflow_experiment_id"], "parent_run_id": sweep["mlflow_parent_run_id"],
        "checkpoint_every_s": checkpoint_every_s, "stale_after_s": stale_after_s,
        "checkpoints": settings.checkpoint_root(),
        "name_keys": _name_keys(registry.sweep_runs(sweep_id)["config"]) if tracking_uri else [],
    }
    attempted: set[str] = set()
    relaunched: dict[str, int] = {}
    # Waves (DESIGN.md decision 10): the runs whose upstream runs have all finished, until none is
    # left; a run whose upstream failed is blocked, not run. Without stages this is one wave.
    while not states.cancel_requested(sweep_id):
        keys = registry.next_wave(sweep_id, attempted)
        if not keys:
            if _await_running(states, sweep_id, stale_after_s):
                continue  # some finished (their dependants may be ready) or were orphans: pending again
            break
        attempted.update(keys)
        _run_wave(sweep, keys, env, run_fn, states)
        for key in _left_pending(registry, sweep_id, keys):  # in another wave, max_failures + 1 times at most
            relaunched[key] = relaunched.get(key, 0) + 1
            if relaunched[key] <= sweep["max_failures"] + 1:
                attempted.discard(key)

    counts = registry.sweep_counts(sweep_id)
    status = final_status(counts, states.cancel_requested(sweep_id))
    states.sweep_status(sweep_id, status, sweep["mlflow_parent_run_id"] if tracking_uri else None)
    if unwritten := states.flush(sweep_id if tracking_uri else None):
        logging.getLogger("headsweep.driver").warning("%d MLflow run status(es) could not be written", unwritten)
    return counts


def _name_keys(configs) -> list[str]:
    from orchestrator import tracking

    return tracking.name_keys(configs)


def _writer(sweep_id: str, registry_url: str, tracking_uri: str | None) -> Writer | Remote:
    """The sweep's state changes: through a writer on this node when its stores are embedded files
    and other hosts would write them (``writer.writer_needed``), else this process's own."""
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive")) if ray.is_initialized() else 1
    if writer.writer_needed(registry_url, tracking_uri, nodes):
        return writer.start(sweep_id, registry_url, tracking_uri)
    return Writer(registry_url, tracking_uri)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    counts = execute_sweep(argv[0], track=os.environ.get("HEADSWEEP_TRACK", "1") == "1")
    print(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
