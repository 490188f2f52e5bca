"""A real multi-process Ray cluster on this machine, on loopback only: the project's local head (of a
temp home) with 4 logical GPUs, a second node (and that node lost: its processes killed), detached
sweeps as Ray Jobs, a driver killed mid-sweep and resumed (by the supervisor, or by hand with
--no-auto-resume); and cluster.yaml's schema."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml

from base.result import RunResult, UnitMap
from orchestrator import settings, tracking
from orchestrator.cluster.head import HEAD_ENV, head_pids, local_head, stop_local_head
from orchestrator.cluster.jobs import cluster_nodes, job_client, job_state, stop_job
from orchestrator.cluster.packaging import job_runtime_env
from orchestrator.cluster.processes import is_loopback, listening_sockets, processes
from orchestrator.driving import supervisor
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry, history
from orchestrator.registry import db as registry_db

pytestmark = pytest.mark.ray
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ray_nodes  # noqa: E402  (tests/ray_nodes.py: simulated worker nodes on this machine)
from waiting import until  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """The project's own local head (of a home of its own, so its ports and temp dir are its own)."""
    cluster_home = tmp_path_factory.mktemp("cluster_home")
    head = local_head(num_cpus=2, num_gpus=4, home=cluster_home)
    yield head | {"home": cluster_home, "ports": json.loads((cluster_home / "ray.json").read_text())["ports"]}
    stop_local_head(home=cluster_home)  # its processes, the second node's included, by PID


@pytest.fixture
def home(tmp_path, monkeypatch, ray_cluster):
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster["address"])
    monkeypatch.setenv("HEADSWEEP_RAY_DASHBOARD", ray_cluster["dashboard"])
    # ray.init leaves RAY_AUTH_MODE=token in os.environ (seen after Serve tests in this process):
    # our drivers and CLIs must talk to this cluster the way it was started (loopback included)
    for key, value in HEAD_ENV.items():
        monkeypatch.setenv(key, value)
    yield tmp_path
    supervisor.stop(ray_cluster["dashboard"], settings.registry_url())  # the one a CLI submit started


def _register(grid: dict) -> tuple[Registry, str]:
    spec = parse_grid(grid)
    registry = Registry(f"sqlite:///{os.environ['HEADSWEEP_HOME']}/registry.db")
    sweep_id, _ = registry.create_sweep(spec.name, "", expand(spec), spec.resources.model_dump(),
                                        spec.max_concurrent, spec.max_failures)
    return registry, sweep_id


def _where(cfg, ctx, seconds: float) -> RunResult:
    """Records where and when it ran: node, visible GPUs, start/end."""
    import numpy as np

    start = time.time()
    time.sleep(seconds)
    node = ray.get_runtime_context().get_node_id()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ones = np.ones((2, 4), dtype=np.float32)
    metrics = {"start": start, "end": time.time(), "node": int(node[:8], 16), "gpu": float(gpus or -1)}
    return RunResult(cfg.run_key, cfg.group_key, metrics, {"heads.gate": UnitMap(ones, "heads", "test")}, steps=1)


TRIVIAL = {"name": "where", "base": {"model": "tiny-bert"}, "max_failures": 0}

DRIVER = """
import functools, json, sys
import ray
from ray import cloudpickle  # Ray pickles with its own vendored cloudpickle
sys.path.insert(0, {here!r})
import test_cluster
cloudpickle.register_pickle_by_value(test_cluster)  # workers get the run function by value
from orchestrator.driving.driver import execute_sweep
ray.init(address={address!r}, log_to_driver=False, logging_level="WARNING")
{arrivals}
counts = execute_sweep({sweep!r}, registry_url={url!r}, track=False,
                       run_fn=functools.partial(test_cluster.{run_fn}, **{kwargs!r}))
print(json.dumps(counts))
"""


# the barrier of _packed's runs, held by their driver (it ends with it)
ARRIVALS = 'arrivals = test_cluster.Arrivals.options(name="arrivals", namespace=test_cluster.NAMESPACE).remote()'


def _driver_command(sweep_id: str, home, run_fn: str = "_where", **kwargs) -> list[str]:
    """The sweep's driver as a process of its own, connected to the cluster, as a real driver is:
    each run is ``run_fn(cfg, ctx, **kwargs)`` (a function of this module)."""
    code = DRIVER.format(here=os.path.dirname(__file__), address=os.environ["RAY_ADDRESS"], sweep=sweep_id,
                         url=f"sqlite:///{home}/registry.db", run_fn=run_fn, kwargs=kwargs,
                         arrivals=ARRIVALS if run_fn == "_packed" else "")
    return [sys.executable, "-c", code]


def _drive(sweep_id: str, home, run_fn: str = "_where", timeout: float = 300, **kwargs) -> dict:
    """Run the sweep's driver (:func:`_driver_command`) to its end; its counts, all finished."""
    done = subprocess.run(_driver_command(sweep_id, home, run_fn, **kwargs), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(counts) == {"finished"}, done.stderr[:4000]
    return counts


NAMESPACE = "headsweep-test-cluster"


@ray.remote(num_cpus=0)
class Arrivals:
    """Which trials are inside their run now (in all and per logical GPU), the most seen at once, and
    a barrier: ``full()`` once ``expected`` were inside together, or ``wait_s`` after the first
    arrival (so packing that never reaches ``expected`` fails the test after one wait, not one per
    wave). The driver of the sweep holds it; its calls run one at a time."""

    def __init__(self, expected: int = 8, wait_s: float = 240.0) -> None:
        self.expected, self.wait_s = expected, wait_s
        self.inside: dict[str, int] = {}
        self.peak = self.peak_per_gpu = 0
        self.deadline: float | None = None

    def arrive(self, gpu: str) -> None:
        self.deadline = self.deadline or time.monotonic() + self.wait_s
        self.inside[gpu] = self.inside.get(gpu, 0) + 1
        self.peak = max(self.peak, sum(self.inside.values()))
        self.peak_per_gpu = max(self.peak_per_gpu, self.inside[gpu])

    def leave(self, gpu: str) -> tuple[int, int]:
        self.inside[gpu] -= 1
        return self.peak, self.peak_per_gpu

    def full(self) -> bool:
        return self.peak >= self.expected or time.monotonic() > self.deadline


def _packed(cfg, ctx) -> RunResult:
    """Arrives, waits at the barrier until 8 trials were inside at once (or the barrier gives up),
    leaves: how many runs share a GPU is counted by the actor, never guessed from timestamps."""
    import numpy as np

    arrivals = ray.get_actor("arrivals", namespace=NAMESPACE)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ray.get(arrivals.arrive.remote(gpu))
    while not ray.get(arrivals.full.remote()):
        time.sleep(0.1)
    peak, peak_per_gpu = ray.get(arrivals.leave.remote(gpu))
    metrics = {"gpu": float(gpu or -1), "peak": peak, "peak_per_gpu": peak_per_gpu}
    ones = np.ones((2, 4), dtype=np.float32)
    return RunResult(cfg.run_key, cfg.group_key, metrics, {"heads.gate": UnitMap(ones, "heads", "test")}, steps=1)


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_gpu_packing_half_a_gpu_per_run_gives_8_concurrent(home):
    """Half a GPU per run on 4 logical GPUs (and a quarter CPU on 2): 8 runs at once, never more, never
    more than 2 on a GPU, every GPU used, every run once. The runs wait for each other (``Arrivals``),
    so reaching 8 is no race between the 8th run's start and the 1st one's end; broken packing (a
    whole GPU per run: 4 at once) fails here after the barrier's wait (240 s): "at most 4 runs at once"."""
    grid = {**TRIVIAL, "axes": {"seed": list(range(16))}, "resources": {"cpus": 0.25, "gpus": 0.5}}
    registry, sweep_id = _register(grid)
    assert _drive(sweep_id, home, run_fn="_packed", timeout=500) == {"finished": 16}
    results = registry.sweep_runs(sweep_id)
    assert [registry.get_run(key)["attempts"] for key in results["run_key"]] == [1] * 16
    metrics = results["metrics"]
    assert {m["gpu"] for m in metrics} == {0.0, 1.0, 2.0, 3.0}
    peak, peak_per_gpu = max(m["peak"] for m in metrics), max(m["peak_per_gpu"] for m in metrics)
    assert peak == 8, f"at most {peak} runs at once"
    assert peak_per_gpu == 2, f"{peak_per_gpu} runs at once on one GPU"


CLI_SWEEP_S = 900
"""pytest's limit for a sweep submitted through the CLI and interrupted: above the sum of its waits'
guards (380 s measured at load 15-33 for the SIGKILLed driver's), so a guard names what hung."""

SLOW_GRID = {
    "name": "detached",
    "base": {
        "model": "tiny-bert",
        "task": {"name": "synthetic-cls", "num_train": 400, "num_eval": 16, "max_length": 24},
        "train": {"max_steps": 60, "batch_size": 8, "eval_every": 10},
    },
    "axes": {"seed": [0, 1, 2, 3]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
    "max_failures": 1,
}


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "headsweep.cli", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=timeout)


def _until(what: str, probe, done, limit_s: float = 180, every_s: float = 0.5):
    """``probe()`` again until ``done(seen)``; the last ``seen``. ``limit_s`` only tells a hang from a
    loaded machine: past it the test fails naming what it awaited and what it saw."""
    last = []
    until(lambda: done(last.append(probe()) or last[-1]), limit_s,
          lambda: f"waited {limit_s:g} s for {what}; saw {last[-1]}", every_s)
    return last[-1]


def _running(registry: Registry, sweep_id: str) -> list[str]:
    """The sweep's runs the registry shows RUNNING."""
    return [key for key in registry.unfinished(sweep_id) if registry.get_run(key)["status"] == "running"]


def _supervisor_looked(registry: Registry, dashboard: str) -> None:
    """Returns once the supervisor finished a look at the registry that began after this call: a
    witness sweep whose driver job failed is made live here, and only a supervisor's look records
    its driver as lost (every sweep that look saw was as it is now)."""
    client = job_client(dashboard)
    failed = client.submit_job(entrypoint="exit 3", entrypoint_num_cpus=0)
    _until(f"the witness job {failed} to fail", lambda: job_state(dashboard, failed)[0], lambda s: s == "FAILED")
    witness, _ = registry.create_sweep("witness", "", expand(parse_grid({**TRIVIAL, "axes": {"seed": [99]}})),
                                       {"cpus": 1}, None, 0)
    registry.set_sweep(witness, status="running", driver=failed)
    _until("the supervisor to record the witness's lost driver", lambda: registry.events(witness),
           lambda events: [e["kind"] for e in events] == ["driver_lost"], limit_s=120)


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(CLI_SWEEP_S)
def test_a_killed_driver_is_resumed_and_every_run_finishes_exactly_once(home, ray_cluster, tmp_path, monkeypatch):
    """Submitted with --no-auto-resume: the sweep stays failed, with the supervisor watching the
    registry, until it is resumed by hand."""
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(SLOW_GRID))
    submitted = _cli("submit", str(grid_file), "--no-auto-resume")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    registry = Registry(f"sqlite:///{home}/registry.db")
    (sweep,) = registry.list_sweeps()
    sweep_id = sweep["id"]
    # submit returned before the sweep was done (it runs on Ray): no clock, both slow down with the machine
    assert registry.sweep_counts(sweep_id).get("finished", 0) < 4
    assert sweep["auto_resumes"] == 0 and "supervisor" not in submitted.stdout
    monkeypatch.setenv("HEADSWEEP_SUPERVISOR_POLL_S", "1")
    watching = supervisor.ensure({"address": ray_cluster["address"], "dashboard": ray_cluster["dashboard"]})

    _until("a run running", lambda: registry.sweep_counts(sweep_id), lambda counts: counts.get("running", 0) > 0)
    driver = registry.get_sweep(sweep_id)["driver"]
    stop_job(ray_cluster["dashboard"], driver)
    _until(f"the driver job {driver} to end", lambda: job_state(ray_cluster["dashboard"], driver)[0],
           lambda state: state not in ("PENDING", "RUNNING"))
    # status and ls tell the truth at once: the sweep failed, and how to go on
    told = " ".join(_cli("status", sweep_id).stdout.split())
    assert f"{sweep_id} (detached): failed" in told and f"headsweep resume {sweep_id}" in told, told
    assert registry.get_sweep(sweep_id)["status"] == "failed"
    # the driver was stopped with runs in flight: the registry counted them when it recorded the loss
    # (a trial's worker that outlived its driver by a moment may have finished one since)
    (lost,) = registry.events(sweep_id)
    left = _running(registry, sweep_id)
    assert lost["kind"] == "driver_lost" and lost["detail"]["orphaned"] >= len(left) >= 1, (lost, left)
    _supervisor_looked(registry, ray_cluster["dashboard"])  # it looks every second: it left this sweep alone
    assert supervisor.running(ray_cluster["dashboard"]) == [watching] and supervisor.watching()
    assert registry.get_sweep(sweep_id)["status"] == "failed"
    assert [e["kind"] for e in registry.events(sweep_id)] == ["driver_lost"]
    assert _running(registry, sweep_id) == left  # not resumed, not reconciled: they wait for a resume by hand

    resumed = _cli("resume", sweep_id, "--wait")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert registry.sweep_counts(sweep_id) == {"finished": 4}
    mlflow = tracking.client()
    runs = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
    children = [r for r in runs if "run_key" in r.data.tags]
    assert sorted(r.data.tags["run_key"] for r in children) == sorted(registry.sweep_runs(sweep_id)["run_key"])
    assert {r.info.status for r in runs} == {"FINISHED"}  # nothing left RUNNING, parent included

    status = _cli("status", sweep_id)
    assert "finished: 4 of 4 runs finished" in status.stdout
    supervisor.stop(ray_cluster["dashboard"])  # what `status` and `wait` ask before promising a resume
    _until("the stopped supervisor to be gone", supervisor.watching, lambda watched: not watched, limit_s=60)


def _driver_pid(sweep_id: str) -> int:
    """The driver's Python process of the sweep (not the job's shell around it)."""
    command = f"{sys.executable} -m headsweep.sweep_job {sweep_id}"
    (pid,) = [pid for pid, (_, cmdline) in processes().items() if cmdline.strip() == command]
    return pid


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(CLI_SWEEP_S)
def test_a_sigkilled_driver_is_resumed_by_the_supervisor(home, ray_cluster, tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(SLOW_GRID))
    submitted = _cli("submit", str(grid_file))
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "the supervisor resumes it" in submitted.stdout
    registry = Registry(f"sqlite:///{home}/registry.db")
    (sweep,) = registry.list_sweeps()
    sweep_id = sweep["id"]
    assert sweep["auto_resumes"] == 3
    (watching,) = supervisor.running(ray_cluster["dashboard"])

    _until("a run running", lambda: registry.sweep_counts(sweep_id), lambda counts: counts.get("running", 0) > 0)
    first_driver = registry.get_sweep(sweep_id)["driver"]
    os.kill(_driver_pid(sweep_id), signal.SIGKILL)
    killed = time.time()
    # "within seconds" (it looks every 5 s; printed below): the deadline only tells a hang from a
    # loaded machine
    events = _until("the supervisor's automatic resume", lambda: registry.events(sweep_id),
                    lambda events: any(e["kind"] == "resumed" for e in events), every_s=0.2)
    resumed_after_s = time.time() - killed
    told = " ".join(_cli("status", sweep_id).stdout.split())
    assert "resumed automatically (1/3)" in told and "driver failed at " in told, told
    # the supervisor's reconcile may have added an ``orphaned`` event meanwhile: the loss and the resume by kind
    (lost,) = [e for e in events if e["kind"] == "driver_lost"]
    (resumed,) = [e for e in events if e["kind"] == "resumed"]
    orphaned = lost["detail"].pop("orphaned")  # its runs that were RUNNING when it died
    assert lost["detail"] == {"driver": first_driver, "state": "FAILED"} and orphaned >= 1
    assert f"; {orphaned} run{'s' if orphaned > 1 else ''} orphaned; resumed automatically" in told, told
    assert resumed["detail"]["auto"] and resumed["detail"]["driver"] == registry.get_sweep(sweep_id)["driver"] != first_driver
    # the supervisor is a process of the head (the head's stop ends it) and listens nowhere beyond loopback
    job_pids = {pid for pid, (_, cmdline) in processes().items() if f"orchestrator.driving.supervisor {watching}" in cmdline}
    head = head_pids(ray_cluster["home"])
    assert job_pids and job_pids <= head
    assert [s for s in listening_sockets(head) if not is_loopback(s[0])] == []
    assert listening_sockets(job_pids) == []

    _until("the resumed sweep to finish", lambda: registry.get_sweep(sweep_id)["status"], lambda s: s == "finished",
           limit_s=400, every_s=1)
    finished_after_s = time.time() - killed
    assert registry.sweep_counts(sweep_id) == {"finished": 4}
    events = registry.events(sweep_id)
    # the dead driver's runs go back to pending by the new driver's reconcile (20 s) or, when that
    # driver is busy with a wave of other runs for longer, by the supervisor's (60 s; recorded)
    assert [e["kind"] for e in events if e["kind"] != "orphaned"] == ["driver_lost", "resumed"], events
    assert sum(len(e["detail"]["run_keys"]) for e in events if e["kind"] == "orphaned") <= orphaned
    mlflow = tracking.client()
    runs = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
    children = [r for r in runs if "run_key" in r.data.tags]
    assert sorted(r.data.tags["run_key"] for r in children) == sorted(registry.sweep_runs(sweep_id)["run_key"])  # no duplicates
    ended = _until("the parent run's end (the driver's last step)",  # nothing left RUNNING, parent included
                   lambda: {r.info.status for r in mlflow.search_runs([sweep["mlflow_experiment_id"]])},
                   lambda statuses: "RUNNING" not in statuses, limit_s=60, every_s=1)
    assert ended == {"FINISHED"}
    print(f"\nkill -> automatic resume: {resumed_after_s:.1f} s; the sweep finished {finished_after_s:.0f} s after the kill")


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(CLI_SWEEP_S)
def test_a_sigkilled_worker_is_rerun_and_every_run_finishes_exactly_once(home, ray_cluster, tmp_path):
    """A detached sweep (MLflow on, the supervisor watching): one trial's worker process is SIGKILLed
    mid-run (what the kernel's OOM killer does). Tune retries the trial (max_failures 1); its new
    attempt takes the dead one's run over (the run key's row, its MLflow run), and the sweep ends
    with every run finished once, one MLflow run per run key and none left RUNNING. The driver never
    died: the supervisor has nothing to resume."""
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(SLOW_GRID))
    submitted = _cli("submit", str(grid_file))
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    registry = Registry(f"sqlite:///{home}/registry.db")
    (sweep,) = registry.list_sweeps()
    sweep_id = sweep["id"]

    # mid-run: running, with the MLflow run its next attempt is to take over
    running = _until("a run running with its MLflow run", lambda: list(map(registry.get_run, _running(registry, sweep_id))),
                     lambda runs: any(r["status"] == "running" and r["mlflow_run_id"] for r in runs), every_s=0.2)
    victim = next(r for r in running if r["status"] == "running" and r["mlflow_run_id"])
    assert victim["attempts"] == 1, victim
    pid = int(victim["worker"].rsplit(":", 1)[1])  # trial_id@host:pid, the trial's own process
    assert "ImplicitFunc" in processes()[pid][1]  # a Tune trial's worker, not the driver
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    while True:  # rerun: a new attempt holds the run (or has finished it)
        now = registry.get_run(victim["run_key"])
        if now["attempts"] == 2 and now["status"] in ("running", "finished"):
            break
        assert now["status"] != "failed" and time.time() - killed < 180, now  # a hang, not a slow machine
        time.sleep(0.2)
    rerun_after_s = time.time() - killed
    assert now["worker"] != victim["worker"] and now["mlflow_run_id"] == victim["mlflow_run_id"]

    _until("the sweep to finish", lambda: registry.get_sweep(sweep_id)["status"], lambda s: s == "finished",
           limit_s=400, every_s=1)
    finished_after_s = time.time() - killed
    assert registry.sweep_counts(sweep_id) == {"finished": 4}
    attempts = {key: registry.get_run(key)["attempts"] for key in registry.sweep_runs(sweep_id)["run_key"]}
    assert attempts == {key: 2 if key == victim["run_key"] else 1 for key in attempts}  # only the victim ran twice
    # the driver lived: nothing lost, nothing resumed; the history names the worker's death
    assert [(e["kind"], e["detail"]["run_key"], e["detail"]["then"]) for e in registry.events(sweep_id)] == [
        ("worker_lost", victim["run_key"], "retried")]
    named_after_s = (registry.events(sweep_id)[0]["at"] - registry_db.now()).total_seconds() + time.time() - killed
    mlflow = tracking.client()
    children = [r for r in mlflow.search_runs([sweep["mlflow_experiment_id"]]) if "run_key" in r.data.tags]
    assert sorted(r.data.tags["run_key"] for r in children) == sorted(attempts)  # one MLflow run per run key
    ended = _until("the parent run's end (the driver's last step)",  # nothing left RUNNING, parent included
                   lambda: {r.info.status for r in mlflow.search_runs([sweep["mlflow_experiment_id"]])},
                   lambda statuses: "RUNNING" not in statuses, limit_s=60, every_s=1)
    assert ended == {"FINISHED"}
    status = _cli("status", sweep_id)
    assert "finished: 4 of 4 runs finished" in status.stdout, status.stdout
    assert f"worker of run {victim['run_key'][:12]} died at" in status.stdout, status.stdout
    assert named_after_s < 120  # Tune notices a dead worker within seconds (printed below)
    print(f"\nworker SIGKILL -> in the sweep's history {named_after_s:.1f} s, its run rerun {rerun_after_s:.1f} s; "
          f"the sweep finished {finished_after_s:.0f} s after the kill")


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_cancel_stops_a_detached_sweep_through_its_live_driver(home, ray_cluster, tmp_path):
    """`headsweep cancel` while the sweep's driver (a Ray job) runs: pending runs are cancelled at once,
    the running trials stop at their next check, and the driver ends by itself, the sweep cancelled
    (the branch where the driver is gone is in test_cli_cancel.py)."""
    grid_file = tmp_path / "grid.yaml"
    endless = {**SLOW_GRID["base"]["train"], "max_steps": 100_000}  # hours: no run can finish before cancel
    grid_file.write_text(yaml.safe_dump({**SLOW_GRID, "base": {**SLOW_GRID["base"], "train": endless}}))
    submitted = _cli("submit", str(grid_file), "--no-auto-resume")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    registry = Registry(f"sqlite:///{home}/registry.db")
    (sweep,) = registry.list_sweeps()
    deadline = time.time() + 180
    while registry.sweep_counts(sweep["id"]).get("running", 0) == 0:
        assert time.time() < deadline, registry.sweep_counts(sweep["id"])
        time.sleep(0.5)
    cancelled = _cli("cancel", sweep["id"])
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled.stderr[-3000:]
    driver = registry.get_sweep(sweep["id"])["driver"]
    deadline = time.time() + 180  # a hang, not a loaded machine: trials look every 2 s
    while (state := job_state(ray_cluster["dashboard"], driver)[0]) in ("PENDING", "RUNNING"):
        assert time.time() < deadline, registry.sweep_counts(sweep["id"])
        time.sleep(0.5)
    assert state == "SUCCEEDED"  # it ended by itself, not stopped
    assert registry.sweep_counts(sweep["id"]) == {"cancelled": 4}
    assert registry.get_sweep(sweep["id"])["status"] == "cancelled"
    mlflow = tracking.client()
    parent = mlflow.get_run(registry.get_sweep(sweep["id"])["mlflow_parent_run_id"])
    assert parent.info.status == "KILLED"


@pytest.fixture
def second_node(ray_cluster):
    """A worker node with 4 CPUs and no GPU joining the module's head, with a temp dir (and so
    processes) of its own; stopped by PID after the test."""
    tmp = f"/tmp/hs-node-{os.getpid()}"  # short: Ray's unix sockets live under it
    try:
        node = ray_nodes.start_node(ray_cluster["address"], tmp, cpus=4, gpus=0)
        _until("the second node in the cluster", lambda: cluster_nodes(ray_cluster["dashboard"]),
               lambda nodes: len(nodes) == 2, limit_s=60, every_s=1)
        yield node
    finally:
        ray_nodes.stop_node(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    # gone from the cluster before the next test counts nodes
    _until("the second node to leave the cluster", lambda: cluster_nodes(ray_cluster["dashboard"]),
           lambda nodes: len(nodes) == 1, limit_s=60, every_s=1)


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_trials_land_on_both_nodes(home, ray_cluster, second_node):
    assert [a for a, _, _ in listening_sockets(head_pids(ray_cluster["home"]) | ray_nodes.node_pids(second_node["tmp"]))
            if not is_loopback(a)] == []
    grid = {**TRIVIAL, "axes": {"seed": list(range(8))}, "resources": {"cpus": 1}, "max_concurrent": 4}
    registry, sweep_id = _register(grid)
    assert _drive(sweep_id, home, seconds=2.0) == {"finished": 8}
    assert len({m["node"] for m in registry.sweep_runs(sweep_id)["metrics"]}) == 2


def _held(cfg, ctx, arrivals: str, together: int, hold_on: str) -> RunResult:
    """A barrier of files (this machine is every node): arrives (a file in ``arrivals`` naming its
    node), waits until ``together`` attempts arrived; then ends at once, or, on the node whose id
    starts with ``hold_on``, stays inside until that node dies (a run that ends by itself after
    ``HOLD_S`` fails the test: its node was never killed)."""
    node = ray.get_runtime_context().get_node_id()
    Path(arrivals, f"{cfg.run_key}-{os.getpid()}").write_text(node)
    deadline = time.monotonic() + HOLD_S
    while len(os.listdir(arrivals)) < together and time.monotonic() < deadline:
        time.sleep(0.1)
    while node.startswith(hold_on) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _where(cfg, ctx, 0.0)


HOLD_S = 300.0


def _arrived(arrivals: Path) -> dict[str, str]:
    """Which attempts arrived at :func:`_held`'s barrier: file name -> node id."""
    return {path.name: path.read_text() for path in arrivals.iterdir()}


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_a_lost_node_s_runs_rerun_elsewhere_and_status_names_the_node(home, ray_cluster, second_node):
    """Six runs of a CPU each on the head (2 CPUs) and a second node (4): they meet at a barrier
    (``_held``), so four run on the second node at once however slowly their workers start; those
    stay inside while the node's processes (raylet, agents, workers) are SIGKILLed at once, a
    machine that died. Tune retries their trials on the head: every run finishes once (only the
    lost node's ran twice), each loss is in the sweep's history with the worker that names the
    node, and `headsweep status` says in one line which node was lost and how many runs it cost."""
    lost_node = second_node["node_id"][:8]
    grid = {**TRIVIAL, "axes": {"seed": list(range(6))}, "resources": {"cpus": 1}, "max_concurrent": 6, "max_failures": 2}
    registry, sweep_id = _register(grid)
    arrivals = home / "arrivals"
    arrivals.mkdir()
    driver = subprocess.Popen(_driver_command(sweep_id, home, run_fn="_held", arrivals=str(arrivals), together=6,
                                              hold_on=lost_node),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _until("4 runs inside on the second node", lambda: (driver.poll(), _arrived(arrivals)),
               lambda seen: seen[0] is not None or sum(n.startswith(lost_node) for n in seen[1].values()) >= 4,
               limit_s=240, every_s=0.2)
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        on_node = [r for r in map(registry.get_run, _running(registry, sweep_id))
                   if history.worker_node(r["worker"])[0] == lost_node]
        assert len(on_node) == 4, on_node  # the node's 4 CPUs, each a run inside its barrier
        assert all(r["worker"].split("@", 1)[0] for r in on_node)  # the trial id still comes first
        killed = ray_nodes.kill_node(second_node["tmp"])
        assert killed and not ray_nodes.node_pids(second_node["tmp"])
        out, err = driver.communicate(timeout=400)
    finally:
        driver.kill()
    assert driver.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"finished": 6}, err[-3000:]
    lost = {r["run_key"] for r in on_node}
    runs = {key: registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]}
    assert {key: run["attempts"] for key, run in runs.items()} == {key: 2 if key in lost else 1 for key in runs}
    assert all(history.worker_node(runs[key]["worker"])[0] != lost_node for key in lost)  # rerun elsewhere
    events = registry.events(sweep_id)
    assert sorted((e["kind"], e["detail"]["run_key"], e["detail"]["then"]) for e in events) == sorted(
        ("worker_lost", key, "retried") for key in lost)
    assert {history.worker_node(e["detail"]["worker"]) for e in events} == {(lost_node, "127.0.0.1")}
    told = " ".join(_cli("status", sweep_id).stdout.split())
    assert "finished: 6 of 6 runs finished" in told, told
    assert f"workers lost on {socket.gethostname()} (Ray node {lost_node}, 127.0.0.1) at " in told and f": {len(lost)} runs rerun by Tune" in told, told


def test_cluster_yaml_is_valid_for_the_ray_launcher():
    from ray.autoscaler._private.util import fillout_defaults, validate_config

    config = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "..", "cluster.yaml")))
    validate_config(fillout_defaults(config))
    assert config["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1
    config["available_node_types"]["head"]["typo"] = 1
    with pytest.raises(Exception, match="typo"):
        validate_config(fillout_defaults(config))


def test_trials_find_the_data_where_the_grid_was_validated(monkeypatch, shared_data):
    """The shipped code lives in Ray's package cache, where ../shared/data is not beside it: the
    job's environment carries the data root resolved at submit (a built-in sst2 sweep failed
    with 'train.tsv not found in .../runtime_resources/py_modules_files/...' without it)."""
    from orchestrator.driving import driver_job

    monkeypatch.delenv("HEADSWEEP_DATA", raising=False)
    env = job_runtime_env(driver_job.driver_env({"address": "127.0.0.1:1"}, track=False))["env_vars"]
    assert env["HEADSWEEP_DATA"] == str(shared_data.resolve()) and (shared_data / "sst2" / "train.tsv").exists()
