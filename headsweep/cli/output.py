"""How the questions' commands write their answers: ``--format`` and ``--out`` checked, rows as csv,
json or parquet, JSON, and the number formats of their tables."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from base.naming import suggest
from base.sections import ConfigError

ROW_FORMATS = ("table", "csv", "parquet", "json")
"""The run table's and results' formats (rows, whatever the format)."""
ANSWER_FORMATS = ("table", "csv", "json")
"""The other questions' formats: the table, the answer's rows as csv, the answer as JSON."""
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
OUT_HELP = "write the answer (--format csv or json) to this file instead of stdout"


def cell(value: Any) -> str:
    """A table cell: four significant digits; ``-`` for a label the run has no value for (a fine-tune's pipeline)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt2(value: float | None) -> str:
    """Two significant digits (a spread needs no more)."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.2g}"


def write_rows(rows: list[dict[str, Any]], fmt: str, path: str | None, columns: list[str] | None = None) -> None:
    """``rows`` as parquet (to ``path``), json or csv (to ``path``, or stdout without one); ``columns``:
    their order (default: the first row's keys)."""
    columns = list(columns if columns is not None else rows[0] if rows else [])
    if fmt == "parquet":
        import pandas as pd

        pd.DataFrame(rows, columns=columns).to_parquet(path, index=False)
        return
    if fmt == "json":
        text = json.dumps(rows, indent=1) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    _write(text, path)


def write_json(value: Any, path: str | None) -> None:
    """``value`` as indented JSON to ``path``, or stdout without one."""
    _write(json.dumps(value, indent=2) + "\n", path)


def _write(text: str, path: str | None) -> None:
    if path:
        Path(path).write_text(text)
    else:
        sys.stdout.write(text)


def check_output(args: argparse.Namespace, formats: tuple[str, ...]) -> None:
    """``--format`` one of ``formats``; ``--out FILE`` (the answer as data, instead of stdout: csv, json,
    parquet) never with the terminal's table, never a figure (that is ``--png``)."""
    if args.format not in formats:
        raise ConfigError(f"--format: unknown format '{args.format}'{suggest(args.format, formats)} "
                          f"(formats: {', '.join(formats)})")
    if args.format == "parquet" and not args.out:
        raise ConfigError("--format parquet writes a binary file: give --out FILE.parquet")
    if args.out and Path(args.out).suffix.lower() in FIGURE_SUFFIXES:
        png = f" --png {args.out}" if hasattr(args, "png") else " none (`headsweep figures` draws them)"
        raise ConfigError(f"--out writes the answer as data (--format {'|'.join(f for f in formats if f != 'table')}); "
                          f"'{args.out}' is a figure's name; this command's figure:{png}")
    if args.out and args.format == "table":
        raise ConfigError(f"--out {args.out}: give --format {'|'.join(f for f in formats if f != 'table')} "
                          "(the table is for the terminal)")


def fmt3(value: float | None) -> str:
    """Three decimals; ``-`` for a missing or undefined value."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def signed(value: float | None) -> str:
    """Three decimals with their sign (an excess over chance); ``-`` for a missing value."""
    return "-" if value is None else f"{value:+.3f}"


def null_cells(null: dict[str, Any]) -> list[str]:
    """One null of a tested statistic (``answers.null_summaries``) as table cells: how the units were
    shuffled, chance (the null's mean), its 95 % band, the excess over it and p."""
    return ["in layers" if null["null"] == "within_layers" else "all units", fmt3(null["null_mean"]),
            f"{fmt3(null['band_lo'])}..{fmt3(null['band_hi'])}", signed(null["excess"]), null["p_text"]]
