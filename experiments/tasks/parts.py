"""The parts the task modules are built from: data containers, data location, readers,
random subsets, tokenisation, the two decoders and accuracy, and the glue of the
generated tasks (``generated_task``).

Every task module is a plain module over these functions; nothing here knows
about a particular task. Others read them too: the driver's job its data root
(``default_data_dir``), probing the UD folder.
"""

from __future__ import annotations

import csv
import os
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.tasks.sources import read_conllu  # noqa: F401 (re-exported: readers live in sources)

IGNORE_INDEX = -100
"""Label of a token that is not scored (special tokens, padding, non-first subwords)."""

DEFAULT_DROPOUT = 0.1

_REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class Split:
    """One tokenised split of a task.

    input_ids: (N, T) long token ids, right-padded.
    attention_mask: (N, T) long, 1 on real tokens.
    labels: (N,) long for classification; (N, T) long for tagging, with
        IGNORE_INDEX (-100) on positions that are not scored.
    features: (N, F) float32 hand-crafted bias features of each example (the task's
        ``bias_features``, read from the raw text before tokenisation), or None when the
        task defines none for this config (see experiments.tasks.bias_feature_names).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    features: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.input_ids.shape != self.attention_mask.shape or self.input_ids.dim() != 2:
            raise ValueError(
                f"input_ids {tuple(self.input_ids.shape)} and attention_mask "
                f"{tuple(self.attention_mask.shape)} must both be (N, T)"
            )
        if self.labels.shape[:1] != self.input_ids.shape[:1]:
            raise ValueError(
                f"labels {tuple(self.labels.shape)} do not match N={self.input_ids.shape[0]}"
            )
        if self.labels.dim() == 2 and self.labels.shape != self.input_ids.shape:
            raise ValueError(
                f"tagging labels {tuple(self.labels.shape)} must be (N, T) = "
                f"{tuple(self.input_ids.shape)}"
            )
        if self.features is not None and (self.features.dim() != 2 or self.features.shape[0] != self.input_ids.shape[0]):
            raise ValueError(
                f"features {tuple(self.features.shape)} must be (N, F) with N={self.input_ids.shape[0]}"
            )

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class TaskData:
    """What a task's `load` returns: train and dev splits, the label set, and any extra
    named evaluation splits (their metrics are reported as ``<metric>/<name>``)."""

    train: Split
    dev: Split
    num_labels: int
    label_names: tuple[str, ...]
    eval_sets: dict[str, Split] = field(default_factory=dict)


# --------------------------------------------------------------------------- data location


def default_data_dir() -> Path:
    """`$HEADSWEEP_DATA` if set, else `<repo root>/../shared/data`."""
    env = os.environ.get("HEADSWEEP_DATA")
    return Path(env) if env else _REPO_ROOT.parent / "shared" / "data"


def task_data_dir(cfg, subdir: str) -> Path:
    """The folder holding a task's files: `<cfg.data_dir or default>/<subdir>`."""
    base = Path(cfg.data_dir) if cfg.data_dir is not None else default_data_dir()
    return base / subdir


def require_files(task: str, directory: Path, names: Sequence[str]) -> None:
    """Raise FileNotFoundError naming the first missing file and where it was looked for."""
    for name in names:
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"task '{task}': {name} not found in {directory} "
                "(set the task's data_dir or $HEADSWEEP_DATA)"
            )


def check_synthetic_sizes(cfg) -> None:
    """Validate the sizes of a generated task (cheap, for submit time)."""
    for key in ("num_train", "num_eval"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"task '{cfg.name}': {key} must be a positive int, got {value!r}")


# --------------------------------------------------------------------------- readers


def read_glue_tsv(path: Path, text_column: str, label_column: str) -> tuple[list[str], list[str]]:
    """Read a GLUE-style TSV with a header row; returns (texts, raw label strings).

    Quotes are not special in GLUE files (QUOTE_NONE); surrounding whitespace
    of the text is stripped (SST-2 phrases end with a space).
    """
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = {text_column, label_column} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"{path}: no column(s) {sorted(missing)} in header {reader.fieldnames}"
            )
        for row in reader:
            texts.append(row[text_column].strip())
            labels.append(row[label_column].strip())
    return texts, labels


# --------------------------------------------------------------------------- subsets


def split_seed(data_seed: int, split: str) -> int:
    """A seed for one split derived from data_seed, so train and dev draw independently."""
    return zlib.crc32(f"{data_seed}:{split}".encode())


def subset_indices(n: int, limit: int | None, data_seed: int, split: str) -> list[int]:
    """Indices of a random subset of `limit` out of `n` items (all if limit is None or >= n).

    Drawn with a torch.Generator seeded from (data_seed, split); returned in
    file order so a subset reads like the file.
    """
    if limit is None or limit >= n:
        return list(range(n))
    if limit < 0:
        raise ValueError(f"subset size must be >= 0, got {limit}")
    gen = torch.Generator().manual_seed(split_seed(data_seed, split))
    return sorted(torch.randperm(n, generator=gen)[:limit].tolist())


# --------------------------------------------------------------------------- tokenisation


def encode_sentences(
    tokenizer, texts: Sequence[str] | Sequence[tuple[str, str]], labels: Sequence[int], max_length: int
) -> Split:
    """Tokenise sentences for classification: truncate to max_length, pad to the longest.

    ``texts`` holds strings, or (first, second) pairs encoded as one sequence pair
    (``[CLS] a [SEP] b [SEP]``, the longer text truncated first).
    """
    if texts and isinstance(texts[0], tuple):
        firsts, seconds = (list(part) for part in zip(*texts, strict=True))
        enc = tokenizer(
            firsts, seconds, truncation=True, max_length=max_length, padding="longest", return_tensors="pt"
        )
    else:
        enc = tokenizer(
            list(texts), truncation=True, max_length=max_length, padding="longest", return_tensors="pt"
        )
    return Split(
        input_ids=enc["input_ids"].long(),  # (N, T)
        attention_mask=enc["attention_mask"].long(),  # (N, T)
        labels=torch.tensor(list(labels), dtype=torch.long),  # (N,)
    )


def encode_words(
    tokenizer, words: Sequence[Sequence[str]], tags: Sequence[Sequence[int]], max_length: int
) -> Split:
    """Tokenise pre-split words for tagging.

    The first subword of each word carries the word's tag; later subwords,
    special tokens and padding get IGNORE_INDEX. Words cut off by max_length are
    not scored. Needs a fast tokenizer (`word_ids()`).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tagging tasks need a fast tokenizer (word_ids())")
    enc = tokenizer(
        [list(w) for w in words],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        padding="longest",
        return_tensors="pt",
    )
    labels = torch.full_like(enc["input_ids"], IGNORE_INDEX)  # (N, T)
    for i, sentence_tags in enumerate(tags):
        previous = None
        for t, word in enumerate(enc.word_ids(i)):
            if word is not None and word != previous:
                labels[i, t] = sentence_tags[word]
            previous = word
    return Split(
        input_ids=enc["input_ids"].long(),
        attention_mask=enc["attention_mask"].long(),
        labels=labels,
    )


# --------------------------------------------------------------------------- decoders


class ClassificationDecoder(nn.Module):
    """Dropout + linear on the first token's ([CLS]) hidden state."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = DEFAULT_DROPOUT):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # hidden_states (B, T, Hd) -> logits (B, C); the mask is unused: [CLS] is always real.
        return self.classifier(self.dropout(hidden_states[:, 0]))


class TaggingDecoder(nn.Module):
    """Dropout + linear on every token's hidden state."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = DEFAULT_DROPOUT):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # hidden_states (B, T, Hd) -> logits (B, T, C); padding is masked out by the labels.
        return self.classifier(self.dropout(hidden_states))


# --------------------------------------------------------------------------- metrics


def classification_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy of argmax over (N, C) logits against (N,) labels."""
    correct = logits.detach().argmax(dim=-1) == labels  # (N,)
    return {"accuracy": correct.double().mean().item()}


def tagging_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Token accuracy of (N, T, C) logits against (N, T) labels, ignoring IGNORE_INDEX.

    NaN when no position is scored.
    """
    scored = labels != IGNORE_INDEX  # (N, T)
    correct = (logits.detach().argmax(dim=-1) == labels) & scored
    num_scored = int(scored.sum())
    if num_scored == 0:
        return {"accuracy": float("nan")}
    return {"accuracy": int(correct.sum()) / num_scored}


def generate_tagged(make_example: Callable, n: int, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    """``n`` sentences of ``make_example(rng) -> (words, tag ids)``, drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    examples = [make_example(rng) for _ in range(n)]
    return [w for w, _ in examples], [t for _, t in examples]


def load_generated(cfg, tokenizer, generate: Callable, encode, label_names: tuple[str, ...]) -> TaskData:
    """A generated task's splits: ``generate(n, seed)`` num_train / num_eval examples, each split
    from its own seed of ``data_seed``, then subset and tokenised as ``build_task_data`` does."""
    sizes = {"train": cfg.num_train, "dev": cfg.num_eval}
    return build_task_data(
        cfg, tokenizer, lambda split: generate(sizes[split], split_seed(cfg.data_seed, split)), encode, label_names,
    )


def no_fingerprint(cfg) -> None:
    """A generated task's fingerprint: None, it reads no files (data_seed and the sizes are in the config)."""
    return None


def generated_task(
    generate: Callable, encode: Callable, label_names: tuple[str, ...],
) -> tuple[Callable[[Any], None], Callable[[Any, Any], TaskData], Callable[[Any], None]]:
    """The task contract's ``check``, ``load`` and ``fingerprint`` of a task that generates its
    train and dev data: ``generate(n, seed) -> (inputs, labels)``, tokenised by ``encode``
    (``encode_sentences`` or ``encode_words``); see ``load_generated``."""

    def load(cfg, tokenizer) -> TaskData:
        """Generate num_train / num_eval examples from data_seed, subset, tokenise."""
        check_synthetic_sizes(cfg)
        return load_generated(cfg, tokenizer, generate, encode, label_names)

    return check_synthetic_sizes, load, no_fingerprint


def build_task_data(
    cfg, tokenizer, read_split, encode, label_names: tuple[str, ...], eval_sets: Sequence[str] = (),
    features: Callable[[list], torch.Tensor] | None = None,
) -> TaskData:
    """The splits of a task: ``read_split(split) -> (inputs, labels)``, a random subset of
    ``max_train`` / ``max_eval`` drawn from ``data_seed``, then ``encode`` (encode_sentences or
    encode_words) to ``max_length`` tokens. Each extra evaluation set ``name`` is read as split
    ``eval_sets.<name>`` and subset like dev (``max_eval``, its own draw). ``features``, when
    given, maps the kept raw inputs to their (N, F) bias features (``Split.features``)."""

    def one(split: str, limit: int | None) -> Split:
        inputs, labels = read_split(split)
        keep = subset_indices(len(inputs), limit, cfg.data_seed, split)
        kept = [inputs[i] for i in keep]
        encoded = encode(tokenizer, kept, [labels[i] for i in keep], cfg.max_length)
        return encoded if features is None else replace(encoded, features=features(kept))

    return TaskData(
        train=one("train", cfg.max_train),
        dev=one("dev", cfg.max_eval),
        num_labels=len(label_names),
        label_names=label_names,
        eval_sets={name: one(f"eval_sets.{name}", cfg.max_eval) for name in eval_sets},
    )
