"""``headsweep``: the command line. Bad input exits 2 with one line naming the problem."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from experiments.config import ConfigError, apply_overrides, parse_config
from orchestrator import settings

console = Console(stderr=True)
out = Console()


def load_yaml(path: str) -> dict:
    """Read a YAML mapping, or raise ConfigError naming the file and the line."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data


def _threads(requested: int | None) -> int:
    import torch

    threads = requested or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def cmd_run(args: argparse.Namespace) -> int:
    """One run, no Ray: validate, train with a progress bar, record in MLflow."""
    cfg = parse_config(apply_overrides(load_yaml(args.config), args.set or []))
    _threads(args.threads)
    from experiments.runner import run
    from experiments.tracking import MemoryTracker
    from experiments.training import RunContext

    tracker, finish = MemoryTracker(), None
    if not args.no_track:
        from orchestrator import tracking

        mlflow = tracking.client(args.tracking_uri)
        experiment_id = tracking.ensure_experiment(mlflow, args.experiment)
        run_name = f"{cfg.task.name}-{cfg.method}-{cfg.pipeline}-seed{cfg.seed}"
        tracker = tracking.MlflowTracker(mlflow, tracking.start_run(mlflow, experiment_id, run_name))
        finish = tracker.finish

    columns = [
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  open heads {task.fields[open_heads]}"),
        TimeElapsedColumn(), TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(f"{cfg.method}/{cfg.pipeline} {cfg.task.name}", total=None, loss=float("nan"), open_heads="-")

        def on_progress(step, total, metrics):
            progress.update(bar, completed=step, total=total, loss=metrics["loss"], open_heads=metrics["open_heads"])

        try:
            result = run(cfg, RunContext(tracker=tracker, on_progress=on_progress))
        except BaseException as err:
            if finish is not None:
                tracker.set_tags({"error": "".join(traceback.format_exception_only(err)).strip()[:4000]})
                finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
            raise
    if finish is not None:
        finish("FINISHED")

    table = Table(title=f"run {cfg.run_key}  ({result.steps} steps, {result.seconds:.1f} s)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(result.metrics.items()):
        table.add_row(name, f"{value:.4f}")
    out.print(table)
    if finish is not None:
        out.print(f"MLflow run {tracker.run_id} in experiment '{args.experiment}' at {mlflow.tracking_uri}")
        out.print("Look at it with: [bold]headsweep ui[/bold]")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    """The MLflow UI over headsweep's tracking store, on 127.0.0.1."""
    uri = args.tracking_uri or settings.tracking_uri()
    command = [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
        "--default-artifact-root", settings.artifact_root(),
        "--host", args.host, "--port", str(args.port), "--workers", "1",
    ]
    console.print(f"MLflow UI for {uri} at http://{args.host}:{args.port}")
    os.execv(sys.executable, command)
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headsweep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="one run, no Ray")
    p.add_argument("config", help="YAML run config (see examples/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. train.lr=1e-4")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the HEADSWEEP_HOME SQLite store)")
    p.add_argument("--experiment", default="headsweep-runs", help="MLflow experiment name")
    p.add_argument("--no-track", action="store_true", help="do not record in MLflow")
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1")
    p.add_argument("--tracking-uri")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.set_defaults(func=cmd_ui)
    return parser


def quiet_libraries() -> None:
    """Our progress bars and tables are the output; silence the libraries' chatter."""
    import logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("mlflow", "alembic", "ray", "ray.tune", "ray.serve", "filelock"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"headsweep: error: {err}", file=sys.stderr)  # one line, never wrapped
        return 2


if __name__ == "__main__":
    sys.exit(main())
