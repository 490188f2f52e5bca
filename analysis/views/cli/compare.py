"""``headsweep compare-maps`` and ``spearman``: do methods, tasks or two groups of runs rank the units alike?
(``analysis.questions.agreement.compare``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich import box
from rich.markup import escape
from rich.table import Table

from analysis import statistics
from analysis.data.select import py
from analysis.questions.agreement.compare import DEFAULT_TOP, compare_maps, overlap
from analysis.questions.agreement.result import Agreement
from analysis.views.answers import compare_json, compare_rows, null_summaries, overlap_json
from analysis.views.cli import common as cli_common
from analysis.views.compare_figure import compare_png

HELP = """\
Spearman rho between unit maps, with the top-k overlap and permutation nulls.

Several maps: each pair of maps over the runs that have both, or over matched runs (a run with one
map and a run with the other that agree on every config key but the method and its own keys: the
same model, task, seed and stage), rho averaged over the pairs. One map with --across AXIS: rho
between the AXIS values' seed-mean maps (task x task: task-specific or shared?).

Rho keeps its sign. A map whose important units are its smallest values (heads.ablation_delta is
negative for important heads) is flipped with a leading '-': -heads.ablation_delta.
"""

EXAMPLES = """\
examples:
  headsweep compare-maps last heads.log_alpha heads.importance -heads.ablation_delta
  headsweep compare-maps last neurons.predictivity --across task --png tasks.png
"""


def _maps_may_start_with_minus(parser: argparse.ArgumentParser) -> None:
    """Let ``-heads.ablation_delta`` be a positional (a flipped map), not an unknown option: argparse
    reads any word that starts with '-' as an option, so such words (a letter, then a dotted map
    name) are taken as positionals here."""
    parse_optional = parser._parse_optional

    def parse(arg_string: str):
        if arg_string[:1] == "-" and arg_string[1:2].isalpha() and "." in arg_string:
            return None  # a positional
        return parse_optional(arg_string)

    parser._parse_optional = parse


@cli_common.bad_input_is_config_error
def cmd_compare_maps(args: argparse.Namespace) -> int:
    """The table (or csv / json) of every pair of maps, and the matrix figure with --png."""
    cli_common.check_output(args, cli_common.AGREEMENT_FORMATS)
    data, where = cli_common.load(args)
    pool = [a.strip() for a in (args.pool or "").split(",") if a.strip()]
    result = compare_maps(data, args.maps, where, across=args.across, top=args.top, n_perm=args.n_perm, pool=pool)
    if args.format == "json":
        cli_common.write_json(compare_json(result), args.out)
    elif args.format == "csv":
        cli_common.write_rows(compare_rows(result), "csv", args.out)
    else:
        _print(result, args.sweep)
    if args.png:
        Path(args.png).write_bytes(compare_png(result, where))
        print(f"matrix -> {args.png}", file=sys.stderr)  # stdout may be the csv or json
    return 0


@cli_common.bad_input_is_config_error
def cmd_spearman(args: argparse.Namespace) -> int:
    """Spearman rho and the top-k overlap of two groups' mean maps, against both nulls."""
    from analysis.data import select

    cli_common.check_output(args, ("table", "json"))
    data, where = cli_common.load(args)
    group_a, group_b = select.parse_filter(args.a), select.parse_filter(args.b)
    answer = overlap_json(overlap(data, group_a, group_b, args.map or select.default_map(data), args.top, where,
                                  args.n_perm))
    if args.format == "json":
        cli_common.write_json({"a": args.a, "b": args.b, **answer}, args.out)
        return 0
    cli_common.out.print(escape(f"{answer['map']}: {args.a} ({answer['n_a']} runs) vs {args.b} ({answer['n_b']} runs), "
                                f"{args.sweep}"))
    cli_common.out.print(f"Spearman rho of the mean maps {cli_common.fmt3(answer['spearman'])}; mean over the "
                         f"pairs of runs {cli_common.fmt3(answer['mean_pairwise'])}")
    for null in answer["nulls"]:
        shuffled, chance, band, excess, p = cli_common.null_cells(null)
        cli_common.out.print(f"  units relabelled {shuffled}: chance {chance}, 95 % {band}, excess {excess}, {p}")
    cli_common.out.print(f"top {answer['k']} units: overlap {cli_common.fmt3(answer['overlap'])} (chance "
                         f"{cli_common.fmt3(answer['chance_overlap'])}), Jaccard {cli_common.fmt3(answer['jaccard'])} "
                         f"(chance {cli_common.fmt3(answer['chance_jaccard'])})")
    return 0


def _print(result: Agreement, sweep: str) -> None:
    """A table per pairwise statistic (rho's with the top-k statistics beside it), each pair's value
    against both nulls, and each one's mean over the pairs."""
    what = "maps" if result.across is None else f"{result.maps[0]} across {result.across}"
    n_perm = next((n["n_perm"] for p in result.pairs for n in null_summaries(p.rho)), 0)
    units = result.shape[0] * result.shape[1]
    asked = statistics.asked("compare_maps")
    top_k = [stat for stat in asked if stat.shape == "top_k"]
    tests = f"{n_perm} permutations per null)" if n_perm else "no permutation test)"
    caption = ("pairs: " + ("pairs of runs (one run when it has both maps)" if result.across is None else
                            "settings of the other axes") + "; shuffled: units relabelled at random within each "
               "layer or across all units, one relabelling per " + ("map" if result.across is None else "value")
               + " shared by its runs; chance = the null's mean; excess = observed - chance; p one-sided, never "
               "below 1/(permutations + 1)")
    for stat in (stat for stat in asked if stat.shape == "pairs"):
        first = stat.name == result.matrix_statistic
        title = escape((f"{what}: {stat.computes} and top {result.k} of {units} units ({sweep}; " if first
                        else f"{what}: {stat.computes} ({sweep}; ") + tests)
        beside = [label for s in top_k for label in (s.label, f"chance {s.label}")] if first else []
        table = Table(title=title, box=box.SIMPLE, pad_edge=False, caption=escape(caption + "".join(
            f"; {s.label}: {s.computes} (mean over the pairs), chance = {s.null}" for s in top_k if first)))
        for column, justify in (("a", "left"), ("b", "left"), ("pairs", "right"), (stat.label, "right"),
                                ("shuffled", "left"), ("chance", "right"), ("95% of chance", "right"),
                                ("excess", "right"), ("p", "right"), *((label, "right") for label in beside)):
            table.add_column(column, justify=justify, no_wrap=True)
        for pair in result.pairs:
            tested = pair.statistics[stat.name]
            for i, null in enumerate(null_summaries(tested) or [None]):
                head = i == 0
                cells = [pair.a, pair.b, str(pair.n_pairs), stat.text(py(tested.observed))] if head else [""] * 4
                cells += ["-"] * 5 if null is None else cli_common.null_cells(null)
                cells += [v for s in top_k for v in (s.text(pair.top_k[s.name]), s.text(result.chance[s.name]))] \
                    if head and first else [""] * len(beside)
                table.add_row(*cells)
        cli_common.out.print(table)
        if len(result.pairs) > 1:
            mean = result.statistics[stat.name]
            within = ", ".join(f"chance {cli_common.fmt3(n['null_mean'])} "
                               f"({'in layers' if n['null'] == 'within_layers' else 'all units'}) {n['p_text']}"
                               for n in null_summaries(mean))
            cli_common.out.print(f"mean {stat.label} over the {len(result.pairs)} pairs: "
                                 f"{stat.text(py(mean.observed))}" + (f"; {within}" if within else ""))
    for note in result.notes:
        cli_common.out.print(f"note: {note}")
    if result.matched_on:
        cli_common.out.print(f"compared only runs equal on: {', '.join(result.matched_on)}")
    if result.pooled_axes:
        cli_common.out.print(f"pooled (averaged over) on request: {', '.join(result.pooled_axes)}")


def register(subparsers: argparse._SubParsersAction, db_help: str, where_help: str) -> None:
    """Add ``compare-maps`` to the main CLI."""
    p = subparsers.add_parser("compare-maps", help="do methods or tasks rank the units alike? Spearman, top-k, nulls",
                              description=HELP, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _maps_may_start_with_minus(p)
    p.add_argument("sweep", help=cli_common.SWEEP_HELP)
    p.add_argument("maps", nargs="+", metavar="MAP",
                   help="unit maps of one kind, e.g. heads.log_alpha heads.importance; a leading '-' flips a map "
                        "(-heads.ablation_delta: larger = more important); one map with --across")
    p.add_argument("--across", help="compare one map across this axis's values (task, model, pipeline, seed, "
                                    "method or a config key)")
    p.add_argument("--top", type=float, default=DEFAULT_TOP,
                   help=f"top-k overlap of this fraction of the units (default {DEFAULT_TOP}: the top 10 %%)")
    p.add_argument("--n-perm", type=int, default=1000,
                   help="relabellings of each null (units within layers, and across all units); default 1000, "
                        "0 = no test")
    p.add_argument("--pool", help="with --across: comma-separated axes to average over instead of matching on them")
    p.add_argument("--format", default="table", choices=cli_common.AGREEMENT_FORMATS,
                   help="table (default), csv (one row per pair of maps) or json (everything)")
    p.add_argument("--out", help=cli_common.OUT_HELP)
    p.add_argument("--png", help="also write the annotated matrix to this PNG file")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_compare_maps)

    p = subparsers.add_parser("spearman", help="do two groups of runs rank a map's units alike? rho, top-k, nulls")
    p.add_argument("sweep", help=cli_common.SWEEP_HELP)
    p.add_argument("--a", required=True, help="group a, as --where: e.g. task:sst2,pipeline:dp")
    p.add_argument("--b", required=True, help="group b, e.g. task:ud-pos")
    p.add_argument("--map", help="the unit map (default: the map most runs of the sweep have)")
    p.add_argument("--top", type=float, default=DEFAULT_TOP,
                   help=f"top-k overlap of this fraction of the units (default {DEFAULT_TOP})")
    p.add_argument("--n-perm", type=int, default=1000, help="relabellings of each null; default 1000, 0 = no test")
    p.add_argument("--format", default="table", choices=("table", "json"), help="table (default) or json")
    p.add_argument("--out", help=cli_common.OUT_HELP)
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_spearman)
