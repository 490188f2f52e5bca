"""classification: text (or text-pair) classification read from the user's own files.

A run config::

    task:
      name: classification
      train: data/train.csv          # tsv, csv, jsonl, or an hf save_to_disk folder
      dev: data/dev.csv              # plain metric names: accuracy, loss
      eval_sets: {ood: data/ood.csv} # more evaluation files: accuracy/ood, loss/ood
      text: sentence                 # one column, or a pair: [premise, hypothesis] (default: text)
      label: label                   # the label column (default: label)
      labels: [neg, neu, pos]        # optional: label ids in this order (default: train's, sorted)
      format: csv                    # optional: default from each file's extension

Relative paths are resolved once, when the config is validated, against
``task.data_dir`` if given, else the current directory (so Ray workers running
in other folders read the same files). Text is stripped of surrounding
whitespace. ``max_train`` / ``max_eval`` draw random subsets from ``data_seed``
(each evaluation set its own draw). Built-in tasks such as sst2 are a fixed
:class:`Spec` over the same code.

``check`` runs at submit: missing file, unknown format, missing column, empty
file, a label outside ``task.labels``, an evaluation label never seen in train
and undecodable text each give a one-line ValueError. A grid of many cells over
the same files reads them once: checks are cached by the files' content hash.

Bias features (for a bias-only model, method ``bias_only``), text pairs only: the
shallow cues NLI models are known to lean on, from the pair's lower-cased words
(``[a-z0-9']+``), first text = premise, second = hypothesis:

- ``all_in_premise``: every hypothesis word occurs in the premise (the lexical-overlap
  heuristic of McCoy et al. 2019; a feature of Clark et al. 2019's HANS bias model);
- ``subsequence``: the hypothesis is a contiguous word subsequence of the premise;
- ``overlap``: the fraction of hypothesis words that occur in the premise;
- ``negation``: the hypothesis holds a negation word (``NEGATIONS`` or ``*n't``:
  Gururangan et al. 2018's annotation artefact);
- ``log_length_ratio``: log((1 + hypothesis words) / (1 + premise words));
- ``hyp:<k>`` for k < ``HYPOTHESIS_BUCKETS``: hypothesis-only bag of words, each word
  hashed (crc32) into one of 128 buckets, 1 where a bucket's word occurs (no vocabulary,
  so every split and file gets the same columns).

A single-text config defines none (a bag of words of the only text is a classifier, not a bias).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import torch

from experiments.tasks import reads
from experiments.tasks.files import eval_set_names, file_task
from experiments.tasks.labels import read_labelled
from experiments.tasks.parts import (
    ClassificationDecoder,
    TaskData,
    build_task_data,
    classification_accuracy,
    encode_sentences,
)
from experiments.tasks.sources import Source, as_label, file_sources, read_records, suggest

VERSION = "1"
KIND = "classification"
METRIC = "accuracy"
READS = reads.CLASSIFICATION  # the task.* keys it reads; any other set is refused

FORMATS = ("tsv", "csv", "jsonl", "hf")
DEFAULT_TEXT = "text"
DEFAULT_LABEL = "label"


@dataclass(frozen=True)
class Spec:
    """Everything the task reads, resolved: hashable, so checks can be cached per spec and content."""

    sources: tuple[Source, ...]  # train, dev, then the evaluation sets
    text: tuple[str, ...]  # one text column, or two for a pair
    label: str
    labels: tuple[str, ...] | None = None  # label values in id order; None = from train
    names: tuple[str, ...] | None = None  # names shown for those ids (sst2: negative, positive)


@dataclass(frozen=True)
class Examples:
    """One file's examples: texts (str, or (first, second) pairs), label strings, file lines."""

    texts: list
    labels: list[str]
    lines: list[int]


NEGATIONS = frozenset({"not", "no", "never", "nobody", "nothing", "none", "neither", "nor", "nowhere", "cannot"})
HYPOTHESIS_BUCKETS = 128
PAIR_FEATURES = ("all_in_premise", "subsequence", "overlap", "negation", "log_length_ratio")
_WORD = re.compile(r"[a-z0-9']+")


def spec(cfg) -> Spec:
    """The Spec of a ``classification`` task config; ValueError for keys that do not apply."""
    if getattr(cfg, "column", None) is not None:
        raise ValueError("task.column: only the tagging task reads task.column; the label column is task.label")
    text = cfg.text if cfg.text is not None else DEFAULT_TEXT
    text = (text,) if isinstance(text, str) else tuple(text)
    if len(text) not in (1, 2):
        raise ValueError(f"task.text: one text column or two (a pair), got {list(text)}")
    labels = tuple(cfg.labels) if cfg.labels is not None else None
    return Spec(file_sources(cfg, "classification", FORMATS), text, cfg.label or DEFAULT_LABEL, labels)


def read_examples(source: Source, text: tuple[str, ...], label: str) -> Examples:
    """The examples of one file; ValueError for an empty file, a missing column or a missing value."""
    records = read_records(source)
    if not records.rows:
        raise ValueError(f"task.{source.role}: {source.path} has no examples")
    for key, column in [("text", c) for c in text] + [("label", label)]:
        if column not in records.columns:
            headerless = ("; if its first row is an example, not a header, name the columns with "
                          "task.columns, e.g. [label, text]") if source.format in ("tsv", "csv") and source.columns is None else ""
            raise ValueError(
                f"task.{key}: no column '{column}' in {source.path} (its columns: "
                f"{', '.join(records.columns)}){suggest(column, records.columns)}{headerless}"
            )
    texts, labels = [], []
    for row, line in zip(records.rows, records.lines, strict=True):
        for column in (*text, label):
            if row.get(column) is None or (column == label and as_label(row[column]) == ""):
                raise ValueError(f"task.{source.role}: {source.path} line {line} has no value in column '{column}'")
        values = tuple(str(row[c]).strip() for c in text)
        texts.append(values if len(values) == 2 else values[0])
        labels.append(as_label(row[label]))
    return Examples(texts, labels, records.lines)


def read_all(s: Spec) -> tuple[dict[str, Examples], tuple[str, ...]]:
    """Every file's examples by role, and the label values in id order; all checks included."""
    return read_labelled(s.sources, lambda source: read_examples(source, s.text, s.label), _label_lines, s.labels)


def _label_lines(examples: Examples):
    """(label, line) of every example: what the label checks walk."""
    return zip(examples.labels, examples.lines, strict=True)


def load_spec(s: Spec, cfg, tokenizer) -> TaskData:
    """Read, check, subset (max_train / max_eval from data_seed) and tokenise every file of ``s``."""
    examples, values = read_all(s)
    ids = {value: i for i, value in enumerate(values)}

    def read_split(role: str) -> tuple[list, list[int]]:
        return examples[role].texts, [ids[label] for label in examples[role].labels]

    features = pair_features if len(s.text) == 2 else None
    return build_task_data(cfg, tokenizer, read_split, encode_sentences, s.names or values, eval_set_names(s.sources),
                           features)


check, load, fingerprint = file_task(spec, read_all, load_spec)  # pairs load as one sequence pair


build_decoder = ClassificationDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = classification_accuracy  # (logits, labels) -> {'accuracy': ...}


# --------------------------------------------------------------------------- bias features


def bias_feature_names(cfg) -> tuple[str, ...]:
    """The pair features (module docstring); ValueError naming ``task.text`` for one text column."""
    text = cfg.text if cfg.text is not None else DEFAULT_TEXT
    if isinstance(text, str) or len(text) != 2:
        raise ValueError(f"task.text: task '{cfg.name}' defines bias features only for text pairs "
                         f"(text: [premise, hypothesis]); this config reads one text column")
    return PAIR_FEATURES + tuple(f"hyp:{k}" for k in range(HYPOTHESIS_BUCKETS))


def bias_features(cfg, texts: list[tuple[str, str]]) -> torch.Tensor:
    """(N, 5 + HYPOTHESIS_BUCKETS) float32 features of (premise, hypothesis) pairs."""
    bias_feature_names(cfg)  # one text column: the same ValueError
    return pair_features(texts)


def pair_features(texts: list[tuple[str, str]]) -> torch.Tensor:
    """(N, 5 + HYPOTHESIS_BUCKETS) float32: ``PAIR_FEATURES`` then the hashed hypothesis words."""
    rows = []
    for premise, hypothesis in texts:
        p, h = _WORD.findall(premise.lower()), _WORD.findall(hypothesis.lower())
        seen = set(p)
        inside = sum(word in seen for word in h)
        bag = [0.0] * HYPOTHESIS_BUCKETS
        for word in h:
            bag[zlib.crc32(word.encode()) % HYPOTHESIS_BUCKETS] = 1.0
        rows.append([
            float(bool(h) and inside == len(h)),
            float(bool(h) and any(p[j : j + len(h)] == h for j in range(len(p) - len(h) + 1))),
            inside / len(h) if h else 0.0,
            float(any(word in NEGATIONS or word.endswith("n't") for word in h)),
            math.log((1 + len(h)) / (1 + len(p))),
            *bag,
        ])
    return torch.tensor(rows, dtype=torch.float32).reshape(len(texts), len(PAIR_FEATURES) + HYPOTHESIS_BUCKETS)
