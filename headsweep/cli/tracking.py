"""``headsweep ui | report``: the MLflow side, the UI over the tracking store and a sweep's report
logged to its parent run."""

from __future__ import annotations

import argparse
import os
import sys

from analysis.views.report import sweep_report
from base.sections import ConfigError
from headsweep.cli.common import DB_HELP, SWEEP_HELP, TRACKING_HELP, console, out
from orchestrator import settings


def cmd_ui(args: argparse.Namespace) -> int:
    """The MLflow UI over headsweep's tracking store, on 127.0.0.1."""
    uri = args.tracking_uri or settings.tracking_uri()
    command = [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
        *(["--default-artifact-root", settings.artifact_root()] if settings.artifact_root() else []),
        "--host", args.host, "--port", str(args.port), "--workers", "1",
    ]
    console.print(f"MLflow UI for {uri} at http://{args.host}:{args.port}")
    # the UI needs none of MLflow's server-side jobs (GenAI optimisation): no Huey consumers (~8 processes)
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    os.execv(sys.executable, command)
    return 0  # not reached


def cmd_report(args: argparse.Namespace) -> int:
    """The sweep's figures and summary metrics, drawn by ``args.render`` (analysis's), logged to its
    MLflow parent run (the driver's job runs this when the sweep finishes)."""
    from orchestrator import report
    from orchestrator.registry import NotFound

    try:
        logged = report.log_sweep_report(args.sweep, args.render, args.db, args.tracking_uri)
    except NotFound as err:
        raise ConfigError(str(err)) from None
    if not logged:
        out.print(f"{args.sweep}: no MLflow parent run or no finished runs; nothing logged")
    for path in logged:
        out.print(path, highlight=False)
    return 0


def register(sub) -> None:
    """``headsweep report`` (the sweep's report drawn by analysis's renderer, handed to
    ``orchestrator.report``, which logs it to MLflow) and ``headsweep ui``."""
    p = sub.add_parser("report", help="log a sweep's figures and summary metrics to its MLflow parent run "
                                      "(its driver does when the sweep finishes)")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--tracking-uri", help=TRACKING_HELP)
    p.set_defaults(func=cmd_report, render=sweep_report)

    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1")
    p.add_argument("--tracking-uri", help=TRACKING_HELP)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default: 5000)")
    p.set_defaults(func=cmd_ui)
