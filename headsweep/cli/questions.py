"""``headsweep runs | results | agreement | compare-maps | spearman | transfer | iou | figures | serve``.

Each command is a question declared in ``analysis.views.vocabulary``: its arguments are the
declaration's parameters (``--name-with-dashes``; a list as comma-separated text), its answer
``Question.ask``'s. What a command adds is where the answer goes (``--format``, ``--out``, ``--png``)
and its table on the terminal (``tables``, ``compare``, ``transfer``). Bad input (an unknown sweep,
axis, metric or value) raises ``ConfigError``, which the main CLI prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from analysis.views import vocabulary
from analysis.views.answers import compare_rows
from analysis.views.compare_figure import compare_png
from analysis.views.figure_plan import agreement_png
from analysis.views.transfer import transfer_png, transfer_rows
from analysis.views.vocabulary import FIGURE_DPI, FIGURE_FORMAT, FIGURES, Param, Question
from headsweep.cli import compare, tables, transfer
from headsweep.cli.common import (
    DB_HELP,
    SWEEP_HELP,
    WHERE_HELP,
    bad_input_is_config_error,
    out,
    registry,
)
from headsweep.cli.output import (
    ANSWER_FORMATS,
    OUT_HELP,
    ROW_FORMATS,
    check_output,
    write_json,
    write_rows,
)


@dataclass(frozen=True)
class Command:
    """A question as a command: its table on the terminal (``show``), its answer as rows for csv
    (``rows``: rows and their columns), its figure (``png``: its name, how it is drawn)."""

    question: Question
    show: Callable[[Any, argparse.Namespace], None]
    rows: Callable[[Any], tuple[list[dict[str, Any]], list[str] | None]] | None = None
    formats: tuple[str, ...] = ANSWER_FORMATS
    counted: str = ""
    """Commands whose answer is rows in every format (the run table, results): 'N <counted> -> FILE'."""
    png: tuple[str, Callable[[Any, Any], bytes]] | None = None
    description: str | None = None
    epilog: str | None = None


COMMANDS = (
    Command(vocabulary.RUNS, tables.show_runs, lambda table: (table.rows, table.columns), ROW_FORMATS, "runs"),
    Command(vocabulary.RESULTS, tables.show_results, lambda answer: (answer[1], None), ROW_FORMATS, "rows"),
    Command(vocabulary.AGREEMENT, tables.show_agreement, lambda result: (tables.matrix_rows(result), None),
            png=("heat map", agreement_png)),
    Command(vocabulary.COMPARE_MAPS, compare.show_compare, lambda result: (compare_rows(result), None),
            png=("matrix", compare_png), description=compare.HELP, epilog=compare.EXAMPLES),
    Command(vocabulary.SPEARMAN, compare.show_spearman, formats=("table", "json")),
    Command(vocabulary.TRANSFER, transfer.show_transfer, lambda result: (transfer_rows(result), None),
            png=("tables", transfer_png), description=transfer.HELP, epilog=transfer.EXAMPLES),
    Command(vocabulary.IOU, tables.show_iou, lambda result: (tables.iou_rows(result), None)),
)


def _asked(command: Command, args: argparse.Namespace) -> tuple[Any, Any, argparse.Namespace]:
    """(the answer, the --where filters, the arguments with each parameter as the question read it)."""
    from analysis.data.loading import open_sweep
    from analysis.data.select import parse_filter

    question, reader = command.question, registry(args)
    data, where = open_sweep(reader, args.sweep), parse_filter(args.where)
    values = question.values({p.name: getattr(args, p.name) for p in question.params})
    context = vocabulary.Context(reader, args.artifact_uris)
    return question.ask(data, where, context, **values), where, argparse.Namespace(**(vars(args) | values))


@bad_input_is_config_error
def cmd_question(command: Command, args: argparse.Namespace) -> int:
    """The answer as the terminal's table, csv, json or parquet (to --out, or stdout), and its figure (--png)."""
    check_output(args, command.formats)
    answer, where, args = _asked(command, args)
    if args.format == "table":
        command.show(answer, args)
    elif args.format == "json" and not command.counted:
        write_json(command.question.json(answer), args.out)
    else:
        rows, columns = command.rows(answer)
        write_rows(rows, args.format, args.out, columns)
        if args.out and command.counted:
            out.print(f"{len(rows)} {command.counted} -> {args.out}")
    if getattr(args, "png", None):
        name, draw = command.png
        Path(args.png).write_bytes(draw(answer, where))
        print(f"{name} -> {args.png}", file=sys.stderr)  # stdout may be the csv or json
    return 0


@bad_input_is_config_error
def cmd_figures(args: argparse.Namespace) -> int:
    """The sweep's figures (``FIGURES``: of --kind only) as files under --out, in --format at --dpi;
    prints their paths."""
    from analysis.data.loading import open_sweep
    from analysis.data.select import parse_filter
    from base.png import figure_bytes

    reader = registry(args)
    data, where = open_sweep(reader, args.sweep), parse_filter(args.where)
    written = 0
    for name, figure in vocabulary.drawn(data, where, vocabulary.Context(reader), args.kind):
        path = Path(args.out) / Path(name).with_suffix(f".{args.format}")
        path.parent.mkdir(parents=True, exist_ok=True)  # once the kind is known good
        path.write_bytes(figure_bytes(figure, args.format, args.dpi))
        out.print(str(path))
        written += 1
    if not written:
        out.print(f"{args.sweep}: no finished runs yet, no figures")
    return 0


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


def add_argument(parser: argparse.ArgumentParser, param: Param) -> None:
    """A declared parameter as an argument: ``--name-with-dashes`` (a positional: words after the
    sweep), its default, its type and bounds checked as it is read (``typed``), its choices."""
    help = param.help.replace("%", "%%")
    if param.positional:
        parser.add_argument(param.name, nargs="+", metavar=param.name.upper().removesuffix("S"), help=help)
        return
    kwargs = {"type": typed(param)} if param.type is not str else {}
    parser.add_argument("--" + param.name.replace("_", "-"), default=param.default, required=param.required,
                        choices=param.choices, help=help, **kwargs)


def typed(param: Param) -> Callable[[str], Any]:
    """``param``'s type as argparse reads a value: a number within its bounds, or an error naming why."""

    def read(text: str) -> Any:
        try:
            value = param.type(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"'{text}' is not {'a whole number' if param.type is int else 'a number'}") from None
        why = param.out_of_bounds(value)
        if why:
            raise argparse.ArgumentTypeError(why)
        return value

    return read


def _add_command(sub: argparse._SubParsersAction, command: Command, artifact_uris) -> None:
    question = command.question
    p = sub.add_parser(question.name, help=question.summary.replace("%", "%%"), description=command.description,
                       epilog=command.epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help=SWEEP_HELP)
    for param in question.params:
        add_argument(p, param)
    if any(param.positional for param in question.params):  # maps: '-heads.ablation_delta' is a map, flipped
        compare.maps_may_start_with_minus(p)
    p.add_argument("--format", default="table", help=f"one of {', '.join(command.formats)} (default: table)")
    p.add_argument("--out", help=OUT_HELP + (" (parquet: required)" if "parquet" in command.formats else ""))
    if command.png:
        p.add_argument("--png", help=f"also write the {command.png[0]} to this PNG file")
    p.add_argument("--where", help=WHERE_HELP)
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=partial(cmd_question, command), artifact_uris=artifact_uris)


def register(sub: argparse._SubParsersAction, artifact_uris=None) -> None:
    """Add the questions' commands, ``figures`` and ``serve`` to the main CLI; ``artifact_uris``: the run
    table's lookup of MLflow artifact URIs (``analysis.questions.run_table.ArtifactUris``; the main CLI
    passes ``headsweep.api.MlflowArtifacts``), for ``runs`` and ``serve``."""
    for command in COMMANDS:
        _add_command(sub, command, artifact_uris)
    p = sub.add_parser("figures", help=FIGURES.summary)
    p.add_argument("sweep", help=SWEEP_HELP)
    for param in (*FIGURES.params, FIGURE_FORMAT, FIGURE_DPI):
        add_argument(p, param)
    p.add_argument("--out", default="figs", help="folder for the files (default: figs)")
    p.add_argument("--where", help=WHERE_HELP)
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=cmd_figures)

    p = sub.add_parser("serve", help="the analysis HTTP service on Ray Serve (127.0.0.1)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=cmd_serve, artifact_uris=artifact_uris)
