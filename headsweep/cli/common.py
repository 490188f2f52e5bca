"""What the command groups of the CLI print through: the consoles and the progress bar."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # tables stay readable in logs and pipes


def progress_bar(fields: str) -> Progress:
    """A task's name, its bar, done of total, ``fields`` (a ``TextColumn`` template of the task's
    fields), time elapsed and left; on stderr."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn(fields), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )
