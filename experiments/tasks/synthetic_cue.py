"""synthetic-cue: a generated tagging task whose tags are decided by a distant word.

A sentence is two or three clauses. Each clause opens with a cue word of one of
four topics (ANIMAL, FOOD, TOOL, PLACE) followed by 1-4 filler words drawn from
one topic-free vocabulary; every word of a clause, the fillers included, is
tagged with the topic of its clause's cue, and neighbouring clauses have
different topics. A filler's tag is therefore decided by a word 1-4 positions
to its left, and never by the filler itself: a model whose attention heads are
all closed (each token sees only itself and its position) is at chance (1/4) on
fillers, about 0.44 token accuracy in all (the cues tag themselves), and knowing
which words the sentence holds (a bag of words) is not enough either, since each
sentence holds two or three topics. (tests/experiments/test_tasks.py computes both
baselines.) Drawn from `random.Random` seeded from data_seed.

Why a task of its own: synthetic-tag (POS-like) is solved from the words alone
for most tokens, so a model with every head closed keeps most of its accuracy;
the demo needs a task where closing heads costs accuracy. Sentences are short
(8.75 words on average) to keep the demo's CPU time low.
"""

from __future__ import annotations

import random

from experiments.tasks import reads
from experiments.tasks.parts import (
    TaggingDecoder,
    encode_words,
    generate_tagged,
    generated_task,
    tagging_accuracy,
)

VERSION = "1"
KIND = "tagging"
METRIC = "accuracy"
READS = reads.GENERATED  # the task.* keys it reads; any other set is refused

CUES: dict[str, tuple[str, ...]] = {
    "ANIMAL": ("dog", "cat", "horse", "bird", "cow", "sheep", "goat", "mouse"),
    "FOOD": ("bread", "cheese", "apple", "soup", "rice", "cake", "milk", "egg"),
    "TOOL": ("hammer", "knife", "rope", "ladder", "nail", "brush", "axe", "spoon"),
    "PLACE": ("city", "village", "park", "market", "harbor", "church", "school", "farm"),
}
LABEL_NAMES = tuple(CUES)
FILLERS = (
    "the", "a", "was", "near", "then", "very", "old", "new", "big", "small", "there", "again",
    "still", "often", "with", "some", "two", "many", "it", "this", "that", "here", "today", "soon",
)  # fmt: skip
CLAUSES = (2, 3)
FILLERS_PER_CLAUSE = (1, 4)


def make_example(rng: random.Random) -> tuple[list[str], list[int]]:
    """One sentence: (words, tag ids), each word tagged with its clause's cue topic."""
    words: list[str] = []
    tags: list[int] = []
    topic = None
    for _ in range(rng.randint(*CLAUSES)):
        topic = rng.choice([t for t in range(len(LABEL_NAMES)) if t != topic])
        clause = [rng.choice(CUES[LABEL_NAMES[topic]])]
        clause += [rng.choice(FILLERS) for _ in range(rng.randint(*FILLERS_PER_CLAUSE))]
        words += clause
        tags += [topic] * len(clause)
    return words, tags


def generate(n: int, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    """n generated sentences: (words, tag ids) lists."""
    return generate_tagged(make_example, n, seed)


check, load, fingerprint = generated_task(generate, encode_words, LABEL_NAMES)


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = tagging_accuracy  # (logits, labels) -> {'accuracy': ...}
