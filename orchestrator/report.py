"""Log a finished sweep's report (its summary metrics and every figure) to its MLflow parent run,
so the MLflow UI shows the sweep's answer (its figures, and charts of the parent's metrics).

    headsweep report SWEEP_ID

The sweep's Ray Job runs this after its driver finished the sweep (``headsweep.sweep_job``). The
report is analysis's to draw (``analysis.views.report.sweep_report``: it reads, never writes); this
module, the orchestrator's side of MLflow, logs what it is handed (:data:`Render`) to the run
``get_sweep(id)["mlflow_parent_run_id"]`` (figures under ``figures/``) with an explicit
``MlflowClient`` (DESIGN.md decision 3). It imports nothing from analysis: the CLI above both
(``headsweep.cli.tracking``) passes the renderer in.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.registry import Registry

ARTIFACT_DIR = "figures"
Render = Callable[[Registry, str], tuple[dict[str, float], list[tuple[str, bytes]]]]
"""``render(registry, sweep_id) -> ({summary metric: value}, [(file name, PNG bytes)])``."""


def log_sweep_report(sweep_id: str, render: Render, registry_url: str | None = None,
                     tracking_uri: str | None = None) -> list[str]:
    """Render the sweep's report and log it to its parent run: the metrics, the PNGs as artifacts.

    Returns the artifact paths logged; [] when the sweep has no MLflow parent run (submitted
    with ``--no-track``) or no finished runs. Raises ``orchestrator.registry.NotFound`` for an
    unknown sweep.
    """
    import mlflow

    from orchestrator import settings

    with Registry(registry_url or settings.registry_url()) as registry:
        run_id = registry.get_sweep(sweep_id)["mlflow_parent_run_id"]
        if run_id is None:
            return []
        metrics, figures = render(registry, sweep_id)
    client = mlflow.MlflowClient(tracking_uri or settings.tracking_uri())
    log_summary(client, run_id, metrics)
    logged = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, png in figures:
            path = Path(tmp) / name
            path.write_bytes(png)
            client.log_artifact(run_id, str(path), ARTIFACT_DIR)
            logged.append(f"{ARTIFACT_DIR}/{name}")
    return logged


def log_summary(client: Any, run_id: str, metrics: dict[str, float]) -> None:
    """``metrics`` on the run, in MLflow's batches of at most 1,000."""
    from mlflow.entities import Metric

    at = int(time.time() * 1000)
    rows = [Metric(key, value, at, 0) for key, value in sorted(metrics.items())]
    for start in range(0, len(rows), 1000):
        client.log_batch(run_id, metrics=rows[start:start + 1000])
