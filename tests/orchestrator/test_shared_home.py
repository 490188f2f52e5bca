"""Issue 42's end-to-end proof: hosts that share only a network filesystem, and the embedded stores.

Five hosts (tests/hosts.py: network namespaces, each its own address, hostname, mounts and PIDs):
``login`` (where the user types), ``ctl`` (slurmctld, and the storage host: its disk keeps the
user's ``HEADSWEEP_HOME`` and serves it over SSH), ``n1``-``n3`` (a slurmd each, 2 CPUs, no GPU). The
home is mounted with sshfs at the same path on login, n1, n2 and n3 (``share_over_sshfs``: each
client's locks and page cache its own, as NFS gives), munge runs on every host with its own copy of
the key. No PostgreSQL, no tracking server: the registry and MLflow are the embedded defaults,
``HEADSWEEP_HOME/registry.db`` and ``HEADSWEEP_HOME/mlflow.db`` on that share. Without the sweep's one
writer (DESIGN.md 16, orchestrator/driving/writer.py) trials on three hosts writing those files lose
rows and corrupt them (tests/shared_fs_sqlite.py); with it, one process on the driver's host writes
them and every run is there once, both files intact.

The tests read the stores from this machine (the storage host's own disk) only read-only while a
sweep runs (``mode=ro``: a reader never rolls back a journal it takes for hot, which a reader on
another host than the writer would otherwise do, its locks not reaching the writer's), and fully
once the job ended.

In the multi-host lane (marked hosts, ray): root, ``ip``, ``nsenter``, ``unshare``, slurm-wlm and
munge, sshfs, openssh-server, ``/dev/fuse``; chromium for the UI's screenshot. Everything started is
stopped by PID, unmounted and the namespaces deleted, pass or fail (``python tests/hosts.py`` cleans
up after a killed run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hosts  # noqa: E402  (tests/hosts.py: hosts as network namespaces)
from waiting import until  # noqa: E402

from orchestrator.cluster.processes import kill_pids  # noqa: E402

pytestmark = [pytest.mark.hosts, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
HEADSWEEP = [sys.executable, "-m", "headsweep.cli"]
COMPUTES = ["n1", "n2", "n3"]
CLIENTS = ["login", *COMPUTES]  # every host that mounts the home (ctl keeps it on its disk)
SEEDS = 10
GRID = {  # 10 seeds x 3 lambdas x DP/SP = 60 cells, plus the 10 fine-tunes the SP cells start from: 70 runs
    "name": "shared-home",
    "base": {"model": "tiny-bert", "method": "head_gates",
             "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 16, "max_length": 16},
             "train": {"max_steps": 10, "batch_size": 8, "eval_every": 10}},
    "axes": {"seed": list(range(SEEDS)), "lambda": [0.05, 0.1, 0.2], "pipeline": ["dp", "sp"]},
    "resources": {"cpus": 1},
}
RUNS = SEEDS * 3 * 2 + SEEDS
UI_PORT = 5000
SCREENSHOT = Path("/tmp/headsweep-shared-home-ui.png")

# Each test's pytest timeout is the sum of its waits and its fixtures' (tests/waiting.py), in s:
CLUSTER_S = (5 * 30 + 5 * 30 + 90 + 30 + 30 + 4 * (30 + 10) + 4 * 10  # cluster: each host's boot and munged, the
             # nodes idle (its last sinfo), sshd on ctl, the 4 sshfs mounts (their last look), each mount checked
             + 4 * 20 + 5 * 20 + 22 * 5)  # at the module's end: 4 unmounts, then 20 s a host, 5 s a process (22 at most)
START_S = 300 + 300  # _start_long: the submit, the sweep started
STORES_S = 30 + 4 * 30  # _runs and _check_stores: 5 read-only connections to the stores, 30 s each at most


@pytest.fixture(scope="module")
def cluster():
    """login, ctl (slurmctld; the storage host: its folder served over sshd) and n1-n3 (slurmd, 2 CPUs);
    the folder mounted with sshfs at the same path on login and n1-n3; munge on every host."""
    lacking = hosts.missing_tools() + [tool for tool in ("sshfs", "/usr/sbin/sshd") if not shutil.which(tool)]
    if lacking or not Path("/dev/fuse").exists():
        pytest.fail(f"a shared-home test needs {', '.join(lacking) or '/dev/fuse'}")
    with hosts.Hosts(["login", "ctl", *COMPUTES]) as cluster:
        cluster.slurm_env = hosts.start_slurm(cluster, "ctl", COMPUTES, cpus=2, gpus=0,
                                              first_job=40_000 + os.getpid() % 20_000, munge_per_host=True)
        cluster.share = hosts.share_over_sshfs(cluster, "ctl", CLIENTS)
        for name in CLIENTS:
            assert hosts.mount_type(cluster, name, cluster.share) == "fuse.sshfs", name
        yield cluster


# --------------------------------------------------------------------------- helpers


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _user_env(cluster: hosts.Hosts, home: Path, **extra: str) -> dict[str, str]:
    """A user's shell on the login host: this checkout's Python, the home on the sshfs share."""
    clean = {name: value for name, value in cluster.slurm_env.items()
             if not name.startswith(("RAY_", "HEADSWEEP_", "MLFLOW_"))}
    return clean | {"HEADSWEEP_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"} | extra


def _headsweep(cluster, env, *args: str, timeout: float = 300, host: str = "login"):
    return cluster.run(host, [*HEADSWEEP, *args], env=env, cwd=str(ROOT), timeout=timeout)


def _job_state(cluster, job_id: str) -> str:
    shown = cluster.run("login", ["scontrol", "-o", "show", "job", job_id], env=cluster.slurm_env, timeout=60).stdout
    found = re.search(r"JobState=(\S+)", shown)
    return found.group(1) if found else "?"


def _node_state(cluster, name: str) -> str:
    shown = cluster.run("login", ["sinfo", "-h", "-n", name, "-o", "%t"], env=cluster.slurm_env, timeout=60)
    return shown.stdout.strip()


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")


def _wait_job(cluster, job_id: str, log, timeout: float) -> str:
    until(lambda: _job_state(cluster, job_id) in ENDED, timeout,
          lambda: f"job {job_id} did not end in {timeout} s:\n{log()[-3000:]}")
    return _job_state(cluster, job_id)


def _submit_slurm(cluster, env, grid: Path, *options: str) -> tuple[str, Path]:
    done = _headsweep(cluster, env, "slurm", str(grid), "--nodes", "3", "--cpus-per-node", "2",
                      "--time", "00:30:00", *options)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    job_id = re.search(r"SLURM job (\d+)", done.stdout).group(1)
    (folder,) = (Path(env["HEADSWEEP_HOME"]) / "slurm").iterdir()
    return job_id, folder


def _resubmit(cluster, env, grid: Path, *options: str, timeout: float = 180) -> tuple[str, list[str]]:
    """``headsweep slurm GRID`` again as a user does after an allocation ended: refused while the dead
    writer's lease on the registry lasts (writer.LEASE_S), then accepted. The new job's id, and what
    each refusal said."""
    refusals: list[str] = []

    def accepted() -> str | None:
        done = _headsweep(cluster, env, "slurm", str(grid), "--cpus-per-node", "2", "--time", "00:30:00", *options)
        if done.returncode == 0:
            return re.search(r"SLURM job (\d+)", done.stdout).group(1)
        refusals.append(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
        assert "writer on host" in refusals[-1], (done.stdout[-2000:], done.stderr[-3000:])
        time.sleep(5)
        return None

    return until(accepted, timeout, lambda: f"headsweep slurm refused for {timeout} s: {refusals[-3:]}", every_s=0), refusals


def _counts_ro(home: Path, sweep_id: str) -> dict[str, int]:
    """The sweep's runs by status, read-only (never rolls back a journal: see the module's doc);
    {} when the file cannot be read at this moment."""
    try:
        with closing(sqlite3.connect(f"file:{home}/registry.db?mode=ro", uri=True, timeout=5)) as db:
            return dict(db.execute(
                "SELECT r.status, count(*) FROM hs_runs r JOIN hs_sweep_runs s ON s.run_key = r.run_key "
                "WHERE s.sweep_id = ? GROUP BY r.status", (sweep_id,)).fetchall())
    except sqlite3.Error:
        return {}


def _ro(home: Path, name: str = "registry.db"):
    """A read-only connection to a store on the share, from this machine (the storage host's disk): it
    never writes the file (opening a ``Registry`` here would set its journal to WAL, this disk being local)."""
    return closing(sqlite3.connect(f"file:{home / name}?mode=ro", uri=True, timeout=30))


def _runs(home: Path, sweep_id: str) -> dict[str, tuple[str, str, int]]:
    """{run_key: (status, host, attempts)} of the sweep's runs (once its job ended)."""
    with _ro(home) as db:
        rows = db.execute("SELECT r.run_key, r.status, r.worker, r.attempts FROM hs_runs r JOIN hs_sweep_runs s "
                          "ON s.run_key = r.run_key WHERE s.sweep_id = ?", (sweep_id,)).fetchall()
    return {key: (status, (worker or "").split("@")[-1].split("[")[0], attempts) for key, status, worker, attempts in rows}


def _sweep(home: Path, sweep_id: str) -> dict:
    with _ro(home) as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM hs_sweeps WHERE id = ?", (sweep_id,)).fetchone())


def _mlflow_runs(home: Path, experiment_id: str) -> Counter:
    """(status, run_key) -> how many MLflow runs of the experiment have it (children: a run_key tag)."""
    with _ro(home, "mlflow.db") as db:
        return Counter(db.execute(
            "SELECT r.status, t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'run_key' AND r.experiment_id = ?", (experiment_id,)).fetchall())


def _integrity(path: Path) -> tuple[str, str]:
    """(PRAGMA integrity_check's answer, the file's journal mode), read-only on the storage host's disk."""
    with _ro(path.parent, path.name) as db:
        said = "; ".join(row[0] for row in db.execute("PRAGMA integrity_check").fetchall())[:2000]
        return said, db.execute("PRAGMA journal_mode").fetchone()[0]


def _check_stores(home: Path, sweep_id: str, runs: dict) -> dict:
    """Every run finished (registry), FINISHED exactly once in MLflow and no other MLflow status
    left unended; both files pass integrity_check. What was found, for the summary."""
    experiment_id = _sweep(home, sweep_id)["mlflow_experiment_id"]
    mlflow = _mlflow_runs(home, experiment_id)
    finished = Counter({key: n for (status, key), n in mlflow.items() if status == "FINISHED"})
    assert sorted(finished) == sorted(runs) and set(finished.values()) == {1}, (
        f"FINISHED in MLflow: {len(finished)} keys, repeated {[k for k, n in finished.items() if n > 1]}, "
        f"missing {sorted(set(runs) - set(finished))[:5]}")
    unended = sorted((status, key) for (status, key) in mlflow if status == "RUNNING")
    assert not unended, f"MLflow runs left RUNNING: {unended}"
    checks = {name: _integrity(home / name) for name in ("registry.db", "mlflow.db")}
    assert all(said == "ok" for said, _ in checks.values()), checks
    return {"mlflow_finished": sum(finished.values()), "mlflow_statuses": Counter(s for s, _ in mlflow.elements()),
            "integrity": checks, "experiment_id": experiment_id}


class Watch:
    """Who opens the store files, sampled on every host while a job runs: each process (on this
    machine's PID) that holds registry.db, mlflow.db or their journals open, by host, with its command
    line (a Ray actor's is ``ray::Writer...``); and the Ray worker logs that name the Writer actor
    (``:actor_name:Writer``), by host (the job removes its Ray temp dir at its end: read as it runs)."""

    def __init__(self, cluster: hosts.Hosts, home: Path, job_id: str, names: list[str] = CLIENTS):
        self.cluster, self.home, self.job_id, self.names = cluster, home, job_id, names
        self.holders: dict[str, dict[int, str]] = {}  # host -> {pid: command line}
        self.writer_logs: dict[str, set[str]] = {}  # host -> the Writer actor's worker log names
        self.samples = 0

    def sample(self) -> None:
        stores = tuple(str(self.home / name) for name in ("registry.db", "mlflow.db"))
        for name in self.names:
            for pid in self.cluster.pids(name):
                try:
                    opened = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                except OSError:  # gone meanwhile
                    continue
                if any(path.startswith(stores) for path in opened):
                    self.holders.setdefault(name, {})[pid] = command
            logs = self.cluster.hosts[name].tmp / f"hs-{self.job_id}"
            for path in logs.glob("session_2*/logs/worker-*.out"):
                try:
                    if ":actor_name:Writer" in path.read_text(errors="replace")[:2000]:
                        self.writer_logs.setdefault(name, set()).add(path.name)
                except OSError:
                    continue
        self.samples += 1

    def summary(self) -> str:
        held = {name: sorted({" ".join(command.split()[:3])[:70] for command in pids.values()})
                for name, pids in self.holders.items()}
        return (f"store files held open on {held} ({self.samples} samples); "
                f"Writer actor's worker logs on {sorted(self.writer_logs)}")


def _wait_job_watching(cluster, job_id: str, log, watch: Watch, timeout: float) -> str:
    def ended() -> bool:
        watch.sample()
        return _job_state(cluster, job_id) in ENDED

    until(ended, timeout, lambda: f"job {job_id} did not end in {timeout} s:\n{log()[-3000:]}", every_s=2)
    return _job_state(cluster, job_id)


def _assert_one_writer_host(watch: Watch, head: str, readers: frozenset[str] = frozenset()) -> None:
    """The store files were opened on the driver's host only (and, read-only, on ``readers``' hosts),
    and there by the Writer actor."""
    assert set(watch.holders) - readers == {head}, f"store files open on {watch.holders} (the driver's host: {head})"
    assert any(command.startswith("ray::Writer") for command in watch.holders[head].values()), watch.holders
    assert set(watch.writer_logs) == {head}, watch.writer_logs


def _head_host(cluster, log: str) -> str:
    head = re.search(r"Ray: 3 node\(s\), head (\S+):", log)
    assert head, log[-3000:]
    return next(name for name in COMPUTES if cluster.address(name) == head.group(1))


# --------------------------------------------------------------------------- 1. a sweep of 70 runs with a stage


# its waits: the submit, the job (+ its last probe, its state), the stores, status, results, the UI (up + its last
# probe, curl, chromium, stopped)
@pytest.mark.timeout(CLUSTER_S + 300 + (720 + 120) + STORES_S + 180 + 180 + (240 + 30 + 120 + 180 + 20 + 30))
def test_a_sweep_with_a_stage_on_three_hosts_sharing_only_sshfs(cluster):
    """``headsweep slurm GRID --nodes 3`` from the login host, the home on the sshfs share: 70 runs (60
    head_gates cells, the 10 fine-tunes the SP cells start from: a stage, its checkpoint read on
    whichever host the SP run lands) run on the three hosts through the sweep's writer on the driver's
    host; every run finished once in the registry and FINISHED once in MLflow, both files intact.
    Then on the login host: ``status``, ``results`` and ``ui`` (MLflow's server reading mlflow.db over
    sshfs) show the runs."""
    home = cluster.share / "home-finish"
    grid = cluster.share / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    env = _user_env(cluster, home)
    start = time.monotonic()
    job_id, folder = _submit_slurm(cluster, env, grid)
    log = lambda: (folder / f"slurm-{job_id}.out").read_text(errors="replace")  # noqa: E731
    watch = Watch(cluster, home, job_id)
    state = _wait_job_watching(cluster, job_id, log, watch, timeout=720)
    took = time.monotonic() - start
    assert state == "COMPLETED", log()[-4000:]
    head = _head_host(cluster, log())
    sweep_id = (folder / "sweep").read_text().strip()
    runs = _runs(home, sweep_id)
    assert len(runs) == RUNS, (len(runs), log()[-2000:])
    attempts = Counter(attempts for _, _, attempts in runs.values())
    assert Counter(status for status, _, _ in runs.values()) == {"finished": RUNS}, runs
    assert attempts == {1: RUNS}, attempts
    per_host = Counter(host for _, host, _ in runs.values())
    assert set(per_host) <= set(COMPUTES) and len(per_host) >= 2, per_host
    stores = _check_stores(home, sweep_id, runs)
    print(f"\n[1] {watch.summary()}")
    # the registry on a network filesystem keeps a rollback journal (WAL's shared memory is one host's)
    assert stores["integrity"]["registry.db"][1] == "delete", stores["integrity"]
    _assert_one_writer_host(watch, head)
    print(f"[1] {len(runs)} runs (attempts {dict(attempts)}) on {dict(per_host)}; driver and writer on {head}; MLflow FINISHED {stores['mlflow_finished']}; integrity {stores['integrity']}; "
          f"{took:.0f} s; load {_load()}")

    # the login host: status, results, the MLflow UI over sshfs
    status = _headsweep(cluster, env, "status", "last", timeout=180)
    assert status.returncode == 0, status.stderr[-2000:]
    results = _headsweep(cluster, env, "results", "last", "--metric", "accuracy", timeout=180)
    assert results.returncode == 0, results.stderr[-2000:]
    print(f"--- status last:\n{status.stdout[-1500:]}\n--- results last --metric accuracy:\n{results.stdout[-2500:]}")
    assert re.search(rf"\b{RUNS}\b", status.stdout) and "finished" in status.stdout, status.stdout[-2000:]
    assert str(RUNS) in results.stdout or len(re.findall(r"\b0\.\d+", results.stdout)) >= 1, results.stdout[-2000:]
    _ui_shows(cluster, env, stores["experiment_id"], RUNS)


SEARCH = """
import json, sys, urllib.request
url, experiment_id = sys.argv[1:3]
found, token = [], None
while True:
    body = {"experiment_ids": [experiment_id], "max_results": 1000, **({"page_token": token} if token else {})}
    request = urllib.request.Request(url + "/api/2.0/mlflow/runs/search", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    page = json.load(urllib.request.urlopen(request, timeout=60))
    found += page.get("runs", [])
    token = page.get("next_page_token")
    if not token:
        break
print(json.dumps([[r["info"]["status"], {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("run_key")]
                  for r in found]))
"""


def _ui_shows(cluster, env, experiment_id: str, expected: int) -> None:
    """``headsweep ui`` on the login host (MLflow's server on mlflow.db over sshfs): its REST API, asked
    with curl there, has ``expected`` FINISHED runs with a run key; one chromium screenshot of the runs page."""
    url = f"http://127.0.0.1:{UI_PORT}"
    ui_log = cluster.base / "ui-login.log"
    server = cluster.popen("login", [*HEADSWEEP, "ui", "--port", str(UI_PORT)], env=env, cwd=str(ROOT),
                           stdout=open(ui_log, "wb"), stderr=subprocess.STDOUT)
    try:
        until(lambda: cluster.run("login", ["curl", "-sf", "-o", "/dev/null", f"{url}/health"], timeout=30).returncode == 0,
              240, lambda: f"headsweep ui did not serve in 240 s: {ui_log.read_text(errors='replace')[-2000:]}")
        body = json.dumps({"experiment_ids": [experiment_id], "filter": "attributes.status = 'FINISHED'",
                           "max_results": 1000})
        curl = cluster.run("login", ["curl", "-sf", "-X", "POST", f"{url}/api/2.0/mlflow/runs/search",
                                     "-H", "Content-Type: application/json", "-d", body], timeout=120)
        assert curl.returncode == 0, (curl.returncode, curl.stderr, ui_log.read_text(errors="replace")[-2000:])
        found = json.loads(curl.stdout).get("runs", [])
        keyed = [run for run in found if any(t["key"] == "run_key" for t in run["data"].get("tags", []))]
        print(f"--- ui: {len(found)} FINISHED runs through {url}/api/2.0/mlflow/runs/search (curl on login), "
              f"{len(keyed)} with a run key")
        assert len(keyed) == expected, (len(keyed), len(found))
        page = f"{url}/#/experiments/{experiment_id}?workflowType=machine_learning"
        shot = "/tmp/ui.png"  # login's own /tmp
        done = cluster.run("login", ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                     "--window-size=1600,1000", "--virtual-time-budget=25000", f"--screenshot={shot}",
                                     page], env=env | {"HOME": "/tmp"}, timeout=180)
        taken = cluster.hosts["login"].tmp / "ui.png"
        assert taken.exists() and taken.stat().st_size > 10_000, (done.returncode, done.stderr[-2000:])
        shutil.copy(taken, SCREENSHOT)
        print(f"--- screenshot of {page} (chromium on login): {SCREENSHOT} ({SCREENSHOT.stat().st_size} bytes)")
    finally:
        kill_pids(lambda: _tree(server.pid), grace_s=5)
        server.wait(30)


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants (by /proc's children lists)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found.add(current)
        todo += [int(child) for child in children]
    return found



# --------------------------------------------------------------------------- 2-4. a sweep interrupted

LONG_SEEDS = 5
LONG = {  # 5 seeds x 2 lambdas x DP/SP + 5 fine-tunes = 25 runs long enough to be caught running
    **GRID, "axes": {"seed": list(range(LONG_SEEDS)), "lambda": [0.05, 0.2], "pipeline": ["dp", "sp"]},
    "base": {**GRID["base"], "train": {"max_steps": 300, "batch_size": 8, "eval_every": 100}},
}
LONG_RUNS = LONG_SEEDS * 2 * 2 + LONG_SEEDS


def _running_ro(home: Path, sweep_id: str) -> dict[str, str] | None:
    """{run_key: host} of the sweep's running runs, read-only; None when unreadable at this moment."""
    try:
        with closing(sqlite3.connect(f"file:{home}/registry.db?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT r.run_key, r.worker FROM hs_runs r JOIN hs_sweep_runs s ON s.run_key = r.run_key "
                              "WHERE s.sweep_id = ? AND r.status = 'running'", (sweep_id,)).fetchall()
    except sqlite3.Error:
        return None
    return {key: (worker or "").split("@")[-1].split("[")[0] for key, worker in rows}


def _status_ro(home: Path, sweep_id: str) -> dict[str, tuple[str, int]] | None:
    """{run_key: (status, attempts)} of every run of the sweep, read-only; None when unreadable."""
    try:
        with closing(sqlite3.connect(f"file:{home}/registry.db?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute("SELECT r.run_key, r.status, r.attempts FROM hs_runs r JOIN hs_sweep_runs s "
                              "ON s.run_key = r.run_key WHERE s.sweep_id = ?", (sweep_id,)).fetchall()
    except sqlite3.Error:
        return None
    return {key: (status, attempts) for key, status, attempts in rows}


def _start_long(cluster, name: str, *options: str):
    home = cluster.share / f"home-{name}"
    grid = cluster.share / f"{name}.yaml"
    grid.write_text(yaml.safe_dump({**LONG, "name": f"shared-home-{name}"}))
    env = _user_env(cluster, home)
    job_id, folder = _submit_slurm(cluster, env, grid, *options)
    log = lambda job=job_id: (folder / f"slurm-{job}.out").read_text(errors="replace")  # noqa: E731
    watch = Watch(cluster, home, job_id)

    def started() -> bool:
        watch.sample()
        return (folder / "sweep").exists() and "Ray: 3 node(s)" in log()

    until(started, 300, lambda: log()[-3000:], every_s=2)
    return home, grid, env, job_id, folder, log, watch, (folder / "sweep").read_text().strip()


def _mid_sweep(home: Path, sweep_id: str, watch: Watch, log, finished: int = 4, running: int = 2,
               on: str | None = None) -> dict[str, int]:
    """Wait until ``finished`` runs finished and ``running`` run (on host ``on``, when given)."""
    def there():
        watch.sample()
        counts = _counts_ro(home, sweep_id)
        if counts.get("finished", 0) < finished or counts.get("running", 0) < running:
            return None
        if on is not None and on not in (_running_ro(home, sweep_id) or {}).values():
            return None
        return counts

    return until(there, 480, lambda: f"not mid-sweep: {_counts_ro(home, sweep_id)}\n{log()[-3000:]}", every_s=1)


@pytest.mark.timeout(CLUSTER_S + START_S + (480 + 5) + 120 + (240 + 120) + (60 + 5) + (180 + 305) + (900 + 120) + STORES_S
                     + 300)  # its waits, in order (an until's deadline + its probe's commands)
def test_scancel_mid_sweep_then_the_same_command_finishes_every_run_once(cluster):
    """``scancel`` while runs run (some finished), then the same ``headsweep slurm`` again: the new
    allocation resumes the sweep; the runs killed at the cancel run again (attempts 2, their MLflow run
    reused), no run finishes twice, both files intact."""
    start = time.monotonic()
    home, grid, env, job_id, folder, log, watch, sweep_id = _start_long(cluster, "cancel")
    at_cancel = _mid_sweep(home, sweep_id, watch, log)
    assert cluster.run("login", ["scancel", job_id], env=cluster.slurm_env).returncode == 0
    assert _wait_job(cluster, job_id, log, timeout=240) == "CANCELLED", log()[-3000:]
    head1 = _head_host(cluster, log())
    left = until(lambda: _status_ro(home, sweep_id), 60, "registry unreadable after the cancel")
    unfinished = {key for key, (status, _) in left.items() if status != "finished"}
    left_running = {key for key, (status, _) in left.items() if status == "running"}
    done_before = {key for key, (status, _) in left.items() if status == "finished"}

    job2, refusals = _resubmit(cluster, env, grid, "--nodes", "3")
    assert job2 != job_id
    log2 = lambda: (folder / f"slurm-{job2}.out").read_text(errors="replace")  # noqa: E731
    watch2 = Watch(cluster, home, job2)
    assert _wait_job_watching(cluster, job2, log2, watch2, timeout=900) == "COMPLETED", log2()[-4000:]
    head2 = _head_host(cluster, log2())
    runs = _runs(home, sweep_id)
    took = time.monotonic() - start
    attempts = Counter(attempts for _, _, attempts in runs.values())
    again = {key for key, (_, _, attempts) in runs.items() if attempts > 1}
    print(f"\n[2] at the cancel {at_cancel}; after it {Counter(s for s, _ in left.values())}; "
          f"job {job_id} (head {head1}) then {job2} (head {head2}); attempts {dict(attempts)}; ran again "
          f"{len(again)} (left running {len(left_running)}); resubmit refused {len(refusals)} time(s) first "
          f"({refusals[:1]}); first {watch.summary()}; second {watch2.summary()}")
    assert len(runs) == LONG_RUNS and Counter(s for s, _, _ in runs.values()) == {"finished": LONG_RUNS}, runs
    assert all(runs[key][2] == 1 for key in done_before), {k: runs[k] for k in done_before if runs[k][2] != 1}
    assert again <= unfinished, (again, left_running, unfinished)  # a run finished before the cancel never reran
    assert set(attempts) <= {1, 2}, attempts
    stores = _check_stores(home, sweep_id, runs)
    _assert_one_writer_host(watch, head1)
    _assert_one_writer_host(watch2, head2)
    told = _headsweep(cluster, env, "status", sweep_id).stdout
    history = [line.strip() for line in told.splitlines() if "SLURM" in line or "allocation" in line]
    print(f"[2] {len(runs)} runs on {dict(Counter(h for _, h, _ in runs.values()))}; MLflow FINISHED "
          f"{stores['mlflow_finished']} (statuses {dict(stores['mlflow_statuses'])}); integrity {stores['integrity']}; "
          f"status says {history}; {took:.0f} s; load {_load()}")


# a reader on the login host (test 3): what it reads of the writer's lease, each second
LEASE_LOOK = """
import sys, time, os
from orchestrator.driving.writer import lease_holder, lease_path
path = lease_path(sys.argv[1])
while True:
    try:
        raw = path.read_text()
    except OSError as err:
        raw = f"{type(err).__name__}: {err}"
    print(f"{time.time():.1f} path={path} holder={lease_holder(sys.argv[1])} raw={raw!r}", flush=True)
    time.sleep(1)
"""
EVIDENCE = Path("/tmp/headsweep-shared-home-follow")  # test 3's files when it fails (kept past the hosts' teardown)


@pytest.mark.timeout(CLUSTER_S + START_S + (480 + 10) + 5 + 90 + (600 + 15) + (900 + 60) + 60 + (120 + 60)
                     + 120 + 20 + 2 * 30 + STORES_S)  # its waits, in order (an until's deadline + its probe's commands)
def test_a_worker_host_cut_mid_sweep_while_login_follows_status_every_run_finishes_once(cluster):
    """A compute host that is not the driver's cut off the network while it runs trials: it loses the
    sshfs share too (a read there fails); its runs run again on the others, the sweep finishes with
    every run once, both files intact; restored, it gets the share back.

    All the while ``headsweep status SWEEP --follow`` runs on the login host (the registry read over the
    login host's own sshfs mount every second while the writer on the driver's host commits). A reader
    on another host shares no lock with the writer; SQLite rolls back a journal it finds with no lock
    held (a "hot" one), which a reader whose locks do not reach the writer's may find mid-transaction:
    so a reader there opens the file read-only (it cannot roll back; it retries) and never records a
    lost driver (5 of 5 runs failed before: 'malformed', or driver_lost recorded from the login host).
    The follow ends with the sweep (exit 0), and no host but the driver's and the login host opened
    the stores."""
    start = time.monotonic()
    home, grid, env, job_id, folder, log, watch, sweep_id = _start_long(cluster, "cut")
    head = _head_host(cluster, log())
    others = [name for name in COMPUTES if name != head]
    said = cluster.base / "follow-login.log"
    follower = cluster.popen("login", [*HEADSWEEP, "status", sweep_id, "--follow"], env=env, cwd=str(ROOT),
                             stdout=open(said, "wb"), stderr=subprocess.STDOUT)
    leases = cluster.base / "lease-login.log"  # what the login host reads of the writer's lease, each second
    looker = cluster.popen("login", [sys.executable, "-c", LEASE_LOOK, f"sqlite:///{home}/registry.db"], env=env,
                           cwd=str(ROOT), stdout=open(leases, "wb"), stderr=subprocess.STDOUT)
    try:
        victim, cut_keys, moved_s = _cut_a_worker(cluster, home, sweep_id, watch, log, others)
        state = _wait_job_watching(cluster, job_id, log, watch, timeout=900)
        follow_rc = follower.wait(120)
    finally:
        kill_pids(lambda: _tree(follower.pid) | _tree(looker.pid), grace_s=5)
    checks = {name: _integrity(home / name) if (home / name).exists() else None for name in ("registry.db", "mlflow.db")}
    readers = {name: pids for name, pids in watch.holders.items() if name != head}
    print(f"\n[3] job {job_id} {state}; status --follow on login: exit {follow_rc}, last lines "
          f"{said.read_text(errors='replace').strip().splitlines()[-2:]}; store files open beside the driver's host "
          f"{head}: {sorted(readers)}; integrity {checks}")
    if state != "COMPLETED" or follow_rc != 0 or any(said != "ok" for said, _ in checks.values()):
        shutil.rmtree(EVIDENCE, ignore_errors=True)
        EVIDENCE.mkdir(parents=True)
        for path in [*home.glob("registry.db*"), *home.glob("mlflow.db*"), folder / f"slurm-{job_id}.out", said, leases]:
            shutil.copy(path, EVIDENCE / path.name)
        print(f"[3] evidence kept in {EVIDENCE}: {sorted(p.name for p in EVIDENCE.iterdir())}")
    assert state == "COMPLETED", log()[-4000:]
    until(lambda: cluster.run(victim, ["timeout", "20", "stat", str(home / "registry.db")], timeout=60).returncode == 0,
          120, f"{victim} did not get the share back")
    runs = _runs(home, sweep_id)
    attempts = Counter(attempts for _, _, attempts in runs.values())
    took = time.monotonic() - start
    print(f"[3] {victim} cut with {len(cut_keys)} run(s) on it (driver on {head}); moved in {moved_s:.0f} s; "
          f"attempts {dict(attempts)}; runs per host {dict(Counter(h for _, h, _ in runs.values()))}; {watch.summary()}")
    assert all(said == "ok" for said, _ in checks.values()), checks
    assert len(runs) == LONG_RUNS and Counter(s for s, _, _ in runs.values()) == {"finished": LONG_RUNS}, runs
    assert all(runs[key][1] != victim and runs[key][2] >= 2 for key in cut_keys), {k: runs[k] for k in cut_keys}
    stores = _check_stores(home, sweep_id, runs)
    _assert_one_writer_host(watch, head, readers=frozenset({"login"}))
    assert follow_rc == 0
    assert set(readers) <= {"login"}, readers  # no compute host but the driver's opened them
    print(f"[3] MLflow FINISHED {stores['mlflow_finished']} (statuses {dict(stores['mlflow_statuses'])}); "
          f"integrity {stores['integrity']}; {took:.0f} s; load {_load()}")


def _cut_a_worker(cluster, home: Path, sweep_id: str, watch: Watch, log, others: list[str]) -> tuple[str, set[str], float]:
    """Once 3 runs finished, cut a host of ``others`` running a trial until its runs moved to the other
    hosts (a read of the share there fails meanwhile), then restore it: (the host, its runs' keys, the
    seconds they took to move)."""
    def victim_busy() -> str | None:
        watch.sample()
        if _counts_ro(home, sweep_id).get("finished", 0) < 3:
            return None
        running = _running_ro(home, sweep_id) or {}
        return next((name for name in others if list(running.values()).count(name) >= 1), None)

    victim = until(victim_busy, 480, lambda: f"no run on {others}: {_counts_ro(home, sweep_id)}\n{log()[-3000:]}")
    cut_keys = {key for key, host in (_running_ro(home, sweep_id) or {}).items() if host == victim}
    cluster.cut(victim)
    cut_at = time.monotonic()
    try:
        lost = cluster.run(victim, ["timeout", "-s", "KILL", "45", "stat", str(home / "registry.db")], timeout=90)
        assert lost.returncode not in (0, 137), (lost.returncode, lost.stdout, lost.stderr)

        def moved() -> bool:
            watch.sample()
            now = _status_ro(home, sweep_id) or {}
            running = _running_ro(home, sweep_id) or {}
            return bool(now) and all(now[key][0] == "finished" or (key in running and running[key] != victim)
                                     for key in cut_keys)

        until(moved, 600, lambda: f"the cut host's runs {cut_keys} did not move: {_running_ro(home, sweep_id)}\n"
              f"{log()[-3000:]}", every_s=2)
        return victim, cut_keys, time.monotonic() - cut_at
    finally:
        cluster.restore(victim)


@pytest.mark.timeout(CLUSTER_S + START_S + (480 + 5) + (180 + 60) + 60 + 120 + (240 + 120) + (60 + 5) + (180 + 305)
                     + (900 + 120) + STORES_S + (120 + 70) + 240 + 15 + STORES_S + 30)  # its waits, in order
def test_the_drivers_host_cut_mid_sweep_then_resumed_on_the_others(cluster):
    """The driver's host (the Ray head, the sweep's writer, the batch script) cut off mid-sweep: it
    loses the share, SLURM fails the job; ``headsweep slurm`` with the same grid on the two other
    nodes resumes the sweep (the cut host left out); every run finishes once, both files intact. Then
    the cut host comes back: what the old job left there writes nothing more (both files still
    intact, every run still finished once, the sweep finished)."""
    start = time.monotonic()
    home, grid, env, job_id, folder, log, watch, sweep_id = _start_long(cluster, "driver-cut")
    head = _head_host(cluster, log())
    at_cut = _mid_sweep(home, sweep_id, watch, log, finished=3, running=2)
    cluster.cut(head)
    cut_at = time.monotonic()
    try:
        # the job runs with --no-kill: SLURM marks the batch host down (SlurmdTimeout 30 s) and keeps the
        # job RUNNING on the other nodes, its batch script (the driver) out of reach: the user cancels it
        until(lambda: "down" in _node_state(cluster, head), 180, lambda: f"{head} not marked down")
        seen = _job_state(cluster, job_id)
        assert cluster.run("login", ["scancel", job_id], env=cluster.slurm_env).returncode == 0
        state = f"{seen} after {head} went down; scancel: " + _wait_job(cluster, job_id, log, timeout=240)
        failed_s = time.monotonic() - cut_at
        left = until(lambda: _status_ro(home, sweep_id), 60, "registry unreadable after the cut")
        others = [name for name in COMPUTES if name != head]
        job2, refusals = _resubmit(cluster, env, grid, "--nodes", "2")
        log2 = lambda: (folder / f"slurm-{job2}.out").read_text(errors="replace")  # noqa: E731
        # the cut host's old processes (the failed job's allocation, supervisor, writer) live on there, the
        # files still open on its dead mount: the new job is watched on the hosts that reach the share
        watch2 = Watch(cluster, home, job2, names=["login", *others])
        assert _wait_job_watching(cluster, job2, log2, watch2, timeout=900) == "COMPLETED", log2()[-4000:]
        head2 = next(name for name in others if re.search(rf"head {re.escape(cluster.address(name))}:", log2()))
        runs = _runs(home, sweep_id)
        stores = _check_stores(home, sweep_id, runs)
    finally:
        cluster.restore(head)
    attempts = Counter(attempts for _, _, attempts in runs.values())
    print(f"\n[4] driver's host {head} cut at {at_cut}; job {job_id} {state} {failed_s:.0f} s later; left "
          f"{Counter(s for s, _ in left.values())}; resubmit refused {len(refusals)} time(s) first ({refusals[:1]}); "
          f"resumed by job {job2} on {others} (head {head2}); attempts "
          f"{dict(attempts)}; runs per host {dict(Counter(h for _, h, _ in runs.values()))}; first {watch.summary()}; "
          f"second {watch2.summary()}")
    assert len(runs) == LONG_RUNS and Counter(s for s, _, _ in runs.values()) == {"finished": LONG_RUNS}, runs
    assert set(attempts) <= {1, 2}, attempts
    _assert_one_writer_host(watch2, head2)
    print(f"[4] MLflow FINISHED {stores['mlflow_finished']} (statuses {dict(stores['mlflow_statuses'])}); "
          f"integrity {stores['integrity']}")

    # the cut host back: SLURM ends what the failed job left there; nothing of it writes the stores again
    until(lambda: hosts.mount_type(cluster, head, cluster.share) == "fuse.sshfs"
          and cluster.run(head, ["timeout", "20", "stat", str(home)], timeout=60).returncode == 0, 120,
          f"{head} did not get the share back")
    back = time.monotonic()
    stale = sorted({_command(pid)[:60] for pid in cluster.pids(head) if _is_ours(pid)})
    until(lambda: not any(_is_ours(pid) for pid in cluster.pids(head)), 240,
          lambda: f"the failed job's processes live on on {head}: "
          f"{[_command(pid) for pid in cluster.pids(head) if _is_ours(pid)]}")
    print(f"[4] {head} back: the failed job's processes there ({len(stale)} kinds: {stale[:4]}) gone "
          f"{time.monotonic() - back:.0f} s later")
    time.sleep(15)  # a lease renewal period and more: anything of the old writer that still ran would have written
    after = _runs(home, sweep_id)
    assert after == runs, {key: (runs[key], after[key]) for key in runs if runs[key] != after[key]}
    stores_after = _check_stores(home, sweep_id, after)
    sweep = _sweep(home, sweep_id)
    print(f"[4] after {head} came back: runs unchanged, integrity {stores_after['integrity']}, sweep {sweep['status']}; "
          f"{time.monotonic() - start:.0f} s; load {_load()}")
    assert sweep["status"] == "finished", sweep


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
    except OSError:
        return ""


def _is_ours(pid: int) -> bool:
    """A process of a headsweep job (its Ray, driver, trials, writer, the allocation)."""
    command = _command(pid)
    return any(word in command for word in ("ray::", "raylet", "gcs_server", "orchestrator.", "headsweep"))


