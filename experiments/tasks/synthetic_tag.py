"""synthetic-tag: a generated POS-like tagging task.

Sentences follow small templates (subject, optional adverb, verb, object noun
phrase or adverb, optional prepositional phrase, optional second clause after a
conjunction) filled from a lexicon of word classes; a word's tag is the class
of the slot it fills. Some words belong to several classes ("watch", "play",
"light", "fast", ...), so their tag depends on where they stand: a model must
look at the neighbours. Drawn from `random.Random` seeded from data_seed.
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

LABEL_NAMES = ("ADJ", "ADP", "ADV", "CCONJ", "DET", "NOUN", "PRON", "VERB")
_TAG_ID = {tag: i for i, tag in enumerate(LABEL_NAMES)}

# Words in several classes: their tag is decided by the slot, not the word.
AMBIGUOUS_NOUN_VERB = ("watch", "play", "run", "walk", "fish", "book", "park", "light", "show")

# slot -> (tag, words). Slots split a class when position changes which words fit.
LEXICON: dict[str, tuple[str, tuple[str, ...]]] = {
    "DET": ("DET", ("the", "a", "this", "every", "some")),
    "DETS": ("DET", ("the", "some", "these", "many")),
    "ADJ": ("ADJ", ("big", "small", "old", "red", "happy", "quiet", "light", "fast", "new")),
    "NOUN": ("NOUN", ("dog", "car", "house", "city", "teacher", "river", "garden")
             + AMBIGUOUS_NOUN_VERB),
    "NOUNS": ("NOUN", ("kids", "dogs", "people", "students", "friends", "birds")),
    "PRON": ("PRON", ("we", "they", "you", "i")),
    "VERB": ("VERB", ("see", "like", "find", "build", "open", "want") + AMBIGUOUS_NOUN_VERB),
    "ADV": ("ADV", ("often", "never", "always", "rarely", "usually")),
    "ADV_AFTER": ("ADV", ("fast", "well", "today", "again", "slowly", "outside")),
    "ADP": ("ADP", ("with", "near", "in", "under", "after")),
    "CCONJ": ("CCONJ", ("and", "but", "or")),
}  # fmt: skip


def _noun_phrase(rng: random.Random) -> list[str]:
    return ["DET"] + (["ADJ"] if rng.random() < 0.4 else []) + ["NOUN"]


def _clause_slots(rng: random.Random) -> list[str]:
    """Slots of one clause: subject (ADV) VERB (object (ADP NP) | ADV_AFTER)."""
    subject = rng.choice([["PRON"], ["DETS", "NOUNS"], _noun_phrase(rng)])
    slots = subject + (["ADV"] if rng.random() < 0.25 else []) + ["VERB"]
    if rng.random() < 0.3:
        return slots + ["ADV_AFTER"]
    slots += _noun_phrase(rng)
    if rng.random() < 0.3:
        slots += ["ADP"] + _noun_phrase(rng)
    return slots


def make_example(rng: random.Random) -> tuple[list[str], list[int]]:
    """One sentence of one or two clauses: (words, tag ids)."""
    slots = _clause_slots(rng)
    if rng.random() < 0.3:
        slots += ["CCONJ"] + _clause_slots(rng)
    words = [rng.choice(LEXICON[slot][1]) for slot in slots]
    tags = [_TAG_ID[LEXICON[slot][0]] for slot in slots]
    return words, tags


def generate(n: int, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    """n generated sentences: (words, tag ids) lists."""
    return generate_tagged(make_example, n, seed)


check, load, fingerprint = generated_task(generate, encode_words, LABEL_NAMES)


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = tagging_accuracy  # (logits, labels) -> {'accuracy': ...}
