"""Finding (or starting) the Ray cluster, and running a sweep's driver on it as a Ray Job.

A sweep outlives the ``headsweep submit`` that started it: the driver runs as
a Ray Job on the cluster's head. Locally, ``submit`` starts a head node
(``ray start --head``) once and reuses it; its address is kept in
``$HEADSWEEP_HOME/ray.json``. ``RAY_ADDRESS`` (or ``--address``) points at an
existing cluster instead. The GCS port defaults to 6390, not Ray's 6379,
which a local Redis often holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import settings

GCS_PORT = int(os.environ.get("HEADSWEEP_RAY_PORT", "6390"))
DASHBOARD_PORT = int(os.environ.get("HEADSWEEP_DASHBOARD_PORT", "8265"))


# A local development head: no usage stats, and no token auth (Ray 2.60 turns it on when a
# ~/.ray/auth_token exists, and then our own clients without the token are refused).
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _state_file() -> Path:
    return settings.home() / "ray.json"


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def local_head(num_cpus: int | None = None, num_gpus: int | None = None) -> dict[str, str]:
    """Address and dashboard URL of the local head node, started if it is not running."""
    state = _state_file()
    default = {"address": f"127.0.0.1:{GCS_PORT}", "dashboard": f"http://127.0.0.1:{DASHBOARD_PORT}"}
    info = json.loads(state.read_text()) if state.exists() else default
    if _alive(info["address"]):
        return info
    command = [
        _ray_bin(), "start", "--head", f"--port={GCS_PORT}", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={DASHBOARD_PORT}", "--disable-usage-stats", "--include-dashboard=true",
        f"--num-cpus={num_cpus or os.cpu_count() or 1}",
    ]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ | LOCAL_ENV)
    state.write_text(json.dumps(default))
    return default


def known_dashboard() -> str:
    """The dashboard URL of the cluster in use, without checking that it is alive (cheap)."""
    if os.environ.get("HEADSWEEP_RAY_DASHBOARD"):
        return os.environ["HEADSWEEP_RAY_DASHBOARD"]
    state = _state_file()
    if state.exists():
        return json.loads(state.read_text())["dashboard"]
    return f"http://127.0.0.1:{DASHBOARD_PORT}"


def stop_local_head() -> None:
    subprocess.run([_ray_bin(), "stop", "--force"], capture_output=True)
    _state_file().unlink(missing_ok=True)


def _alive(address: str) -> bool:
    result = subprocess.run([_ray_bin(), "status", f"--address={address}"], capture_output=True, timeout=60, env=os.environ | LOCAL_ENV)
    return result.returncode == 0


def cluster_nodes(address: str) -> list[dict[str, float]]:
    """Per-node totals of the live nodes, e.g. [{"CPU": 2.0, "GPU": 0.0}], for resource checks."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="WARNING", ignore_reinit_error=True)
    return [
        {"CPU": node["Resources"].get("CPU", 0.0), "GPU": node["Resources"].get("GPU", 0.0)}
        for node in ray.nodes()
        if node["Alive"]
    ]


def submit_driver(dashboard: str, sweep_id: str, env: dict[str, str]) -> str:
    """Start ``python -m orchestrator.driver SWEEP`` as a Ray Job; return the job's submission id."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    submission_id = f"{sweep_id}-driver-{int(time.time())}"
    for attempt in range(10):  # a just-started node's job agent may not be up yet
        try:
            client.submit_job(
                # the sweep, then its figures logged to the sweep's MLflow parent run; the job's status is the sweep's
                entrypoint=(
                    f"{sys.executable} -m orchestrator.driver {sweep_id}; rc=$?; "
                    f"[ \"$HEADSWEEP_TRACK\" = 0 ] || {sys.executable} -m analysis.report {sweep_id} || true; exit $rc"
                ),
                submission_id=submission_id,
                runtime_env={"env_vars": env},
            )
            return submission_id
        except RuntimeError as err:
            if "No available agent" not in str(err) or attempt == 9:
                raise
            time.sleep(1)
    return submission_id


def driver_status(dashboard: str, submission_id: str) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED (or UNKNOWN when the job is gone)."""
    from ray.job_submission import JobSubmissionClient

    try:
        return str(JobSubmissionClient(dashboard).get_job_status(submission_id).value)
    except Exception:
        return "UNKNOWN"


def stop_driver(dashboard: str, submission_id: str) -> None:
    from ray.job_submission import JobSubmissionClient

    try:
        JobSubmissionClient(dashboard).stop_job(submission_id)
    except Exception:
        pass
