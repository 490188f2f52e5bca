"""``headsweep slurm``: the sbatch script it writes, and sweeps through a real SLURM.

The slow tests start their own single-node SLURM (Debian's slurm-wlm: slurmctld and slurmd, with
munge and a key of its own) from a private config and state folder in a temp dir, on 127.0.0.1
and free ports, as the current user (SlurmUser; run as root here), submit through ``sbatch``
(``headsweep slurm``), and tear it all down (jobs, daemons, munge, the jobs' Ray) even on
failure. .ci/run installs slurm-wlm and munge.
"""

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from waiting import until

from base.sections import ConfigError
from orchestrator import tracking
from orchestrator.cluster.head import PORTS
from orchestrator.cluster.processes import (
    is_loopback,
    listening_sockets,
    process_tree,
    processes,
    stop_ray,
)
from orchestrator.registry import Registry
from orchestrator.registry.events import ALLOCATION_ENDED, DRIVER_LOST, RESUMED
from orchestrator.slurm import allocation, sbatch

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "squeue", "sinfo")
GRID = {  # three tiny runs, one at a time: long enough to cancel one mid-run
    "name": "onslurm",
    "base": {
        "model": "tiny-bert",
        "task": {"name": "synthetic-cls", "num_train": 200, "num_eval": 16, "max_length": 24},
        "train": {"max_steps": 40, "batch_size": 8, "eval_every": 20},
    },
    "axes": {"seed": [0, 1, 2]},
    "resources": {"cpus": 1},
    "max_concurrent": 1,
}
EXAMPLE = sbatch.Job(  # examples/slurm/headsweep.sbatch is this job's script
    name="hs-stem-cell-63f12bb014", grid="/home/me/headsweep/examples/grid_stem_cell.yaml",
    folder="/home/me/headsweep/.headsweep/slurm/stem-cell-63f12bb014", workdir="/home/me/headsweep",
    python="/home/me/headsweep/.venv/bin/python", nodes=2, cpus_per_node=16, gpus_per_node=4, time="04:00:00",
    partition="gpu", requeue=True, env={
        "HEADSWEEP_HOME": "/home/me/headsweep/.headsweep",
        "HEADSWEEP_DB": "postgresql+psycopg://me@db.cluster.example:5432/headsweep",
        "HEADSWEEP_TRACKING_URI": "postgresql+psycopg://me@db.cluster.example:5432/mlflow",
        "HEADSWEEP_ARTIFACT_ROOT": "file:///home/me/headsweep/.headsweep/mlartifacts",
        "HEADSWEEP_CHECKPOINTS": "file:///home/me/headsweep/.headsweep/checkpoints",
    })


# --------------------------------------------------------------------------- the script (fast)


def test_the_shipped_template_is_what_headsweep_slurm_writes(tmp_path, monkeypatch):
    """... for docs/clusters.md's command, on a machine with other paths."""
    assert (ROOT / "examples/slurm/headsweep.sbatch").read_text() == sbatch.script(EXAMPLE)
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    readme = sbatch.plan_job(str(ROOT / "examples/grid_stem_cell.yaml"), nodes=2, gpus_per_node=4,
                            time_limit="04:00:00", cpus_per_node=16, partition="gpu", requeue=True)
    assert readme.folder.startswith(f"{tmp_path}/slurm/stem-cell-")
    elsewhere = {"name": EXAMPLE.name, "grid": EXAMPLE.grid, "folder": EXAMPLE.folder, "workdir": EXAMPLE.workdir,
                 "python": EXAMPLE.python, "env": EXAMPLE.env}
    assert dataclasses.replace(readme, **elsewhere) == EXAMPLE


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    done = _headsweep("slurm", str(grid), "--nodes", "2", "--gpus-per-node", "0", "--time", "1-00:00", "--dry-run",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    options = [line.split()[1] for line in lines if line.startswith("#SBATCH")]
    assert {"--nodes=2", "--time=1-00:00", "--no-requeue"} <= set(options)
    assert "--cpus-per-task=1" in options  # max_concurrent 1 over 2 nodes, 1 CPU per run
    assert not any(option.startswith("--gpus-per-node") for option in options)
    assert f"export HEADSWEEP_DB=sqlite:///{tmp_path}/home/registry.db" in lines
    assert lines[-1].startswith(f"exec {sys.executable} -m orchestrator.slurm.allocation job {tmp_path}/home/slurm/onslurm-")
    assert not (tmp_path / "home" / "slurm").exists()


def test_the_allocation_is_checked_before_anything_is_submitted(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "resources": {"cpus": 1, "gpus": 1}}))
    with pytest.raises(ConfigError, match="--time: expected a SLURM time"):
        sbatch.plan_job(str(grid), 1, 1, "4 hours")
    with pytest.raises(ConfigError, match="a trial needs 1 CPU and 1 GPU on one node"):
        sbatch.plan_job(str(grid), 1, 0, "60")
    assert sbatch.plan_job(str(grid), 2, 4, "60").cpus_per_node == 4  # 4 runs of 1 CPU fit on 4 GPUs


def test_a_password_in_a_url_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.setenv("HEADSWEEP_DB", "postgresql+psycopg://me:secret@db:5432/headsweep")
    with pytest.raises(ConfigError, match="HEADSWEEP_DB has a password in it"):
        sbatch.exported_env()


def test_ray_on_one_node_is_loopback_only_with_ports_of_its_own():
    ports = {name: 30000 + i for i, name in enumerate(PORTS)}
    head, env = allocation.node_command("/tmp/hs-7", ports, 8, 2, "127.0.0.1")
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and "--head" in head
    assert {"--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--port=30000", "--num-cpus=8",
            "--num-gpus=2", "--temp-dir=/tmp/hs-7", "--block"} <= set(head)
    worker, env = allocation.node_command("/tmp/hs-7", ports, 8, 0, "10.0.0.12", head="10.0.0.11:30000")
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and "--head" not in worker
    assert {"--node-ip-address=10.0.0.12", "--address=10.0.0.11:30000"} <= set(worker)
    assert not any(arg.startswith(("--port=", "--dashboard")) and "agent" not in arg for arg in worker)
    assert allocation.allocated({"SLURM_CPUS_ON_NODE": "6", "CUDA_VISIBLE_DEVICES": "0,1"}) == (6, 2)


def test_the_history_names_the_allocation_that_ended_and_the_job_that_resumed():
    from datetime import datetime

    from orchestrator.registry.history import history

    at = datetime(2026, 1, 1, 12, 0)
    events = [{"kind": DRIVER_LOST, "at": at, "detail": {"driver": "d1", "state": ALLOCATION_ENDED, "orphaned": 1}},
              {"kind": RESUMED, "at": at, "detail": {"driver": "d2", "auto": False, "by": "SLURM job 4243"}}]
    sweep = {"id": "sw-1", "status": "running", "auto_resumes": 3, "cancel_requested": False}
    (line,) = history(sweep | {"events": events})
    assert line.startswith("driver ended with its SLURM allocation at ")
    assert line.endswith("; 1 run orphaned; resumed by SLURM job 4243")
    # not resumed by this allocation's supervisor: its Ray goes with it
    (line,) = history(sweep | {"status": "failed", "events": events[:1]})
    assert line.endswith("`headsweep resume sw-1` runs what is left")


# --------------------------------------------------------------------------- a real SLURM (slow)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PORT_TRIES = 3  # starts of slurmctld and slurmd, each pair on two other free ports, while one was taken meanwhile
# Each slow test's pytest timeout is the sum of its waits and its fixtures' (tests/waiting.py), in s. slurm_env:
# munged; each try, the node idle (+ its last sinfo) and the daemons stopped if one exited; at the module's end
# squeue, scancel, the jobs gone (+ its last squeue), the Ray of the module's jobs (4 at most), the daemons.
SLURM_S = 30 + PORT_TRIES * (60 + 60 + 2 * 15) + 60 + 60 + (60 + 60) + 4 * 20 + 3 * 15
SUBMIT_S = 300  # the submit fixture's `headsweep slurm`
JOB_S = 300 + 60 + 60  # _wait_job: the job ended (+ its last scontrol), its state


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _slurm_conf(base: Path, user: str, host: str, first_job: int) -> str:
    """A single-node SLURM's config in ``base``, its daemons on two loopback ports free a moment ago
    (they bind their own: one taken meanwhile stops a daemon, and the fixture writes another config)."""
    return "\n".join([
        "ClusterName=hstest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmUser={user}", f"SlurmdUser={user}",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={base / 'munge'}/socket",
        f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool",
        f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd.pid",
        f"SlurmctldLogFile={base}/slurmctld.log", f"SlurmdLogFile={base}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin",
        "ReturnToService=2", "KillWait=10", "MinJobAge=600", f"FirstJobId={first_job}",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN",
        f"PartitionName=hs Nodes={host} Default=YES MaxTime=INFINITE State=UP", "",
    ])


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """A private single-node SLURM on 127.0.0.1; yields the environment its clients (sbatch) need."""
    missing = [name for name in DAEMONS if not shutil.which(name)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: apt-get install slurm-wlm munge (.ci/run does)")
    base = tmp_path_factory.mktemp("slurm")
    munge = base / "munge"
    for folder in (munge, base / "state", base / "spool"):
        folder.mkdir()
    munge.chmod(0o711)  # munged wants its socket's folder searchable by all, and writable by it alone
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o400)
    user, host = os.environ.get("USER") or subprocess.check_output(["id", "-un"], text=True).strip(), socket.gethostname()
    first_job = 10_000 + os.getpid() % 80_000  # Ray temp dirs /tmp/hs-JOBID of no earlier session
    conf = base / "slurm.conf"
    env = os.environ | {"SLURM_CONF": str(conf)}
    daemons = []
    try:
        daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge}/socket", f"--key-file={munge}/key",
             f"--pid-file={munge}/pid", f"--seed-file={munge}/seed", f"--log-file={munge}/log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        until(lambda: (munge / "socket").exists(), 30, "munged did not start")
        for attempt in range(1, PORT_TRIES + 1):
            for log in ("slurmctld.log", "slurmd.log"):  # this try's own
                (base / log).unlink(missing_ok=True)
            conf.write_text(_slurm_conf(base, user, host, first_job))
            started = [subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL) for daemon in ("slurmctld", "slurmd")]
            daemons += started
            until(lambda started=started: any(d.poll() is not None for d in started)
                  or _run(["sinfo", "-h", "-o", "%t"], env).stdout.strip() == "idle", 60,
                  f"the node did not come up: {base}/slurmd.log")
            if all(d.poll() is None for d in started):
                break
            said = "\n".join(f"--- {name}: " + (base / name).read_text(errors="replace")[-1500:]
                              for name in ("slurmctld.log", "slurmd.log") if (base / name).exists())
            for daemon in started:
                _stop(daemon)
                daemons.remove(daemon)
            if "Address already in use" not in said or attempt == PORT_TRIES:
                pytest.fail(f"SLURM's daemons did not start (try {attempt} of {PORT_TRIES}):\n{said}")
        yield env
    finally:
        jobs = _run(["squeue", "-h", "-o", "%i"], env).stdout.split() if len(daemons) == 3 else []
        if jobs:
            _run(["scancel", *jobs], env)
            try:  # tearing down: a job that will not leave goes with the daemons below
                until(lambda: not _run(["squeue", "-h"], env).stdout.strip(), 60, "the jobs did not leave")
            except AssertionError:
                pass
        slurmd_tree = process_tree({daemons[-1].pid}) if daemons else set()
        for job in range(first_job, first_job + 20):  # what a killed job's Ray left, if any
            stop_ray(allocation.ray_temp_dir(str(job)))
            shutil.rmtree(allocation.ray_temp_dir(str(job)), ignore_errors=True)
        for daemon in reversed(daemons):
            _stop(daemon)
        for pid in slurmd_tree - {d.pid for d in daemons}:  # slurmstepd of a job that did not end
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _run(command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def _headsweep(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headsweep.cli", *args], env=env or os.environ.copy(),
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def _job_state(job_id: str, env: dict) -> str:
    shown = _run(["scontrol", "-o", "show", "job", job_id], env).stdout
    return re.search(r"JobState=(\S+)", shown).group(1)


def _wait_job(job_id: str, env: dict, timeout: float = 300) -> str:
    """The job's final state, once it ended (a hang fails the test, a slow machine does not)."""
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")
    until(lambda: _job_state(job_id, env) in ended, timeout, f"job {job_id} did not end in {timeout} s")
    return _job_state(job_id, env)


@pytest.fixture
def submit(slurm_env, tmp_path):
    """``submit(*flags, seeds=3)``: ``headsweep slurm`` of GRID (with that many seeds) from a home of its
    own; (SLURM job id, env, job folder, what it printed)."""
    env = slurm_env | {"HEADSWEEP_HOME": str(tmp_path / "home")}
    grid = tmp_path / "grid.yaml"

    def submit(*flags: str, seeds: int = 3) -> tuple[str, dict, Path, str]:
        grid.write_text(yaml.safe_dump(GRID | {"axes": {"seed": list(range(seeds))}}))
        done = _headsweep("slurm", str(grid), "--time", "10", "--cpus-per-node", "2", *flags, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        job_id = re.search(r"SLURM job (\d+)", done.stdout).group(1)
        (folder,) = (tmp_path / "home" / "slurm").iterdir()
        return job_id, env, folder, done.stdout

    return submit


def _registry(env: dict) -> Registry:
    return Registry(f"sqlite:///{env['HEADSWEEP_HOME']}/registry.db")


def _log(folder: Path, job_id: str) -> str:
    return (folder / f"slurm-{job_id}.out").read_text()


def _stuck(folder: Path, job_id: str) -> str:
    """What a job that did not get on says: the end of its log, and of its Ray's logs (the driver's and
    the supervisor's job output, their runtime env's set-up, the job agent, the trials' workers), read
    before the job's Ray goes."""
    said = [_log(folder, job_id)[-3000:]]
    logs = Path(allocation.ray_temp_dir(job_id)) / "session_latest" / "logs"
    patterns = ("job-driver-*.log", "runtime_env_setup-*.log", "runtime_env_agent.log", "dashboard_agent.log",
                "dashboard_JobHead.log", "raylet.err", "gcs_server.err", "worker-*.err")
    for path in sorted({path for pattern in patterns for path in logs.glob(pattern)}):
        tail = [line[:300] for line in path.read_text(errors="replace").splitlines()[-8:]]
        if tail:
            said.append(f"--- {path.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(said if len(said) > 1 else [*said, f"(no Ray logs under {logs})"])


def _finished_once_in_mlflow(env: dict, registry: Registry, sweep_id: str) -> None:
    """Every run of the sweep has exactly one FINISHED MLflow run (an interrupted attempt's is KILLED)."""
    mlflow = tracking.client(f"sqlite:///{env['HEADSWEEP_HOME']}/mlflow.db")
    runs = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
    finished = sorted(r.data.tags["run_key"] for r in runs if "run_key" in r.data.tags and r.info.status == "FINISHED")
    assert finished == sorted(registry.sweep_runs(sweep_id)["run_key"])


def _mid_sweep(job_id: str, env: dict, folder: Path, running_first: Callable[[], None] | None = None
               ) -> tuple[Registry, str]:
    """Once the job's sweep has one run finished and the next one running: its registry and id.
    ``running_first``: called once a run is running (the job's Ray is up), BEFORE the wait for a finished
    one, so that whatever the caller does next (a scancel) follows that moment by one query, not by the
    seconds ``running_first`` takes: a run of these grids lasts only a few seconds."""
    until(lambda: (folder / "sweep").exists(), 180, f"job {job_id} did not submit its sweep")
    registry, sweep_id = _registry(env), (folder / "sweep").read_text().strip()
    if running_first is not None:
        until(lambda: registry.sweep_counts(sweep_id).get("running", 0) >= 1, 180, lambda: _stuck(folder, job_id))
        running_first()
    until(lambda: registry.sweep_counts(sweep_id).get("finished", 0) >= 1
           and registry.sweep_counts(sweep_id).get("running", 0) >= 1, 180, lambda: _stuck(folder, job_id))
    return registry, sweep_id


def _ended_and_resumed(registry: Registry, sweep_id: str, by: str) -> tuple[dict, dict]:
    """The sweep's history: its driver lost once (the first allocation's), then resumed once, by
    ``by`` (between and after them, maybe events about runs: a trial's worker killed as Ray stopped,
    the interrupted run reset by the new supervisor)."""
    events = registry.events(sweep_id)
    about_the_driver = [e for e in events if e["kind"] in (DRIVER_LOST, RESUMED)]
    assert [e["kind"] for e in about_the_driver] == [DRIVER_LOST, RESUMED], events
    lost, resumed = about_the_driver
    assert resumed["detail"].get("by") == by and resumed["detail"]["driver"], events
    return lost, resumed


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(SLURM_S + SUBMIT_S + JOB_S + 60)  # the last: scontrol show job
def test_a_sweep_on_slurm_finishes(submit):
    start = time.monotonic()
    job_id, env, folder, _ = submit()
    assert _wait_job(job_id, env) == "COMPLETED", _log(folder, job_id)[-3000:]
    took = time.monotonic() - start
    registry, sweep_id = _registry(env), (folder / "sweep").read_text().strip()
    assert registry.get_sweep(sweep_id)["status"] == "finished"
    assert registry.sweep_counts(sweep_id) == {"finished": 3}
    assert [registry.get_run(key)["attempts"] for key in registry.sweep_runs(sweep_id)["run_key"]] == [1, 1, 1]
    _finished_once_in_mlflow(env, registry, sweep_id)
    log = _log(folder, job_id)
    assert f"{sweep_id}: finished" in log and "INFO" not in log.split("Ray: 1 node(s)")[1], log[-3000:]
    tmp = allocation.ray_temp_dir(job_id)
    assert not stop_ray(tmp) and not Path(tmp).exists()  # the job stopped its Ray and removed its temp dir
    # the comments after #SBATCH options are comments: the job ran where `headsweep slurm` ran
    assert f"WorkDir={folder.parents[2]} " in _run(["scontrol", "-o", "show", "job", job_id], env).stdout
    print(f"\nsubmit -> sweep finished -> SLURM job ended: {took:.0f} s")


# its waits: mid-sweep (3 waits, the dashboard asked), scancel, the job, its Ray gone (+ its last look), the submit
# again, the job, status
@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(SLURM_S + SUBMIT_S + (3 * 180 + 10) + 60 + JOB_S + (30 + 20) + SUBMIT_S + JOB_S + 300)
def test_a_cancelled_job_submitted_again_finishes_every_run_once(submit):
    start = time.monotonic()

    def while_it_runs() -> None:
        """Every server of the job's Ray on loopback, its dashboard refusing a client without the token."""
        ray = {pid for pid, (_, cmdline) in processes().items() if tmp in cmdline}
        assert ray and [s for s in listening_sockets(process_tree(ray)) if not is_loopback(s[0])] == []
        dashboard = re.search(r"dashboard (http://127\.0\.0\.1:\d+)", _log(folder, first)).group(1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=10)
        assert refused.value.code in (401, 403)

    # 4 runs, one at a time: cancelled with 1 finished, 1 running and 2 pending, the job stops its Ray on
    # SIGTERM before anything else, so its driver starts no run after it (with 2 pending, one could
    # start and finish in the seconds scancel takes to reach the job on a loaded machine; not two)
    first, env, folder, _ = submit(seeds=4)
    tmp = allocation.ray_temp_dir(first)
    registry, sweep_id = _mid_sweep(first, env, folder, running_first=while_it_runs)
    before = {key: registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]}
    _run(["scancel", first], env)  # at once (a few queries after): the sweep's running run ends within seconds
    cancelled_after_s = time.monotonic() - start
    assert _wait_job(first, env) == "CANCELLED"
    until(lambda: not stop_ray(tmp), 30, "the cancelled job's Ray is still running")
    assert re.search(r"\d\d:\d\d:\d\d SLURM ends the allocation \(SIGTERM\): Ray stops", _log(folder, first))
    assert registry.sweep_counts(sweep_id).get("finished", 0) < 4, registry.sweep_counts(sweep_id)

    second, _, _, told = submit(seeds=4)
    assert second != first and f"resumes sweep {sweep_id}" in told
    assert _wait_job(second, env) == "COMPLETED", _log(folder, second)[-3000:]
    took = time.monotonic() - start

    assert registry.sweep_counts(sweep_id) == {"finished": 4}
    after = {key: registry.get_run(key) for key in before}
    done_before = [key for key, run in before.items() if run["status"] == "finished"]
    assert done_before and all(after[key] == before[key] for key in done_before)  # never ran again
    interrupted = [key for key, run in before.items() if run["status"] == "running"]
    # each run's trials: one, plus one for a run the cancel interrupted (unless it finished first)
    assert all(after[key]["attempts"] <= 1 + (key in interrupted) for key in after), after
    _finished_once_in_mlflow(env, registry, sweep_id)

    lost, resumed = _ended_and_resumed(registry, sweep_id, f"SLURM job {second}")
    told = " ".join(_headsweep("status", sweep_id, env=env).stdout.split())
    assert f"resumed by SLURM job {second}" in told, told
    # recorded at scancel's SIGTERM (or, had SIGKILL come first, by the next allocation)
    assert lost["detail"]["state"] == ALLOCATION_ENDED and "driver ended with its SLURM allocation at" in told, told
    print(f"\nsubmit -> scancel mid-sweep: {cancelled_after_s:.0f} s; -> submitted again, every run finished "
          f"once: {took:.0f} s in all; the end recorded as {lost['detail']['state']}")


# its waits: mid-sweep (2 waits), the warning, the job requeued (+ its last look), scontrol update, the job
@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(SLURM_S + SUBMIT_S + 2 * 180 + 60 + (120 + 120) + 60 + JOB_S)
def test_near_its_time_limit_a_requeue_job_requeues_itself_and_resumes_the_sweep(submit):
    start = time.monotonic()
    job_id, env, folder, _ = submit("--requeue")
    registry, sweep_id = _mid_sweep(job_id, env, folder)
    _run(["scancel", "--batch", "--signal=USR1", job_id], env)  # what --signal=B:USR1@90 sends
    until(lambda: "Restarts=1" in _run(["scontrol", "-o", "show", "job", job_id], env).stdout
           and _job_state(job_id, env) == "PENDING", 120, lambda: _stuck(folder, job_id))
    warned_after_s = time.monotonic() - start
    _run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env)  # SLURM holds a requeued job ~2 min
    assert _wait_job(job_id, env) == "COMPLETED", _log(folder, job_id)[-3000:]
    took = time.monotonic() - start

    assert registry.sweep_counts(sweep_id) == {"finished": 3}
    _finished_once_in_mlflow(env, registry, sweep_id)
    lost, _ = _ended_and_resumed(registry, sweep_id, f"SLURM job {job_id}")
    assert lost["detail"]["state"] == ALLOCATION_ENDED
    assert "requeued: the next allocation resumes the sweep" in _log(folder, job_id)
    print(f"\nsubmit -> the time-limit warning mid-sweep -> requeued: {warned_after_s:.0f} s; -> every run "
          f"finished once: {took:.0f} s in all")
