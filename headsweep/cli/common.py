"""What the command groups of the CLI share: the one console for answers (``out``) and the one for
progress and notes (``console``, stderr), the progress bar, the sweep a command names (``--db``,
``last``, an unknown id named as the nearest) and bad input as a one-line ``ConfigError``."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from base.sections import ConfigError
from orchestrator import settings

SWEEP_HELP = "a sweep id, or 'last' (the newest sweep)"
DB_HELP = "registry URL (default: $HEADSWEEP_DB or the HEADSWEEP_HOME SQLite file)"
TRACKING_HELP = "MLflow tracking URI (default: the HEADSWEEP_HOME SQLite store)"
WHERE_HELP = ("only these runs, e.g. 'metrics.accuracy > 0.8 and params.train.lr = 3e-4 and seed != 1' "
              "or task:sst2,seed:0|1")

console = Console(stderr=True)
# A terminal wraps tables at its width; a pipe or a file gets them whole, a line a line (rich's default
# there is 80 columns, which folds a run x run matrix into unreadable pieces).
out = Console(width=None if sys.stdout.isatty() else 100_000)


def progress_bar(fields: str) -> Progress:
    """A task's name, its bar, done of total, ``fields`` (a ``TextColumn`` template of the task's
    fields), time elapsed and left; on stderr."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn(fields), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )


def registry(args: argparse.Namespace):
    """The registry's reader the command reads (``--db``, else the CLI's)."""
    from orchestrator.registry.reader import RegistryReader

    return RegistryReader(getattr(args, "db", None) or settings.registry_url())


def known_sweep(registry, sweep_id: str) -> None:
    """ConfigError naming the nearest sweep when ``registry`` (a reader) has no sweep ``sweep_id``."""
    from analysis.data.loading import unknown_sweep

    if sweep_id not in {s["id"] for s in registry.list_sweeps()}:
        raise ConfigError(str(unknown_sweep(registry, sweep_id)))


def bad_input_is_config_error(handler: Callable[..., int]) -> Callable[..., int]:
    """The handler with an analysis ``QueryError`` (bad input) raised as ``ConfigError``: the main CLI
    prints it as one line, exit status 2."""

    @functools.wraps(handler)
    def wrapper(*given: Any) -> int:
        from analysis.data.errors import QueryError

        try:
            return handler(*given)
        except QueryError as err:
            raise ConfigError(str(err)) from None

    return wrapper
