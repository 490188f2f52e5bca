"""``headsweep submit | status | ls | resume | cancel``: a sweep on Ray, followed with a progress bar.

What each does is ``orchestrator.driving.sweeps``'s; this module prints it.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from base.sections import ConfigError
from headsweep.cli.common import SWEEP_HELP, known_sweep, out, progress_bar
from orchestrator import settings
from orchestrator.status import RUN_DONE, SWEEP_DONE, RunStatus

STATUSES = tuple(RunStatus)


def _count_text(counts: dict[str, int]) -> str:
    """'3 of 12 runs finished, 2 running, 7 pending': finished first, then each other status with runs."""
    others = [f"{counts[status]} {status}" for status in STATUSES
              if status != RunStatus.FINISHED and counts.get(status)]
    return ", ".join([f"{counts.get(RunStatus.FINISHED, 0)} of {sum(counts.values())} runs finished", *others])


def follow(sweep_id: str) -> int:
    """Progress bar until the sweep is done; exit 0 only if every run finished."""
    from orchestrator.driving import sweeps

    with progress_bar("{task.fields[counts]}") as progress:
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
    from orchestrator.driving import sweeps

    if args.dry_run:
        name, configs, counts = sweeps.plan(args.grid, args.sets or [])
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
        from headsweep.cli.optimisers import optimiser_table

        out.print(optimiser_table(configs))
        return 0
    submitted = sweeps.submit(args.grid, force=args.force, rerun_failed=args.rerun_failed, track=args.track,
                              auto_resume=args.auto_resume, sets=args.sets or [])
    counts = submitted.counts
    out.print(f"[bold]{submitted.sweep_id}[/bold]: {counts['total']} runs, {counts['new']} new, "
              f"{counts['finished']} already finished, {counts.get('requeued', 0)} requeued")
    if submitted.driver is None:
        out.print("nothing to run: every run of this grid is already finished")
        return 0
    if args.wait:
        return follow(submitted.sweep_id)
    out.print(f"running on Ray (driver {submitted.driver}); follow it with: headsweep status {submitted.sweep_id}")
    if args.auto_resume and settings.auto_resumes():
        out.print(f"if its driver dies, the supervisor resumes it (up to {settings.auto_resumes()} times; "
                  "--no-auto-resume turns this off)")
    return 0


def show_status(sweep_id: str) -> None:
    from rich.markup import escape

    from orchestrator.driving import supervisor
    from orchestrator.driving.driver_job import driver_gone, driver_starting
    from orchestrator.driving.writer import for_looking
    from orchestrator.registry.history import history as sweep_history

    registry = for_looking(settings.registry_url())
    driver_gone(registry, registry.get_sweep(sweep_id))  # a dead driver: failed, and its history says so
    sweep = registry.get_sweep(sweep_id) | {"events": registry.events(sweep_id)}
    history = sweep_history(sweep, supervised=supervisor.watching)
    counts = registry.sweep_counts(sweep_id)
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in RUN_DONE)
    from rich.progress_bar import ProgressBar

    out.print(f"[bold]{sweep_id}[/bold] ({sweep['name']}): {sweep['status']}: {_count_text(counts)}")
    out.print(ProgressBar(total=max(total, 1), completed=done, width=60), f"{done}/{total}")
    runs = registry.sweep_runs(sweep_id)
    collapsed = collapsed_text(runs)
    if collapsed:
        out.print(f"[red]{escape(collapsed)}[/red]", highlight=False)
    for i, line in enumerate(history):  # lost drivers and resumes; the last in red while unanswered
        unanswered = i == len(history) - 1 and sweep["status"] == "failed"
        out.print(f"[red]{escape(line)}[/red]" if unanswered else escape(line), highlight=False)
    starting = driver_starting(sweep)
    if starting:
        out.print(f"[yellow]{escape(starting)}[/yellow]", highlight=False)
    for line in data_lines(runs):
        out.print(escape(line), highlight=False)
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


def collapsed_text(runs: dict) -> str | None:
    """'2 of 6 checked runs collapsed (...): <key> (finetune seed 1), ...' of a sweep's runs
    (``registry.sweep_runs``), None when none did (``base.collapse``)."""
    from base.collapse import COLLAPSED

    checked = [(i, m[COLLAPSED]) for i, m in enumerate(runs["metrics"]) if COLLAPSED in m]
    hit = [i for i, flag in checked if flag == 1.0]
    if not hit:
        return None
    names = [f"{runs['run_key'][i]} ({_run_label(runs, i)})" for i in hit[:5]]
    more = f", ... ({len(hit)} in all)" if len(hit) > 5 else ""
    return (f"{len(hit)} of {len(checked)} checked runs collapsed (one class on dev, or the uniform guess's loss "
            f"ln K): {', '.join(names)}{more}; kept in results, counted in their column")


def data_lines(runs: dict) -> list[str]:
    """'data: mytask = data/train.tsv+dev.tsv#1a2b3c4d (6 runs)', one line per task of a sweep's runs
    (``registry.sweep_runs``): what each task trained on, so a sweep on the wrong data is seen at a
    glance. Runs registered before runs had a ``data`` label are left out."""
    counts: dict[tuple[str, str], int] = {}
    for labels in runs["labels"]:
        if labels.get("data"):
            pair = (str(labels.get("task")), str(labels["data"]))
            counts[pair] = counts.get(pair, 0) + 1
    return [f"data: {task} = {data} ({n} run{'s' if n != 1 else ''})" for (task, data), n in sorted(counts.items())]


def _run_label(runs: dict, i: int) -> str:
    """'head_gates sp, seed 1': run ``i``'s method, pipeline (when it has one) and seed."""
    labels = runs["labels"][i]
    pipeline = labels.get("pipeline")
    return f"{labels['method']}{f' {pipeline}' if pipeline else ''}, seed {labels['seed']}"


def cmd_status(args: argparse.Namespace) -> int:
    if args.sweep is None:
        if args.follow:
            raise ConfigError("status --follow needs a sweep id (or last)")
        return cmd_ls(args)
    _known_sweep(args.sweep)
    if args.follow:  # re-attach: the progress bar until the sweep ends, then its status
        return follow(args.sweep)
    show_status(args.sweep)
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    """``headsweep head status|stop``: this HEADSWEEP_HOME's local Ray head, shown or stopped."""
    from orchestrator.cluster.head import head_status, stop_local_head

    state = head_status()
    if state is None or not state["alive"]:
        out.print(f"no local Ray head runs for HEADSWEEP_HOME={settings.home()}")
        return 0
    if args.action == "status":
        out.print(f"local Ray head for HEADSWEEP_HOME={settings.home()}: {state['address']}, dashboard "
                  f"{state['dashboard']}; {len(state['pids'])} processes, {state['rss_mb']:.0f} MB resident (summed over them); "
                  "stop it with: headsweep head stop", soft_wrap=True)
        return 0
    running = _running_sweeps()
    if running and not args.force:
        raise ConfigError(f"sweeps still running on this head: {', '.join(running)}; cancel them first, "
                          "or stop it anyway with --force")
    stop_local_head()
    out.print(f"stopped the local Ray head of HEADSWEEP_HOME={settings.home()} ({len(state['pids'])} processes, "
              f"{state['rss_mb']:.0f} MB)")
    return 0


def _running_sweeps() -> list[str]:
    """The ids of this home's sweeps whose driver has not ended (none when it has no registry)."""
    from pathlib import Path

    from orchestrator.driving.writer import for_looking

    url = settings.registry_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    return [s["id"] for s in for_looking(url).list_sweeps() if s["status"] not in SWEEP_DONE]


def _known_sweep(sweep_id: str) -> None:
    from orchestrator.driving.writer import for_looking

    known_sweep(for_looking(settings.registry_url()), sweep_id)


def cmd_ls(args: argparse.Namespace) -> int:
    from orchestrator.driving.writer import for_looking

    table = Table(title="sweeps")
    for column in ("sweep", "name", "created", "status", "runs", "finished", "failed", "running", "progress"):
        table.add_column(column)
    from orchestrator.driving.driver_job import driver_gone

    registry = for_looking(settings.registry_url())
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
    from orchestrator.driving import sweeps

    _known_sweep(args.sweep)
    driver = sweeps.resume(args.sweep, track=args.track)
    if driver is None:
        out.print(f"{args.sweep}: nothing left to run")
        return 0
    out.print(f"{args.sweep}: resumed (driver {driver})")
    return follow(args.sweep) if args.wait else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator.driving import sweeps

    _known_sweep(args.sweep)
    counts = sweeps.cancel(args.sweep)
    out.print(f"{args.sweep}: cancel requested; running trials stop at their next check; {_count_text(counts)}")
    return 0


def register(sub) -> None:
    """``headsweep submit``, ``status``, ``ls``, ``resume`` and ``cancel``."""
    p = sub.add_parser("submit", help="submit a grid as a sweep on Ray")
    p.add_argument("grid", help="grid YAML (see examples/grid_*.yaml)")
    p.add_argument("--set", action="append", dest="sets", metavar="KEY=V1,V2",
                   help="override the grid: a list makes KEY an axis of those values (seed=0,1,2), one value sets "
                        "it for every cell (train.lr=1e-4); repeatable")
    p.add_argument("--dry-run", action="store_true", help="print the expansion: runs, new, already finished, "
                   "and what trains, per parameter group")
    p.add_argument("--wait", action="store_true", help="follow the sweep with a progress bar")
    p.add_argument("--force", action="store_true", help="rerun even finished runs")
    p.add_argument("--rerun-failed", action="store_true", help="requeue failed and cancelled runs")
    p.add_argument("--no-track", action="store_false", dest="track", help="do not record in MLflow")
    p.add_argument("--no-auto-resume", action="store_false", dest="auto_resume",
                   help="if the sweep's driver dies, leave the sweep failed (default: the supervisor resumes it, "
                        "up to HEADSWEEP_AUTO_RESUMES=3 times)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="counts, progress, ETA and failures of a sweep (all sweeps without one)")
    p.add_argument("sweep", nargs="?", help=SWEEP_HELP + "; without one, every sweep (as ls)")
    p.add_argument("--follow", action="store_true",
                   help="re-attach to a running sweep: its progress bar until it ends (exit 0 if every run finished)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("head", help="the local Ray head of this HEADSWEEP_HOME: shown or stopped")
    p.add_argument("action", choices=("status", "stop"), help="status: address, processes, memory; stop: end it")
    p.add_argument("--force", action="store_true", help="stop it even while sweeps of this home still run")
    p.set_defaults(func=cmd_head)

    p = sub.add_parser("ls", help="sweeps with their progress")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("resume", help="run what is not finished after a crash")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--wait", action="store_true", help="follow the sweep with a progress bar until it ends")
    p.add_argument("--no-track", action="store_false", dest="track", help="do not record the resumed runs in MLflow")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("cancel", help="stop scheduling and stop running trials")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.set_defaults(func=cmd_cancel)
