"""The local Ray head that ``submit`` starts: loopback only, one per HEADSWEEP_HOME, stopped by PID, its
nodes what ``submit`` checks a grid's resources against; and a sweep runs the code of the checkout that
submitted it, whoever started the head."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from experiments.harness.runner import source_hash
from orchestrator.cluster.head import (
    LOCAL_ENV,
    ClusterError,
    head_pids,
    local_head,
    stop_local_head,
    temp_dir,
)
from orchestrator.cluster.jobs import job_client
from orchestrator.cluster.packaging import PACKAGES
from orchestrator.cluster.processes import is_loopback, listening_sockets

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head_a(tmp_path_factory):
    """Checkout A's head: this checkout, a home of its own."""
    home = tmp_path_factory.mktemp("home_a")
    head = local_head(num_cpus=2, home=home)
    yield head | {"home": home}
    stop_local_head(home=home)


JOB = """
import pathlib, sys, time
import ray
ray.init()
@ray.remote
class Holder:
    def ping(self):
        return 1
holder = Holder.remote()
ray.get([holder.ping.remote(), ray.remote(lambda: 1).remote()])
pathlib.Path(sys.argv[1]).write_text("up")
time.sleep(120)
"""


def test_nothing_the_local_head_starts_listens_beyond_loopback(head_a, tmp_path):
    """GCS, raylet, object manager, dashboard and its agent, runtime-env agent, metrics, a job's driver,
    an actor and a task worker: every listening socket of the head's process tree is on 127.0.0.1."""
    (tmp_path / "job.py").write_text(JOB)
    ready = tmp_path / "ready"
    client = job_client(head_a["dashboard"])
    job = client.submit_job(entrypoint=f"{sys.executable} {tmp_path / 'job.py'} {ready}")
    deadline = time.monotonic() + 180
    while not ready.exists():
        assert client.get_job_status(job).value in ("PENDING", "RUNNING") and time.monotonic() < deadline, client.get_job_logs(job)
        time.sleep(0.5)
    try:
        pids = head_pids(head_a["home"])
        sockets = listening_sockets(pids)
        table = {pid: cmdline(pid) for pid in pids}  # a short-lived worker may be gone by now: ""
        assert [s for s in sockets if not is_loopback(s[0])] == [], sockets
        ports = {port for _, port, _ in sockets}
        state = json.loads((head_a["home"] / "ray.json").read_text())
        assert {state["ports"][name] for name in ("gcs", "dashboard", "node_manager", "object_manager")} <= ports
        listeners = {pid for _, _, pid in sockets}
        assert any("Holder" in table.get(pid, "") or "job.py" in table.get(pid, "") for pid in listeners)  # workers too
        assert 10001 not in ports and not any("ray_client_server" in cmd for cmd in table.values())
    finally:
        client.stop_job(job)


def cmdline(pid: int) -> str:
    """The process's command line; "" once it has exited (between listing a head's processes and reading them)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_each_home_has_its_own_head_and_stops_only_its_own(head_a, tmp_path):
    assert local_head(home=head_a["home"]) == {k: head_a[k] for k in ("address", "dashboard")}  # reused
    a_pids = head_pids(head_a["home"])
    home_b = tmp_path / "home_b"
    home_b.mkdir()
    # ray.json copied from A's home into B's: B must not take A's head for its own
    shutil.copy(head_a["home"] / "ray.json", home_b / "ray.json")
    head_b = local_head(num_cpus=1, home=home_b)
    try:
        assert head_b["address"] != head_a["address"] and head_b["dashboard"] != head_a["dashboard"]
        b_state = json.loads((home_b / "ray.json").read_text())
        assert b_state["home"] == str(home_b.resolve()) and b_state["temp_dir"] != temp_dir(head_a["home"])
        assert head_pids(home_b).isdisjoint(a_pids)
    finally:
        assert stop_local_head(home=home_b)
    assert not head_pids(home_b) and not (home_b / "ray.json").exists()
    assert a_pids <= head_pids(head_a["home"]) | {p for p in a_pids if not Path(f"/proc/{p}").exists()}
    assert local_head(home=head_a["home"])["address"] == head_a["address"]  # A's head still up


def test_a_port_held_by_someone_else_is_an_error_not_a_head_to_join(tmp_path, monkeypatch):
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        monkeypatch.setenv("HEADSWEEP_RAY_PORT", str(foreign.getsockname()[1]))
        with pytest.raises(ClusterError, match="taken by another process"):
            local_head(home=tmp_path)
    assert not (tmp_path / "ray.json").exists()


def test_resources_no_node_can_satisfy_fail_at_submit_and_write_nothing(head_a, tmp_path, monkeypatch, capsys):
    """Checked against the head's real nodes (2 CPUs, no GPU), before anything is written. `submit`
    in this process: its exit status through a real one is test_cli_submit.py's."""
    from headsweep.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    monkeypatch.setenv("RAY_ADDRESS", head_a["address"])
    monkeypatch.setenv("HEADSWEEP_RAY_DASHBOARD", head_a["dashboard"])
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({**GRID, "resources": {"cpus": 1, "gpus": 8}}))
    assert main(["submit", str(grid_file)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "GPU" in line and "no node has that" in line, line
    assert not home.exists() or not any(home.iterdir())  # no registry, no MLflow store, no head of its own


def test_a_driver_that_cannot_start_is_named_while_submit_waits(head_a, tmp_path, monkeypatch, capsys):
    """A sweep whose driver's Ray job stays PENDING (here: it asks for more CPUs than the head has) is
    not a silent "submitted": ``wait`` hands its progress printer Ray's own words about the job, and
    ``status`` shows them."""
    from orchestrator.driving import driver_job, sweeps
    from orchestrator.driving.grid import expand, parse_grid
    from orchestrator.registry import Registry

    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.setenv("HEADSWEEP_RAY_DASHBOARD", head_a["dashboard"])
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    registry = Registry(f"sqlite:///{tmp_path}/registry.db")
    sweep_id, _ = registry.create_sweep("stuck", "", expand(parse_grid(GRID)), {"cpus": 1}, 1, 0)
    client = job_client(head_a["dashboard"])
    job = client.submit_job(entrypoint="true", entrypoint_num_cpus=64)
    registry.set_sweep(sweep_id, driver=job, status="submitted")
    try:
        monkeypatch.setattr(driver_job, "STARTING_S", 3600.0)
        assert driver_job.driver_starting(registry.get_sweep(sweep_id)) is None  # not yet
        monkeypatch.setattr(driver_job, "STARTING_S", 0.0)
        notes = []

        def printer(sweep, counts):
            if sweep.get("starting"):
                notes.append(sweep["starting"])
                raise StopIteration

        with pytest.raises(StopIteration):
            sweeps.wait(sweep_id, printer, poll_s=0.1)
        (note,) = notes
        assert note.startswith("its driver's Ray job is PENDING ") and "s after submission: " in note, note
        assert "waiting for resources" in note, note  # Ray's message
        from headsweep.cli import main

        assert main(["status", sweep_id]) == 0  # and `status` says it too
        told = " ".join(capsys.readouterr().out.split())
        assert "its driver's Ray job is PENDING " in told and "waiting for resources" in told, told
        registry.set_sweep(sweep_id, status="running")  # a driver that started the sweep has nothing to explain
        assert driver_job.driver_starting(registry.get_sweep(sweep_id)) is None
    finally:
        client.stop_job(job)


GRID = {
    "name": "checkout-b",
    "base": {
        "model": "tiny-bert",
        "task": {"name": "synthetic-cls", "num_train": 32, "num_eval": 8, "max_length": 16},
        "train": {"max_steps": 2, "batch_size": 8, "eval_every": 2},
    },
    "axes": {"seed": [0]},
    "resources": {"cpus": 1},
}


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_a_sweep_submitted_from_checkout_b_runs_b_code_on_a_head(head_a, tmp_path):
    """Checkout B (a copy of the packages with a marker added) submits to the head that A started, in the
    same home: the driver job and the trial import B's code, and the run records B's source hash."""
    checkout_b = tmp_path / "b"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, checkout_b / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(checkout_b / "experiments" / "__init__.py", "a") as init:
        init.write('\nCHECKOUT_MARKER = "B"\n')
    env = os.environ | LOCAL_ENV | {"HEADSWEEP_HOME": str(head_a["home"]), "PYTHONPATH": str(checkout_b)}
    hash_b = subprocess.run([sys.executable, "-c", "from experiments.harness.runner import source_hash; print(source_hash())"],
                            cwd=checkout_b, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert hash_b != source_hash()
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    a_pids = head_pids(head_a["home"])
    done = subprocess.run([sys.executable, "-m", "headsweep.cli", "submit", str(grid), "--wait"],
                          cwd=checkout_b, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert head_pids(head_a["home"]) & a_pids  # A's head, not a new one

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{head_a['home']}/mlflow.db")
    experiment = client.get_experiment_by_name("checkout-b")
    children = [r for r in client.search_runs([experiment.experiment_id]) if "run_key" in r.data.tags]
    assert len(children) == 1
    assert children[0].data.tags["git_commit"].endswith(f"src:{hash_b}"), children[0].data.tags["git_commit"]


def test_headsweep_head_shows_the_head_and_stops_it_once_no_sweep_runs(head_a, monkeypatch, capsys):
    """``headsweep head status|stop`` (last in this module: it stops head_a). A sweep of the home still
    running: stop refuses, one line; cancelled, stop ends every process of the head."""
    from experiments.harness.config import parse_config
    from headsweep.cli import main as headsweep
    from orchestrator import settings
    from orchestrator.registry import Registry

    monkeypatch.setenv("HEADSWEEP_HOME", str(head_a["home"]))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_RAY_DASHBOARD", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    pids = head_pids(head_a["home"])
    assert pids
    assert headsweep(["head", "status"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    # Ray starts and ends idle workers on its own, so the count is the command's, read at its moment
    counted = re.search(rf"{re.escape(head_a['address'])}, dashboard {re.escape(head_a['dashboard'])}; (\d+) processes",
                        shown)
    assert counted and int(counted.group(1)) >= 3, shown  # GCS, raylet, dashboard at least
    assert "stop it with: headsweep head stop" in shown
    with Registry(settings.registry_url()) as registry:
        cfg = parse_config({"model": "tiny-bert", "task": {"name": "synthetic-cls"}})
        sweep_id, _ = registry.create_sweep("running", "name: running\n", [cfg], {"cpus": 1.0}, None, 1)
        registry.set_sweep(sweep_id, status="running")
        assert headsweep(["head", "stop"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"headsweep: error: sweeps still running on this head: {sweep_id}; cancel them first, "
            "or stop it anyway with --force")
        assert pids & head_pids(head_a["home"]) and (head_a["home"] / "ray.json").exists()  # the same head, still up
        registry.set_sweep(sweep_id, status="cancelled")
    assert headsweep(["head", "stop"]) == 0
    assert "stopped the local Ray head" in capsys.readouterr().out
    assert head_pids(head_a["home"]) == set()
    assert headsweep(["head", "status"]) == 0
    assert "no local Ray head runs" in capsys.readouterr().out


PRIORITY = """
import os, pathlib, sys
import ray
ray.init()
@ray.remote
class Trial:
    def nice(self):
        return os.getpriority(os.PRIO_PROCESS, 0)
task = ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0))
pathlib.Path(sys.argv[1]).write_text(f"{ray.get(task.remote())} {ray.get(Trial.remote().nice.remote())}")
"""


def test_the_heads_trials_run_at_the_priority_of_any_process(tmp_path, monkeypatch):
    """Ray starts its workers at niceness 15 (beside one busy process at 0 a trial gets ~3 % of a core);
    the local head starts them at 0: a task and an actor of a job report niceness 0. The session's own
    RAY_worker_niceness (conftest) is removed first, so the head's own setting is what is tested."""
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    home = tmp_path / "home"
    head = local_head(num_cpus=1, home=home)
    try:
        (tmp_path / "job.py").write_text(PRIORITY)
        said = tmp_path / "said"
        client = job_client(head["dashboard"])
        job = client.submit_job(entrypoint=f"{sys.executable} {tmp_path / 'job.py'} {said}")
        deadline = time.monotonic() + 180
        while client.get_job_status(job).value in ("PENDING", "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert said.exists(), client.get_job_logs(job)
        assert said.read_text() == "0 0"
    finally:
        stop_local_head(home=home)
