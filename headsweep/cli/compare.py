"""What ``headsweep compare-maps`` and ``spearman`` print: do methods, tasks or two groups of runs rank the
units alike? (``analysis.questions.agreement.compare``)."""

from __future__ import annotations

import argparse
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from analysis import statistics
from analysis.data.select import py
from analysis.questions.agreement.result import AgreementMatrix
from analysis.views.answers import null_summaries
from headsweep.cli.common import out
from headsweep.cli.output import fmt3, null_cells
from headsweep.cli.tables import notes

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


def maps_may_start_with_minus(parser: argparse.ArgumentParser) -> None:
    """Let ``-heads.ablation_delta`` be a positional (a flipped map), not an unknown option: argparse
    reads any word that starts with '-' as an option, so such words (a letter, then a dotted map
    name) are taken as positionals here."""
    parse_optional = parser._parse_optional

    def parse(arg_string: str):
        if arg_string[:1] == "-" and arg_string[1:2].isalpha() and "." in arg_string:
            return None  # a positional
        return parse_optional(arg_string)

    parser._parse_optional = parse


def show_spearman(answer: dict[str, Any], args: argparse.Namespace) -> None:
    """rho of the two groups' mean maps against both nulls, and their top-k overlap beside chance."""
    out.print(escape(f"{answer['map']}: {args.a} ({answer['n_a']} runs) vs {args.b} ({answer['n_b']} runs), "
                     f"{args.sweep}"))
    out.print(f"Spearman rho of the mean maps {fmt3(answer['spearman'])}; mean over the "
              f"pairs of runs {fmt3(answer['mean_pairwise'])}")
    for null in answer["nulls"]:
        shuffled, chance, band, excess, p = null_cells(null)
        out.print(f"  units relabelled {shuffled}: chance {chance}, 95 % {band}, excess {excess}, {p}")
    out.print(f"top {answer['k']} units: overlap {fmt3(answer['overlap'])} (chance "
              f"{fmt3(answer['chance_overlap'])}), Jaccard {fmt3(answer['jaccard'])} "
              f"(chance {fmt3(answer['chance_jaccard'])})")


def show_compare(result: AgreementMatrix, args: argparse.Namespace) -> None:
    """A table per pairwise statistic (rho's with the top-k statistics beside it), each pair's value
    against both nulls, and each one's mean over the pairs."""
    sweep = args.sweep
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
                cells += ["-"] * 5 if null is None else null_cells(null)
                cells += [v for s in top_k for v in (s.text(pair.top_k[s.name]), s.text(result.chance[s.name]))] \
                    if head and first else [""] * len(beside)
                table.add_row(*cells)
        out.print(table)
        if len(result.pairs) > 1:
            mean = result.statistics[stat.name]
            within = ", ".join(f"chance {fmt3(n['null_mean'])} "
                               f"({'in layers' if n['null'] == 'within_layers' else 'all units'}) {n['p_text']}"
                               for n in null_summaries(mean))
            out.print(f"mean {stat.label} over the {len(result.pairs)} pairs: "
                      f"{stat.text(py(mean.observed))}" + (f"; {within}" if within else ""))
    notes(result)
