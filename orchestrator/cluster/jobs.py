"""Ray Jobs on the cluster in use, over HTTP (the dashboard's Jobs and State APIs): a client for
exactly one dashboard, the live nodes' resources, a job's state, stopping a job, and where Ray's
INFO lines go while a job is submitted. The sweep's driver (``orchestrator.driving.driver_job``)
and the supervisor (``orchestrator.driving.supervisor``) are such jobs.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.cluster.head import ClusterError


@contextlib.contextmanager
def _this_address():
    """Ray's HTTP clients (Jobs, State API) take RAY_API_SERVER_ADDRESS or RAY_ADDRESS over the address
    they are given: a user's RAY_ADDRESS would send our calls to another cluster. Not here."""
    saved = {name: os.environ.pop(name) for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS") if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _known(dashboard: str) -> str:
    if not dashboard:
        raise ClusterError("no Ray dashboard known: no local head for this HEADSWEEP_HOME, and HEADSWEEP_RAY_DASHBOARD is unset")
    return dashboard


def job_client(dashboard: str):
    """A Ray Jobs client for exactly this dashboard URL (never one Ray finds by itself)."""
    from ray.job_submission import JobSubmissionClient

    _known(dashboard)
    with _this_address():
        return JobSubmissionClient(dashboard)


def cluster_nodes(dashboard: str) -> list[dict[str, float]]:
    """Per-node totals of the live nodes, e.g. [{"CPU": 2.0, "GPU": 0.0}], for resource checks (over HTTP)."""
    from ray.util.state import list_nodes

    _known(dashboard)
    with _this_address():
        nodes = list_nodes(address=dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    return [
        {"CPU": float(node.resources_total.get("CPU", 0.0)), "GPU": float(node.resources_total.get("GPU", 0.0))}
        for node in nodes
    ]


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


def job_state(dashboard: str, submission_id: str) -> tuple[str, datetime | None]:
    """The job's state (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED, or UNKNOWN when the job is gone)
    and when it ended (None while it runs)."""
    info = _job_info(dashboard, submission_id)
    if info is None:
        return "UNKNOWN", None
    ended = datetime.fromtimestamp(info.end_time / 1000, UTC).replace(tzinfo=None) if info.end_time else None
    return str(info.status.value), ended


def job_since(dashboard: str, submission_id: str) -> tuple[str, float, str] | None:
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


def stop_job(dashboard: str, submission_id: str) -> None:
    try:
        job_client(dashboard).stop_job(submission_id)
    except Exception:
        pass
