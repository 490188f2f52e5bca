"""Where a file task's examples come from: paths, formats, content hashes and readers.

Formats (``task.format``, or from each file's extension; a folder is ``hf``):

- ``tsv``: tab-separated with a header row, read WITHOUT quoting (every tab
  separates, as in GLUE files, so a ``"`` inside a sentence is just a character).
- ``csv``: comma-separated with a header row, standard (RFC 4180) quoting.
- ``jsonl``: one JSON object per line (blank lines skipped); the first object's
  keys are the columns.
- ``conllu``: CoNLL-U (10 tab-separated columns per word; comments, multiword
  ranges and empty nodes skipped).
- ``bio``: one token per line with its tag as the last whitespace-separated
  field (two-column BIO; CoNLL-2003's four columns work too), a blank line
  between sentences, ``-DOCSTART-`` lines skipped.
- ``hf``: a folder written by ``datasets.Dataset.save_to_disk`` (one split; for
  a ``DatasetDict`` point at ``<folder>/<split>``). Needs the ``datasets``
  package (not a dependency); ``ClassLabel`` columns are read as their names.

Every problem is a one-line ValueError naming the config key, the file and,
where there is one, the line. Text files are UTF-8 (a BOM is dropped).
Nothing here imports torch: the checks run at submit time.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.naming import suggest

FORMATS = ("tsv", "csv", "jsonl", "conllu", "bio", "hf")
_EXTENSIONS = {
    ".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".conllu": "conllu", ".bio": "bio", ".iob": "bio", ".iob2": "bio",
}  # fmt: skip
CONLLU_COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")


@dataclass(frozen=True)
class Source:
    """One file a task reads: its role (``train``, ``dev``, ``eval_sets.ood``), absolute path, format.

    ``columns``: the column names of a tsv/csv file without a header row (``task.columns``).
    A Hugging Face dataset by name (``task.hf``) is format ``hub``: ``path`` is its name (or a
    local dataset folder ``datasets.load_dataset`` reads), ``config`` its configuration and
    ``split`` the split this role reads (``train``, ``validation``)."""

    role: str
    path: str
    format: str
    columns: tuple[str, ...] | None = None
    config: str | None = None
    split: str | None = None


# --------------------------------------------------------------------------- paths and formats


RELATIVE = " (a relative path is resolved against task.data_dir, else the current directory)"
"""What a missing file's message adds: where a relative path was looked for (not the grid file's folder)."""


def resolve_path(path: str, data_dir: str | None) -> str:
    """Absolute path: ``~`` expanded, a relative path taken against ``data_dir`` (else the current
    directory). Idempotent, so resolving an already validated config again changes nothing."""
    base = Path(data_dir).expanduser() if data_dir else Path(".")
    return os.path.abspath(base / Path(path).expanduser())


def file_format(role: str, path: str, declared: str | None, allowed: tuple[str, ...], task: str) -> str:
    """The format of one file: ``declared`` (``task.format``) if given, else from its extension
    (a folder is ``hf``). A missing path fails first, naming it."""
    if not os.path.exists(path):
        raise ValueError(f"task.{role}: no such file: {path}{RELATIVE}")
    if declared is not None:
        if declared not in FORMATS:
            raise ValueError(
                f"task.format: unknown format '{declared}' (known: {', '.join(FORMATS)}){suggest(declared, FORMATS)}"
            )
        fmt = declared
    elif os.path.isdir(path):
        fmt = "hf"
    else:
        ext = Path(path).suffix.lower()
        if ext not in _EXTENSIONS:
            raise ValueError(
                f"task.{role}: cannot tell the format of {path} from its extension '{ext}'; "
                f"set task.format to one of {', '.join(allowed)}"
            )
        fmt = _EXTENSIONS[ext]
    if fmt not in allowed:
        other = "tagging" if task == "classification" else "classification"
        raise ValueError(
            f"task.{role}: {path} is {fmt}, the {task} task reads {', '.join(allowed)} "
            f"(a {fmt} file belongs to the {other} task?)"
        )
    return fmt


def require(source: Source) -> None:
    """ValueError naming the key and the path when a source is not there (a hub dataset is
    checked when it loads)."""
    if source.format == "hub":
        return
    exists = os.path.isdir(source.path) if source.format == "hf" else os.path.isfile(source.path)
    if not exists:
        kind = "folder" if source.format == "hf" else "file"
        raise ValueError(f"task.{source.role}: no such {kind}: {source.path}{RELATIVE}")


def eval_set_items(cfg) -> list[tuple[str, str]]:
    """(name, path) of each extra evaluation set, sorted by name (a dict or pairs in the config)."""
    sets = getattr(cfg, "eval_sets", None) or {}
    return sorted(dict(sets).items())


def file_sources(cfg, task: str, formats: tuple[str, ...]) -> tuple[Source, ...]:
    """Train, dev and evaluation-set sources of a file task's config: files (paths made absolute),
    or the splits of a Hugging Face dataset named by ``task.hf``."""
    hub = getattr(cfg, "hf", None)
    roles = [("train", cfg.train), ("dev", cfg.dev)]
    for role, path in roles:
        if path is None:
            what = "split names, e.g. train and validation" if hub else "paths to your files"
            raise ValueError(f"task.{role}: the {task} task needs task.train and task.dev ({what})")
    roles += [(f"eval_sets.{name}", path) for name, path in eval_set_items(cfg)]
    columns = getattr(cfg, "columns", None)
    if hub:
        if columns is not None or cfg.format is not None:
            key = "columns" if columns is not None else "format"
            raise ValueError(f"task.{key}: a dataset named by task.hf has its own columns and format; drop task.{key}")
        return tuple(Source(role, hub, "hub", config=getattr(cfg, "hf_config", None), split=split)
                     for role, split in roles)
    sources = []
    for role, path in roles:
        absolute = resolve_path(path, cfg.data_dir)
        fmt = file_format(role, absolute, cfg.format, formats, task)
        if columns is not None and fmt not in ("tsv", "csv"):
            raise ValueError(f"task.columns: names the columns of tsv/csv files without a header row; "
                             f"task.{role} is {fmt}")
        sources.append(Source(role, absolute, fmt, columns=columns))
    return tuple(sources)


# --------------------------------------------------------------------------- content hashes

_DIGESTS: dict[tuple[str, int, int], str] = {}
"""sha256 of a file's bytes by (path, size, mtime_ns): a grid of 10,000 cells hashes each file once."""


def file_digest(path: str) -> str:
    """sha256 hex of one file's bytes, cached while its size and mtime stay the same."""
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
        _DIGESTS[key] = sha.hexdigest()
    return _DIGESTS[key]


def source_digest(source: Source) -> str:
    """Digest of a file, of every file under an ``hf`` folder (relative names included), or a hub
    dataset's own content fingerprint (``datasets``' cache key of the loaded split)."""
    require(source)
    if source.format == "hub":
        return _load_hub(source)._fingerprint
    if source.format != "hf":
        return file_digest(source.path)
    root = Path(source.path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    parts = [f"{p.relative_to(root).as_posix()}:{file_digest(str(p))}" for p in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def fingerprint_sources(sources: Iterable[Source]) -> str:
    """Content hash of everything a task reads: each role with its file's sha256 (16 hex)."""
    material = "\n".join(f"{s.role}={source_digest(s)}" for s in sources)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- tables


def read_text(role: str, path: str) -> str:
    """A UTF-8 text file's contents; ValueError naming the line of the first undecodable byte."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(
            f"task.{role}: {path} line {line} is not UTF-8 text (byte 0x{data[err.start]:02x}); save it as UTF-8"
        ) from None


@dataclass(frozen=True)
class Records:
    """The rows of a table file: ``columns`` in file order, one dict per row, the row's line."""

    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    lines: list[int]  # file line (or dataset row, 1-based) of each row, for error messages


def read_records(source: Source) -> Records:
    """Rows of a tsv, csv, jsonl or hf source."""
    require(source)
    if source.format == "hf":
        return _read_hf(source)
    if source.format == "hub":
        return _records_of(_load_hub(source))
    text = read_text(source.role, source.path)
    if source.format == "jsonl":
        return _read_jsonl(source, text)
    if source.format == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    columns = source.columns if source.columns is not None else tuple(next(reader, ()))
    named = "task.columns names" if source.columns is not None else "its header has"
    rows, lines = [], []
    for fields in reader:
        if not fields:  # a blank line
            continue
        if len(fields) != len(columns):
            raise ValueError(
                f"task.{source.role}: {source.path} line {reader.line_num} has {len(fields)} fields, "
                f"{named} {len(columns)}"
            )
        rows.append(dict(zip(columns, fields, strict=True)))
        lines.append(reader.line_num)
    return Records(columns, rows, lines)


def _read_jsonl(source: Source, text: str) -> Records:
    rows, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"task.{source.role}: {source.path} line {number} is not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"task.{source.role}: {source.path} line {number} is not a JSON object")
        rows.append(row)
        lines.append(number)
    return Records(tuple(rows[0]) if rows else (), rows, lines)


def _datasets(source: Source):
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"task.{source.role}: reading {source.path} needs the 'datasets' package (pip install datasets)"
        ) from None
    return datasets


def _read_hf(source: Source) -> Records:
    datasets = _datasets(source)
    data = datasets.load_from_disk(source.path)
    if isinstance(data, datasets.DatasetDict):
        raise ValueError(
            f"task.{source.role}: {source.path} holds a DatasetDict (splits: {', '.join(data)}); "
            f"point at one split's folder, e.g. {source.path}/{next(iter(data), 'train')}"
        )
    return _records_of(data)


_HUB: dict[Source, Any] = {}
"""Loaded hub splits by source: a grid's cells check and fingerprint each split once."""


def _load_hub(source: Source):
    """One split of a dataset named by ``task.hf`` (``datasets.load_dataset``, cached on disk by
    ``datasets``); ValueError naming the key and why it could not load (offline, unknown name,
    config or split)."""
    if source not in _HUB:
        datasets = _datasets(source)
        what = f"'{source.path}'" + (f" (config '{source.config}')" if source.config else "")
        try:
            _HUB[source] = datasets.load_dataset(source.path, source.config, split=source.split)
        except Exception as err:  # noqa: BLE001 (datasets raises many kinds; the message says which)
            reason = " ".join(str(err).split()) or type(err).__name__
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
            hint = (" (HF_HUB_OFFLINE is set: only datasets already in the cache load; unset it where "
                    "the hub is reachable, or point task.train/dev at files)") if offline else ""
            raise ValueError(f"task.{source.role}: cannot load split '{source.split}' of the dataset "
                             f"{what}: {reason[:300]}{hint}") from None
    return _HUB[source]


def _records_of(data) -> Records:
    """A ``datasets.Dataset``'s rows, ``ClassLabel`` ids read as their names (also inside sequences)."""
    rows = data.to_list()
    for name, feature in data.features.items():
        names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
        if names:
            for row in rows:
                value = row[name]
                row[name] = [names[v] for v in value] if isinstance(value, list) else names[value]
    return Records(tuple(data.column_names), rows, list(range(1, len(rows) + 1)))


def as_label(value: Any) -> str:
    """A label as a string: strings stripped, other JSON/YAML values as JSON (1 -> '1', true -> 'true')."""
    return value.strip() if isinstance(value, str) else json.dumps(value)


# --------------------------------------------------------------------------- tagged sentences


def read_conllu(path: str | Path, role: str = "train") -> list[list[list[str]]]:
    """Sentences of word rows (the 10 columns as strings); see :func:`conllu_sentences`."""
    return [rows for _, rows in conllu_sentences(role, str(path))]


def conllu_sentences(role: str, path: str) -> list[tuple[int, list[list[str]]]]:
    """(first line, word rows) of every sentence of a CoNLL-U file.

    Comment lines, multiword-token ranges (id ``3-4``) and empty nodes (id ``8.1``)
    are skipped, so row i of a sentence is word id i + 1 and HEAD indices stay valid.
    """
    sentences: list[tuple[int, list[list[str]]]] = []
    words: list[list[str]] = []
    start = 0
    for number, line in enumerate(read_text(role, path).splitlines(), start=1):
        if not line.strip():
            if words:
                sentences.append((start, words))
                words = []
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != len(CONLLU_COLUMNS):
            raise ValueError(f"task.{role}: {path} line {number} has {len(cols)} tab-separated columns, CoNLL-U has 10")
        if "-" in cols[0] or "." in cols[0]:
            continue
        if not words:
            start = number
        words.append(cols)
    if words:
        sentences.append((start, words))
    return sentences


def bio_sentences(role: str, path: str) -> list[tuple[int, list[str], list[str]]]:
    """(first line, tokens, tags) of every sentence of a BIO file (token first, tag last)."""
    sentences: list[tuple[int, list[str], list[str]]] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    for number, line in enumerate(read_text(role, path).splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if tokens:
                sentences.append((start, tokens, tags))
                tokens, tags = [], []
            continue
        if len(fields) < 2:
            raise ValueError(f"task.{role}: {path} line {number} has no tag (expected 'token<space or tab>tag')")
        if not tokens:
            start = number
        tokens.append(fields[0])
        tags.append(fields[-1])
    if tokens:
        sentences.append((start, tokens, tags))
    return sentences
