"""A sweep's report: its summary metrics and every figure, read from the registry (never written).

The driver logs it to the sweep's MLflow parent run when the sweep finishes: the orchestrator's
``headsweep report`` (headsweep/cli/tracking.py, above both) hands :func:`sweep_report` to ``orchestrator.report.log_sweep_report``, which does the MLflow
writing. Analysis itself never writes and never imports MLflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.registry.reader import RegistryReader


def sweep_report(registry: RegistryReader, sweep_id: str) -> tuple[dict[str, float], list[tuple[str, bytes]]]:
    """(``summary.summary_metrics``, ``figure_plan.render_all``: ``[(file name, PNG bytes)]``) of the
    sweep. Raises ``orchestrator.registry.reader.NotFound`` for an unknown sweep."""
    # imported here: the CLI builds its parser with this function on every command, and the
    # figures (matplotlib, scipy) take seconds to import
    from analysis.data.loading import load_sweep
    from analysis.views.figure_plan import render_all
    from analysis.views.summary import summary_metrics

    data = load_sweep(registry, sweep_id)
    return summary_metrics(data), render_all(data)
