"""``headsweep results | agreement | compare-maps | transfer | iou | figures | serve``: analysis's
commands, which analysis registers itself."""

from __future__ import annotations

from analysis.views.cli.commands import register as register_analysis


def register(sub) -> None:
    """Analysis's commands on the ``headsweep`` parser."""
    register_analysis(sub)
