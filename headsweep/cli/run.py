"""``headsweep run | methods``: one run on this machine, no Ray; every method and its keys."""

from __future__ import annotations

import argparse
import os
import traceback

from rich.table import Table

from base.naming import suggest
from base.sections import ConfigError, read_yaml
from headsweep.cli.common import TRACKING_HELP, out, progress_bar


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
    from experiments.harness.config import apply_overrides, parse_config
    from experiments.training.precision import check_precision

    cfg = parse_config(apply_overrides(load_yaml(args.config), args.sets or []))

    check_precision(cfg, "cpu")  # headsweep run trains on this machine's CPU: fp16 fails here, not after its stages
    if args.dry_run:
        from headsweep.cli.optimisers import optimiser_table

        out.print(f"run {cfg.run_key} ({cfg.run_name(' ')}): validated, nothing run")
        out.print(optimiser_table([cfg]))
        return 0
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
    if args.track:
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
    from experiments.harness.runner import run
    from experiments.methods import METHODS
    from experiments.training.context import RunContext
    from experiments.training.tracking import MemoryTracker

    tracker, finish = MemoryTracker(), None
    if args.track:
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

    with progress_bar("loss {task.fields[loss]:.3f}{task.fields[values]}") as progress:
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
    from experiments.harness import config_keys as keys
    from experiments.harness.config import RunConfig
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


def register(sub) -> None:
    """``headsweep run`` and ``headsweep methods``."""
    p = sub.add_parser("run", help="one run, no Ray")
    p.add_argument("config", help="YAML run config (see examples/)")
    p.add_argument("--set", action="append", dest="sets", metavar="KEY=VALUE", help="override a key, e.g. train.lr=1e-4")
    p.add_argument("--tracking-uri", help=TRACKING_HELP)
    p.add_argument("--experiment", default="headsweep-runs", help="MLflow experiment name")
    p.add_argument("--no-track", action="store_false", dest="track", help="do not record in MLflow")
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.add_argument("--dry-run", action="store_true", help="validate; print the run key and what trains, per "
                   "parameter group (lr, weight decay, schedule, clip, betas, eps); run nothing")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("methods", help="every method: pipelines, config keys with defaults and meaning")
    p.add_argument("method", nargs="?", help="show only this method")
    p.add_argument("--shared", action="store_true", help="also list the shared keys (seed, model, task.*, train.*)")
    p.set_defaults(func=cmd_methods)
