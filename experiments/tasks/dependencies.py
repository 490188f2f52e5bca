"""Dependency trees of UD EWT, word by word, aligned to a tokenizer's subwords (for probes).

A CoNLL-U file carries per word its UPOS (column 4), XPOS (5), HEAD (7: the 1-based id of its
head word, 0 = root) and DEPREL (8). ``read_trees`` reads them (comments, multiword-token
ranges ``3-4`` and empty nodes ``8.1`` skipped, as the tagging tasks do, so row i is word i + 1);
``encode_trees`` tokenises the words like ``tagging`` (``is_split_into_words``, a fast
tokenizer) and records, per word, the token index of its first subword and one past its last.
Words cut off by ``max_length`` are dropped: truncation cuts the end, so the kept words are a
prefix and word indices stay valid; a head index >= the number of kept words points at a cut
word (``arcs`` leaves those out).

Relations are UD's full labels (``nsubj:pass``); ``relation`` gives the universal part
(``nsubj``), which the probes group by.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from experiments.tasks.parts import subset_indices
from experiments.tasks.sources import CONLLU_COLUMNS, conllu_sentences

UD_EWT = "ud_ewt"
FILES = {"train": "en_ewt-ud-dev.conllu", "dev": "en_ewt-ud-test.conllu"}
"""As the ud-pos task: UD's dev file is what probes fit on (centroids, word frequencies), UD's
test file what they score on (only these two splits ship with the shared data)."""

UD_RELATIONS = (
    "acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound", "conj",
    "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat", "goeswith", "iobj",
    "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan", "parataxis", "punct",
    "reparandum", "root", "vocative", "xcomp",
)  # fmt: skip
"""UD v2's 37 universal dependency relations (``root`` has no head word: an arc to ROOT only
where ``arcs(root=True)`` asks for it)."""

_HEAD, _DEPREL, _UPOS = (CONLLU_COLUMNS.index(c) for c in ("head", "deprel", "upos"))


@dataclass(frozen=True)
class Tree:
    """One sentence's words with their dependency tree (word indices 0-based)."""

    words: tuple[str, ...]
    upos: tuple[str, ...]
    heads: tuple[int, ...]
    """Index of each word's head word; -1 for the root."""
    deprels: tuple[str, ...]


@dataclass(frozen=True)
class EncodedTrees:
    """Trees tokenised: ``input_ids``, ``attention_mask`` (N, T) right-padded, and per sentence
    the kept words' token spans ``first[i]``, ``end[i]`` (W_i,) (subwords ``first:end``)."""

    trees: list[Tree]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    first: list[np.ndarray]
    end: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.trees)


def relation(deprel: str) -> str:
    """The universal relation of a UD label: ``nsubj:pass`` -> ``nsubj``."""
    return deprel.split(":", 1)[0]


def read_trees(path: str | Path, role: str = "train") -> list[Tree]:
    """Every sentence of a CoNLL-U file as a ``Tree``; ValueError (naming the line) for a bad HEAD.
    Read once per file content (size and mtime): every probe run of a process shares it."""
    stat = os.stat(path)
    return list(_read_trees(os.path.abspath(path), stat.st_size, stat.st_mtime_ns, role))


@functools.lru_cache(maxsize=8)
def _read_trees(path: str, _size: int, _mtime_ns: int, role: str) -> tuple[Tree, ...]:
    trees = []
    for line, rows in conllu_sentences(role, str(path)):
        heads = []
        for row in rows:
            if not row[_HEAD].isdigit() or int(row[_HEAD]) > len(rows):
                raise ValueError(f"{path}: sentence at line {line}: HEAD {row[_HEAD]!r} of word {row[0]} is not a word id")
            heads.append(int(row[_HEAD]) - 1)
        trees.append(Tree(tuple(r[1] for r in rows), tuple(r[_UPOS] for r in rows), tuple(heads),
                          tuple(r[_DEPREL] for r in rows)))
    return tuple(trees)


def encode_trees(tokenizer, trees: list[Tree], max_length: int) -> EncodedTrees:
    """Tokenise the trees' words (truncation to ``max_length``, padding to the longest) and find
    each kept word's subword span. Needs a fast tokenizer (``word_ids()``)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("dependency probes need a fast tokenizer (word_ids())")
    enc = tokenizer([list(t.words) for t in trees], is_split_into_words=True, truncation=True,
                    max_length=max_length, padding="longest", return_tensors="pt")
    firsts, ends = [], []
    for i in range(len(trees)):
        spans: dict[int, list[int]] = {}
        for t, word in enumerate(enc.word_ids(i)):
            if word is not None:
                spans.setdefault(word, [t, t + 1])[1] = t + 1
        kept = len(spans)  # a prefix of the words: 0 .. kept - 1
        firsts.append(np.array([spans[w][0] for w in range(kept)], dtype=np.int64))
        ends.append(np.array([spans[w][1] for w in range(kept)], dtype=np.int64))
    return EncodedTrees(trees, enc["input_ids"].long(), enc["attention_mask"].long(), firsts, ends)


def arcs(tree: Tree, kept: int, root: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(dependent word indices, head word indices, universal relations) of the tree's arcs whose
    two words are both among the first ``kept`` words. The root word has no head word: without
    ``root`` it has no arc; with it, its arc has head -1 (ROOT) and relation ``root`` (He & Choi's
    probe scores it)."""
    found = [(d, h, relation(r)) for d, (h, r) in enumerate(zip(tree.heads, tree.deprels, strict=True))
             if d < kept and (0 <= h < kept or (root and h == -1))]
    dependents = np.array([d for d, _, _ in found], dtype=np.int64)
    heads = np.array([h for _, h, _ in found], dtype=np.int64)
    return dependents, heads, [r for _, _, r in found]


def load_ud_ewt(folder: str | Path, split: str, tokenizer, max_length: int, max_sentences: int | None,
                data_seed: int = 0) -> EncodedTrees:
    """UD EWT's ``split`` (``train`` = UD dev, ``dev`` = UD test; see ``FILES``), a random subset of
    ``max_sentences`` drawn from ``data_seed`` (kept in file order), tokenised."""
    path = Path(folder) / FILES[split]
    if not path.is_file():
        raise FileNotFoundError(f"UD EWT: {FILES[split]} not found in {folder} (set task.data_dir or $HEADSWEEP_DATA)")
    trees = read_trees(path, split)
    keep = subset_indices(len(trees), max_sentences, data_seed, f"trees:{split}")
    return encode_trees(tokenizer, [trees[i] for i in keep], max_length)
