"""Log every figure and the summary metrics of a finished sweep to its MLflow parent run, so the
MLflow UI shows the sweep's answer (its figures, and charts of the parent's metrics).

    python -m orchestrator.report SWEEP_ID

The sweep driver runs this after the sweep finishes. analysis draws the
figures and computes the summary from the registry (``analysis.figure_plan.render_all``,
``analysis.summary.summary_metrics``: they read, never write); this module, the orchestrator's
side of MLflow, logs them to the run ``get_sweep(id)["mlflow_parent_run_id"]`` (figures under
``figures/``) with an explicit ``MlflowClient`` (DESIGN.md decision 3). The layer rule: orchestrator
reaches analysis only through its public entry points (this and the CLI).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARTIFACT_DIR = "figures"


def log_sweep_figures(sweep_id: str, registry_url: str | None = None,
                      tracking_uri: str | None = None) -> list[str]:
    """Render the sweep's figures (``figure_plan.render_all``) and log the PNGs to its parent run.

    Returns the artifact paths logged; [] when the sweep has no MLflow parent
    run (submitted with ``--no-track``) or no finished runs. Raises
    ``orchestrator.registry.NotFound`` for an unknown sweep.
    """
    import mlflow

    from analysis import figure_plan
    from analysis.loading import load_sweep
    from analysis.summary import summary_metrics
    from orchestrator import settings
    from orchestrator.registry import Registry

    with Registry(registry_url or settings.registry_url()) as registry:
        run_id = registry.get_sweep(sweep_id)["mlflow_parent_run_id"]
        if run_id is None:
            return []
        data = load_sweep(registry, sweep_id)
    client = mlflow.MlflowClient(tracking_uri or settings.tracking_uri())
    log_summary(client, run_id, summary_metrics(data))
    logged = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, png in figure_plan.render_all(data):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_id")
    parser.add_argument("--db", help="registry URL (default: $HEADSWEEP_DB or the HEADSWEEP_HOME file)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: headsweep's)")
    args = parser.parse_args(argv)
    from orchestrator.registry import NotFound

    try:
        logged = log_sweep_figures(args.sweep_id, args.db, args.tracking_uri)
    except NotFound as err:
        print(f"orchestrator.report: error: {err}", file=sys.stderr)
        return 2
    if not logged:
        print(f"{args.sweep_id}: no MLflow parent run or no finished runs; nothing logged")
    for path in logged:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
