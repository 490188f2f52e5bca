"""Simulated Ray worker nodes on this machine, joining a loopback head (the project's local head).

Each node has its own temp dir (``ray start --temp-dir``: "can be specified per node") and its
own block of ports, so its processes are found by that dir (its raylet and agents name it; its
workers are the raylet's children) and stopped, or killed as a crashed machine would be, by PID,
never with ``ray stop`` (which ends every Ray on the machine). Used by the two-node and lost-node
tests (tests/orchestrator/test_cluster.py) and the 64-logical-GPU scale run
(tests/benchmarks/scale_gpus.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.cluster.head import HEAD_ENV, head_ports
from orchestrator.cluster.processes import kill_tree, processes, ray_pids, stop_ray

# Ray's single-machine mode refuses to start a worker node, and would turn 127.0.0.1 into the
# machine's address without the second patch; the third leaves out the Ray client server.
JOIN = (
    "import sys; import ray._private.ray_constants as constants; import ray.scripts.scripts as cli; "
    "constants.ENABLE_RAY_CLUSTER = True; "
    "cli.services.resolve_ip_for_localhost = lambda host: '127.0.0.1' if cli.services.is_localhost(host) else host; "
    "cli.get_ray_client_dependency_error = lambda: ImportError('no Ray client server'); "
    "sys.argv[0] = 'ray'; sys.exit(cli.main())"
)

# Many simulated nodes share this machine's 2 cores and its memory, and Ray sizes a node's worker
# pool by its logical CPUs (32 per node of 8 GPUs here): it prestarts a worker per CPU when the
# first driver connects, keeps as many idle, and starts up to as many at once (Ray's defaults:
# prestart_worker_first_driver, num_workers_soft_limit and worker_maximum_startup_concurrency =
# CPUs). At 8 nodes that was ~10 GiB of `ray::IDLE` workers before the first trial, and under load
# a storm of workers starting for leases that timed out (each importing the trial path) until the
# head's memory monitor killed the sweep's driver after 151-166 trials. A real node has the cores
# and the memory for its own pool; a simulated one starts two workers at a time and keeps one idle.
NODE_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_num_workers_soft_limit": "1",
            "RAY_worker_maximum_startup_concurrency": "2"}


def start_node(address: str, tmp: str, cpus: int, gpus: int, env: dict[str, str] | None = None) -> dict:
    """Start a worker node joining the head at ``address`` with ``cpus`` logical CPUs and ``gpus``
    logical GPUs (no CUDA: Ray only counts them and sets ``CUDA_VISIBLE_DEVICES`` per task); return
    its temp dir, ports and Ray node id (hex). ``tmp`` must be short (unix sockets live under it)."""
    Path(tmp).mkdir(parents=True, exist_ok=True)
    ports = head_ports(Path(tmp))  # a free block keyed by the node's temp dir
    command = [sys.executable, "-c", JOIN, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
               f"--temp-dir={tmp}", f"--num-cpus={cpus}", f"--num-gpus={gpus}", "--disable-usage-stats",
               f"--dashboard-agent-listen-port={ports['agent_http']}", f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
               f"--runtime-env-agent-port={ports['runtime_env_agent']}", f"--metrics-export-port={ports['metrics_export']}",
               f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}"]
    environ = {k: v for k, v in (env or os.environ).items() if k != "RAY_ADDRESS"} | HEAD_ENV | NODE_ENV
    subprocess.run(command, check=True, capture_output=True, env=environ, cwd=tmp, timeout=180)
    return {"tmp": tmp, "ports": ports, "node_id": node_id(tmp)}


def node_pids(tmp: str) -> set[int]:
    """Every living process of the node that uses ``tmp``: its raylet, agents, log monitor, and their
    children (the workers, whose command lines Ray retitles, e.g. ``ray::ImplicitFunc.train``)."""
    return ray_pids(tmp)


def node_id(tmp: str) -> str:
    """The node's Ray node id (hex), from its raylet's command line (``--node_id=``)."""
    table = processes()
    for pid in node_pids(tmp):
        found = re.search(r"--node_id=([0-9a-f]+)", table.get(pid, (0, ""))[1])
        if found and "raylet" in table[pid][1]:
            return found[1]
    raise RuntimeError(f"no raylet under {tmp}")


def alive(tmp: str) -> bool:
    """The node's raylet runs (a raylet the GCS marked dead, e.g. after missed health checks on a
    loaded machine, exits by itself)."""
    table = processes()
    return any("raylet" in table.get(pid, (0, ""))[1] for pid in node_pids(tmp))


def kill_node(tmp: str) -> set[int]:
    """SIGKILL every process of the node at once (a machine that died: no drain, no goodbye to the
    GCS), until none of them lives; the PIDs killed."""
    return kill_tree(tmp, grace_s=0, kill_s=10)


def stop_node(tmp: str) -> None:
    """Stop the node's processes by PID (SIGTERM, then SIGKILL)."""
    stop_ray(tmp)
