"""The tables ``headsweep runs``, ``results``, ``agreement`` and ``iou`` print on the terminal (``--format
table``): each takes the question's answer and the parsed arguments (``compare`` and ``transfer`` hold
those of compare-maps, spearman and transfer)."""

from __future__ import annotations

import argparse
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from analysis import statistics
from analysis.data.select import py
from analysis.questions.run_table import RunTable
from analysis.views.answers import null_summaries
from base.collapse import COLLAPSED
from base.units import OPEN_THRESHOLD
from headsweep.cli.common import out
from headsweep.cli.output import cell, fmt2, fmt3, null_cells, signed

_NOT_SHOWN = ("group_key", "started_at", "finished_at", "artifact_uri", "maps")


def show_runs(table: RunTable, args: argparse.Namespace) -> None:
    """The columns whose values differ between the runs (the run key short), the constant ones in the
    caption; every column with --format csv, json or parquet."""
    rows = table.rows
    shown = [c for c in table.columns if c not in _NOT_SHOWN and (c == "run_key" or len({str(r[c]) for r in rows}) > 1)]
    constant = [c for c in table.columns if c not in shown and c not in _NOT_SHOWN and rows
                and rows[0][c] not in (None, "") and len({str(r[c]) for r in rows}) == 1]
    caption = "  ".join(f"{c}: {cell(rows[0][c])}" for c in constant)
    caption += f"\n{len(rows)} runs; every column ({len(table.columns)}): --format csv|json|parquet"
    title = f"runs of {args.sweep}" + (f" where {args.where}" if args.where else "")
    view = Table(title=title, caption=caption.strip(), box=box.SIMPLE, pad_edge=False)
    for column in shown:
        view.add_column(column, no_wrap=True,
                        justify="right" if column.startswith(("metrics.", "duration")) else "left")
    for row in rows:
        view.add_row(*(row[c][:12] if c == "run_key" else cell(row[c]) for c in shown))
    out.print(view)


def show_results(answer: tuple[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """Group columns that vary, then mean, std, n, the 95 % CI and runs (and the mean expected open heads
    beside open heads); constant columns in the caption."""
    metric, rows = answer
    group_by = args.group_by or ()
    title = f"{metric} per {', '.join(group_by) or 'cell (over seeds)'}: {args.sweep}"
    stats_columns = ("mean", "std", "n", "ci_lo", "ci_hi", "ci_method", "runs", "metric", "expected_open", COLLAPSED)
    groups = [k for k in rows[0] if k not in (*stats_columns, "group_key")] if rows else []  # key: csv/json
    constant = [k for k in groups if len(rows) > 1 and len({str(r[k]) for r in rows}) == 1]
    caption = "  ".join(f"{k}: {cell(rows[0][k])}" for k in constant)
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
        ci = f"[{cell(row['ci_lo'])}, {cell(row['ci_hi'])}] {row['ci_method']}"
        table.add_row(*(cell(row[k]) for k in shown),
                      cell(row["mean"]), fmt2(row["std"]), str(row["n"]), ci, str(row["runs"]),
                      *((cell(row["expected_open"]),) if expected else ()),
                      *((f"[red]{row[COLLAPSED]}[/red]" if row[COLLAPSED] else "0",) if collapsed else ()))
    out.print(table)


def matrix_rows(result) -> list[dict[str, Any]]:
    """The agreement matrix as rows (``--format csv``): the label, its r with every label, its runs."""
    return [{result.across: label, **{other: py(v) for other, v in zip(result.labels, row, strict=True)},
             "runs": n} for label, row, n in zip(result.labels, result.matrix, result.n_runs, strict=True)]


def show_agreement(result, args: argparse.Namespace) -> None:
    """The matrix, then each statistic against both permutation nulls, then what each one pools."""
    matrix = statistics.STATISTICS[result.matrix_statistic]
    table = Table(title=f"{result.map_name}: {matrix.computes} across {result.across} ({args.sweep})", box=box.SIMPLE)
    table.add_column(result.across, overflow="fold")
    for label in result.labels:
        table.add_column(label, justify="right", overflow="fold")
    table.add_column("runs", justify="right")
    for label, row, n in zip(result.labels, result.matrix, result.n_runs, strict=True):
        table.add_row(label, *(cell(py(v)) for v in row), str(n))
    out.print(table)
    notes(result)
    out.print(_agreement_tests(result, matrix))
    across = "seeds" if result.across == "seed" else f"{result.across} values"
    for stat in statistics.asked("agreement"):
        between = f" between {across}" if stat.shape == "pairs" else ""
        name = f"{result.across} {stat.label}" if stat is matrix else stat.label
        out.print(escape(f"{name}: {stat.computes}{between}, {result.statistics[stat.name].pooled}"))


def notes(result) -> None:
    """An agreement's notes, the axes it matched on and those it pooled (compare-maps' too)."""
    for note in result.notes:
        out.print(f"note: {note}")
    if result.matched_on:
        out.print(f"compared only runs equal on: {', '.join(result.matched_on)}")
    if result.pooled_axes:
        out.print(f"pooled (averaged over) on request: {', '.join(result.pooled_axes)}")


def _agreement_tests(result, matrix) -> Table:
    """Each statistic agreement asks, observed beside each null: chance, its 95 % band, excess and p."""
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
    for stat in statistics.asked("agreement"):
        name = f"{result.across} {stat.label}" if stat is matrix else stat.label
        tested = result.statistics[stat.name]
        nulls = null_summaries(tested)
        if not nulls:
            tests.add_row(name, stat.text(tested.observed), "-", "-", "-", "-", "-")
        for i, null in enumerate(nulls):
            tests.add_row(name if i == 0 else "", stat.text(tested.observed) if i == 0 else "", *null_cells(null))
    return tests


def iou_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The IoU matrix as rows (``--format csv``): the label, its IoU with every label."""
    return [{result["across"]: label, **dict(zip(result["labels"], row, strict=True))}
            for label, row in zip(result["labels"], result["matrix"], strict=True)]


def show_iou(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The IoU matrix, its mean per matrix role and layer, and what it says beside chance."""
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
