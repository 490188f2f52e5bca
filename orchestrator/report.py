"""Log every figure of a finished sweep to its MLflow parent run, so the MLflow UI shows them.

    python -m orchestrator.report SWEEP_ID

The sweep driver runs this after the sweep finishes. analysis draws the
figures from the registry (``analysis.figure_plan.render_all``: it reads,
never writes); this module, the orchestrator's side of MLflow, logs them under
``figures/`` of the run ``get_sweep(id)["mlflow_parent_run_id"]``, with an
explicit ``MlflowClient`` (DESIGN.md decision 3). The layer rule: orchestrator
reaches analysis only through its public entry points (this and the CLI).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

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
    from orchestrator import settings
    from orchestrator.registry import Registry

    with Registry(registry_url or settings.registry_url()) as registry:
        run_id = registry.get_sweep(sweep_id)["mlflow_parent_run_id"]
        if run_id is None:
            return []
        data = load_sweep(registry, sweep_id)
    client = mlflow.MlflowClient(tracking_uri or settings.tracking_uri())
    logged = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, png in figure_plan.render_all(data):
            path = Path(tmp) / name
            path.write_bytes(png)
            client.log_artifact(run_id, str(path), ARTIFACT_DIR)
            logged.append(f"{ARTIFACT_DIR}/{name}")
    return logged


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
