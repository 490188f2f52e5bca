"""synthetic-shortcut: synthetic-cls with a planted shortcut, and an evaluation set without it.

Single sentences (not pairs: the shortcut is one word, the rule needs the whole sentence).
Each is a synthetic-cls sentence (label 1 iff it holds more effective positive than negative
words, "not" flipping the word after it), made harder: the majority polarity (1 to 3 words)
outnumbers the other by exactly one, so every word and every "not" counts. One marker word is
inserted between two of its phrases: ``MARKERS[s]`` for a *shortcut label* s. The marker says
nothing about the sentiment, but in train and dev it agrees with the label (s == y) for
exactly ``SHORTCUT_RATE`` (0.9) of each class's examples, so a model reaches 90 % there by
reading one word. The extra evaluation set ``ood`` (metrics ``accuracy/ood``, ``loss/ood``)
draws the same sentences with the marker uncorrelated (``OOD_RATE`` 0.5): there the marker
alone scores chance and only the real rule scores above it.

Measured (MiniLM, ``finetune``, cross-entropy, 300 steps of 32, seed 0; 2.5 min on 2 CPUs):
0.94 in distribution, 0.70 out of it; the shortcut is learnt first (0.90 / 0.50 after 100
steps), the rule after. With the marker uncorrelated in training too (SHORTCUT_RATE 0.5), the
same run reaches 0.99 on both: the rule is learnable, the shortcut only delays it.

Sizes: ``num_train`` (train), ``num_eval`` (dev and ood each); ``max_train`` / ``max_eval``
subset them like any task. Labels are exactly balanced (even sizes) and so is each marker;
everything is drawn from ``random.Random`` seeded from ``data_seed`` and the split's name.

Bias features (``bias_features``): how often each marker word occurs, ``(N, 2)``: the planted
shortcut and nothing else, so a bias-only model (method ``bias_only``) scores 0.9 on dev and
0.5 on ood.
"""

from __future__ import annotations

import random

import torch

from experiments.tasks import reads
from experiments.tasks.parts import (
    ClassificationDecoder,
    TaskData,
    build_task_data,
    check_synthetic_sizes,
    classification_accuracy,
    encode_sentences,
    no_fingerprint,
    split_seed,
)
from experiments.tasks.synthetic_cls import LABEL_NAMES, balanced_labels, join_chunks, make_chunks

VERSION = "1"
KIND = "classification"
METRIC = "accuracy"
READS = reads.GENERATED  # the task.* keys it reads; any other set is refused

MARKERS = ("london", "paris")
"""The marker word of shortcut label 0 and of shortcut label 1 (one WordPiece each, never
a word of synthetic-cls's vocabulary, no sentiment)."""
MAX_COUNT, MARGIN = 3, 1
"""Harder than synthetic-cls (majority up to 4, any smaller minority): 1 to 3 words of the
majority polarity outnumber the other by exactly one, so the real rule takes longer to learn
than the marker (measured on MiniLM: tests/real/test_shortcut.py)."""
SHORTCUT_RATE = 0.9
"""Fraction of each class's train and dev examples whose marker agrees with the label."""
OOD_RATE = 0.5
"""Fraction of each class's ood examples whose marker agrees with the label: 0.5, uncorrelated
(the marker alone scores chance; only the real rule scores above it)."""
AGREEMENT = {"train": SHORTCUT_RATE, "dev": SHORTCUT_RATE, "eval_sets.ood": OOD_RATE}
"""Agreement of marker and label per split; extra evaluation sets are ``eval_sets.<name>``."""


check, fingerprint = check_synthetic_sizes, no_fingerprint  # generated: nothing to read


def generate(n: int, seed: int, agreement: float) -> tuple[list[str], list[int]]:
    """n sentences with exactly balanced labels, each with one marker word; in each class,
    round(agreement * class size) markers agree with the label, the others contradict it."""
    rng = random.Random(seed)
    labels = balanced_labels(rng, n)
    agrees = [False] * n
    for label in (0, 1):
        members = [i for i, y in enumerate(labels) if y == label]
        for i in rng.sample(members, round(agreement * len(members))):
            agrees[i] = True
    texts = []
    for label, agree in zip(labels, agrees, strict=True):
        chunks = make_chunks(rng, label, MAX_COUNT, MARGIN)
        chunks.insert(rng.randint(0, len(chunks)), [MARKERS[label if agree else 1 - label]])
        texts.append(join_chunks(chunks))
    return texts, labels


def bias_feature_names(cfg) -> tuple[str, ...]:
    """``marker:london``, ``marker:paris``: the count of each marker word."""
    return tuple(f"marker:{word}" for word in MARKERS)


def bias_features(cfg, texts: list[str]) -> torch.Tensor:
    """(N, 2) float32: how often each of MARKERS occurs in each sentence (as a word)."""
    counts = [[text.split().count(word) for word in MARKERS] for text in texts]
    return torch.tensor(counts, dtype=torch.float32).reshape(len(texts), len(MARKERS))


def load(cfg, tokenizer) -> TaskData:
    """Generate train (num_train), dev and ood (num_eval each) from data_seed, subset, tokenise;
    every split carries its bias features."""
    check(cfg)

    def read_split(split: str) -> tuple[list[str], list[int]]:
        size = cfg.num_train if split == "train" else cfg.num_eval
        return generate(size, split_seed(cfg.data_seed, split), AGREEMENT[split])

    eval_sets = [split.removeprefix("eval_sets.") for split in AGREEMENT if split.startswith("eval_sets.")]
    return build_task_data(
        cfg, tokenizer, read_split, encode_sentences, LABEL_NAMES, eval_sets,
        features=lambda texts: bias_features(cfg, texts),
    )


build_decoder = ClassificationDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = classification_accuracy  # (logits, labels) -> {'accuracy': ...}
