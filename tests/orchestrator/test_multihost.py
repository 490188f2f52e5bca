"""A cluster of several hosts crossed by a real network (tests/hosts.py: network namespaces, each
host its own address and hostname, no DNS, no default route, a node-local /tmp, one shared folder
as an NFS home), and headsweep on it as researchers run it:

- SLURM across hosts: slurmctld on a controller host, a slurmd on each of three compute hosts
  (2 logical GPUs each), ``headsweep slurm GRID --nodes 3 --gpus-per-node 2`` from a login host with
  a time-limit requeue, then ``scancel`` mid-sweep and the same command again (every run once, the
  history names the job that ended and the one that resumed). The plain finish on three hosts, and
  scancel, cuts and the login host's reads on a home shared over a real network filesystem, are
  tests/orchestrator/test_shared_home.py's.
- Ray across hosts with token authentication (docs/clusters.md "Machines you already have, started by hand"): ``ray start``
  on each host as docs/clusters.md says, ``headsweep submit`` from the login host; a client without the token
  is refused; every port that listens beyond loopback on each host is one docs/clusters.md lists.

Their own lane (``make test-hosts``, in CI after the slow set): the hosts and SLURM are set up once for the module (~15 s), each sweep takes
minutes on 2 cores. Needs root, ``ip``, ``nsenter``, ``unshare``; slurm-wlm and munge (.ci/run
installs them). Everything is torn down by PID and the namespaces deleted, pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hosts  # noqa: E402  (tests/hosts.py: hosts as network namespaces)
from hub_caches import DATASET_ID, MODEL_ID, dataset_cache, hub_cache  # noqa: E402
from waiting import until  # noqa: E402

from orchestrator.cluster.processes import kill_pids  # noqa: E402
from orchestrator.registry import Registry  # noqa: E402
from orchestrator.registry.events import DRIVER_LOST, RESUMED  # noqa: E402

pytestmark = [pytest.mark.hosts, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
HEADSWEEP = [sys.executable, "-m", "headsweep.cli"]
RAY_START = [sys.executable, "-m", "orchestrator.cluster.head", "ray-start"]
COMPUTES = ["n1", "n2", "n3"]
GRID = {  # six short runs at half a GPU: two per node at once on 3 nodes of 2 logical GPUs
    "name": "multihost",
    "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls", "num_train": 200, "num_eval": 16, "max_length": 24},
             "train": {"max_steps": 20, "batch_size": 8, "eval_every": 20}},
    "axes": {"seed": [0, 1, 2, 3, 4, 5]},
    "resources": {"cpus": 0.5, "gpus": 0.5},
}
LONG = {**GRID, "name": "multihost-long",  # runs long enough to cancel the job mid-sweep
        "base": {**GRID["base"], "train": {"max_steps": 150, "batch_size": 8, "eval_every": 50}},
        "max_concurrent": 2}
# Ray's ports on a multi-host node, as docs/clusters.md starts it (nothing else may listen
# beyond loopback): GCS, dashboard (Jobs API), raylet, object manager, runtime-env agent, the
# dashboard agent's gRPC and HTTP, metrics export, the autoscaler's and dashboard's metrics, and
# the workers' range.
README_PORTS = {"gcs": 6379, "dashboard": 8265, "node_manager": 6380, "object_manager": 6381,
                "runtime_env_agent": 6382, "agent_grpc": 6383, "agent_http": 52365, "metrics_export": 6384,
                "autoscaler_metrics": 44217, "dashboard_metrics": 44227}
WORKER_PORTS = (10002, 10999)
DB_PASSWORD = secrets.token_urlsafe(16)  # as cluster.yaml's HEADSWEEP_DB_PASSWORD: PGPASSWORD on every node

# Each test's pytest timeout is the sum of its waits and its fixtures' (tests/waiting.py), in s:
CLUSTER_S = (5 * 30 + 30 + 90 + 30  # cluster: each host's boot, munged, the nodes idle (and its last sinfo)
             + 5 * 20 + 27 * 5)  # at the module's end the hosts' teardown: 20 s a host, 5 s a process (27 at most)
RAY_S = 60 + 120 + 30 + 4 * 20  # ray_on_hosts: the head's GCS, the nodes joined (its last probe), Ray stopped
SERVICES_S = 120 + 90 + 3 * 60 + 300 + 30  # services: initdb, pg_ctl, psql x 3; MLflow's server up (its last probe)


@pytest.fixture(scope="module")
def cluster():
    """login, a controller (ctl: slurmctld, and the plain-Ray test's head) and three compute hosts."""
    lacking = hosts.missing_tools()
    if lacking:
        pytest.fail(f"a multi-host test needs {', '.join(lacking)}")
    with hosts.Hosts(["login", "ctl", *COMPUTES]) as cluster:
        cluster.slurm_env = hosts.start_slurm(cluster, "ctl", COMPUTES, cpus=2, gpus=2,
                                              first_job=30_000 + os.getpid() % 20_000)
        yield cluster


def _user_env(cluster: hosts.Hosts, home: Path, **extra: str) -> dict[str, str]:
    """A user's shell on the login host: this checkout's Python, a home on the shared filesystem."""
    clean = {name: value for name, value in cluster.slurm_env.items()
             if not name.startswith(("RAY_", "HEADSWEEP_", "MLFLOW_"))}
    return clean | {"HEADSWEEP_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"} | extra


def _headsweep(cluster, env, *args: str, timeout: float = 300):
    return cluster.run("login", [*HEADSWEEP, *args], env=env, cwd=str(ROOT), timeout=timeout)


def _job_state(cluster, job_id: str) -> str:
    shown = cluster.run("login", ["scontrol", "-o", "show", "job", job_id], env=cluster.slurm_env, timeout=60).stdout
    found = re.search(r"JobState=(\S+)", shown)
    return found.group(1) if found else "?"


def _wait_job(cluster, job_id: str, log, timeout: float = 480) -> str:
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")
    until(lambda: _job_state(cluster, job_id) in ended, timeout,
           lambda: f"job {job_id} did not end in {timeout} s:\n{log()[-3000:]}")
    return _job_state(cluster, job_id)


def _submit_slurm(cluster, env, grid: Path, *options: str) -> tuple[str, Path]:
    done = _headsweep(cluster, env, "slurm", str(grid), "--nodes", "3", "--gpus-per-node", "2",
                      "--cpus-per-node", "2", "--time", "00:20:00", *options)
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = re.search(r"SLURM job (\d+)", done.stdout).group(1)
    (folder,) = (Path(env["HEADSWEEP_HOME"]) / "slurm").iterdir()
    return job_id, folder


def _runs(home: Path, sweep_id: str) -> list[tuple[str, str, int]]:
    """(status, host, attempts) of the sweep's runs, from the registry on the shared filesystem."""
    registry = Registry(f"sqlite:///{home}/registry.db")
    rows = [registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]]
    return [(row["status"], (row["worker"] or "").split("@")[-1].split("[")[0], row["attempts"]) for row in rows]


def _finished_once_in_mlflow(home: Path, sweep_id: str) -> None:
    registry = Registry(f"sqlite:///{home}/registry.db")
    with sqlite3.connect(home / "mlflow.db") as db:
        finished = sorted(key for (key,) in db.execute(
            "SELECT t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'run_key' AND r.status = 'FINISHED' AND r.experiment_id = ?",
            (registry.get_sweep(sweep_id)["mlflow_experiment_id"],)))
    assert finished == sorted(registry.sweep_runs(sweep_id)["run_key"])


@pytest.mark.timeout(CLUSTER_S + 300 + 240 + 300 + 60 + (180 + 120) + 60 + (400 + 60) + 60 + (480 + 120) + 300
                     + (480 + 120))  # its waits, in order (an until's deadline + its probe's command)
def test_requeue_at_the_time_limit_then_scancel_then_the_same_command_finish_every_run_once(cluster):
    """Three allocations of one sweep across the hosts: ``--requeue``'s time-limit warning (SIGUSR1)
    mid-sweep requeues the job itself; in its next allocation ``scancel`` ends it; ``headsweep slurm``
    again resumes it: every run finishes exactly once, the history names each allocation that ended and
    the job that resumed the sweep."""
    home = cluster.shared / "home-cancel"
    grid = cluster.shared / "long.yaml"
    grid.write_text(yaml.safe_dump(LONG))
    env = _user_env(cluster, home)
    start = time.monotonic()
    job_id, folder = _submit_slurm(cluster, env, grid, "--requeue")
    log = lambda job=job_id: (folder / f"slurm-{job}.out").read_text(errors="replace")  # noqa: E731
    until(lambda: (folder / "sweep").exists(), 240, lambda: log()[-3000:])
    sweep_id = (folder / "sweep").read_text().strip()
    registry = Registry(f"sqlite:///{home}/registry.db")

    def finished_and_running(at_least: int):
        counts = registry.sweep_counts(sweep_id)
        return counts.get("finished", 0) >= at_least and counts.get("running", 0) >= 1

    until(lambda: finished_and_running(1), 300, lambda: log()[-3000:])
    slurm = cluster.slurm_env
    assert cluster.run("login", ["scancel", "--batch", "--signal=USR1", job_id], env=slurm, timeout=60).returncode == 0
    until(lambda: "Restarts=1" in cluster.run("login", ["scontrol", "-o", "show", "job", job_id], env=slurm,
                                              timeout=60).stdout
           and _job_state(cluster, job_id) == "PENDING", 180, lambda: log()[-3000:])
    requeued = (registry.sweep_counts(sweep_id), time.monotonic() - start)
    cluster.run("login", ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=slurm, timeout=60)  # held ~2 min
    finished_before = requeued[0].get("finished", 0)
    until(lambda: _job_state(cluster, job_id) == "RUNNING" and finished_and_running(finished_before + 1), 400,
           lambda: log()[-3000:])
    assert cluster.run("login", ["scancel", job_id], env=slurm, timeout=60).returncode == 0
    assert _wait_job(cluster, job_id, log) == "CANCELLED"
    cancelled = (registry.sweep_counts(sweep_id), time.monotonic() - start)
    again, _ = _submit_slurm(cluster, env, grid)
    assert _wait_job(cluster, again, lambda: log(again)) == "COMPLETED", log(again)[-3000:]
    runs = _runs(home, sweep_id)
    assert [status for status, _, _ in runs] == ["finished"] * 6, runs
    assert len({host for _, host, _ in runs}) >= 2, runs
    _finished_once_in_mlflow(home, sweep_id)
    about_the_driver = [e for e in registry.events(sweep_id) if e["kind"] in (DRIVER_LOST, RESUMED)]
    assert [e["kind"] for e in about_the_driver] == [DRIVER_LOST, RESUMED] * 2, about_the_driver
    assert [e["detail"]["by"] for e in about_the_driver[1::2]] == [f"SLURM job {job_id}", f"SLURM job {again}"]
    assert "requeued: the next allocation resumes the sweep" in log()
    print(f"\njob {job_id}: time-limit warning at {requeued[0]} ({requeued[1]:.0f} s), requeued; scancel in its next "
          f"allocation at {cancelled[0]} ({cancelled[1]:.0f} s); job {again} resumed and finished "
          f"({time.monotonic() - start:.0f} s in all): runs (status, host, attempts) {runs}")


# --------------------------------------------------------------------------- Ray with token auth


# how many Ray nodes are alive, asked of a dashboard with the cluster's token
ALIVE = ("import json, sys, urllib.request as u; "
         "r = u.Request(sys.argv[1] + '/nodes?view=summary', headers={'Authorization': 'Bearer ' + sys.argv[2]}); "
         "print(sum(n['raylet']['state'] == 'ALIVE' for n in json.load(u.urlopen(r, timeout=5))['data']['summary']))")


@pytest.fixture
def ray_on_hosts(cluster):
    """Ray as docs/clusters.md starts it: a head on ctl, a worker with 2 logical GPUs on each compute host,
    token authentication on (one token, every node and client); stopped by PID after the test."""
    token = secrets.token_urlsafe(32)
    env = {name: value for name, value in cluster.slurm_env.items() if not name.startswith(("RAY_", "HEADSWEEP_"))}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            "PGPASSWORD": DB_PASSWORD,  # cluster.yaml's node.env: every Ray process reaches PostgreSQL
            "RAY_USAGE_STATS_ENABLED": "0", "AUTOSCALER_METRIC_PORT": str(README_PORTS["autoscaler_metrics"]),
            "DASHBOARD_METRIC_PORT": str(README_PORTS["dashboard_metrics"])}
    head = cluster.address("ctl")
    ports = [f"--node-manager-port={README_PORTS['node_manager']}",
             f"--object-manager-port={README_PORTS['object_manager']}",
             f"--runtime-env-agent-port={README_PORTS['runtime_env_agent']}",
             f"--dashboard-agent-grpc-port={README_PORTS['agent_grpc']}",
             f"--dashboard-agent-listen-port={README_PORTS['agent_http']}",
             f"--metrics-export-port={README_PORTS['metrics_export']}",
             f"--min-worker-port={WORKER_PORTS[0]}", f"--max-worker-port={WORKER_PORTS[1]}", "--disable-usage-stats"]
    started = [cluster.popen("ctl", [*RAY_START, "--head", "--block", f"--node-ip-address={head}",
                                     f"--port={README_PORTS['gcs']}", f"--dashboard-host={head}",
                                     f"--dashboard-port={README_PORTS['dashboard']}", "--num-cpus=1", "--num-gpus=0",
                                     *ports], env=env, cwd="/tmp")]
    dashboard = f"http://{head}:{README_PORTS['dashboard']}"

    def alive() -> int:  # Ray nodes alive, as the head's dashboard says (0 while it does not answer)
        shown = cluster.run("login", [sys.executable, "-c", ALIVE, dashboard, token], timeout=30).stdout.strip()
        return int(shown) if shown.isdigit() else 0

    try:  # the workers once the head's GCS listens (they register with it)
        until(lambda: README_PORTS["gcs"] in {port for _, port, _ in cluster.listening("ctl")},
              60, lambda: f"the Ray head's GCS does not listen on ctl's port {README_PORTS['gcs']} "
              f"(its ray start's exit code: {started[0].poll()}, None while it runs)")
        for name in COMPUTES:
            started.append(cluster.popen(name, [*RAY_START, "--block", f"--node-ip-address={cluster.address(name)}",
                                                f"--address={head}:{README_PORTS['gcs']}", "--num-cpus=2",
                                                "--num-gpus=2", *ports], env=env, cwd="/tmp"))
        until(lambda: alive() == 4, 120, lambda: f"the Ray nodes did not join: {alive()} of 4 alive")
        yield {"env": env, "dashboard": dashboard, "address": f"{head}:{README_PORTS['gcs']}", "token": token}
    finally:
        for name in ("ctl", *COMPUTES):
            kill_pids(lambda name=name: {pid for pid in cluster.pids(name) if _is_ray(pid)}, grace_s=5)


def _is_ray(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "ray" in command and "slurm" not in command and "munge" not in command


def _gcs_answers(log: str) -> list[str]:
    """What the GCS answered each time a Ray client asked it for the cluster's ID, from the client's
    log (its stderr): 'Unauthenticated: RPC error: InvalidAuthToken: ...' to a client without the
    token, 'TimedOut: ...' when nothing answered."""
    return re.findall(r"Failed to get cluster ID from GCS server: (.+)", log)


def _refused_for_its_token(out: str, log: str) -> bool:
    """A token-less ``ray.init`` (``gcs`` below) was refused by the GCS for its token: it raised
    ConnectionError (Ray 2.60 raises that for a refusal and for a GCS that never answered alike), and
    the GCS answered Unauthenticated, InvalidAuthToken."""
    lines = out.strip().splitlines()
    raised = bool(lines) and lines[-1].startswith("refused: ConnectionError")
    return raised and any(answer.startswith("Unauthenticated:") and "InvalidAuthToken" in answer
                          for answer in _gcs_answers(log))


@pytest.mark.timeout(CLUSTER_S + RAY_S + 480 + 3 * 60 + 120)  # the submit, the Jobs API's 3 clients, the GCS's
def test_ray_across_hosts_with_token_auth(cluster, ray_on_hosts):
    """``headsweep submit`` from the login host to a Ray cluster of four hosts: the runs run on the
    workers; a client without the token, or with another, is refused by the Jobs API and the GCS;
    beyond loopback every host listens only on the ports docs/clusters.md lists."""
    home = cluster.shared / "home-ray"
    grid = cluster.shared / "ray.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "name": "ray-hosts"}))
    env = _user_env(cluster, home) | ray_on_hosts["env"] | {
        "HEADSWEEP_RAY_DASHBOARD": ray_on_hosts["dashboard"], "RAY_ADDRESS": ray_on_hosts["address"]}
    done = _headsweep(cluster, env, "submit", str(grid), "--wait", timeout=480)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    sweep_id = re.search(r"(sw-\S+):", done.stdout).group(1)
    runs = _runs(home, sweep_id)
    assert [(status, attempts) for status, _, attempts in runs] == [("finished", 1)] * 6
    assert {host for _, host, _ in runs} <= set(COMPUTES) and len({host for _, host, _ in runs}) >= 2, runs

    jobs = ("import sys; from ray.job_submission import JobSubmissionClient\n"
            "try:\n    JobSubmissionClient(sys.argv[1]).list_jobs(); print('admitted')\n"
            "except Exception as err:\n    print('refused:', type(err).__name__, str(err).splitlines()[0])")
    gcs = ("import sys, ray\n"
           "try:\n    ray.init(address=sys.argv[1], log_to_driver=False); print('admitted')\n"
           "except Exception as err:\n    print('refused:', type(err).__name__, str(err).splitlines()[0])")
    without = {name: value for name, value in env.items() if name not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    other = env | {"RAY_AUTH_TOKEN": secrets.token_urlsafe(32)}
    said = {}
    for who, client_env in (("no token", without), ("another token", other), ("the token", env)):
        said[who] = cluster.run("login", [sys.executable, "-c", jobs, ray_on_hosts["dashboard"]], env=client_env,
                                cwd="/tmp", timeout=60).stdout.strip()
    tokenless = cluster.run("login", [sys.executable, "-c", gcs, ray_on_hosts["address"]], env=without, cwd="/tmp",
                            timeout=120)
    said["GCS, no token"] = tokenless.stdout.strip().splitlines()[-1:] + _gcs_answers(tokenless.stderr)[-1:]
    print("\n" + "\n".join(f"{who}: {line}" for who, line in said.items()))
    assert said["no token"].startswith("refused: AuthenticationError"), said
    assert said["another token"].startswith("refused: AuthenticationError"), said
    assert said["the token"] == "admitted", said
    assert _refused_for_its_token(tokenless.stdout, tokenless.stderr), (said, tokenless.stderr[-2000:])

    allowed = set(README_PORTS.values())
    for name in ("ctl", *COMPUTES):
        beyond = [(address, port, program) for address, port, program in cluster.listening(name)
                  if not address.startswith("127.") and not program.startswith(("slurm", "munge"))]
        print(f"{name} ({cluster.address(name)}): " + ", ".join(f"{a}:{p} {prog}" for a, p, prog in beyond))
        stray = [(a, p, prog) for a, p, prog in beyond
                 if p not in allowed and not WORKER_PORTS[0] <= p <= WORKER_PORTS[1]]
        assert not stray, f"{name} listens beyond loopback on ports docs/clusters.md does not list: {stray}"


# --------------------------------------------------------------------------- registry and MLflow over the network


@pytest.fixture(scope="module")
def services(cluster):
    """On the head host (ctl), as cluster.yaml sets it up: PostgreSQL on its cluster address (password
    logins from the subnet) for the registry and MLflow, and an MLflow tracking server over HTTP with
    proxied artifacts in ctl's local /tmp."""
    database = hosts.start_postgres(cluster, "ctl", DB_PASSWORD)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("HEADSWEEP_", "MLFLOW_"))}
    mlflow = hosts.start_mlflow_server(cluster, "ctl", f"postgresql+psycopg://headsweep@{database}/mlflow",
                                       env | {"PGPASSWORD": DB_PASSWORD})
    return {"db": f"postgresql+psycopg://headsweep@{database}/headsweep", "mlflow": mlflow}


CHECK = """
import json, sys
from mlflow import MlflowClient
from orchestrator.registry import Registry
sweep_id, db, uri = sys.argv[1:4]
registry = Registry(db)
runs = [registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]]
mlflow = MlflowClient(uri)
found = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
print(json.dumps({"runs": [[r["status"], r["worker"], r["attempts"]] for r in runs],
                  "mlflow": [[r.info.status, r.info.artifact_uri, r.data.tags.get("run_key"),
                              [a.path for a in mlflow.list_artifacts(r.info.run_id)]] for r in found]}))
"""


def _without_artifacts(runs: list, store: Path) -> list[str]:
    """The run keys of ``runs`` (CHECK's [status, artifact URI, run key, artifacts listed]) whose
    maps.npz (every run logs one: experiments/harness/runner.py) the server does not list, or whose file is
    not in its store ``store`` (``mlflow-artifacts:/E/R/artifacts`` is ``store/E/R/artifacts`` there)."""
    return [key for _, uri, key, listed in runs
            if "maps.npz" not in listed or not (store / uri.removeprefix("mlflow-artifacts:/") / "maps.npz").is_file()]


@pytest.mark.timeout(CLUSTER_S + RAY_S + SERVICES_S + 300 + 480 + 120)  # the refused submit, the submit, CHECK
def test_registry_on_postgresql_and_mlflow_over_http_with_no_shared_filesystem(cluster, ray_on_hosts, services):
    """A sweep submitted from the login host with its home on the login host's own disk (no other
    host sees it): the registry is PostgreSQL on the head host over the cluster network, MLflow a
    tracking server over HTTP; the runs run on the workers, every run's artifacts reach the server's
    store through HTTP (none is written on a worker), every run is in both, once.

    First, the same submit with the embedded defaults (SQLite registry and MLflow in that home, which
    no other host sees) is refused in one line naming a node and the path, before anything runs."""

    home = Path("/tmp/headsweep-home")  # the login host's local /tmp
    grid = cluster.shared / "services.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "name": "over-the-network"}))
    env = _user_env(cluster, home) | ray_on_hosts["env"] | {
        "HEADSWEEP_RAY_DASHBOARD": ray_on_hosts["dashboard"], "RAY_ADDRESS": ray_on_hosts["address"]}
    refused = _headsweep(cluster, env, "submit", str(grid), timeout=300)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("headsweep: error:")]
    print(f"\nthe home on login's disk: exit {refused.returncode}, {errors}")
    assert refused.returncode == 2 and len(errors) == 1, (refused.stdout[-2000:], refused.stderr[-3000:])
    assert re.search(rf"node (ctl|n1|n2|n3) \(10\.[\d.]+\) does not see the registry \({home}\)", errors[0]), errors
    assert not Registry(f"sqlite:///{cluster.hosts['login'].tmp}/headsweep-home/registry.db").list_sweeps()
    assert not list((cluster.hosts["login"].tmp / "headsweep-home").glob(".headsweep-shared-*"))
    env |= {"HEADSWEEP_DB": services["db"], "HEADSWEEP_TRACKING_URI": services["mlflow"]}
    done = _headsweep(cluster, env, "submit", str(grid), "--wait", timeout=480)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    sweep_id = re.search(r"(sw-\S+):", done.stdout).group(1)
    checked = cluster.run("login", [sys.executable, "-c", CHECK, sweep_id, services["db"], services["mlflow"]],
                          env=env, cwd=str(ROOT), timeout=120)
    assert checked.returncode == 0, checked.stderr[-2000:]
    said = json.loads(checked.stdout.strip().splitlines()[-1])
    assert [(status, attempts) for status, _, attempts in said["runs"]] == [("finished", 1)] * 6
    hosts_used = {worker.split("@")[1].split("[")[0] for _, worker, _ in said["runs"]}
    assert hosts_used <= set(COMPUTES), hosts_used
    children = [run for run in said["mlflow"] if run[2]]
    assert sorted(status for status, *_ in children) == ["FINISHED"] * 6
    assert all(uri.startswith("mlflow-artifacts:/") for _, uri, _, _ in said["mlflow"]), said["mlflow"]
    stored = cluster.hosts["ctl"].tmp / "mlartifacts"
    lacking = _without_artifacts(children, stored)
    assert not lacking, f"runs whose maps.npz did not reach the server's store {stored}: {lacking}"
    for name in COMPUTES:
        assert not (cluster.hosts[name].tmp / "mlartifacts").exists()
    print(f"\nruns on {sorted(hosts_used)}; artifacts: {sorted(len(a) for *_, a in children)} per run, "
          f"{sum(1 for p in stored.rglob('*') if p.is_file())} files in the server's store")


# --------------------------------------------------------------------------- hub ids without a network


@pytest.mark.timeout(CLUSTER_S + RAY_S + 480 + 180)  # the submit, the refused one
def test_a_hub_model_and_a_dataset_by_name_run_on_hosts_without_a_network(cluster, ray_on_hosts):
    """No host has a route to the hub. The Hugging Face cache on the shared filesystem holds a model
    by hub id and a dataset by name (as a submit with the hub would have left it): the submit resolves
    both there (the hub is not set offline: it cannot be reached), the trials on the workers load
    them offline from it. A hub id that is neither cached nor reachable stops the submit with one
    line naming it, before anything runs."""
    caches = cluster.shared / "hf"
    hub_cache(caches / "hub")
    dataset_cache(caches / "datasets", [{"sentence": f"{'a fine' if i % 2 else 'a dull'} film {i}", "label": i % 2}
                                        for i in range(24)])
    home = cluster.shared / "home-hub"
    grid = cluster.shared / "hub.yaml"
    task = {"name": "classification", "hf": DATASET_ID, "train": "train", "dev": "validation", "text": "sentence",
            "max_length": 16}
    grid.write_text(yaml.safe_dump({**GRID, "name": "hub-ids", "axes": {"seed": [0, 1, 2]},
                                    "base": {**GRID["base"], "model": MODEL_ID, "task": task,
                                             "train": {"max_steps": 4, "batch_size": 4, "eval_every": 4}}}))
    env = _user_env(cluster, home) | ray_on_hosts["env"] | {
        "HEADSWEEP_RAY_DASHBOARD": ray_on_hosts["dashboard"], "RAY_ADDRESS": ray_on_hosts["address"]}
    env = {name: value for name, value in env.items() if not name.startswith(("HF_", "TRANSFORMERS_"))} | {
        "HF_HUB_CACHE": str(caches / "hub"), "HF_DATASETS_CACHE": str(caches / "datasets"),
        "HF_HUB_ETAG_TIMEOUT": "3", "HF_HUB_DOWNLOAD_TIMEOUT": "3"}  # the hub not offline: unreachable
    done = _headsweep(cluster, env, "submit", str(grid), "--wait", timeout=480)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    sweep_id = re.search(r"(sw-\S+):", done.stdout).group(1)
    runs = _runs(home, sweep_id)
    assert [(status, attempts) for status, _, attempts in runs] == [("finished", 1)] * 3, runs
    assert {host for _, host, _ in runs} <= set(COMPUTES)
    assert {config["model"] for config in Registry(f"sqlite:///{home}/registry.db").sweep_runs(sweep_id)["config"]} \
        == {MODEL_ID}

    missing = cluster.shared / "missing.yaml"
    missing.write_text(yaml.safe_dump({**GRID, "name": "missing", "base": {**GRID["base"], "model": "no-such-org/no-model"}}))
    refused = _headsweep(cluster, env, "submit", str(missing), timeout=180)
    said = [line for line in refused.stderr.strip().splitlines() if line.startswith("headsweep: error:")]
    print(f"\nhub-id sweep: runs on {sorted({h for _, h, _ in runs})}; unreachable id: {said}")
    assert refused.returncode == 2 and len(said) == 1, refused.stderr[-2000:]  # beside it: "downloading ..."
    assert said[0].startswith(f"headsweep: error: model 'no-such-org/no-model' is not in the hub cache ({caches / 'hub'}) "
                              "and could not be downloaded: "), said
    assert "missing" not in {s["name"] for s in Registry(f"sqlite:///{home}/registry.db").list_sweeps()}


# --------------------------------------------------------------------------- cluster-onprem.yaml through `ray up`


# its waits, in order: sshd on 4 hosts, ray up, 4 nodes alive (+ its last probe, its message's), ray exec, the
# registry read, ray down, Ray gone from the head then from the workers, Ray stopped
@pytest.mark.timeout(CLUSTER_S + SERVICES_S + 4 * 30 + 600 + (300 + 30 + 60) + 600 + 60 + 300 + 60 + 180 + 4 * 20)
def test_cluster_onprem_yaml_through_ray_up_runs_a_sweep_then_ray_down(cluster, services):
    """docs/clusters.md's path for machines reached over SSH, for real: cluster-onprem.yaml with the hosts'
    addresses (ctl the head, n1-n3 the workers), sshd on each, a home on the shared filesystem with
    headsweep's venv at ~/hs; ``ray up`` from the login host (Ray's launcher: setup commands over SSH,
    the head, its autoscaler starting a worker on each worker host over SSH); ``ray exec ... headsweep
    submit --wait`` on the head; every run once, in PostgreSQL and MLflow's server; ``ray down``
    leaves no Ray on the head, and the workers' Ray ends with it (the local provider stops only the
    head: each worker's raylet exits once its GCS is gone; Ray leaves its log monitor, which the
    worker's next ``ray stop``, the first start command, ends)."""
    home = cluster.home  # ~ on every host (a shared home, as NFS gives)
    for folder in (".headsweep", ".ray"):
        (home / folder).mkdir(parents=True)
    (home / "hs").symlink_to(Path(sys.executable).parents[1])  # the venv every node has (a shared home)
    (home / ".bashrc").write_text("")
    token = secrets.token_urlsafe(32)
    (home / ".ray" / "auth_token").write_text(token)
    (home / ".headsweep" / "cluster.env").write_text(
        f"export HEADSWEEP_DB={services['db']}\nexport HEADSWEEP_TRACKING_URI={services['mlflow']}\n"
        f"export PGPASSWORD='{DB_PASSWORD}'\nexport HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0\n"
        "export RAY_raylet_start_wait_time_s=180\n")  # `ray start`'s wait for its raylet (30 s) on a loaded machine
    key = hosts.start_sshd(cluster, ["ctl", *COMPUTES])
    config = yaml.safe_load((ROOT / "cluster-onprem.yaml").read_text())
    config["provider"] |= {"head_ip": cluster.address("ctl"), "worker_ips": [cluster.address(n) for n in COMPUTES]}
    config["auth"] = {"ssh_user": "root", "ssh_private_key": str(key)}
    launcher = home / "cluster.yaml"
    launcher.write_text(yaml.safe_dump(config))
    (home / "grid.yaml").write_text(yaml.safe_dump({**GRID, "name": "onprem", "resources": {"cpus": 0.5}}))
    env = {"HOME": str(Path.home()), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
           "RAY_UP_enable_autoscaler_v2": "0"}  # v2 (Ray 2.60) counts the head among worker_ips: one worker short
    ray = str(Path(sys.executable).parent / "ray")

    def launcher_run(*args: str, timeout: float = 600):
        start = time.monotonic()
        done = cluster.run("login", [ray, *args, str(launcher)], env=env, cwd=str(home), timeout=timeout)
        return done, time.monotonic() - start

    def alive() -> int:
        shown = cluster.run("ctl", [sys.executable, "-c", ALIVE, "http://127.0.0.1:8265", token], timeout=30)
        return int(shown.stdout.strip() or 0) if shown.returncode == 0 else 0

    try:
        up, up_s = launcher_run("up", "-y", "--no-config-cache", timeout=600)
        assert up.returncode == 0, (up.stdout[-3000:], up.stderr[-3000:])
        start = time.monotonic()
        until(lambda: alive() == 4, 300, lambda: f"{alive()} of 4 nodes alive; the head's autoscaler said:\n"
               + cluster.run("ctl", ["sh", "-c", "tail -30 /tmp/ray/session_latest/logs/monitor.*"], timeout=30).stdout)
        joined_s = time.monotonic() - start
        done = cluster.run("login", [ray, "exec", str(launcher), "headsweep submit ~/grid.yaml --wait"], env=env,
                           cwd=str(home), timeout=600)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        said = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)  # through ssh -tt: rich's colours
        sweep_id = re.search(r"(sw-\S+):", said).group(1)
        read = cluster.run("login", [sys.executable, "-c", STATE, sweep_id, services["db"]],
                           env=_user_env(cluster, cluster.shared / "home-login", PGPASSWORD=DB_PASSWORD), cwd=str(ROOT),
                           timeout=60)
        assert read.returncode == 0, (sweep_id, done.stdout[-2000:], read.stderr[-2000:])
        final = json.loads(read.stdout.strip().splitlines()[-1])
        assert sorted((status, attempts) for status, _, attempts in final.values()) == [("finished", 1)] * 6, final
        ran_on = sorted({host for _, host, _ in final.values()})
        assert set(ran_on) <= {"ctl", *COMPUTES} and len(set(ran_on) & set(COMPUTES)) >= 2, final
        down, down_s = launcher_run("down", "-y", timeout=300)
        assert down.returncode == 0, (down.stdout[-3000:], down.stderr[-3000:])
        until(lambda: not [pid for pid in cluster.pids("ctl") if _is_ray(pid)], 60,
               lambda: "Ray left on the head after `ray down`")
        start = time.monotonic()
        def left_on_workers() -> list[str]:  # Ray 2.60 leaves each node's log monitor (the next `ray stop` ends it)
            found = [f"{name}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
                     for name in COMPUTES for pid in cluster.pids(name) if _is_ray(pid)]
            return [line for line in found if "ray/_private/log_monitor.py" not in line]

        until(lambda: not left_on_workers(), 180,
               lambda: "the workers' Ray outlived the head by 180 s after `ray down`:\n" + "\n".join(left_on_workers()))
        print(f"\nray up {up_s:.0f} s; 3 workers joined {joined_s:.0f} s later; sweep of 6 runs on {ran_on}; "
              f"ray down {down_s:.0f} s; workers' Ray gone {time.monotonic() - start:.0f} s after")
    finally:
        for name in ("ctl", *COMPUTES):
            kill_pids(lambda name=name: {pid for pid in cluster.pids(name) if _is_ray(pid)}, grace_s=5)


# --------------------------------------------------------------------------- a host cut off


STATE = """
import json, sys
from orchestrator.registry import Registry
registry = Registry(sys.argv[2])
runs = {key: registry.get_run(key) for key in registry.sweep_runs(sys.argv[1])["run_key"]}
print(json.dumps({key: [run["status"], (run["worker"] or "").split("@")[-1].split("[")[0] if "@" in (run["worker"] or "")
                        else "", run["attempts"]] for key, run in runs.items()}))
"""


@pytest.mark.timeout(CLUSTER_S + SERVICES_S + 300 + 240 + (300 + 60) + (400 + 60 + 60) + (900 + 60) + 60 + 60 + 120
                     + 300)  # its waits, in order (an until's deadline + its probe's command, + its message's)
def test_a_worker_host_cut_off_mid_sweep_its_runs_rerun_on_the_others(cluster, services):
    """One compute host's network cut while it runs trials (its switch port down: its processes live
    on, unreachable, and so are the registry on PostgreSQL and MLflow's server to them). Ray marks the
    node dead, or the supervisor sees its runs' heartbeats stop first: either way its runs run again on
    the other hosts; SLURM's job goes on (``--no-kill``); ``headsweep status`` names the host. The host
    back, it is left out cleanly (its raylet, marked dead, exits: no Ray of the job is left on it), and
    the sweep finishes with every run once."""
    home = cluster.shared / "home-cut"
    grid = cluster.shared / "cut.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "name": "multihost-cut",
                                    "base": {**GRID["base"], "train": {"max_steps": 3000, "batch_size": 8, "eval_every": 1000}}}))
    env = _user_env(cluster, home, HEADSWEEP_DB=services["db"], HEADSWEEP_TRACKING_URI=services["mlflow"],
                    PGPASSWORD=DB_PASSWORD)
    job_id, folder = _submit_slurm(cluster, env, grid)
    log = lambda: (folder / f"slurm-{job_id}.out").read_text(errors="replace")  # noqa: E731
    until(lambda: (folder / "sweep").exists(), 240, lambda: log()[-3000:])
    sweep_id = (folder / "sweep").read_text().strip()
    head = re.search(r"Ray: 3 node\(s\), head (\S+):", log()).group(1)
    victim = next(name for name in reversed(COMPUTES) if cluster.address(name) != head)

    def state() -> dict[str, list]:
        done = cluster.run("login", [sys.executable, "-c", STATE, sweep_id, services["db"]], env=env, cwd=str(ROOT),
                           timeout=60)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}

    cut: list[str] = []

    def running_on_victim() -> bool:
        cut[:] = [key for key, (status, host, _) in state().items() if status == "running" and host == victim]
        return bool(cut)

    until(running_on_victim, 300, lambda: log()[-3000:])
    start = time.monotonic()
    cluster.cut(victim)
    try:
        until(lambda: all(state().get(key, ["", victim])[1] not in ("", victim) for key in cut), 400,
               lambda: f"the cut host's runs did not move: {state()}\n{log()[-3000:]}")
        moved_s = time.monotonic() - start
    finally:
        cluster.restore(victim)
    head_host = next(name for name in COMPUTES if cluster.address(name) == head)
    kept = cluster.shared / "driver-logs"

    def ended() -> bool:  # the driver's and trials' Ray logs, kept as the job goes (the job removes them)
        # session_latest is an absolute link, into the host's own /tmp: read the session folder itself
        logs = cluster.hosts[head_host].tmp / f"hs-{job_id}"
        lost = cluster.hosts[victim].tmp / f"hs-{job_id}"
        for path in [*logs.glob("session_2*/logs/job-driver-*.log"), *logs.glob("session_2*/logs/raylet.out"),
                     *logs.glob("session_2*/logs/gcs_server.out"), *lost.glob("session_2*/logs/raylet.out")]:
            kept.mkdir(exist_ok=True)
            shutil.copy(path, kept / f"{path.parents[2] == lost and victim or 'head'}-{path.name}")
        return _job_state(cluster, job_id) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")

    until(ended, 900, lambda: log()[-3000:])
    drivers = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(kept.glob("head-job-driver-*.log")))
    assert _job_state(cluster, job_id) == "COMPLETED", f"{log()[-2000:]}\n--- the driver's log:\n{drivers}"
    final = state()
    assert sorted(status for status, _, _ in final.values()) == ["finished"] * 6, final
    assert all(final[key][1] != victim and final[key][2] >= 2 for key in cut), (cut, final)
    checked = cluster.run("login", [sys.executable, "-c", CHECK, sweep_id, services["db"], services["mlflow"]],
                          env=env, cwd=str(ROOT), timeout=120)
    children = [run for run in json.loads(checked.stdout.strip().splitlines()[-1])["mlflow"] if run[2]]
    assert sorted(key for status, _, key, _ in children if status == "FINISHED") == sorted(final), children
    told = _headsweep(cluster, env, "status", sweep_id).stdout
    lines = [line for line in told.splitlines() if f" on {victim} (Ray node " in line]  # lost or orphaned there
    print(f"\n{victim} ({cluster.address(victim)}) cut with {len(cut)} run(s) on it; they ran again elsewhere "
          f"{moved_s:.0f} s later; runs (status, host, attempts): {sorted(final.values())}; status: {lines}")
    assert lines and f", {cluster.address(victim)})" in lines[0], told
    ray_left = [pid for pid in cluster.pids(victim) if _is_ray(pid)]
    assert not ray_left, f"Ray processes left on {victim} after the job: {ray_left}"
