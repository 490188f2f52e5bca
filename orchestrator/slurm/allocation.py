"""A sweep inside its SLURM allocation: the last line of ``headsweep slurm``'s script.

``python -m orchestrator.slurm.allocation job FOLDER [--requeue]`` (:func:`run_job`) runs on the
allocation's first node:

1. a Ray head there and, through ``srun``, a Ray worker on each other node (``... node
   HEAD_ADDRESS``, :func:`run_node`), each from :func:`node_command`: the node's CPUs and GPUs as
   SLURM allocated them, ports of this job's own (a block keyed by its Ray temp dir, as a local
   head's is by its home), a short temp dir (``/tmp/hs-JOBID``: Ray's unix socket paths must stay
   under 107 bytes), token authentication with a token made for the job (in the environment every
   node inherits, never on disk), the dashboard (Jobs API) on 127.0.0.1; on one node every Ray
   server on 127.0.0.1 (the local head's loopback mode), on several the node's cluster-network
   address, as cluster.yaml's;
2. the sweep (:func:`start_sweep`): submitted in the first allocation (its id into ``sweep``),
   resumed in every later one (``--requeue``, or the script submitted again): a run that
   finished never runs again, a run the last allocation left running runs again (the new
   driver resets it once its heartbeat is stale); the sweep's history records the allocation
   that ended and the job that resumed it;
3. it waits for the sweep, then stops Ray on every node, by PID (never ``ray stop``, which ends
   every Ray of the user on the node).

When SLURM ends the job first: SIGUSR1 (its time limit nears) or SIGTERM (``scancel``,
preemption, a requeue), Ray stops at once (its driver starts no run the allocation could not
finish), the end is recorded in the sweep's history (``record_end``), and with
``--requeue`` after SIGUSR1 the job requeues itself when this allocation finished some run (a
sweep whose runs never fit the time limit does not loop). SIGKILL follows; nothing depends on
the record: the next allocation records the end it missed.

Why not ``ray symmetric-run`` (Ray >= 2.49, installed here): it refuses to start where any Ray
runs on the node (another job's, on a shared node), ends with ``ray stop`` (another job's Ray
too), starts the Ray client server on every interface, and waits 30 s at most for the nodes.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from base.sections import ConfigError
from orchestrator import settings
from orchestrator.cluster.addresses import node_ip
from orchestrator.cluster.head import LOOPBACK_ENV, head_ports
from orchestrator.cluster.jobs import cluster_nodes
from orchestrator.cluster.processes import is_loopback, kill_tree
from orchestrator.slurm.sbatch import known_sweep

NODE_WAIT_S = 300.0
"""How long the head waits for its workers (and itself) to join."""


# --------------------------------------------------------------------------- Ray on the nodes


def ray_temp_dir(job_id: str) -> str:
    """This job's Ray temp dir on every node: short, for Ray's unix sockets (under 107 bytes)."""
    return f"/tmp/hs-{job_id}"


def node_command(tmp: str, ports: dict[str, int], cpus: int, gpus: int, ip: str,
                 head: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``ray start --block`` (without the Ray client server) for a head (``head`` None) or a worker
    joining ``head``, and the environment it needs: this node's CPUs and GPUs, its ``ports``
    (:func:`head_ports`), ``ip`` as the node's address (127.0.0.1: every server on loopback)."""
    command = [
        sys.executable, "-m", "orchestrator.cluster.head", "ray-start", "--block", f"--node-ip-address={ip}",
        f"--temp-dir={tmp}", f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--disable-usage-stats",
        f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}",
        f"--dashboard-agent-listen-port={ports['agent_http']}", f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}", f"--metrics-export-port={ports['metrics_export']}",
    ]
    if head is None:
        command += ["--head", f"--port={ports['gcs']}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={ports['dashboard']}"]
    else:
        command.append(f"--address={head}")
    env = {"AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"]),
           "DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"])}
    return command, env | network_env(ip)


def network_env(ip: str) -> dict[str, str]:
    """Ray's single-machine mode (every server on 127.0.0.1) for a loopback ``ip``, its cluster mode else."""
    return LOOPBACK_ENV if is_loopback(ip) else {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}


def allocated(env: dict[str, str] | None = None) -> tuple[int, int]:
    """(CPUs, GPUs) SLURM allocated on this node."""
    env = os.environ if env is None else env
    gpus = env.get("SLURM_GPUS_ON_NODE") or len([g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g])
    return int(env.get("SLURM_CPUS_ON_NODE") or 1), int(gpus)


def start_node(tmp: str, ip: str, head: str | None = None) -> tuple[subprocess.Popen, dict[str, int]]:
    """Start this node's Ray, with ports from this job's block (keyed by its temp dir, probed free
    on this node); what a dead earlier allocation of the job left under ``tmp`` is stopped first."""
    kill_tree(tmp)
    Path(tmp).mkdir(parents=True, exist_ok=True)
    ports = head_ports(Path(tmp))
    command, env = node_command(tmp, ports, *allocated(), ip, head)
    # cwd: the temp dir, so that no job or worker finds a checkout's packages in its working directory;
    # Ray's banner to a file there (the job's log is the sweep's)
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"} | env  # joins no other cluster
    with open(Path(tmp) / "ray-start.log", "ab") as log:
        return subprocess.Popen(command, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT), ports


def stop_node(process: subprocess.Popen | None, tmp: str) -> None:
    """Stop this node's Ray: every process under the job's temp dir, by PID, then ``ray start --block``
    (killed: its SIGTERM would drain the node for up to 30 s, of SLURM's 30 s before SIGKILL); the
    temp dir goes too (what went wrong is in the job's log)."""
    kill_tree(tmp)
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
    shutil.rmtree(tmp, ignore_errors=True)


def _start_log(tmp: str, lines: int = 20) -> str:
    """The end of this node's ``ray start`` output."""
    try:
        return "\n".join((Path(tmp) / "ray-start.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _wait_for_nodes(dashboard: str, count: int, processes: list[subprocess.Popen], tmp: str) -> None:
    deadline = time.monotonic() + NODE_WAIT_S
    seen = 0
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise ConfigError(f"Ray did not start: `{shlex.join(process.args[:4])} ...` exited with "
                                  f"{process.returncode}; this node's Ray said:\n{_start_log(tmp)}")
        try:
            seen = len(cluster_nodes(dashboard))
        except Exception:  # noqa: BLE001 - the dashboard is not up yet
            seen = 0
        if seen >= count:
            return
        time.sleep(1)
    raise ConfigError(f"{seen} of {count} Ray nodes joined within {NODE_WAIT_S:g} s; this node's Ray said:\n"
                      f"{_start_log(tmp)}")


def start_ray(tmp: str, nodes: int, ip: str) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Ray on the allocation: the head on this node, a worker on each other node (one ``srun``),
    once every node joined; the processes to stop and the head's address and dashboard URL."""
    processes = []
    try:
        head_process, ports = start_node(tmp, ip)
        processes.append(head_process)
        head = {"address": f"{ip}:{ports['gcs']}", "dashboard": f"http://127.0.0.1:{ports['dashboard']}"}
        if nodes > 1:
            processes.append(subprocess.Popen([
                "srun", "--no-kill", f"--nodes={nodes - 1}", f"--ntasks={nodes - 1}", "--ntasks-per-node=1",
                f"--exclude={os.environ.get('SLURMD_NODENAME', socket.gethostname())}",
                sys.executable, "-m", "orchestrator.slurm.allocation", "node", head["address"]]))
        _wait_for_nodes(head["dashboard"], nodes, processes, tmp)
    except BaseException:
        stop_ray(processes, tmp)
        raise
    return processes, head


def stop_ray(processes: list[subprocess.Popen], tmp: str) -> None:
    """Stop the workers (srun passes SIGTERM on: each stops its Ray), then this node's Ray."""
    for workers in processes[1:]:
        if workers.poll() is None:
            workers.terminate()
            try:
                workers.wait(30)
            except subprocess.TimeoutExpired:
                workers.kill()
    stop_node(processes[0] if processes else None, tmp)


def run_node(head: str) -> int:
    """A worker node (``srun`` starts one per other node): its Ray until SLURM or the head stops it."""
    tmp = ray_temp_dir(os.environ["SLURM_JOB_ID"])
    process = None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        process, _ = start_node(tmp, node_ip(peer=head), head)
        code = process.wait()
        print(f"Ray on {socket.gethostname()} ended ({code}):\n{_start_log(tmp)}", file=sys.stderr)
        return code
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_node(process, tmp)


# --------------------------------------------------------------------------- the sweep in the allocation


class AllocationEnding(BaseException):
    """SLURM is ending the job (SIGUSR1: its time limit nears; SIGTERM: scancel, preemption, a requeue).
    A BaseException, as KeyboardInterrupt, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGUSR1):  # once: what follows is the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise AllocationEnding(signum)


def record_end(sweep_id: str) -> bool:
    """The sweep's driver ended with its SLURM allocation: the sweep failed, its history says so
    (nothing when its driver had written the final status, or this was recorded already)."""
    from orchestrator.registry import Registry
    from orchestrator.registry.events import ALLOCATION_ENDED

    registry = Registry(settings.registry_url())
    sweep = registry.get_sweep(sweep_id)
    return bool(sweep["driver"]) and registry.lose_driver(sweep_id, sweep["driver"], ALLOCATION_ENDED)


def start_sweep(folder: Path, job_id: str) -> str:
    """Submit the folder's grid (its first allocation) or resume its sweep (every later one); the sweep id."""
    from orchestrator.driving import sweeps

    sweep_id = known_sweep(folder)
    if sweep_id is None:
        submitted = sweeps.submit((folder / "grid").read_text().strip())
        (folder / "sweep.tmp").write_text(submitted.sweep_id + "\n")
        (folder / "sweep.tmp").replace(folder / "sweep")
        print(f"{submitted.sweep_id}: submitted ({submitted.counts['total']} runs, {submitted.counts['new']} new)")
        return submitted.sweep_id
    if record_end(sweep_id):  # the last allocation was killed before it could record its end
        print(f"{sweep_id}: its driver ended with the last allocation")
    driver = sweeps.resume(sweep_id, by=f"SLURM job {job_id}")
    print(f"{sweep_id}: resumed" + ("" if driver else ": nothing left to run"))
    return sweep_id


def _quiet() -> None:
    """The job's log shows the sweep, not the libraries' INFO lines (set after their imports, which set them)."""
    import mlflow  # noqa: F401
    import ray.dashboard.modules.dashboard_sdk  # noqa: F401

    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "mlflow"):  # the second sets its own INFO
        logging.getLogger(name).setLevel(logging.WARNING)


def _finished(sweep_id: str) -> int:
    from orchestrator.registry import Registry

    return Registry(settings.registry_url()).sweep_counts(sweep_id).get("finished", 0)


def _printer(sweep_id: str):
    last: list[str] = []

    def update(sweep, counts):
        line = f"{sweep['status']}: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        if sweep.get("starting"):  # a driver slow to start: why
            print(f"{datetime.now():%H:%M:%S} {sweep_id}: {sweep['starting']}")
        if [line] != last:
            last[:] = [line]
            print(f"{datetime.now():%H:%M:%S} {sweep_id} {line}")

    return update


def run_job(folder: Path, requeue: bool = False) -> int:
    """The job on its first node: Ray on every node, the sweep submitted or resumed, waited for, Ray
    stopped. 0 when every run finished; 128 + the signal when SLURM ended the allocation first."""
    from orchestrator.driving import sweeps

    job_id, nodes = os.environ["SLURM_JOB_ID"], int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    tmp = ray_temp_dir(job_id)
    # a token for this job: in the environment every node's Ray and every client inherits, never on disk
    os.environ |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_urlsafe(32),
                   "RAY_USAGE_STATS_ENABLED": "0"}
    ip = "127.0.0.1" if nodes == 1 else node_ip()
    os.environ |= network_env(ip)  # this process's Ray clients and the workers' srun see the same mode
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _on_signal)
    processes: list[subprocess.Popen] = []
    sweep_id, finished_before, again = None, 0, False
    try:
        processes, head = start_ray(tmp, nodes, ip)
        print(f"Ray: {nodes} node(s), head {head['address']}, dashboard {head['dashboard']}, temp dir {tmp}")
        os.environ |= {"RAY_ADDRESS": head["address"], "HEADSWEEP_RAY_DASHBOARD": head["dashboard"]}
        _quiet()
        sweep_id = start_sweep(folder, job_id)
        finished_before = _finished(sweep_id)
        sweep = sweeps.wait(sweep_id, _printer(sweep_id), poll_s=2.0)
        print(f"{sweep_id}: {sweep['status']}")
        return 0 if sweep["status"] == "finished" else 1
    except AllocationEnding as end:
        # Ray first: the driver starts no run it could not finish (the record needs only the registry)
        print(f"{datetime.now():%H:%M:%S} SLURM ends the allocation ({end}): Ray stops", flush=True)
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_IGN)
        stop_ray(processes, tmp)
        processes = []
        if sweep_id and record_end(sweep_id):
            print(f"{sweep_id}: recorded in its history")
        if end.signum == signal.SIGUSR1 and requeue and sweep_id:
            again = _finished(sweep_id) > finished_before
            print("requeued: the next allocation resumes the sweep" if again else
                  "not requeued: no run finished in this allocation (do the runs fit its time limit?)")
        return 128 + end.signum
    finally:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_IGN)
        stop_ray(processes, tmp)
        if again:  # last: SLURM ends this allocation at once
            subprocess.run(["scontrol", "requeue", job_id], check=False, timeout=60)


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.slurm.allocation job FOLDER [--requeue]`` (the script's last line) or
    ``node HEAD_ADDRESS`` (a worker node, through srun)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["job"] and len(argv) >= 2:
            return run_job(Path(argv[1]), requeue="--requeue" in argv[2:])
        if argv[:1] == ["node"] and len(argv) == 2:
            return run_node(argv[1])
    except ConfigError as err:
        print(f"headsweep: error: {err}", file=sys.stderr)
        return 2
    print("usage: python -m orchestrator.slurm.allocation job FOLDER [--requeue] | node HEAD_ADDRESS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
