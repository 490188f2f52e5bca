"""``headsweep results | agreement | figures | serve``: the analysis commands.

``register(subparsers)`` adds them to the main parser (orchestrator/cli.py).
Each handler takes the parsed args and returns an exit code; bad input
(an unknown sweep, axis, metric or value) raises ``ConfigError``, which the
main CLI prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from experiments.config import ConfigError, suggest

FORMATS = ("table", "csv", "parquet", "json")
out = Console()


def _registry(args: argparse.Namespace):
    from orchestrator import settings
    from orchestrator.registry import Registry

    return Registry(args.db or settings.registry_url())


def _load(args: argparse.Namespace):
    """(the sweep's SweepData, the --where filters)."""
    from analysis import queries
    from analysis.loading import load_sweep
    from orchestrator.registry import NotFound

    registry = _registry(args)
    try:
        data = load_sweep(registry, args.sweep)
    except NotFound:
        known = [s["id"] for s in registry.list_sweeps()]
        raise ConfigError(f"unknown sweep '{args.sweep}'{suggest(args.sweep, known)}") from None
    return data, queries.parse_filter(args.where or "")


def _bad_input_is_config_error(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(handler)
    def wrapper(args: argparse.Namespace) -> int:
        from analysis.queries import QueryError

        try:
            return handler(args)
        except QueryError as err:
            raise ConfigError(str(err)) from None

    return wrapper


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --------------------------------------------------------------------------- results


def _write_rows(rows: list[dict[str, Any]], fmt: str, path: str | None) -> None:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
        return
    if fmt == "json":
        text = json.dumps(rows, indent=1) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    if path:
        Path(path).write_text(text)
    else:
        sys.stdout.write(text)


@_bad_input_is_config_error
def cmd_results(args: argparse.Namespace) -> int:
    """Mean, std, n and 95 % CI of a metric per group."""
    from analysis import queries

    if args.format not in FORMATS:
        raise ConfigError(f"--format: unknown format '{args.format}'{suggest(args.format, FORMATS)}")
    if args.format == "parquet" and not args.out:
        raise ConfigError("--format parquet writes a binary file: give --out FILE.parquet")
    data, where = _load(args)
    group_by = [a.strip() for a in (args.group_by or "").split(",") if a.strip()]
    metric = args.metric or queries.default_metric(data)
    rows = queries.aggregate(data, group_by, metric, where)
    if args.format != "table":
        _write_rows(rows, args.format, args.out)
        if args.out:
            out.print(f"{len(rows)} rows -> {args.out}")
        return 0
    out.print(_results_table(rows, f"{metric} per {', '.join(group_by) or 'cell (over seeds)'}: {args.sweep}"))
    return 0


def _results_table(rows: list[dict[str, Any]], title: str) -> Table:
    """Group columns that vary, then mean, std, n, the 95 % CI and runs; constant columns in the caption."""
    stats_columns = ("mean", "std", "n", "ci_lo", "ci_hi", "runs", "metric")
    groups = [k for k in rows[0] if k not in (*stats_columns, "group_key")] if rows else []  # key: csv/json
    constant = [k for k in groups if len(rows) > 1 and len({str(r[k]) for r in rows}) == 1]
    caption = "  ".join(f"{k}: {_fmt(rows[0][k])}" for k in constant)
    table = Table(title=title, caption=caption or None, box=box.SIMPLE)
    shown = [k for k in groups if k not in constant]
    for column in shown:
        table.add_column(column, overflow="fold")
    for column in ("mean", "std", "n", "95% CI", "runs"):
        table.add_column(column, justify="right")
    for row in rows:
        ci = f"[{_fmt(row['ci_lo'])}, {_fmt(row['ci_hi'])}]"
        table.add_row(*(_fmt(row[k]) for k in shown),
                      _fmt(row["mean"]), _fmt(row["std"]), str(row["n"]), ci, str(row["runs"]))
    return table


# --------------------------------------------------------------------------- agreement


@_bad_input_is_config_error
def cmd_agreement(args: argparse.Namespace) -> int:
    """The agreement matrix, the stem cell statistic and their permutation bands."""
    from analysis import queries

    data, where = _load(args)
    result = queries.agreement(data, args.across, where, n_perm=args.n_perm)
    table = Table(title=f"gate Pearson r across {args.across}: {args.sweep}", box=box.SIMPLE)
    table.add_column(args.across)
    for label in result.labels:
        table.add_column(label, justify="right")
    table.add_column("runs", justify="right")
    for label, row, n in zip(result.labels, result.matrix, result.n_runs, strict=True):
        table.add_row(label, *(_fmt(queries.py(v)) for v in row), str(n))
    out.print(table)
    for name, value in (("mean off-diagonal r", result.mean_offdiag),
                        (f"stem cell r ({result.n_groups} cells)", result.stem_cell)):
        s = queries.null_summary(value)
        line = f"{name}: {_fmt(s['observed'])}"
        if s["p_value"] is not None:
            line += f"  (null 95% band [{_fmt(s['band_lo'])}, {_fmt(s['band_hi'])}], p = {s['p_value']:.3g}, " \
                    f"{args.n_perm} permutations)"
        out.print(line)
    if args.png:
        Path(args.png).write_bytes(queries.agreement_png(result, where))
        out.print(f"heat map -> {args.png}")
    return 0


# --------------------------------------------------------------------------- figures


@_bad_input_is_config_error
def cmd_figures(args: argparse.Namespace) -> int:
    """Every figure of the sweep as PNG files under --out; prints their paths."""
    from analysis import queries

    data, where = _load(args)
    data = queries.select(data, where)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    plan = queries.figure_plan(data)
    for name, kind, params in plan:
        path = folder / name
        path.write_bytes(queries.figure(data, kind, **params))
        out.print(str(path))
    if not plan:
        out.print(f"{args.sweep}: no finished runs yet, no figures")
    return 0


# --------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    """The analysis HTTP service on Ray Serve; blocks until Ctrl-C."""
    from analysis.service import serve_app
    from orchestrator import settings

    url = args.db or settings.registry_url()
    out.print(f"analysis service for {url} at http://{args.host}:{args.port}/ "
              f"(OpenAPI: /docs, /openapi.json); Ctrl-C stops it")
    serve_app(url, args.host, args.port, blocking=True)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``results``, ``agreement``, ``figures`` and ``serve`` to the main CLI."""
    db_help = "registry URL (default: $HEADSWEEP_DB or the HEADSWEEP_HOME SQLite file)"
    where_help = "only these runs, e.g. task:sst2,pipeline:dp,seed:0|1"

    p = subparsers.add_parser("results", help="a metric's mean, std, n and 95%% CI per group")
    p.add_argument("sweep")
    p.add_argument("--group-by", default="", help="comma-separated axes, e.g. task,sparsity,pipeline "
                                                  "(default: per cell, over seeds)")
    p.add_argument("--metric", help="default: accuracy, else the first metric")
    p.add_argument("--format", default="table", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--out", help="write to this file (required for parquet)")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_results)

    p = subparsers.add_parser("agreement", help="gate agreement across seeds, tasks, pipelines or models")
    p.add_argument("sweep")
    p.add_argument("--across", required=True, choices=("seed", "task", "pipeline", "model", "run"))
    p.add_argument("--png", help="also write the heat map to this PNG file")
    p.add_argument("--n-perm", type=int, default=200, help="permutations of the null (0 = none)")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_agreement)

    p = subparsers.add_parser("figures", help="every figure of a sweep as PNG files")
    p.add_argument("sweep")
    p.add_argument("--out", default="figs", help="folder for the PNG files (default: figs)")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_figures)

    p = subparsers.add_parser("serve", help="the analysis HTTP service on Ray Serve (127.0.0.1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_serve)
