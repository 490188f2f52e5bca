"""tagging: token tagging read from the user's own files (CoNLL-U, BIO, or an hf folder).

A run config::

    task:
      name: tagging
      train: data/train.conllu           # conllu, bio, or an hf save_to_disk folder (one format)
      dev: data/dev.conllu               # plain metric names: accuracy, loss
      eval_sets: {web: data/web.conllu}  # more evaluation files: accuracy/web, loss/web
      column: upos                       # CoNLL-U: upos (default), xpos, deprel, or any of its
                                         # 10 columns; hf: the tag column (default tags)
      text: tokens                       # hf only: the tokens column (default tokens)
      labels: [B-PER, I-PER, O]          # optional: tag ids in this order (default: train's, sorted)

BIO files hold one ``token tag`` per line and a blank line between sentences;
the tag is the last field. Paths resolve like the classification task's
(against ``task.data_dir``, else the current directory, at validation). The
first subword of each word carries its tag (a fast tokenizer is needed);
``max_train`` / ``max_eval`` count sentences. ``check`` gives the same
one-line errors as the classification task, cached by content hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.tasks import reads
from experiments.tasks.files import eval_set_names, file_task
from experiments.tasks.labels import read_labelled
from experiments.tasks.parts import (
    TaggingDecoder,
    TaskData,
    build_task_data,
    encode_words,
    tagging_accuracy,
)
from experiments.tasks.sources import (
    CONLLU_COLUMNS,
    Source,
    bio_sentences,
    conllu_sentences,
    file_sources,
    read_records,
    suggest,
)

VERSION = "1"
KIND = "tagging"
METRIC = "accuracy"
READS = reads.TAGGING  # the task.* keys it reads; any other set is refused

FORMATS = ("conllu", "bio", "hf")
DEFAULT_CONLLU_COLUMN = "upos"
DEFAULT_HF_TAGS, DEFAULT_HF_TOKENS = "tags", "tokens"


@dataclass(frozen=True)
class Spec:
    """Everything the task reads, resolved and hashable (see classification.Spec)."""

    sources: tuple[Source, ...]  # train, dev, then the evaluation sets; one format
    column: str | None  # CoNLL-U column name or hf tag column; None for BIO
    tokens: str | None = None  # hf tokens column
    labels: tuple[str, ...] | None = None  # tag values in id order; None = from train


@dataclass(frozen=True)
class Examples:
    """One file's sentences: words, tag strings per word, and each sentence's first line."""

    words: list[list[str]]
    tags: list[list[str]]
    lines: list[int]


def spec(cfg) -> Spec:
    """The Spec of a ``tagging`` task config; ValueError for keys that do not fit its files."""
    if getattr(cfg, "label", None) is not None:
        raise ValueError("task.label: the tagging task reads its tags from task.column")
    sources = file_sources(cfg, "tagging", FORMATS)
    formats = sorted({s.format for s in sources})
    if len(formats) > 1:
        raise ValueError(f"task.format: the files of a tagging task need one format, got {', '.join(formats)}")
    fmt, column = formats[0], cfg.column
    if fmt not in ("hf", "hub") and cfg.text is not None:
        raise ValueError(f"task.text: {fmt} files have a fixed word column; task.text is for hf datasets")
    labels = tuple(cfg.labels) if cfg.labels is not None else None
    if fmt == "bio":
        if column is not None:
            raise ValueError("task.column: BIO files have one tag column (the last field); leave task.column unset")
        return Spec(sources, None, labels=labels)
    if fmt in ("hf", "hub"):
        tokens = cfg.text if cfg.text is not None else DEFAULT_HF_TOKENS
        if not isinstance(tokens, str):
            raise ValueError(f"task.text: the tagging task reads one tokens column, got {list(tokens)}")
        return Spec(sources, column or DEFAULT_HF_TAGS, tokens, labels)
    column = (column or DEFAULT_CONLLU_COLUMN).lower()
    if column not in CONLLU_COLUMNS:
        raise ValueError(
            f"task.column: CoNLL-U has no column '{column}' (its columns: {', '.join(CONLLU_COLUMNS)})"
            f"{suggest(column, CONLLU_COLUMNS)}"
        )
    return Spec(sources, column, labels=labels)


def read_examples(source: Source, s: Spec) -> Examples:
    """The sentences of one file; ValueError for an empty file or a missing column."""
    if source.format == "conllu":
        index = CONLLU_COLUMNS.index(s.column)
        found = [(line, [r[1] for r in rows], [r[index] for r in rows]) for line, rows in conllu_sentences(source.role, source.path)]
    elif source.format == "bio":
        found = bio_sentences(source.role, source.path)
    else:
        found = _hf_sentences(source, s.tokens, s.column)
    if not found:
        raise ValueError(f"task.{source.role}: {source.path} has no sentences")
    return Examples([w for _, w, _ in found], [t for _, _, t in found], [line for line, _, _ in found])


def _hf_sentences(source: Source, tokens: str, column: str) -> list[tuple[int, list[str], list[str]]]:
    records = read_records(source)
    for key, name in (("text", tokens), ("column", column)):
        if records.rows and name not in records.columns:
            raise ValueError(
                f"task.{key}: no column '{name}' in {source.path} (its columns: "
                f"{', '.join(records.columns)}){suggest(name, records.columns)}"
            )
    found = []
    for row, line in zip(records.rows, records.lines, strict=True):
        words, tags = row[tokens], row[column]
        if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags):
            raise ValueError(f"task.{source.role}: {source.path} row {line}: '{tokens}' and '{column}' must be lists of the same length")
        found.append((line, [str(w) for w in words], [str(t) for t in tags]))
    return found


def _tag_lines(examples: Examples):
    """(tag, sentence line) for every word: what the label checks walk."""
    return ((tag, line) for tags, line in zip(examples.tags, examples.lines, strict=True) for tag in tags)


def read_all(s: Spec) -> tuple[dict[str, Examples], tuple[str, ...]]:
    """Every file's sentences by role, and the tag values in id order; all checks included."""
    return read_labelled(s.sources, lambda source: read_examples(source, s), _tag_lines, s.labels)


def load_spec(s: Spec, cfg, tokenizer) -> TaskData:
    """Read, check, subset (max_train / max_eval sentences from data_seed) and tokenise."""
    examples, values = read_all(s)
    ids = {value: i for i, value in enumerate(values)}

    def read_split(role: str) -> tuple[list[list[str]], list[list[int]]]:
        return examples[role].words, [[ids[t] for t in tags] for tags in examples[role].tags]

    return build_task_data(cfg, tokenizer, read_split, encode_words, values, eval_set_names(s.sources))


check, load, fingerprint = file_task(spec, read_all, load_spec)  # the first subword carries the tag


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = tagging_accuracy  # (logits, labels) -> {'accuracy': ...}
