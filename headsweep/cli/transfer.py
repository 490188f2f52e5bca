"""What ``headsweep transfer`` prints: prompt transferability between tasks as task x task tables
(``analysis.questions.transfer``; drawn by ``analysis.views.transfer``)."""

from __future__ import annotations

import argparse

from rich import box
from rich.table import Table

from analysis.questions.transfer import TABLES, TRANSFER, Transfer
from analysis.views.transfer import panel_title
from headsweep.cli.common import out
from headsweep.cli.output import fmt3

HELP = """\
Task x task tables of the prompt_transfer runs (rows: source task, columns: target task; seed
means): zero-shot transfer of the source prompt to the target task, the overlap of the two
prompts' top 20 % skill neurons and of the neurons they activate, and the target accuracy lost
to noise on the source's top neurons vs on as many random ones. Then Spearman rho between each
overlap and transfer_relative across the ordered pairs of different tasks, against the transfer
values shuffled among the pairs (Wang et al. 2022: 0.71 for skill neurons, 0.53 for activated ones).
"""

EXAMPLES = """\
examples:
  headsweep submit examples/grid_skill_transfer.yaml --wait
  headsweep transfer last --png transfer.png
  headsweep transfer last --fraction 0.05 --format csv
  headsweep transfer last --noise-std 0.5          # the cells at another noise level
"""


def show_transfer(result: Transfer, args: argparse.Namespace) -> None:
    """Each task x task table, then Spearman(overlap, transfer) against its null."""
    for name in TABLES:
        table = Table(title=f"{panel_title(name, result)} ({result.sweep_id}, {result.model})",
                      box=box.SIMPLE, pad_edge=False)
        table.add_column("source \\ target")
        for task in result.tasks:
            table.add_column(task, justify="right")
        for i, source in enumerate(result.tasks):
            table.add_row(source, *(fmt3(v) for v in result.tables[name][i]))
        out.print(table)
    for c in result.correlations:
        line = f"Spearman({c.overlap}, {TRANSFER}) = {fmt3(c.rho)}"
        if c.tested is None:
            line += " (no permutation test)"
        else:
            t = c.tested
            line += (f"; transfer shuffled among the pairs: chance {fmt3(t.null_mean)}, 95 % "
                     f"{fmt3(t.band_lo)}..{fmt3(t.band_hi)}, {t.p_text} ({t.n_perm} permutations)")
        out.print(line)
    out.print(f"pooled: {result.pooled}")
    for note in result.notes:
        out.print(f"note: {note}")
