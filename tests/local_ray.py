"""The tests' one way to start a private local Ray: 2 CPUs, no dashboard, the workers' logs not
forwarded, and a start-up wait long enough for a loaded machine.

``ray.init`` waits for its raylet to register with the GCS, 30 s unless ``RAY_raylet_start_wait_time_s``
says otherwise (the driver's GCS client reads it at each start); on two cores busy with other tests that
can run out while nothing is wrong. The tests give it STARTUP_WAIT_S (a value already set wins); past
that, the start fails saying what was slow: Ray's daemons that were up and their states, the last lines
of the raylet's and the GCS's logs, the machine's load."""

from __future__ import annotations

import os
from pathlib import Path

import ray

from orchestrator.cluster.processes import kill_pids, process_tree, processes

STARTUP_WAIT = "RAY_raylet_start_wait_time_s"
STARTUP_WAIT_S = 180
DEFAULTS = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False}


def _half_started() -> set[int]:
    """The Ray daemons this process started (and their children) that a failed start-up left."""
    table = processes()
    daemons = {pid for pid, (ppid, cmdline) in table.items() if ppid == os.getpid() and "/ray/" in cmdline}
    return process_tree(daemons, table)


def _what_was_slow() -> str:
    """Ray's daemons this process started, each with its state (R running, S sleeping, D waiting on the
    disk, T stopped), the last lines of the raylet's and the GCS's logs, and the machine's load."""
    table, up, session = processes(), [], None
    for pid in sorted(_half_started()):
        argv = table.get(pid, (0, ""))[1].split()
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if not argv:
            continue
        name = Path(argv[0]).name  # a Python daemon by its script
        name = next((Path(a).name for a in argv[1:] if a.endswith(".py")), name) if name.startswith("python") else name
        up.append(f"{name} {pid} {state}")
        session = session or next((a.split("=", 1)[1] for a in argv if a.startswith("--session-dir=")), None)
    logs = [Path(session or "/nonexistent", "logs", name) for name in ("raylet.out", "gcs_server.out")]
    tails = [f"{log.name}: " + " | ".join(log.read_text(errors="replace").splitlines()[-3:])
             for log in logs if log.exists()]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "; ".join([f"load {load}", f"up: {', '.join(up) or 'none'}", *tails])


def start_local_ray(**options):
    """``ray.init`` with the tests' defaults (``options`` override them), Ray's start-up wait
    STARTUP_WAIT_S; past it, what Ray started is stopped and the error says what was slow."""
    before = os.environ.get(STARTUP_WAIT)
    os.environ[STARTUP_WAIT] = before or str(STARTUP_WAIT_S)  # its daemons, started meanwhile, keep it
    try:
        return ray.init(**(DEFAULTS | options))
    except Exception as error:  # Ray raises a bare Exception for this
        if "timed out during startup" not in str(error):
            raise
        slow = _what_was_slow()
        ray.shutdown()
        kill_pids(_half_started)
        raise RuntimeError(f"Ray's raylet did not register with its GCS in {os.environ[STARTUP_WAIT]} s "
                           f"({STARTUP_WAIT}): {slow}") from error
    finally:
        if before is None:
            os.environ.pop(STARTUP_WAIT, None)
