"""``headsweep transfer``: prompt transferability between tasks as task x task tables (``analysis.questions.transfer``; drawn by ``analysis.views.transfer``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich import box
from rich.table import Table

from analysis.questions.transfer import TABLES, TRANSFER, Transfer, transfer_tables
from analysis.views.cli import common as cli_common
from analysis.views.transfer import panel_title, transfer_json, transfer_png, transfer_rows

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


@cli_common.bad_input_is_config_error
def cmd_transfer(args: argparse.Namespace) -> int:
    cli_common.check_output(args, cli_common.AGREEMENT_FORMATS)
    data, where = cli_common.load(args)
    result = transfer_tables(data, where, fraction=args.fraction, noise_std=args.noise_std, n_perm=args.n_perm)
    if args.format == "json":
        cli_common.write_json(transfer_json(result), args.out)
    elif args.format == "csv":
        cli_common.write_rows(transfer_rows(result), "csv", args.out)
    else:
        _print(result)
    if args.png:
        Path(args.png).write_bytes(transfer_png(result, where))
        print(f"tables -> {args.png}", file=sys.stderr)  # stdout may be the csv or json
    return 0


def _print(result: Transfer) -> None:
    for name in TABLES:
        table = Table(title=f"{panel_title(name, result)} ({result.sweep_id}, {result.model})",
                      box=box.SIMPLE, pad_edge=False)
        table.add_column("source \\ target")
        for task in result.tasks:
            table.add_column(task, justify="right")
        for i, source in enumerate(result.tasks):
            table.add_row(source, *(cli_common.fmt3(v) for v in result.tables[name][i]))
        cli_common.out.print(table)
    for c in result.correlations:
        line = f"Spearman({c.overlap}, {TRANSFER}) = {cli_common.fmt3(c.rho)}"
        if c.tested is None:
            line += " (no permutation test)"
        else:
            t = c.tested
            line += (f"; transfer shuffled among the pairs: chance {cli_common.fmt3(t.null_mean)}, 95 % "
                     f"{cli_common.fmt3(t.band_lo)}..{cli_common.fmt3(t.band_hi)}, {t.p_text} ({t.n_perm} permutations)")
        cli_common.out.print(line)
    cli_common.out.print(f"pooled: {result.pooled}")
    for note in result.notes:
        cli_common.out.print(f"note: {note}")


def register(subparsers: argparse._SubParsersAction, db_help: str, where_help: str) -> None:
    """Add ``transfer`` to the main CLI."""
    p = subparsers.add_parser("transfer", help="prompt transfer between tasks: task x task tables, overlap vs transfer",
                              description=HELP, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help=cli_common.SWEEP_HELP)
    p.add_argument("--fraction", type=float,
                   help="the perturbed fraction of the neurons in the drop tables (default: the largest reported)")
    p.add_argument("--noise-std", type=float,
                   help="the runs at this prompt_transfer.noise_std (default: the value most runs have)")
    p.add_argument("--n-perm", type=int, default=1000,
                   help="shuffles of the transfer values among the pairs; default 1000, 0 = no test")
    p.add_argument("--format", default="table", choices=cli_common.AGREEMENT_FORMATS,
                   help="table (default), csv (one row per ordered pair) or json (everything)")
    p.add_argument("--out", help=cli_common.OUT_HELP)
    p.add_argument("--png", help="also write the annotated tables to this PNG file")
    p.add_argument("--where", help=where_help)
    p.add_argument("--db", help=db_help)
    p.set_defaults(func=cmd_transfer)
