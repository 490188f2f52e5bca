"""synthetic-cls: a generated sentiment-like classification task.

Each sentence is a few filler words with sentiment words inserted at random
places; a sentiment word may be negated by a preceding "not", which flips its
polarity. Label 1 iff the sentence holds more (effective) positive than
negative words, never a tie. Counting over the whole sentence and reading
"not" in front of a word need context, while real English words give a
pretrained WordPiece model a head start. Classes are exactly balanced (for an
even size); everything is drawn from `random.Random` seeded from data_seed.
"""

from __future__ import annotations

import random

from experiments.tasks import reads
from experiments.tasks.parts import (
    ClassificationDecoder,
    classification_accuracy,
    encode_sentences,
    generated_task,
)

VERSION = "1"
KIND = "classification"
METRIC = "accuracy"
READS = reads.GENERATED  # the task.* keys it reads; any other set is refused

LABEL_NAMES = ("negative", "positive")

POSITIVE = (
    "good", "great", "excellent", "wonderful", "brilliant", "lovely", "superb",
    "delightful", "charming", "moving", "funny", "clever", "beautiful", "fresh",
)  # fmt: skip
NEGATIVE = (
    "bad", "awful", "terrible", "boring", "dull", "weak", "poor", "messy",
    "tedious", "bland", "clumsy", "ugly", "stale", "annoying",
)  # fmt: skip
FILLER = (
    "the", "a", "movie", "film", "story", "plot", "cast", "acting", "script", "music",
    "was", "is", "seemed", "felt", "and", "but", "with", "very", "quite", "really",
    "overall", "ending", "director", "scenes", "this", "its", "at", "times", "rather",
)  # fmt: skip
NEGATION = "not"
NEGATION_RATE = 0.4
MAX_COUNT = 4  # effective words of the majority polarity: 1..MAX_COUNT
FILLER_RANGE = (4, 9)


def _sentiment_phrase(rng: random.Random, positive: bool) -> list[str]:
    """One effective positive/negative word, sometimes as "not" + the opposite word."""
    if rng.random() < NEGATION_RATE:
        return [NEGATION, rng.choice(NEGATIVE if positive else POSITIVE)]
    return [rng.choice(POSITIVE if positive else NEGATIVE)]


def make_chunks(
    rng: random.Random, label: int, max_count: int = MAX_COUNT, margin: int | None = None
) -> list[list[str]]:
    """One sentence whose majority effective polarity is `label` (1 = positive), as chunks:
    single filler words and whole sentiment phrases ("not" + its word stay one chunk), so a
    caller may insert more chunks anywhere without splitting a phrase.

    The majority count is drawn from 1..max_count, the minority from 0..majority - 1, or,
    with ``margin``, fixed at majority - margin (at least 0): a harder count."""
    majority = rng.randint(1, max_count)
    minority = rng.randint(0, majority - 1) if margin is None else max(0, majority - margin)
    polarities = [label == 1] * majority + [label == 0] * minority
    chunks = [[rng.choice(FILLER)] for _ in range(rng.randint(*FILLER_RANGE))]
    for positive in polarities:
        chunks.insert(rng.randint(0, len(chunks)), _sentiment_phrase(rng, positive))
    return chunks


def join_chunks(chunks: list[list[str]]) -> str:
    return " ".join(word for chunk in chunks for word in chunk)


def make_example(rng: random.Random, label: int) -> str:
    """One sentence whose majority effective polarity is `label` (1 = positive)."""
    return join_chunks(make_chunks(rng, label))


def generate(n: int, seed: int) -> tuple[list[str], list[int]]:
    """n sentences with exactly balanced labels (n // 2 positive when n is odd)."""
    rng = random.Random(seed)
    labels = balanced_labels(rng, n)
    return [make_example(rng, y) for y in labels], labels


def balanced_labels(rng: random.Random, n: int) -> list[int]:
    """n labels 0/1 in random order, n // 2 of them 1 (so exactly balanced for an even n)."""
    labels = [i % 2 for i in range(n)]
    rng.shuffle(labels)
    return labels


check, load, fingerprint = generated_task(generate, encode_sentences, LABEL_NAMES)


build_decoder = ClassificationDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = classification_accuracy  # (logits, labels) -> {'accuracy': ...}
