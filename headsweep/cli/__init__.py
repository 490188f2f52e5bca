"""``headsweep``: the command line. Bad input exits 2 with one line naming the problem.

One module per command group, each with its ``register(subparsers)``: ``run`` (run, methods),
``sweeps`` (submit, status, head, ls, resume, cancel), ``questions`` (runs, results, agreement,
compare-maps, spearman, transfer, iou, figures, serve: built from the questions' declarations in
``analysis.views.vocabulary``), ``slurm`` and ``tracking`` (report, ui). What they share is in
``common`` (the consoles, the progress bar, the sweep a command names) and ``output`` (how
answers are written); the questions' tables in ``tables``, ``compare`` and ``transfer``.
"""

from __future__ import annotations

import argparse
import os
import sys

from base.sections import ConfigError
from headsweep.api import MlflowArtifacts
from headsweep.cli import questions, run, slurm, sweeps, tracking
from orchestrator import settings


def _resolve_sweep(args: argparse.Namespace) -> None:
    """``last`` as the sweep argument -> the newest sweep of the registry the command reads
    (``--db`` where the command takes it)."""
    if getattr(args, "sweep", None) is None:  # a command without one: no registry to open
        return
    from orchestrator.registry import LAST, NotFound, Registry

    if args.sweep != LAST:
        return
    try:
        args.sweep = Registry(getattr(args, "db", None) or settings.registry_url()).resolve_sweep(args.sweep)
    except NotFound as err:
        raise ConfigError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headsweep", description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run.register(sub)  # the order of `headsweep --help`
    sweeps.register(sub)
    # the run table's artifact URIs come from the MLflow store (HEADSWEEP_TRACKING_URI)
    questions.register(sub, MlflowArtifacts())
    slurm.register(sub)
    tracking.register(sub)
    return parser


def quiet_libraries() -> None:
    """Our progress bars and tables are the output; silence the libraries' chatter."""
    import logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow sets its loggers' level from it on import
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local clusters; set it to "token" for a secured one
    for name in ("mlflow", "alembic", "ray", "ray.tune", "ray.serve", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        _resolve_sweep(args)
        return args.func(args)
    except ConfigError as err:
        print(f"headsweep: error: {err}", file=sys.stderr)  # one line, never wrapped
        return 2


if __name__ == "__main__":
    sys.exit(main())
