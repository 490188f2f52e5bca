"""``headsweep``: the command line. Bad input exits 2 with one line naming the problem."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from experiments.common.naming import suggest
from experiments.core.sections import ConfigError, read_yaml
from orchestrator import settings, slurm
from orchestrator.status import RUN_DONE, SWEEP_DONE, RunStatus

STATUSES = tuple(RunStatus)
console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # tables stay readable in logs and pipes


def load_yaml(path: str) -> dict:
    """Read a run config file: a YAML mapping, or ConfigError naming the file."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data


def _threads(requested: int | None) -> int:
    import torch

    threads = requested or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def cmd_run(args: argparse.Namespace) -> int:
    """One run, no Ray: validate, train with a progress bar, record in MLflow.

    A run that starts from other runs (stages: ``init_from``, SP's default fine-tune) runs
    them first, each once: their final weights go to the checkpoint store under their run
    keys, where a later run (or sweep) finds and reuses them."""
    from experiments.core.config import apply_overrides, parse_config
    from experiments.core.precision import check_precision

    cfg = parse_config(apply_overrides(load_yaml(args.config), args.set or []))

    check_precision(cfg, "cpu")  # headsweep run trains on this machine's CPU: fp16 fails here, not after its stages
    _threads(args.threads)
    from orchestrator.checkpoints import CheckpointStore
    from orchestrator.registry.stages import with_upstreams

    store = CheckpointStore()
    chain, edges = with_upstreams([cfg])
    needed = {up for _, _, up in edges}
    for key, step in chain.items():
        if key == cfg.run_key:
            break
        if store.exists(key):
            out.print(f"{step.run_name(' ')}: its weights are in the checkpoint store (run {key}), reused")
            continue
        out.print(f"first the run it starts from: {step.method} {step.run_name(' ')} (run {key})")
        _run_tracked(step, args, store, save=key in needed)
    result, tracker = _run_tracked(cfg, args, store, save=False)
    out.print(f"run {cfg.run_key}: {result.steps} steps in {result.seconds:.1f} s")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(result.metrics.items()):
        table.add_row(name, f"{value:.4f}")
    out.print(table)
    if not args.no_track:
        from orchestrator.tracking import ui_url

        experiment = tracker.mlflow.get_run(tracker.run_id).info.experiment_id
        out.print(f"MLflow run {tracker.run_id} in experiment '{args.experiment}' at {tracker.mlflow.tracking_uri}")
        out.print(f"Look at it with: [bold]headsweep ui[/bold], then {ui_url(experiment, tracker.run_id)}", soft_wrap=True)
    return 0


def _progress_value(value) -> str:
    """A step value on the progress bar: '-' before the first, integers without '.0'."""
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _run_tracked(cfg, args: argparse.Namespace, store, save: bool):
    """``experiments.run`` of one config with a progress bar and (unless --no-track) an MLflow run;
    its upstreams' weights from ``store``, its own saved there when ``save``."""
    from experiments.core.context import RunContext
    from experiments.core.runner import run
    from experiments.core.tracking import MemoryTracker
    from experiments.methods import METHODS

    tracker, finish = MemoryTracker(), None
    if not args.no_track:
        from orchestrator import tracking

        mlflow = tracking.client(args.tracking_uri)
        experiment_id = tracking.ensure_experiment(mlflow, args.experiment)
        tracker = tracking.MlflowTracker(mlflow, tracking.start_run(mlflow, experiment_id, cfg.run_name()))
        finish = tracker.finish
    hooks = {"save_artifact": lambda name, data: store.put(cfg.run_key, name, data)}
    if cfg.upstreams:
        hooks["load_upstream"] = lambda role: store.load(cfg.upstreams[role].run_key)
    if save:
        hooks["save_weights"] = lambda weights: store.save(cfg.run_key, weights)

    shown = getattr(METHODS[cfg.method], "PROGRESS", {})  # the method's own progress values beside the loss

    def values(metrics: dict) -> str:
        return "".join(f"  {said} {_progress_value(metrics.get(name))}" for name, said in shown.items())

    columns = [
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}{task.fields[values]}"),
        TimeElapsedColumn(), TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(cfg.run_name(" "), total=None, loss=float("nan"), values=values({}))

        def on_progress(step, total, metrics):
            progress.update(bar, completed=step, total=total, loss=metrics.get("loss", float("nan")),
                            values=values(metrics))

        try:
            result = run(cfg, RunContext(tracker=tracker, on_progress=on_progress, **hooks))
        except BaseException as err:
            if finish is not None:
                tracker.set_tags({"error": "".join(traceback.format_exception_only(err)).strip()[:4000]})
                finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
            raise
    if finish is not None:
        finish("FINISHED")
    return result, tracker


def cmd_methods(args: argparse.Namespace) -> int:
    """Every method (or one): VERSION, pipelines, short names, and its keys with defaults and meaning."""
    from experiments.core import config_keys as keys
    from experiments.core.config import RunConfig
    from experiments.methods import METHODS

    if args.method is not None and args.method not in METHODS:
        raise ConfigError(f"unknown method '{args.method}'{suggest(args.method, METHODS)}")
    for name in [args.method] if args.method else list(METHODS):
        module = METHODS[name]
        shorts = keys.short_names(name)
        table = Table(title=f"[bold]{name}[/bold]  VERSION {module.VERSION}  pipelines: {', '.join(module.PIPELINES)}",
                      caption=(module.__doc__ or "").strip().splitlines()[0], title_justify="left")
        for column in ("key", "short name", "default", "meaning"):
            table.add_column(column, overflow="fold")
        rows = keys.describe(module.Config, f"{name}.")
        for key, default, meaning in rows:
            leaf = key.split(".", 1)[1]
            table.add_row(key, leaf if leaf in shorts else "", default, meaning)
        if not rows:
            table.add_row("(none)", "", "", "no keys of its own: it reads the shared sections")
        out.print(table)
        reference = getattr(module, "REFERENCE", {})
        if reference:
            sets = " ".join(f"--set {name}.{key}={_yaml_value(value)}" for key, value in reference.items())
            out.print(f"  defaults follow the paper's reference code except {', '.join(reference)} "
                      f"(sounder choices, see each key); the reference protocol: {sets}")
        else:
            out.print("  every default follows the paper's reference code (PARITY.md)")
    if args.shared:
        table = Table(title="[bold]shared keys[/bold] (every run)", title_justify="left")
        for column in ("key", "default", "meaning"):
            table.add_column(column, overflow="fold")
        for key, default, meaning in keys.describe(RunConfig):
            table.add_row(key, default, meaning)
        out.print(table)
    else:
        out.print("A run config: seed, model, task, train, method, and the method's section "
                  "(method: head_gates + head_gates: {lambda: 0.05}). Shared keys: headsweep methods --shared")
    return 0


def _yaml_value(value: object) -> str:
    """A value as ``--set`` reads it back (YAML): true/false, null, numbers, strings."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


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


def _sweep_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )


def _count_text(counts: dict[str, int]) -> str:
    """'3 of 12 runs finished, 2 running, 7 pending': finished first, then each other status with runs."""
    others = [f"{counts[status]} {status}" for status in STATUSES
              if status != RunStatus.FINISHED and counts.get(status)]
    return ", ".join([f"{counts.get(RunStatus.FINISHED, 0)} of {sum(counts.values())} runs finished", *others])


def follow(sweep_id: str) -> int:
    """Progress bar until the sweep is done; exit 0 only if every run finished."""
    from orchestrator import sweeps

    with _sweep_progress() as progress:
        bar = progress.add_task(sweep_id, total=None, counts="")

        def update(sweep, counts):
            done = sum(counts.get(s, 0) for s in RUN_DONE)
            progress.update(bar, completed=done, total=sum(counts.values()), counts=_count_text(counts))
            if sweep.get("starting"):
                progress.console.print(f"{sweep_id}: {sweep['starting']}")

        sweep = sweeps.wait(sweep_id, update)
    show_status(sweep_id)
    return 0 if sweep["status"] == "finished" else 1


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrator import sweeps

    if args.dry_run:
        name, configs, counts = sweeps.plan(args.grid)
        from orchestrator.registry.stages import describe_dag

        dag = describe_dag(counts["dag"])
        out.print(
            f"grid '{name}': {counts['total']} runs, {counts['new']} new, {counts['finished']} already finished"
            + (f", {counts['other']} known but not finished" if counts.get("other") else "")
        )
        if dag:
            out.print(f"stages: {len(configs)} cells + {dag}; each upstream runs once, before them")
        table = Table(title="first cells")
        labels = [cfg.labels() for cfg in configs[:10]]
        columns = list(dict.fromkeys(name for row in labels for name in row))  # the methods' short names too
        for column in ("run_key", *columns):
            table.add_column(column)
        for cfg, row in zip(configs, labels, strict=False):
            table.add_row(cfg.run_key, *("-" if row.get(c) is None else str(row[c]) for c in columns))
        out.print(table)
        return 0
    submitted = sweeps.submit(args.grid, force=args.force, rerun_failed=args.rerun_failed, track=not args.no_track,
                              auto_resume=not args.no_auto_resume)
    counts = submitted.counts
    out.print(f"[bold]{submitted.sweep_id}[/bold]: {counts['total']} runs, {counts['new']} new, "
              f"{counts['finished']} already finished, {counts.get('requeued', 0)} requeued")
    if submitted.driver is None:
        out.print("nothing to run: every run of this grid is already finished")
        return 0
    if args.wait:
        return follow(submitted.sweep_id)
    out.print(f"running on Ray (driver {submitted.driver}); follow it with: headsweep status {submitted.sweep_id}")
    if not args.no_auto_resume and settings.auto_resumes():
        out.print(f"if its driver dies, the supervisor resumes it (up to {settings.auto_resumes()} times; "
                  "--no-auto-resume turns this off)")
    return 0


def show_status(sweep_id: str) -> None:
    from rich.markup import escape

    from orchestrator import supervisor
    from orchestrator.drivers import driver_gone, driver_starting
    from orchestrator.registry import Registry
    from orchestrator.registry.history import history as sweep_history

    registry = Registry(settings.registry_url())
    driver_gone(registry, registry.get_sweep(sweep_id))  # a dead driver: failed, and its history says so
    sweep = registry.get_sweep(sweep_id) | {"events": registry.events(sweep_id)}
    history = sweep_history(sweep, supervised=supervisor.watching)
    counts = registry.sweep_counts(sweep_id)
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in RUN_DONE)
    from rich.progress_bar import ProgressBar

    out.print(f"[bold]{sweep_id}[/bold] ({sweep['name']}): {sweep['status']}: {_count_text(counts)}")
    out.print(ProgressBar(total=max(total, 1), completed=done, width=60), f"{done}/{total}")
    for i, line in enumerate(history):  # lost drivers and resumes; the last in red while unanswered
        unanswered = i == len(history) - 1 and sweep["status"] == "failed"
        out.print(f"[red]{escape(line)}[/red]" if unanswered else escape(line), highlight=False)
    starting = driver_starting(sweep)
    if starting:
        out.print(f"[yellow]{escape(starting)}[/yellow]", highlight=False)
    dag = registry.sweep_dag(sweep_id)
    if dag["upstream"]:
        out.print(f"stages: {dag['upstream']} upstream runs that {dag['dependants']} runs start from "
                  "(each runs once, before them; a failed one blocks its dependants)")
    if sweep.get("mlflow_experiment_id"):
        from orchestrator.tracking import ui_url

        out.print(f"MLflow: headsweep ui, then {ui_url(sweep['mlflow_experiment_id'])}", soft_wrap=True)
    eta = registry.eta_seconds(sweep_id)
    if eta is not None and sweep["status"] not in SWEEP_DONE:
        out.print(f"ETA about {eta / 60:.1f} min")
    failures = registry.failures(sweep_id)
    if failures:
        table = Table(title=f"failed and blocked runs ({len(failures)})")
        table.add_column("run_key")
        table.add_column("status")
        table.add_column("attempts", justify="right")
        table.add_column("error")
        for failure in failures[:20]:
            last_line = (failure["error"] or "").strip().splitlines()[-1:] or [""]
            table.add_row(failure["run_key"], failure["status"], str(failure["attempts"]), last_line[0][:160])
        out.print(table)


def cmd_status(args: argparse.Namespace) -> int:
    if args.sweep is None:
        return cmd_ls(args)
    _known_sweep(args.sweep)
    show_status(args.sweep)
    return 0


def _known_sweep(sweep_id: str) -> None:
    from orchestrator.registry import Registry

    known = [s["id"] for s in Registry(settings.registry_url()).list_sweeps()]
    if sweep_id not in known:
        raise ConfigError(f"unknown sweep '{sweep_id}'{suggest(sweep_id, known)}")


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


def cmd_ls(args: argparse.Namespace) -> int:
    from orchestrator.registry import Registry

    table = Table(title="sweeps")
    for column in ("sweep", "name", "created", "status", "runs", "finished", "failed", "running", "progress"):
        table.add_column(column)
    from orchestrator.drivers import driver_gone

    registry = Registry(settings.registry_url())
    for sweep in registry.list_sweeps():
        if driver_gone(registry, sweep):  # a dead driver's sweep is failed, not running
            sweep = {**sweep, "status": "failed"}
        counts = sweep["counts"]
        total = sum(counts.values())
        done = sum(counts.get(s, 0) for s in RUN_DONE)
        table.add_row(sweep["id"], sweep["name"], str(sweep["created_at"])[:19], sweep["status"], str(total),
                      str(counts.get("finished", 0)), str(counts.get("failed", 0)), str(counts.get("running", 0)),
                      f"{100 * done / max(total, 1):.0f}%")
    out.print(table)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator import sweeps

    _known_sweep(args.sweep)
    driver = sweeps.resume(args.sweep, track=not args.no_track)
    if driver is None:
        out.print(f"{args.sweep}: nothing left to run")
        return 0
    out.print(f"{args.sweep}: resumed (driver {driver})")
    return follow(args.sweep) if args.wait else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator import sweeps

    _known_sweep(args.sweep)
    counts = sweeps.cancel(args.sweep)
    out.print(f"{args.sweep}: cancel requested; running trials stop at their next check; {_count_text(counts)}")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    # The one place the orchestrator reaches up into analysis: its commands (results, agreement,
    # figures, serve, ...) and the sweep report that `report` logs to MLflow.
    from analysis.views.cli.commands import register
    from analysis.views.cli.common import SWEEP_HELP
    from analysis.views.report import sweep_report

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

    p = sub.add_parser("methods", help="every method: pipelines, config keys with defaults and meaning")
    p.add_argument("method", nargs="?", help="show only this method")
    p.add_argument("--shared", action="store_true", help="also list the shared keys (seed, model, task.*, train.*)")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("submit", help="submit a grid as a sweep on Ray")
    p.add_argument("grid", help="grid YAML (see examples/grid_*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the expansion: runs, new, already finished")
    p.add_argument("--wait", action="store_true", help="follow the sweep with a progress bar")
    p.add_argument("--force", action="store_true", help="rerun even finished runs")
    p.add_argument("--rerun-failed", action="store_true", help="requeue failed and cancelled runs")
    p.add_argument("--no-track", action="store_true", help="do not record in MLflow")
    p.add_argument("--no-auto-resume", action="store_true",
                   help="if the sweep's driver dies, leave the sweep failed (default: the supervisor resumes it, "
                        "up to HEADSWEEP_AUTO_RESUMES=3 times)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="counts, progress, ETA and failures of a sweep (all sweeps without one)")
    p.add_argument("sweep", nargs="?", help=SWEEP_HELP + "; without one, every sweep (as ls)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ls", help="sweeps with their progress")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("resume", help="run what is not finished after a crash")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--wait", action="store_true", help="follow the sweep with a progress bar until it ends")
    p.add_argument("--no-track", action="store_true", help="do not record the resumed runs in MLflow")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("cancel", help="stop scheduling and stop running trials")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.set_defaults(func=cmd_cancel)

    register(sub)
    slurm.register(sub)  # headsweep slurm: orchestrator/slurm.py

    p = sub.add_parser("report", help="log a sweep's figures and summary metrics to its MLflow parent run "
                                      "(its driver does when the sweep finishes)")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--db", help="registry URL (default: $HEADSWEEP_DB or the HEADSWEEP_HOME SQLite file)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the HEADSWEEP_HOME SQLite store)")
    p.set_defaults(func=cmd_report, render=sweep_report)

    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the HEADSWEEP_HOME SQLite store)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default: 5000)")
    p.set_defaults(func=cmd_ui)
    return parser


def quiet_libraries() -> None:
    """Our progress bars and tables are the output; silence the libraries' chatter."""
    import logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
