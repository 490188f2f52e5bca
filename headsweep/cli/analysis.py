"""``headsweep runs | results | agreement | compare-maps | spearman | transfer | iou | figures | serve``: analysis's
commands, which analysis registers itself."""

from __future__ import annotations

from analysis.views.cli.commands import register as register_analysis
from headsweep.api import MlflowArtifacts


def register(sub) -> None:
    """Analysis's commands on the ``headsweep`` parser; the run table's artifact URIs come from the
    MLflow store (``HEADSWEEP_TRACKING_URI``), read by ``headsweep.api.MlflowArtifacts``."""
    register_analysis(sub, MlflowArtifacts())
