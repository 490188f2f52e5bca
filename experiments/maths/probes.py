"""What heads do, read off their attention maps and outputs: parameter-free probes and head roles.

Every function takes numpy arrays of ONE sentence's padding-cropped attention (``crop``:
``attn`` (L, H, n, n), rows = queries, columns = keys, n real tokens) or the per-token /
per-instance arrays those give, concatenated over sentences along the last axis; none
reads a model. Scores come back per head, (L, H).

- He & Choi (2021), "stem cell" probes, on words as their reference code pools them: the
  dependency attention probe (``word_attention``, ``dep_probe_hits``, ``label_rates``) and the
  centroid probe (``word_means``, ``class_centroids``, ``nearest_centroid`` by cosine,
  ``label_accuracy``).
- Voita et al. (2019), head roles: ``confidence``, ``positional`` (threshold 0.9),
  syntactic (``directed_hits`` per relation and direction, ``positional_baseline``),
  rare-word (``most_attended_word``, ``rarest_words``).
- Kovaleva et al. (2019): ``pattern_masses`` (share on [CLS]/[SEP], on the previous/next
  token, inside / outside the query's own sentence), ``classify_patterns`` (a thresholded
  rule in place of the paper's CNN, documented there), ``attention_cosine`` (attention
  change after fine-tuning, padding cropped, which the reference code did not do).

Argmax ties go to the first (lowest) position, as ``np.argmax`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

POSITIONAL_THRESHOLD = 0.9
"""Voita: a head is positional when its argmax sits at the same offset (-1 or +1) for >= 90 % of tokens."""

PATTERNS = ("vertical", "diagonal", "vertical_diagonal", "block", "heterogeneous")
"""Kovaleva's five attention patterns, in the order of ``classify_patterns``' codes."""

DOMINANT = 0.5
"""A pattern's mass that alone makes a map vertical or diagonal (``classify_patterns``)."""
SHARED = 0.25
"""Both the vertical and the diagonal mass at least this: vertical + diagonal."""
BLOCK = 0.7
"""Mass inside the query's own sentence (neighbours included, [CLS]/[SEP] not) that makes a
sentence-pair map a block; attention spread evenly over a pair puts about 0.5 there."""


# --------------------------------------------------------------------------- attention maps


def crop(attn: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """One example's maps (L, H, T, T) with padding removed from rows and columns: (L, H, n, n),
    n = the number of positions where ``mask`` (T,) is nonzero (anywhere, not only at the end)."""
    keep = np.flatnonzero(np.asarray(mask))
    return attn[..., keep[:, None], keep[None, :]]


def row_argmax(attn: np.ndarray) -> np.ndarray:
    """(L, H, n) int: the key each query attends to most."""
    return attn.argmax(axis=-1)


def attention_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L, H) cosine similarity between each head's flattened (n*n) maps of two models on the
    same cropped example (Kovaleva: attention change after fine-tuning; average over examples)."""
    a = a.reshape(*a.shape[:2], -1).astype(np.float64)
    b = b.reshape(*b.shape[:2], -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(norms, 1e-12)


# --------------------------------------------------------------------------- Voita et al. 2019


def confidence(row_max: np.ndarray) -> np.ndarray:
    """(L, H): mean over tokens of a head's largest attention weight; ``row_max`` (L, H, N) is
    ``attn.max(-1)`` of every sentence, concatenated (so each token counts once)."""
    return row_max.mean(axis=-1)


def argmax_offsets(argmax: np.ndarray) -> np.ndarray:
    """(L, H, n): where each query's argmax sits relative to the query (-1 = previous token)."""
    return argmax - np.arange(argmax.shape[-1])


def positional(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(share at -1, share at +1), each (L, H): the fraction of tokens whose argmax is the previous
    / next token. ``offsets`` (L, H, N) from ``argmax_offsets``, concatenated over sentences.
    A head is positional (Voita) when either share is >= ``POSITIONAL_THRESHOLD``."""
    return (offsets == -1).mean(axis=-1), (offsets == 1).mean(axis=-1)


def directed_hits(argmax: np.ndarray, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(L, H, P) bool: for each pair p, does the query at token ``source[p]`` attend most to
    ``target[p]``? ``argmax`` (L, H, n); ``source``, ``target`` (P,) token indices."""
    return argmax[..., np.asarray(source, dtype=np.int64)] == np.asarray(target, dtype=np.int64)


def label_rates(hits: np.ndarray, labels: Sequence[str]) -> dict[str, np.ndarray]:
    """Mean of ``hits`` (L, H, P) over the instances of each label (P,): {label: (L, H)},
    labels in order of first appearance."""
    labels = np.asarray(labels)
    return {str(label): hits[..., labels == label].mean(axis=-1) for label in dict.fromkeys(labels.tolist())}


def positional_baseline(offsets: np.ndarray, labels: Sequence[str]) -> dict[str, tuple[int, float]]:
    """Voita's baseline for a syntactic head: per relation, its most frequent relative offset
    (head position - dependent position, in words) and the share of its instances at that
    offset, i.e. the accuracy of always pointing there. ``offsets``, ``labels`` (P,)."""
    offsets, labels = np.asarray(offsets), np.asarray(labels)
    found = {}
    for label in dict.fromkeys(labels.tolist()):
        values, counts = np.unique(offsets[labels == label], return_counts=True)
        found[str(label)] = (int(values[counts.argmax()]), float(counts.max() / counts.sum()))
    return found


def most_attended_word(attn: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(L, H) int: the word that receives the most attention, per head. A word's share is the
    attention its subword columns ``first[w]:end[w]`` receive, averaged over every query row
    (special tokens' rows included); special tokens are not words and cannot win."""
    received = attn.mean(axis=-2)  # (L, H, n): attention each key gets, mean over queries
    cumulative = np.concatenate([np.zeros((*received.shape[:-1], 1)), received.cumsum(-1)], axis=-1)
    per_word = cumulative[..., np.asarray(end)] - cumulative[..., np.asarray(first)]  # (L, H, W)
    return per_word.argmax(axis=-1)


def rarest_words(frequencies: Sequence[float]) -> np.ndarray:
    """Indices of a sentence's least frequent words (all of them when several tie)."""
    frequencies = np.asarray(frequencies)
    return np.flatnonzero(frequencies == frequencies.min())


# --------------------------------------------------------------------------- He & Choi 2021


def span_matrix(first: np.ndarray, end: np.ndarray, n: int, root: bool = False) -> np.ndarray:
    """(n, S) 0/1 float64: column s marks the tokens of span s, the words' subwords
    ``first[w]:end[w]`` (W spans); with ``root``, span 0 is token 0 alone ([CLS], <s>: He & Choi's
    ROOT) and word w is span w + 1. Tokens in no span ([SEP], padding) are all-zero rows."""
    starts = np.concatenate([[0], first]) if root else np.asarray(first)
    ends = np.concatenate([[1], end]) if root else np.asarray(end)
    tokens = np.arange(n)[:, None]
    return ((tokens >= starts[None, :]) & (tokens < ends[None, :])).astype(np.float64)


def word_attention(attn: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(L, H, W + 1, W + 1) float64: one sentence's attention pooled to words the way He & Choi's
    reference does (elit/components/mtl/head_mtl.py:151-159, ``sum_span`` at :20-38): a query
    word's row is the MEAN of its subwords' rows, a key word's column the SUM of its subwords'
    columns. Index 0 is ROOT, the first token ([CLS], <s>) on its own; word w is index w + 1;
    tokens in no word ([SEP]) are left out of both axes, so no argmax can land on them. ``attn`` (L, H, n, n) cropped, ``first``,
    ``end`` (W,) the words' subword spans (``first[0] >= 1``: token 0 is not a word)."""
    first, end = np.asarray(first), np.asarray(end)
    if len(first) and first[0] < 1:
        raise ValueError("word_attention: token 0 belongs to a word; ROOT needs a special token ([CLS], <s>) there")
    spans = span_matrix(first, end, attn.shape[-1], root=True)  # (n, W + 1)
    keys = attn.astype(np.float64) @ spans  # (L, H, n, W + 1): sum over the key word's subwords
    return (spans / spans.sum(0)).T @ keys  # (L, H, W + 1, W + 1): mean over the query word's


def word_means(features: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(W, ...) float64: each word's features averaged over its subwords ``first[w]:end[w]``
    (He & Choi's centroid probe: elit/components/mtl/head_mtl.py:221, ``sum_span(.., mean=True)``);
    ``features`` (n, ...) per token."""
    spans = span_matrix(np.asarray(first), np.asarray(end), features.shape[0])  # (n, W)
    flat = features.reshape(features.shape[0], -1).astype(np.float64)
    return ((spans / spans.sum(0)).T @ flat).reshape(spans.shape[1], *features.shape[1:])


def dep_probe_hits(argmax: np.ndarray, head: np.ndarray, dependent: np.ndarray) -> np.ndarray:
    """(L, H, P) bool: the dependency attention probe of one sentence,
    ``1(argmax a[d] = h or argmax a[h] = d)`` for each head-dependent pair (P,), as positions of
    ``argmax`` (L, H, W + 1), the argmax of ``word_attention``: ROOT is 0, word w is w + 1. A root
    arc has head 0: a hit when the root word attends most to ROOT or ROOT ([CLS]) to the root word
    (the reference scores both: stem_cell_hypothesis/en_bert_base/head/dep.py:161-164)."""
    return directed_hits(argmax, dependent, head) | directed_hits(argmax, head, dependent)


def class_centroids(features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(U, C, D): the mean feature of each class per unit; NaN for a class with no token.
    ``features`` (N, U, D): each unit's (head's) D values at N training tokens; ``labels`` (N,)."""
    labels = np.asarray(labels)
    centroids = np.full((features.shape[1], num_classes, features.shape[2]), np.nan)
    for c in range(num_classes):
        if (labels == c).any():
            centroids[:, c] = features[labels == c].mean(axis=0)
    return centroids


COSINE_EPS = 1e-8
"""Floor of a vector's norm in ``nearest_centroid`` (torch.nn.CosineSimilarity's eps, the reference's)."""


def nearest_centroid(features: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(N, U): per unit, the class whose centroid has the highest COSINE similarity to each token's
    feature (He & Choi, stem_cell_hypothesis/en_bert_base/head/pos.py:171-180:
    ``CosineSimilarity(dim=-1)`` then ``argmax`` over classes, ties to the first class); classes
    without a centroid (NaN) are never chosen. ``features`` (N, U, D), ``centroids`` (U, C, D)."""
    x = features.astype(np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), COSINE_EPS)
    c = np.nan_to_num(centroids.astype(np.float64))
    c = c / np.maximum(np.linalg.norm(c, axis=-1, keepdims=True), COSINE_EPS)
    similarity = np.einsum("nud,ucd->nuc", x, c)  # (N, U, C)
    similarity[:, np.isnan(centroids).any(-1)] = -np.inf
    return similarity.argmax(axis=-1)


def label_accuracy(predicted: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """(overall (U,), {class: (U,)}): per unit, accuracy over all tokens and over the tokens of each
    gold class present (that class's recall). ``predicted`` (N, U), ``gold`` (N,)."""
    gold = np.asarray(gold)
    correct = predicted == gold[:, None]
    return correct.mean(axis=0), {int(c): correct[gold == c].mean(axis=0) for c in np.unique(gold)}


# --------------------------------------------------------------------------- Kovaleva et al. 2019


def segments(special: np.ndarray) -> np.ndarray:
    """(n,) int: which sentence each token belongs to, the number of special tokens before it
    (``[CLS] a b [SEP] c [SEP]`` -> a, b in 1, c in 2; special tokens get their own count)."""
    special = np.asarray(special, dtype=bool)
    return np.concatenate([[0], np.cumsum(special)[:-1]])


def pattern_masses(attn: np.ndarray, special: np.ndarray) -> dict[str, np.ndarray]:
    """Where each head's attention goes, averaged over the query rows of one cropped example:
    {name: (L, H)}, the four summing to 1 per head.

    - ``special``: on [CLS]/[SEP] (``special`` (n,) bool marks them): Kovaleva's vertical;
    - ``diagonal``: on the previous or next token (not special): diagonal;
    - ``own``: the rest inside the query's own sentence (itself included): block, in a pair;
    - ``other``: on another sentence of a pair.
    """
    special = np.asarray(special, dtype=bool)
    n = special.shape[0]
    seg = segments(special)
    offset = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    on_special = np.broadcast_to(special[None, :], (n, n))
    regions = {
        "special": on_special,
        "diagonal": (offset == 1) & ~on_special,
        "own": (offset != 1) & ~on_special & (seg[:, None] == seg[None, :]),
    }
    regions["other"] = ~(regions["special"] | regions["diagonal"] | regions["own"])
    return {name: (attn * region).sum(-1).mean(-1) for name, region in regions.items()}


def classify_patterns(masses: dict[str, np.ndarray], pair: bool) -> np.ndarray:
    """(L, H) int, codes into ``PATTERNS``: Kovaleva's attention patterns by a thresholded rule on
    ``pattern_masses`` (the paper's CNN, trained on ~400 hand-labelled maps, replaced by this).

    In this order, first match wins:
    1. vertical + diagonal: on [CLS]/[SEP] >= ``SHARED`` AND on the neighbours >= ``SHARED``;
    2. vertical: on [CLS]/[SEP] >= ``DOMINANT``;
    3. diagonal: on the previous/next token >= ``DOMINANT``;
    4. block: a sentence pair (``pair``) and inside the query's own sentence (``own`` +
       ``diagonal``) >= ``BLOCK``;
    5. heterogeneous: the rest.
    A single sentence has no block (its in-sentence mass cannot tell a block from a spread-out
    map), so there block-like heads are heterogeneous.
    """
    v, d = masses["special"], masses["diagonal"]
    codes = np.full(v.shape, PATTERNS.index("heterogeneous"))
    if pair:
        codes[masses["own"] + d >= BLOCK] = PATTERNS.index("block")
    codes[d >= DOMINANT] = PATTERNS.index("diagonal")
    codes[v >= DOMINANT] = PATTERNS.index("vertical")
    codes[(v >= SHARED) & (d >= SHARED)] = PATTERNS.index("vertical_diagonal")
    return codes
