"""Finding (or starting) the Ray cluster, and running a sweep's driver on it as a Ray Job.

A sweep outlives the ``headsweep submit`` that started it: the driver runs as
a Ray Job on the cluster's head. ``RAY_ADDRESS`` + ``HEADSWEEP_RAY_DASHBOARD``
point at an existing cluster; otherwise ``submit`` starts a local head once
and reuses it.

The local head belongs to its ``HEADSWEEP_HOME``:

- it listens on 127.0.0.1 only, every port (GCS, raylet, object manager,
  dashboard and its agent, runtime-env agent, metrics, every worker), and
  starts no Ray client server;
- its ports are a block derived from the home's path (between Ray's worker
  ports and Linux's ephemeral ports; the next free block if that one is
  taken), its Ray temp dir is ``$TMPDIR/headsweep-ray-<hash of the home>``,
  and ``$HEADSWEEP_HOME/ray.json`` records the home, the ports and the
  interpreter that started it. A checkout with another home never attaches
  to it, and stopping it (``python -m orchestrator.cluster stop``) ends only
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

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.common.sections import ConfigError
from orchestrator import settings

# A local development head: no usage stats, and no token auth (Ray 2.60 turns it on when a
# ~/.ray/auth_token exists, and then our own clients without the token are refused). It is
# reachable from this machine only (loopback, below).
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
# Ray's single-machine mode: node IP 127.0.0.1, every server bound to loopback.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
HEAD_ENV = LOCAL_ENV | LOOPBACK_ENV

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
        state_file = _state_file(home)
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        if state.get("home") == str(home) and _head_alive(state):
            if state.get("python") != sys.executable:
                raise ClusterError(
                    f"the Ray head of HEADSWEEP_HOME={home} runs {state.get('python')}, not {sys.executable}: "
                    f"stop it (`{sys.executable} -m orchestrator.cluster stop`) or use another HEADSWEEP_HOME"
                )
            return _info(state)
        return _start_head(home, num_cpus, num_gpus)


def _start_head(home: Path, num_cpus: int | None, num_gpus: int | None) -> dict[str, str]:
    tmp = temp_dir(home)
    _kill_tree(tmp)  # what is left of a dead head of this home
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
        _kill_tree(tmp)
        raise ClusterError(f"could not start a local Ray head: {(started.stderr or started.stdout).strip()[-500:]}")
    state = {
        "home": str(home), "address": f"127.0.0.1:{ports['gcs']}", "dashboard": f"http://127.0.0.1:{ports['dashboard']}",
        "temp_dir": tmp, "python": sys.executable, "ports": ports,
    }
    _state_file(home).write_text(json.dumps(state, indent=1))
    return _info(state)


def known_dashboard() -> str:
    """The dashboard URL of the cluster in use, without checking that it is alive (cheap); "" when this
    home has no local head on record (never a guess such as :8265, where another cluster may answer)."""
    if os.environ.get("HEADSWEEP_RAY_DASHBOARD"):
        return os.environ["HEADSWEEP_RAY_DASHBOARD"]
    state_file = _state_file()
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    return state.get("dashboard", "") if state.get("home") == str(settings.home()) else ""


def stop_local_head(home: Path | None = None) -> bool:
    """Stop the local head of ``home`` (default: HEADSWEEP_HOME): its processes only, by PID, never another
    Ray on the machine. True if something was running."""
    home = Path(home).resolve() if home else settings.home()
    stopped = stop_ray(temp_dir(home))
    _state_file(home).unlink(missing_ok=True)
    return stopped


def stop_ray(tmp: str) -> bool:
    """Stop the Ray processes of one node that use the temp dir ``tmp`` (and their children), by PID,
    never another Ray on the machine. True if something was running."""
    return bool(_kill_tree(tmp))


# --- processes and sockets, from /proc (Linux) ------------------------------------------------

def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every living process we can see. A zombie (killed, not yet
    reaped by its parent) is dead and left out."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if state != "Z":
            table[int(entry)] = (int(ppid), cmdline)
    return table


def process_tree(roots: set[int], table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """The roots and all their descendants."""
    table = table if table is not None else _processes()
    tree, grew = set(roots), True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in tree} - tree
        tree |= children
        grew = bool(children)
    return tree


def _head_pids(tmp: str) -> set[int]:
    """Every living process of the head that uses this temp dir: its daemons (named by the dir) and their children."""
    table = _processes()
    mine = {os.getpid(), os.getppid()}
    roots = {pid for pid, (_, cmdline) in table.items()
             if tmp in cmdline and "/ray/" in cmdline.replace(tmp, "") and pid not in mine}
    return process_tree(roots, table) - mine


def head_pids(home: Path | None = None) -> set[int]:
    """The processes of the local head of ``home`` (default: HEADSWEEP_HOME); empty when none runs."""
    return _head_pids(temp_dir(Path(home).resolve() if home else None))


def _kill_tree(tmp: str, grace_s: float = 5.0, kill_s: float = 15.0) -> set[int]:
    """SIGTERM every process of the head that uses ``tmp`` (none when ``grace_s`` is 0: a machine that
    died), then SIGKILL what still lives after ``grace_s``, again and again until none does (``kill_s``
    at most): a SIGKILLed process stays in /proc until the kernel has torn it down, and a raylet may
    fork a worker between the listing and the signal. The processes first listed stay targets after
    their parent died (an orphan is no longer in the tree). The PIDs signalled: empty if none ran."""
    known = _head_pids(tmp)
    if grace_s:
        _signal(known, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive_pid(p) for p in known):
        time.sleep(0.1)
    deadline = time.monotonic() + kill_s
    while (alive := {p for p in known if _alive_pid(p)} | _head_pids(tmp)) and time.monotonic() < deadline:
        _signal(alive, signal.SIGKILL)
        known |= alive
        time.sleep(0.05)
    return known


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive_pid(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def listening_sockets(pids: set[int] | None = None) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket (of these processes), read from /proc/net/tcp{,6}."""
    listening: dict[str, tuple[str, int]] = {}  # socket inode -> (address, port)
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            listening[fields[9]] = (_address(hex_addr[:width]), int(hex_port, 16))
    found = []
    for pid in sorted(pids if pids is not None else {int(p) for p in os.listdir("/proc") if p.isdigit()}):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                found.append((*listening[target[8:-1]], pid))
    return sorted(set(found))


def _address(hex_addr: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (little-endian 32-bit words) -> text."""
    raw = b"".join(bytes.fromhex(hex_addr[i:i + 8])[::-1] for i in range(0, len(hex_addr), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or 127.x as an IPv4-mapped IPv6 address (a dual-stack socket bound to loopback)."""
    return address.startswith(("127.", "::ffff:127.")) or address == "::1"


def _head_alive(state: dict) -> bool:
    """This home's head runs: its GCS, raylet and dashboard processes are up and listen on the recorded ports."""
    tmp = state.get("temp_dir")
    if not tmp:
        return False
    pids = _head_pids(tmp)
    table = _processes()
    if not any("gcs_server" in table.get(p, (0, ""))[1] for p in pids) or not any("raylet" in table.get(p, (0, ""))[1] for p in pids):
        return False
    ports = {port for _, port, _ in listening_sockets(pids)}
    wanted = {int(state["address"].rsplit(":", 1)[1]), int(state["dashboard"].rsplit(":", 1)[1])}
    return wanted <= ports


@contextlib.contextmanager
def _this_address():
    """Ray's HTTP clients (Jobs, State API) take RAY_API_SERVER_ADDRESS or RAY_ADDRESS over the address
    they are given: a user's RAY_ADDRESS would send our calls to another cluster. Not here."""
    saved = {name: os.environ.pop(name) for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS") if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def job_client(dashboard: str):
    """A Ray Jobs client for exactly this dashboard URL (never one Ray finds by itself)."""
    from ray.job_submission import JobSubmissionClient

    if not dashboard:
        raise ClusterError("no Ray dashboard known: no local head for this HEADSWEEP_HOME, and HEADSWEEP_RAY_DASHBOARD is unset")

    with _this_address():
        return JobSubmissionClient(dashboard)


def cluster_nodes(dashboard: str) -> list[dict[str, float]]:
    """Per-node totals of the live nodes, e.g. [{"CPU": 2.0, "GPU": 0.0}], for resource checks (over HTTP)."""
    from ray.util.state import list_nodes

    if not dashboard:
        raise ClusterError("no Ray dashboard known: no local head for this HEADSWEEP_HOME, and HEADSWEEP_RAY_DASHBOARD is unset")
    with _this_address():
        nodes = list_nodes(address=dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    return [
        {"CPU": float(node.resources_total.get("CPU", 0.0)), "GPU": float(node.resources_total.get("GPU", 0.0))}
        for node in nodes
    ]


# --- the driver as a Ray Job ------------------------------------------------------------------

PACKAGES = ("experiments", "orchestrator", "analysis")


def shipped_code() -> list[str]:
    """The folders of this process's own experiments/, orchestrator/ and analysis/: what a job ships."""
    import importlib.util

    return [importlib.util.find_spec(name).submodule_search_locations[0] for name in PACKAGES]


def plugin_code(value: str) -> tuple[list[str], list[str]]:
    """Where the method modules ``HEADSWEEP_METHODS`` names (``value``) live: the folders of those
    in a package, and the files of single-file modules (each one's top-level module). Modules inside
    headsweep's packages ship already; one that cannot be found here was refused at validation."""
    import importlib.util

    packages, files = [], []
    for path in (p.strip() for p in value.split(",")):
        top = path.split(".", 1)[0]
        spec = importlib.util.find_spec(top) if top and top not in PACKAGES else None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            packages.append(spec.submodule_search_locations[0])
        elif spec.origin:
            files.append(spec.origin)
    return sorted(set(packages)), sorted(set(files))


def _plugin_files_dir(files: list[str]) -> str:
    """A folder of this home holding copies of the single-file plug-ins (Ray ships folders, not files),
    named by their content, so a job ships them as its working dir (on the trials' path)."""
    import shutil

    digest = hashlib.sha256(b"".join(Path(f).name.encode() + Path(f).read_bytes() for f in files)).hexdigest()[:16]
    folder = settings.home() / "plugins" / digest
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for file in files:
            shutil.copy2(file, folder / Path(file).name)
    return str(folder)


def job_runtime_env(env: dict[str, str]) -> dict:
    """The driver job's runtime env: the submitting checkout's code and the given variables.

    The packages go as ``py_modules``: Ray puts them first on the path of the driver job and of
    every task and actor of the job (the Tune trials), ahead of whatever checkout the cluster's
    Python has installed, so a sweep runs the code that submitted it.
    """
    from experiments.keyed.runner import code_version

    packages, files = plugin_code(env.get("HEADSWEEP_METHODS", ""))  # plug-in methods ship with the job too
    return {
        "py_modules": shipped_code() + packages,
        **({"working_dir": _plugin_files_dir(files)} if files else {}),
        "excludes": ["__pycache__", "*.pyc"],
        "env_vars": env | {"HEADSWEEP_CODE_COMMIT": code_version().split(" ", 1)[0]},
    }


@contextlib.contextmanager
def ray_logs_to(path: Path):
    """Ray's INFO lines (``Uploading package gcs://...``) go to ``path`` instead of the terminal, where
    the user asked for a sweep id and a progress bar; Ray's warnings and errors still reach stderr."""
    import logging

    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("ray")
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = (logger.level, [(h, h.level) for h in logger.handlers])
    for handler, _ in saved[1]:
        handler.setLevel(max(handler.level, logging.WARNING))
    logger.setLevel(logging.INFO)
    logger.addHandler(to_file)
    try:
        yield
    finally:
        logger.removeHandler(to_file)
        to_file.close()
        logger.setLevel(saved[0])
        for handler, level in saved[1]:
            handler.setLevel(level)


def submit_driver(dashboard: str, sweep_id: str, env: dict[str, str]) -> str:
    """Start ``python -m orchestrator.driver SWEEP`` as a Ray Job; return the job's submission id.
    Ray's own INFO lines go to ``$HEADSWEEP_HOME/logs/<sweep>.log``."""
    client = job_client(dashboard)  # imports Ray, which sets up its loggers: redirect them after
    with ray_logs_to(settings.home() / "logs" / f"{sweep_id}.log"):
        return _submit_driver(client, sweep_id, env)


def _submit_driver(client, sweep_id: str, env: dict[str, str]) -> str:
    submission_id = f"{sweep_id}-driver-{int(time.time())}"
    for attempt in range(10):  # a just-started node's job agent may not be up yet
        try:
            client.submit_job(
                # the sweep, then its figures logged to the sweep's MLflow parent run; the job's status is the
                # driver's. A killed or crashed driver ends the job at once (its figures wait for the driver that
                # finishes the sweep): the supervisor resumes it within seconds.
                entrypoint=(
                    f"{sys.executable} -m orchestrator.driver {sweep_id}; rc=$?; [ $rc -ne 0 ] || "
                    f"[ \"$HEADSWEEP_TRACK\" = 0 ] || {sys.executable} -m orchestrator.cli report {sweep_id} || true; exit $rc"
                ),
                submission_id=submission_id,
                runtime_env=job_runtime_env(env),
            )
            return submission_id
        except RuntimeError as err:
            if "No available agent" not in str(err) or attempt == 9:
                raise
            time.sleep(1)
    return submission_id


def driver_status(dashboard: str, submission_id: str) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED (or UNKNOWN when the job is gone)."""
    return driver_job(dashboard, submission_id)[0]


def driver_job(dashboard: str, submission_id: str) -> tuple[str, float | None]:
    """The job's status (as ``driver_status``) and when it ended (Unix seconds; None while it runs)."""
    info = _job_info(dashboard, submission_id)
    if info is None:
        return "UNKNOWN", None
    return str(info.status.value), (info.end_time / 1000 if info.end_time else None)


def driver_since(dashboard: str, submission_id: str) -> tuple[str, float, str] | None:
    """The job's status, seconds since it was submitted, and Ray's message about it (for a PENDING
    job: what it may be waiting for); None when the job is unknown."""
    info = _job_info(dashboard, submission_id)
    if info is None:
        return None
    return str(info.status.value), max(0.0, time.time() - (info.start_time or 0) / 1000), info.message or ""


def _job_info(dashboard: str, submission_id: str):
    try:
        return job_client(dashboard).get_job_info(submission_id)
    except Exception:
        return None


def stop_driver(dashboard: str, submission_id: str) -> None:
    try:
        job_client(dashboard).stop_job(submission_id)
    except Exception:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.cluster start|stop|status``: this home's local Ray head.

    ``ray-start ARGS``: Ray's ``ray start ARGS`` without the Ray client server (cluster.yaml's nodes).
    """
    argv = argv if argv is not None else sys.argv[1:] or ["status"]
    command = argv[0]
    if command == "ray-start":
        os.execv(sys.executable, [sys.executable, "-c", _RAY_START, "start", *argv[1:]])
    if command == "start":
        print(json.dumps(local_head()))
    elif command == "stop":
        print("stopped" if stop_local_head() else "no local head was running", f"(HEADSWEEP_HOME={settings.home()})")
    elif command == "status":
        state_file = _state_file()
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        alive = state.get("home") == str(settings.home()) and _head_alive(state)
        print(json.dumps(state | {"alive": alive}, indent=1) if state else "no local head for this HEADSWEEP_HOME")
    else:
        print(f"usage: {sys.executable} -m orchestrator.cluster start|stop|status|ray-start ARGS", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
