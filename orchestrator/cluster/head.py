"""Finding (or starting) the Ray cluster: the local head of a ``HEADSWEEP_HOME`` and its ports.

A sweep outlives the ``headsweep submit`` that started it: the driver runs as
a Ray Job on the cluster's head (``orchestrator.cluster.jobs``). ``RAY_ADDRESS``
+ ``HEADSWEEP_RAY_DASHBOARD`` point at an existing cluster; otherwise ``submit``
starts a local head once and reuses it (:func:`cluster_in_use`).

The local head belongs to its ``HEADSWEEP_HOME``:

- it listens on 127.0.0.1 only, every port (GCS, raylet, object manager,
  dashboard and its agent, runtime-env agent, metrics, every worker), and
  starts no Ray client server;
- its ports are a block derived from the home's path (between Ray's worker
  ports and Linux's ephemeral ports; the next free block if that one is
  taken), its Ray temp dir is ``$TMPDIR/headsweep-ray-<hash of the home>``,
  and ``$HEADSWEEP_HOME/ray.json`` records the home, the ports and the
  interpreter that started it. A checkout with another home never attaches
  to it, and stopping it (``python -m orchestrator.cluster.head stop``) ends only
  its own processes, never another Ray on the machine (``ray stop`` would).

How loopback-only works in Ray 2.60: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
(Ray's single-machine mode, the default on macOS and Windows) the node IP is
127.0.0.1, and then the GCS, the raylet, the agents, the workers and the
metrics servers bind 127.0.0.1 instead of every interface or the machine's address.
Every process that connects to the head by GCS address needs the same
variable (else Ray rewrites 127.0.0.1 into the machine's address); the head's
own processes, and so the driver job and its trials, inherit it. The
submitting process talks to the head over HTTP only (dashboard, Jobs API).
``ray start`` has no switch to leave out the Ray client server (port 0 is
refused, no port means 10001 when grpc is installed); it is started here with
Ray's own CLI code, told that the client's dependencies are missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from base.sections import ConfigError
from orchestrator import settings
from orchestrator.cluster import addresses
from orchestrator.cluster.processes import (
    is_loopback,
    kill_tree,
    listening_sockets,
    processes,
    ray_pids,
    stop_ray,
)

# A local development head: no usage stats, and no token auth (Ray 2.60 turns it on when a
# ~/.ray/auth_token exists, and then our own clients without the token are refused). It is
# reachable from this machine only (loopback, below).
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
# Ray's single-machine mode: node IP 127.0.0.1, every server bound to loopback.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray starts its workers (every trial) at niceness 15, below everything else on the machine: on a shared
# machine, or one with any other busy process, a trial at 15 gets ~3 % of a core beside a process at 0
# (the CFS weights 36 vs 1024; measured: a test suite 10x slower beside two busy loops). Our heads and
# nodes start them at 0, as a plain training script runs; the job supervisor already is.
WORKER_ENV = {"RAY_worker_niceness": "0"}
HEAD_ENV = LOCAL_ENV | LOOPBACK_ENV | WORKER_ENV

# Between Ray's worker ports (10002-19999) and Linux's ephemeral ports (32768-60999).
PORT_RANGE = (20000, 32768)
PORTS = ("gcs", "dashboard", "agent_http", "agent_grpc", "runtime_env_agent", "metrics_export",
         "node_manager", "object_manager", "autoscaler_metrics", "dashboard_metrics")
BLOCK = 16  # ports per home, room to spare

# `ray start` with Ray's own CLI, minus the Ray client server (see the module's docstring).
_RAY_START = (
    "import sys; import ray.scripts.scripts as cli; "
    "cli.get_ray_client_dependency_error = lambda: ImportError('headsweep: no Ray client server'); "
    "sys.argv[0] = 'ray'; sys.exit(cli.main())"
)


class ClusterError(ConfigError):
    """The cluster cannot be used as asked: one line saying why and what to do."""


def _state_file(home: Path | None = None) -> Path:
    return (home or settings.home()) / "ray.json"


def _recorded(home: Path | None = None) -> dict:
    """What ray.json of ``home`` records ({} when nothing is)."""
    state_file = _state_file(home)
    return json.loads(state_file.read_text()) if state_file.exists() else {}


def _home_key(home: Path) -> str:
    return hashlib.sha256(str(home).encode()).hexdigest()[:12]


def temp_dir(home: Path | None = None) -> str:
    """The Ray temp dir of a home's local head: short (Ray's unix sockets live under it), keyed by the home."""
    return str(Path(tempfile.gettempdir()) / f"headsweep-ray-{_home_key(home or settings.home())}")


def _port_free(port: int) -> bool:
    """Whether the head could bind ``port`` on 127.0.0.1 (a listener on every interface holding it
    makes this bind fail too, so loopback is the only address probed)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def head_ports(home: Path) -> dict[str, int]:
    """The home's block of ports (the next free block when some port of it is taken).

    ``HEADSWEEP_RAY_PORT`` / ``HEADSWEEP_DASHBOARD_PORT`` pin the GCS and dashboard ports.
    """
    pinned = {name: int(os.environ[var]) for name, var in
              (("gcs", "HEADSWEEP_RAY_PORT"), ("dashboard", "HEADSWEEP_DASHBOARD_PORT")) if os.environ.get(var)}
    blocks = (PORT_RANGE[1] - PORT_RANGE[0]) // BLOCK
    first = int(_home_key(home), 16) % blocks
    for i in range(blocks):
        base = PORT_RANGE[0] + ((first + i) % blocks) * BLOCK
        ports = {name: base + j for j, name in enumerate(PORTS)} | pinned
        if all(_port_free(port) for name, port in ports.items() if name not in pinned):
            return ports
    raise ClusterError(f"no free block of {len(PORTS)} ports in {PORT_RANGE[0]}-{PORT_RANGE[1]} for a local Ray head")


def _info(state: dict) -> dict[str, str]:
    return {"address": state["address"], "dashboard": state["dashboard"]}


def local_head(num_cpus: int | None = None, num_gpus: int | None = None, home: Path | None = None) -> dict[str, str]:
    """Address and dashboard URL of the local head node of ``home`` (default: HEADSWEEP_HOME), started if
    it is not running.

    Never another home's head: ray.json written for another home is ignored, and a port this home
    needs that something else holds is an error.
    """
    home = Path(home).resolve() if home else settings.home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two submits at once start one head
        state = _recorded(home)
        if state.get("home") == str(home) and _head_alive(state):
            if state.get("python") != sys.executable:
                raise ClusterError(
                    f"the Ray head of HEADSWEEP_HOME={home} runs {state.get('python')}, not {sys.executable}: "
                    f"stop it (`{sys.executable} -m orchestrator.cluster.head stop`) or use another HEADSWEEP_HOME"
                )
            return _info(state)
        return _start_head(home, num_cpus, num_gpus)


def _start_head(home: Path, num_cpus: int | None, num_gpus: int | None) -> dict[str, str]:
    tmp = temp_dir(home)
    kill_tree(tmp)  # what is left of a dead head of this home
    ports = head_ports(home)
    for name in ("gcs", "dashboard"):
        if not _port_free(ports[name]):
            raise ClusterError(
                f"port {ports[name]} ({name}) is taken by another process, not this home's Ray head "
                f"(HEADSWEEP_HOME={home}): unset or change HEADSWEEP_RAY_PORT/HEADSWEEP_DASHBOARD_PORT, or set "
                "RAY_ADDRESS and HEADSWEEP_RAY_DASHBOARD to use that cluster on purpose"
            )
    command = [
        sys.executable, "-c", _RAY_START, "start", "--head", "--node-ip-address=127.0.0.1",
        f"--port={ports['gcs']}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
        f"--dashboard-agent-listen-port={ports['agent_http']}", f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}", f"--metrics-export-port={ports['metrics_export']}",
        f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}",
        f"--temp-dir={tmp}", "--disable-usage-stats", "--include-dashboard=true",
        f"--num-cpus={num_cpus or os.cpu_count() or 1}",
    ]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    env = os.environ | HEAD_ENV | {
        "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"]),
        "DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"]),
    }
    for name in ("RAY_ADDRESS", "PYTHONPATH"):  # the head joins no cluster and imports no checkout by path
        env.pop(name, None)
    Path(tmp).mkdir(parents=True, exist_ok=True)
    # cwd: the temp dir, so that no job or worker finds a checkout's packages in its working directory
    started = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp, timeout=180)
    if started.returncode != 0:
        kill_tree(tmp)
        raise ClusterError(f"could not start a local Ray head: {(started.stderr or started.stdout).strip()[-500:]}")
    state = {
        "home": str(home), "address": f"127.0.0.1:{ports['gcs']}", "dashboard": f"http://127.0.0.1:{ports['dashboard']}",
        "temp_dir": tmp, "python": sys.executable, "ports": ports,
    }
    _state_file(home).write_text(json.dumps(state, indent=1))
    return _info(state)


def cluster_in_use() -> dict[str, str]:
    """The cluster to use: RAY_ADDRESS + HEADSWEEP_RAY_DASHBOARD if set, else the local head."""
    if os.environ.get("HEADSWEEP_RAY_DASHBOARD"):
        return {"address": os.environ.get("RAY_ADDRESS", "auto"), "dashboard": os.environ["HEADSWEEP_RAY_DASHBOARD"]}
    return local_head()


def known_dashboard() -> str:
    """The dashboard URL of the cluster in use, without checking that it is alive (cheap); "" when this
    home has no local head on record (never a guess such as :8265, where another cluster may answer)."""
    if os.environ.get("HEADSWEEP_RAY_DASHBOARD"):
        return os.environ["HEADSWEEP_RAY_DASHBOARD"]
    state = _recorded()
    return state.get("dashboard", "") if state.get("home") == str(settings.home()) else ""


def stop_local_head(home: Path | None = None) -> bool:
    """Stop the local head of ``home`` (default: HEADSWEEP_HOME): its processes only, by PID, never another
    Ray on the machine. True if something was running."""
    home = Path(home).resolve() if home else settings.home()
    stopped = stop_ray(temp_dir(home))
    _state_file(home).unlink(missing_ok=True)
    return stopped


def head_pids(home: Path | None = None) -> set[int]:
    """The processes of the local head of ``home`` (default: HEADSWEEP_HOME); empty when none runs."""
    return ray_pids(temp_dir(Path(home).resolve() if home else None))


def head_status(home: Path | None = None) -> dict | None:
    """The local head of ``home`` (default: HEADSWEEP_HOME) as recorded (address, dashboard, ...) with
    ``alive``, its ``pids`` and their resident memory ``rss_mb``; None when this home has none on record."""
    home = Path(home).resolve() if home else settings.home()
    state = _recorded(home)
    if not state or state.get("home") != str(home):
        return None
    pids = head_pids(home) if _head_alive(state) else set()
    return state | {"alive": bool(pids), "pids": sorted(pids), "rss_mb": sum(map(_rss_mb, pids))}


def _rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (0 once it is gone)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _head_alive(state: dict) -> bool:
    """This home's head runs: its GCS, raylet and dashboard processes are up and listen on the recorded ports."""
    tmp = state.get("temp_dir")
    if not tmp:
        return False
    pids = ray_pids(tmp)
    table = processes()
    if not any("gcs_server" in table.get(p, (0, ""))[1] for p in pids) or not any("raylet" in table.get(p, (0, ""))[1] for p in pids):
        return False
    ports = {port for _, port, _ in listening_sockets(pids)}
    wanted = {int(state["address"].rsplit(":", 1)[1]), int(state["dashboard"].rsplit(":", 1)[1])}
    return wanted <= ports


def with_node_address(args: list[str]) -> list[str]:
    """``ray start``'s ``args`` with ``--node-ip-address`` added where they lack it on a cluster (not
    in the loopback mode, not joining a head on loopback): :func:`addresses.node_ip`, toward the head
    for a worker (``--address``); left to Ray's guess when even that cannot tell."""
    loopback = LOOPBACK_ENV["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    head = next((arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
                 for i, arg in enumerate(args) if arg.split("=", 1)[0] == "--address"), None)
    given = any(arg.split("=", 1)[0] == "--node-ip-address" for arg in args)
    if given or (head and is_loopback(head.rpartition(":")[0])) or os.environ.get(
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == loopback:
        return args
    try:
        return [*args, f"--node-ip-address={addresses.node_ip(peer=head)}"]
    except ConfigError:
        return args


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.cluster.head start|stop|status``: this home's local Ray head.

    ``ray-start ARGS``: Ray's ``ray start ARGS`` without the Ray client server (cluster.yaml's nodes).
    """
    argv = argv if argv is not None else sys.argv[1:] or ["status"]
    command = argv[0]
    if command == "ray-start":
        for name, value in WORKER_ENV.items():  # unless the user set it
            os.environ.setdefault(name, value)
        os.execv(sys.executable, [sys.executable, "-c", _RAY_START, "start", *with_node_address(argv[1:])])
    if command == "start":
        print(json.dumps(local_head()))
    elif command == "stop":
        print("stopped" if stop_local_head() else "no local head was running", f"(HEADSWEEP_HOME={settings.home()})")
    elif command == "status":
        state = head_status()
        print(json.dumps(state, indent=1) if state else "no local head for this HEADSWEEP_HOME")
    else:
        print(f"usage: {sys.executable} -m orchestrator.cluster.head start|stop|status|ray-start ARGS", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
