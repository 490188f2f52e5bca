"""UD dependency arcs as a tagging task: each word's head, as its offset from the word.

Our formulation, not a parser. A word ``i`` with head ``h`` (CoNLL-U column HEAD,
``0`` for the root) is tagged with ``h - i`` clipped to a window of ``WINDOW`` (5)
words on each side: 13 classes ``<-5, -5, ..., -1, root, +1, ..., +5, >+5`` (a
non-root word is never its own head, so offset 0 is free for ``root``). Inside the
window the class IS the arc (the head is recovered exactly); outside it only its
side is. No tree constraint, no biaffine scorer: a linear layer on each word's first
subword (the tagging decoder), so it plugs into every method and the multi-task
setting (POS + arcs + SST-2, He & Choi 2021) like any other tagging task.

Why offsets rather than ``deprel`` (the general ``tagging`` task with
``column: deprel`` already gives relation labels): the relation says what kind of
arc a word has, not where its head is; the offset is the arc itself, and it needs
nothing but a per-word label. On the UD EWT dev file 8 % of words are roots, 81 %
have their head within 5 words and 11 % farther.

Metrics: ``accuracy`` (the 13-way class of each scored word) and
``arc_accuracy``: the share of words whose head is recovered exactly, a correct
class other than the two "far" ones: a lower bound of the unlabelled attachment
score (UAS) of these predictions.

Files: like ``ud-pos`` (`<data_dir or default>/ud_ewt/en_ewt-ud-{dev,test}.conllu`),
read with the same CoNLL-U reader: it TRAINS on UD's dev file and EVALUATES on
UD's test file. Comment lines, multiword-token ranges and empty nodes are skipped,
so the words kept are ids 1..n and HEAD indexes them. Offsets are counted in words
of the full sentence; a word past ``max_length`` tokens is not scored.
"""

from __future__ import annotations

import torch

from experiments.tasks import reads
from experiments.tasks.files import check_once, fixed_sources
from experiments.tasks.parts import (
    IGNORE_INDEX,
    TaggingDecoder,
    TaskData,
    build_task_data,
    encode_words,
    tagging_accuracy,
)
from experiments.tasks.sources import CONLLU_COLUMNS, Source, conllu_sentences, fingerprint_sources

VERSION = "1"
KIND = "tagging"
METRIC = "accuracy"
READS = reads.SHARED_FILES  # the task.* keys it reads; any other set is refused

WINDOW = 5
"""Offsets -WINDOW..+WINDOW are their own classes; farther heads collapse into one class per side."""

LABEL_NAMES = (
    (f"<-{WINDOW}",) + tuple(f"{d:+d}" for d in range(-WINDOW, 0)) + ("root",)
    + tuple(f"{d:+d}" for d in range(1, WINDOW + 1)) + (f">+{WINDOW}",)
)
"""Class ids in offset order: ``<-5`` is 0, ``root`` is WINDOW + 1 (6), ``>+5`` is 2 * WINDOW + 2 (12)."""
ROOT = WINDOW + 1
FAR = (0, 2 * WINDOW + 2)
"""The two classes that do not name the head (only its side)."""

_HEAD = CONLLU_COLUMNS.index("head")
_SUBDIR = "ud_ewt"
_FILES = {"train": "en_ewt-ud-dev.conllu", "dev": "en_ewt-ud-test.conllu"}


def arc_label(word: int, head: int) -> int:
    """The class id of word ``word`` (1-based) with head ``head`` (0 = root).

    >>> [LABEL_NAMES[arc_label(3, h)] for h in (0, 1, 2, 4, 8, 9)]
    ['root', '-2', '-1', '+1', '+5', '>+5']
    """
    if head == 0:
        return ROOT
    offset = max(-WINDOW - 1, min(WINDOW + 1, head - word))
    return offset + WINDOW + 1


def read_arcs(role: str, path: str) -> tuple[list[list[str]], list[list[int]]]:
    """Words and arc class ids per sentence of a CoNLL-U file; ValueError naming the key, file
    and sentence line for a HEAD that is not a word of its sentence (or 0)."""
    words, labels = [], []
    for line, rows in conllu_sentences(role, path):
        sentence = []
        for i, row in enumerate(rows, start=1):
            head = row[_HEAD]
            if not head.isdigit() or int(head) > len(rows) or int(head) == i:
                raise ValueError(f"task.{role}: {path} sentence at line {line}: word {i} ({row[1]!r}) has "
                                 f"HEAD {head!r}, not 0 or another word of its {len(rows)}")
            sentence.append(arc_label(i, int(head)))
        words.append([row[1] for row in rows])
        labels.append(sentence)
    if not words:
        raise ValueError(f"task.{role}: {path} has no sentences")
    return words, labels


def sources(cfg) -> tuple[Source, ...]:
    """The two CoNLL-U files; FileNotFoundError if either is missing."""
    return fixed_sources(cfg, _SUBDIR, _FILES, "conllu")


def check(cfg) -> None:
    """FileNotFoundError if either CoNLL-U file is missing; ValueError for a bad HEAD (cached by content)."""
    found = sources(cfg)
    check_once("ud-dep", found, lambda: [read_arcs(source.role, source.path) for source in found])


def load(cfg, tokenizer) -> TaskData:
    """Read, subset (max_train / max_eval sentences, drawn from data_seed) and tokenise."""
    files = {s.role: s.path for s in sources(cfg)}
    return build_task_data(cfg, tokenizer, lambda role: read_arcs(role, files[role]), encode_words, LABEL_NAMES)


def fingerprint(cfg) -> str:
    """Content hash of the two CoNLL-U files."""
    return fingerprint_sources(sources(cfg))


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


def compute_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``accuracy`` over the 13 classes and ``arc_accuracy``: correct and not a "far" class
    (the head recovered exactly), over the same scored words; NaN when none is scored."""
    metrics = tagging_accuracy(logits, labels)
    scored = labels != IGNORE_INDEX
    named = scored & (labels != FAR[0]) & (labels != FAR[1])
    exact = (logits.detach().argmax(dim=-1) == labels) & named
    metrics["arc_accuracy"] = int(exact.sum()) / int(scored.sum()) if int(scored.sum()) else float("nan")
    return metrics
