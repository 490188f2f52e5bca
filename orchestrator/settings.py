"""Where things live: one data directory (HEADSWEEP_HOME) with embedded defaults.

- registry: ``HEADSWEEP_DB`` (any SQLAlchemy URL) or ``sqlite:///$HOME/registry.db``
- checkpoints of upstream runs (stages): ``HEADSWEEP_CHECKPOINTS`` (any fsspec URI) or
  ``$HOME/checkpoints``
- MLflow: ``HEADSWEEP_TRACKING_URI`` / ``MLFLOW_TRACKING_URI`` or ``sqlite:///$HOME/mlflow.db``,
  artifacts under ``$HOME/mlartifacts`` (with a tracking server, ``http(s)://...``: the server's
  proxied artifact store), or ``HEADSWEEP_ARTIFACT_ROOT``
- the supervisor (``orchestrator/driving/supervisor.py``): ``HEADSWEEP_AUTO_RESUMES`` automatic resumes
  per sweep (default 3; 0 turns them off, as ``submit --no-auto-resume`` does for one sweep),
  looking every ``HEADSWEEP_SUPERVISOR_POLL_S`` seconds (default 5)
- retries through a lost database (``orchestrator/retry.py``): registry and MLflow calls keep
  trying for ``HEADSWEEP_RETRY_S`` seconds (default 60), then fail with the database's error
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    path = Path(os.environ.get("HEADSWEEP_HOME", ".headsweep")).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def tracking_uri() -> str:
    uri = os.environ.get("HEADSWEEP_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{home() / 'mlflow.db'}"


def artifact_root() -> str | None:
    """Where new MLflow experiments put artifacts: ``HEADSWEEP_ARTIFACT_ROOT``; else, with an MLflow
    tracking server (an http(s) tracking URI), None: the server's own store (``mlflow server
    --artifacts-destination``: uploads go through the server, so worker hosts need no shared
    filesystem for artifacts); else a folder under the home."""
    if os.environ.get("HEADSWEEP_ARTIFACT_ROOT"):
        return os.environ["HEADSWEEP_ARTIFACT_ROOT"]
    if tracking_uri().startswith(("http://", "https://")):
        return None
    return (home() / "mlartifacts").as_uri()


def checkpoint_root() -> str:
    """Where upstream runs keep their final weights (any fsspec URI; a local folder by default)."""
    return os.environ.get("HEADSWEEP_CHECKPOINTS") or (home() / "checkpoints").as_uri()


def registry_url() -> str:
    return os.environ.get("HEADSWEEP_DB") or f"sqlite:///{home() / 'registry.db'}"


def auto_resumes() -> int:
    """How many times the supervisor resumes a newly submitted sweep whose driver died."""
    return max(0, int(os.environ.get("HEADSWEEP_AUTO_RESUMES", "3")))


def supervisor_poll_s() -> float:
    """Seconds between two looks of the supervisor at the registry and the drivers' Ray jobs."""
    return float(os.environ.get("HEADSWEEP_SUPERVISOR_POLL_S", "5"))


def retry_budget_s() -> float:
    """Seconds a registry or MLflow call keeps retrying through a lost database connection."""
    return float(os.environ.get("HEADSWEEP_RETRY_S", "60"))
