"""``headsweep runs | results | agreement | compare-maps | spearman | transfer | iou | figures | serve``: the analysis commands.

``register(subparsers, artifact_uris)`` adds them to the main parser (headsweep/cli/analysis.py); ``compare`` and
``transfer`` hold compare-maps and transfer, ``common`` what they share.
Each handler takes the parsed args and returns an exit code; bad input
(an unknown sweep, axis, metric or value) raises ``ConfigError``, which the
main CLI prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from analysis.views.cli import compare, transfer
from analysis.views.cli.common import (
    AGREEMENT_FORMATS,
    OUT_HELP,
    SWEEP_HELP,
    bad_input_is_config_error,
    check_output,
    fmt3,
    load,
    null_cells,
    out,
    registry,
    signed,
    write_json,
    write_rows,
)
from analysis.views.figure_kinds import DPI, DPI_RANGE, FIGURE_KINDS
from experiments.common.collapse import COLLAPSED
from experiments.common.png import FORMATS as FIGURE_FORMATS
from experiments.common.units import OPEN_THRESHOLD

FORMATS = ("table", "csv", "parquet", "json")


def _fmt(value: Any) -> str:
    if value is None or value == "":  # a label the run has no value for (a fine-tune's pipeline)
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --------------------------------------------------------------------------- runs


@bad_input_is_config_error
def cmd_runs(args: argparse.Namespace) -> int:
    """The run table (``analysis.questions.run_table``): one row per run, every column."""
    from analysis.questions.run_table import run_table

    check_output(args, FORMATS)
    data, where = load(args)
    table = run_table(data, where, registry(args).get_sweep(data.sweep_id)["grid"], args.artifact_uris)
    if args.format != "table":
        write_rows(table.rows, args.format, args.out, table.columns)
        if args.out:
            out.print(f"{len(table.rows)} runs -> {args.out}")
        return 0
    out.print(_runs_table(table, f"runs of {args.sweep}" + (f" where {args.where}" if args.where else "")))
    return 0


_NOT_SHOWN = ("group_key", "started_at", "finished_at", "artifact_uri", "maps")


def _runs_table(table, title: str) -> Table:
    """The columns whose values differ between the runs (the run key short), the constant ones in the
    caption; every column with --format csv, json or parquet."""
    rows = table.rows
    shown = [c for c in table.columns if c not in _NOT_SHOWN and (c == "run_key" or len({str(r[c]) for r in rows}) > 1)]
    constant = [c for c in table.columns if c not in shown and c not in _NOT_SHOWN and rows
                and rows[0][c] not in (None, "") and len({str(r[c]) for r in rows}) == 1]
    caption = "  ".join(f"{c}: {_fmt(rows[0][c])}" for c in constant)
    caption += f"\n{len(rows)} runs; every column ({len(table.columns)}): --format csv|json|parquet"
    view = Table(title=title, caption=caption.strip(), box=box.SIMPLE, pad_edge=False)
    for column in shown:
        view.add_column(column, no_wrap=True,
                        justify="right" if column.startswith(("metrics.", "duration")) else "left")
    for row in rows:
        view.add_row(*(row[c][:12] if c == "run_key" else _fmt(row[c]) for c in shown))
    return view


# --------------------------------------------------------------------------- results


@bad_input_is_config_error
def cmd_results(args: argparse.Namespace) -> int:
    """Mean, std, n and 95 % CI of a metric per group."""
    from analysis.questions import results

    check_output(args, FORMATS)
    data, where = load(args)
    group_by = [a.strip() for a in (args.group_by or "").split(",") if a.strip()]
    metric, rows = results.results(data, group_by, args.metric, where)
    if args.format != "table":
        write_rows(rows, args.format, args.out)
        if args.out:
            out.print(f"{len(rows)} rows -> {args.out}")
        return 0
    out.print(_results_table(rows, f"{metric} per {', '.join(group_by) or 'cell (over seeds)'}: {args.sweep}"))
    return 0


def _dpi(text: str) -> float:
    """``--dpi``: a number within ``DPI_RANGE``, as the service takes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    low, high = DPI_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text} is outside {low} to {high} dots per inch")
    return value


def _results_table(rows: list[dict[str, Any]], title: str) -> Table:
    """Group columns that vary, then mean, std, n, the 95 % CI and runs (and the mean expected open heads
    beside open heads); constant columns in the caption."""
    stats_columns = ("mean", "std", "n", "ci_lo", "ci_hi", "ci_method", "runs", "metric", "expected_open", COLLAPSED)
    groups = [k for k in rows[0] if k not in (*stats_columns, "group_key")] if rows else []  # key: csv/json
    constant = [k for k in groups if len(rows) > 1 and len({str(r[k]) for r in rows}) == 1]
    caption = "  ".join(f"{k}: {_fmt(rows[0][k])}" for k in constant)
    caption += "\n95% CI: t interval below 10 runs (t), percentile bootstrap from 10 (bootstrap)"
    expected = bool(rows) and "expected_open" in rows[0]
    if expected:
        caption += (f"\nopen: test-time gate > {OPEN_THRESHOLD:g}; expected open (mean): sum over heads of "
                    "P(gate > 0) in training, what the L0 penalty counts")
    collapsed = any(row.get(COLLAPSED) for row in rows)  # shown where some run collapsed
    if collapsed:
        caption += ("\ncollapsed: runs that predict one class on dev (or whose loss is the uniform guess's "
                    "ln K); counted in n and the mean, not left out")
    table = Table(title=title, caption=caption.strip(), box=box.SIMPLE, pad_edge=False)
    shown = [k for k in groups if k not in constant]
    for column in shown:
        table.add_column(column, no_wrap=True)
    for column in ("mean", "std", "n", "95% CI", "runs", *(("expected open",) if expected else ()),
                   *((COLLAPSED,) if collapsed else ())):
        table.add_column(column, justify="right", no_wrap=column == "95% CI")
    for row in rows:
        ci = f"[{_fmt(row['ci_lo'])}, {_fmt(row['ci_hi'])}] {row['ci_method']}"
        table.add_row(*(_fmt(row[k]) for k in shown),
                      _fmt(row["mean"]), _fmt2(row["std"]), str(row["n"]), ci, str(row["runs"]),
                      *((_fmt(row["expected_open"]),) if expected else ()),
                      *((f"[red]{row[COLLAPSED]}[/red]" if row[COLLAPSED] else "0",) if collapsed else ()))
    return table


# --------------------------------------------------------------------------- agreement


@bad_input_is_config_error
def cmd_agreement(args: argparse.Namespace) -> int:
    """The agreement matrix and two tested statistics, each against both permutation nulls."""
    from analysis.data import select
    from analysis.questions.agreement.across_runs import agreement
    from analysis.views import answers, figure_plan

    check_output(args, AGREEMENT_FORMATS)
    data, where = load(args)
    pool = [a.strip() for a in (args.pool or "").split(",") if a.strip()]
    result = agreement(data, args.across, where, n_perm=args.n_perm, map_name=args.map or select.default_map(data),
                       pool=pool)
    if args.format == "json":
        write_json(answers.agreement_json(result), args.out)
    elif args.format == "csv":
        write_rows(_matrix_rows(result), "csv", args.out)
    else:
        _print_agreement(result, args.sweep)
    if args.png:
        Path(args.png).write_bytes(figure_plan.agreement_png(result, where))
        print(f"heat map -> {args.png}", file=sys.stderr)  # stdout may be the csv or json
    return 0


def _matrix_rows(result) -> list[dict[str, Any]]:
    """The agreement matrix as rows: the label, its r with every label, its runs."""
    from analysis.data import select

    return [{result.across: label, **{other: select.py(v) for other, v in zip(result.labels, row, strict=True)},
             "runs": n} for label, row, n in zip(result.labels, result.matrix, result.n_runs, strict=True)]


def _print_agreement(result, sweep: str) -> None:
    from analysis import statistics
    from analysis.data import select
    from analysis.views.answers import null_summaries

    matrix = statistics.STATISTICS[result.matrix_statistic]
    table = Table(title=f"{result.map_name}: {matrix.computes} across {result.across} ({sweep})", box=box.SIMPLE)
    table.add_column(result.across, overflow="fold")
    for label in result.labels:
        table.add_column(label, justify="right", overflow="fold")
    table.add_column("runs", justify="right")
    for label, row, n in zip(result.labels, result.matrix, result.n_runs, strict=True):
        table.add_row(label, *(_fmt(select.py(v)) for v in row), str(n))
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}")
    if result.matched_on:
        out.print(f"compared only runs equal on: {', '.join(result.matched_on)}")
    if result.pooled_axes:
        out.print(f"pooled (averaged over) on request: {', '.join(result.pooled_axes)}")
    across = "seeds" if result.across == "seed" else f"{result.across} values"
    n_perm = next((n["n_perm"] for n in null_summaries(result.mean_offdiag)), 0)
    tests = Table(title=f"{result.map_name}: is the agreement more than chance? ({n_perm} permutations per null)"
                  if n_perm else "no permutation test (--n-perm 0)", box=box.SIMPLE, pad_edge=False,
                  caption="shuffled: each run's units shuffled within each layer (the same units "
                          "beyond how many each layer keeps?) or across all units (the same units at all?); "
                          "chance = the null's mean; excess = observed - chance; p one-sided, never below 1/(permutations + 1)")
    for column, justify in (("statistic", "left"), ("observed", "right"), ("shuffled", "left"),
                            ("chance", "right"), ("95% of chance", "right"), ("excess", "right"),
                            ("p", "right")):
        tests.add_column(column, justify=justify, no_wrap=True)
    asked = statistics.asked("agreement")
    names = {stat.name: f"{result.across} {stat.label}" if stat is matrix else stat.label for stat in asked}
    for stat in asked:
        tested = result.statistics[stat.name]
        nulls = null_summaries(tested)
        if not nulls:
            tests.add_row(names[stat.name], stat.text(tested.observed), "-", "-", "-", "-", "-")
        for i, null in enumerate(nulls):
            tests.add_row(names[stat.name] if i == 0 else "", stat.text(tested.observed) if i == 0 else "",
                          *null_cells(null))
    out.print(tests)
    for stat in asked:
        between = f" between {across}" if stat.shape == "pairs" else ""
        out.print(escape(f"{names[stat.name]}: {stat.computes}{between}, {result.statistics[stat.name].pooled}"))


@bad_input_is_config_error
def cmd_iou(args: argparse.Namespace) -> int:
    """Mask IoU of kept weights between runs that differ in one axis, beside chance."""
    from analysis.questions import masks

    check_output(args, AGREEMENT_FORMATS)
    data, where = load(args)
    pool = [a.strip() for a in (args.pool or "").split(",") if a.strip()]
    result = masks.mask_iou(data, args.across, masks.stored_masks(), where, pool,
                            load_initial=masks.stored_masks(name=masks.INITIAL_FILE))
    if args.format == "json":
        write_json(result, args.out)
        return 0
    if args.format == "csv":
        write_rows([{args.across: label, **dict(zip(result["labels"], row, strict=True))}
                     for label, row in zip(result["labels"], result["matrix"], strict=True)], "csv", args.out)
        return 0
    table = Table(title=f"weight masks: IoU of kept weights across {args.across} ({args.sweep})", box=box.SIMPLE)
    table.add_column(args.across, overflow="fold")
    for label in result["labels"]:
        table.add_column(label, justify="right", overflow="fold")
    for label, row in zip(result["labels"], result["matrix"], strict=True):
        table.add_row(label, *(fmt3(v) for v in row))
    out.print(table)
    roles = Table(title="mean IoU per matrix (rows: layers)", box=box.SIMPLE)
    roles.add_column("layer", justify="right")
    for role in result["per_role"]:
        roles.add_column(role, justify="right")
    for layer in range(len(next(iter(result["per_role"].values()), []))):
        roles.add_row(str(layer), *(fmt3(values[layer]) for values in result["per_role"].values()))
    out.print(roles)
    for note in result["notes"]:
        out.print(f"note: {note}")
    out.print(f"kept weights (shared initialisation included): IoU {fmt3(result['iou'])}, chance "
              f"{fmt3(result['chance'])} (random masks of the same density per matrix), excess "
              f"{signed(result['excess'])}: {result['pooled']}; compared only runs equal on: "
              f"{', '.join(result['matched_on'])}")
    if (flips := result["flips"]) is not None:
        out.print(f"what training changed (flips from each run's initial mask, {flips['flipped']:.2%} of the entries "
                  f"a run): IoU {fmt3(flips['iou'])}, chance {fmt3(flips['chance'])}, excess "
                  f"{signed(flips['excess'])}: {flips['pooled']}")
    out.print(f"the density maps against their permutation nulls: headsweep agreement {args.sweep} "
              f"--map heads.mask_density --across {args.across}")
    return 0


def _fmt2(value: float | None) -> str:
    """Two significant digits (a spread needs no more)."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.2g}"


# --------------------------------------------------------------------------- figures


@bad_input_is_config_error
def cmd_figures(args: argparse.Namespace) -> int:
    """The sweep's figures (``figure_plan``; ``--kind``: of that kind only) as files under --out, in
    --format at --dpi; prints their paths."""
    from analysis.data import select
    from analysis.views import figure_plan

    if args.kind:
        figure_plan.check_kind(args.kind)
    data, where = load(args)
    data = select.select(data, where)
    plan = [entry for entry in figure_plan.figure_plan(data) if args.kind in (None, entry[1])]
    if args.kind and not plan:  # a kind the default plan leaves out: drawn once with its defaults
        plan = [(f"{args.kind}.png", args.kind, {})]
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, kind, params in plan:
        path = folder / Path(name).with_suffix(f".{args.format}")
        path.write_bytes(figure_plan.figure(data, kind, fmt=args.format, dpi=args.dpi, **params))
        out.print(str(path))
    if not plan:
        out.print(f"{args.sweep}: no finished runs yet, no figures")
    return 0


# --------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    """The analysis HTTP service on Ray Serve; blocks until Ctrl-C, then ends this process (exit 0)."""
    from analysis.views.service.serve import serve_app
    from orchestrator import settings
    from orchestrator.registry.reader import RegistryReader

    url = args.db or settings.registry_url()
    RegistryReader(url).close()  # a missing or older registry is one line here, not a failed Serve replica
    # Ctrl-C (SIGINT) stops it even when it was started with SIGINT ignored, as a shell does for a
    # command run in the background (`headsweep serve &`): Python then installs no KeyboardInterrupt
    # handler, and `kill -INT` would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out.print(f"analysis service for {url} at http://{args.host}:{args.port}/ "
              f"(OpenAPI: /docs, /openapi.json); Ctrl-C stops it")
    serve_app(url, args.host, args.port, blocking=True, artifact_uris=args.artifact_uris)
    # Serve and the Ray it started are down (serve_app). Left to itself, the interpreter's exit then
    # waits in Ray's native teardown (no Python frame) until serve_app's 8 s watchdog ends it: 9 s
    # from Ctrl-C idle, at the edge of the 10 s promise. Nothing is left to flush or close but stdio.
    out.print("stopped")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(subparsers: argparse._SubParsersAction, artifact_uris=None) -> None:
    """Add the analysis commands to the main CLI; ``artifact_uris``: the run table's lookup of MLflow
    artifact URIs (``analysis.questions.run_table.ArtifactUris``), for ``runs`` and ``serve``."""
    db_help = "registry URL (default: $HEADSWEEP_DB or the HEADSWEEP_HOME SQLite file)"
    where_help = ("only these runs, e.g. 'metrics.accuracy > 0.8 and params.train.lr = 3e-4 and seed != 1' "
                  "or task:sst2,seed:0|1")

    p = subparsers.add_parser("runs", help="the run table: labels, status, times, MLflow run, params.*, metrics.*")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--where", help=where_help)
    p.add_argument("--format", default="table", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--out", help=OUT_HELP + " (parquet: required)")
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_runs, artifact_uris=artifact_uris)

    p = subparsers.add_parser("results", help="a metric's mean, std, n and 95%% CI per group")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--group-by", default="", help="comma-separated axes, e.g. task,sparsity,pipeline "
                                                  "(default: per cell, over seeds)")
    p.add_argument("--metric", help="default: accuracy, else the first metric")
    p.add_argument("--format", default="table", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--out", help=OUT_HELP + " (parquet: required)")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_results)

    p = subparsers.add_parser("agreement", help="do runs keep the same units? (across seeds, tasks, pipelines, ...)")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--across", default="seed", help="seed (default), run, a label (task, model, method, pipeline, "
                                                    "a method's short name) or any config key")
    p.add_argument("--map", help="the unit map to compare, e.g. heads.gate, heads.log_alpha "
                                 "(default: the map most runs of the sweep have)")
    p.add_argument("--pool", help="comma-separated axes to average over instead of matching on them")
    p.add_argument("--format", default="table", choices=AGREEMENT_FORMATS,
                   help="table (default; the statistics too), csv (the matrix) or json (everything)")
    p.add_argument("--out", help=OUT_HELP)
    p.add_argument("--png", help="also write the heat map to this PNG file")
    p.add_argument("--n-perm", type=int, default=1000,
                   help="permutations of each null (units shuffled within layers, and across all units); "
                        "default 1000, 0 = no test")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_agreement)

    compare.register(subparsers, db_help, where_help)
    transfer.register(subparsers, db_help, where_help)

    p = subparsers.add_parser("iou", help="do runs keep the same weights? mask IoU across seeds, pipelines, losses, ...")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--across", default="seed", help="seed (default), or any axis (pipeline, loss, method, task, "
                   "a config key): pairs of runs that differ in it only")
    p.add_argument("--pool", help="comma-separated axes to average over instead of matching on them")
    p.add_argument("--format", default="table", choices=AGREEMENT_FORMATS, help="table (default), csv or json")
    p.add_argument("--out", help=OUT_HELP)
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_iou)

    p = subparsers.add_parser("figures", help="the figures of a sweep as PNG, PDF or SVG files")
    p.add_argument("sweep", help=SWEEP_HELP)
    p.add_argument("--kind", help=f"only figures of this kind: {', '.join(FIGURE_KINDS)} (default: every figure "
                                  "worth drawing for the sweep)")
    p.add_argument("--format", default="png", choices=FIGURE_FORMATS, help="file format (default: png; pdf or svg for a paper)")
    p.add_argument("--dpi", type=_dpi, default=DPI, help=f"resolution, {DPI_RANGE[0]} to {DPI_RANGE[1]} "
                                                        f"(default: {DPI}; e.g. 300 for print)")
    p.add_argument("--out", default="figs", help="folder for the files (default: figs)")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_figures)

    p = subparsers.add_parser("serve", help="the analysis HTTP service on Ray Serve (127.0.0.1)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_serve, artifact_uris=artifact_uris)
