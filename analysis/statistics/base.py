"""What a statistic is: :class:`Statistic`, and the pair matrices its pairwise maths gives.

A statistic says what it computes, what chance gives (its null) and how it prints, and carries
its maths as small pure functions over arrays, in one of three shapes:

- ``pairs``: two maps of the same units compared, row by row (Pearson r, Spearman rho, RBO). The
  consumers build their matrices over labels from it and test it against permutation nulls
  (``analysis.statistics.nulls.NULLS``): ``agreement`` shuffles each run's units, ``compare_maps``
  relabels each map's units.
- ``cells``: the runs of each cell (the seeds of one setting) taken together, tested against the
  same nulls (He & Choi's stem cell statistic).
- ``top_k``: a function of the top-k sets of two maps, with chance in closed form (top-k overlap,
  Jaccard): ``compare_maps`` picks the sets (its ``top`` fraction, ties broken at random).

Shapes: ``P = L * K`` units; rows of maps ``(Q, P)``; groups of rows ``(C, n, P)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

QUESTIONS = ("agreement", "compare_maps")
"""What a statistic can be asked in: ``agreement`` (do runs keep the same units?) and
``compare_maps`` (do maps rank the units alike?)."""

_PAIR_CHUNK_ELEMENTS = 4_000_000
"""Pairs of rows handed to ``pairs`` at once (pairs x units) when a matrix is built from it."""


@dataclass(frozen=True)
class Statistic:
    """One agreement statistic: its name, what it computes, what chance gives, how it prints, its maths."""

    name: str
    """Its key in every answer: the Python result, the JSON, the MLflow metric names (``rbo``)."""
    label: str
    """How tables and figures name it (``RBO``)."""
    computes: str
    """What it computes, in words (printed under the tables; the service's schema describes it so)."""
    null: str
    """What chance gives: the null it is read against, in words."""
    asked_in: tuple[str, ...]
    """The questions (``QUESTIONS``) that compute it."""
    order: int
    """Its place among the statistics of a table or an answer (lower first)."""
    pairs: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    """``(Q, P), (Q, P) -> (Q,)``: the statistic of each pair of rows (NaN where undefined)."""
    stack: Callable[[np.ndarray], np.ndarray] | None = None
    """Optional, with ``pairs``: ``(C, n, P) -> (C, n, n)``, every pair within each group at once
    (the same values as ``pairs``, faster)."""
    matrix: Callable[[np.ndarray], np.ndarray] | None = None
    """Optional, with ``pairs``: ``(n, P) -> (n, n)``, every pair of many rows (a run x run matrix)."""
    cells: Callable[[np.ndarray, list[np.ndarray]], float] | None = None
    """``(N, P)`` maps and the run indexes of each cell (in seed order) -> one number."""
    rows: Callable[[np.ndarray], np.ndarray] | None = None
    """Optional, with ``between`` or ``copies``: ``(N, P) -> (N, P)``, what the statistic reads of
    each map, unit by unit, so that shuffling a map's units shuffles its row alike
    (``rows(x[:, pi]) == rows(x)[:, pi]``, to rounding): a permutation null computes the rows
    once and shuffles them instead of the maps (Pearson: the centred, unit-norm maps)."""
    between: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    """With ``pairs`` and ``rows``: ``(..., P), (..., P) -> (...)``, the statistic of two maps from
    their rows (``pairs(a, b) == between(rows(a), rows(b))``), for many shuffled copies at once."""
    copies: Callable[[np.ndarray, list[np.ndarray]], np.ndarray] | None = None
    """With ``cells`` and ``rows``: ``(c, N, P)`` rows of c shuffled copies of the runs and the
    cells -> ``(c,)``, ``cells`` of each copy (to rounding)."""
    min_runs: int = 2
    """``cells``: a cell counts from this many runs."""
    per_cell: str = ""
    """``cells``: what one cell's value is, in words (``the mean over their triples of ...``)."""
    top_k: Callable[[np.ndarray, int], np.ndarray] | None = None
    """``(|A & B| per pair, k) -> (Q,)``: the statistic of two top-k sets from their shared count."""
    chance: Callable[[int, int], float] | None = None
    """``top_k``: its expected value for two independent random k-sets of P units, ``(P, k) -> float``."""
    digits: int = 3
    """Decimals it prints with."""

    def __post_init__(self) -> None:
        shapes = [shape for shape in ("pairs", "cells", "top_k") if getattr(self, shape) is not None]
        if len(shapes) != 1:
            raise ValueError(f"statistic {self.name!r}: give exactly one of pairs, cells, top_k (got {shapes})")
        if (self.top_k is None) != (self.chance is None):
            raise ValueError(f"statistic {self.name!r}: a top_k statistic comes with its chance")
        if (self.between is not None and self.pairs is None) or (self.copies is not None and self.cells is None):
            raise ValueError(f"statistic {self.name!r}: between goes with pairs, copies with cells")
        if (self.rows is None) != (self.between is None and self.copies is None):
            raise ValueError(f"statistic {self.name!r}: rows comes with between or copies, and they with rows")
        unknown = [q for q in self.asked_in if q not in QUESTIONS]
        if unknown:
            raise ValueError(f"statistic {self.name!r}: unknown question {unknown[0]!r} (one of {QUESTIONS})")

    @property
    def shape(self) -> str:
        """``pairs``, ``cells`` or ``top_k``: which maths it carries."""
        return "pairs" if self.pairs is not None else "cells" if self.cells is not None else "top_k"

    def text(self, value: float | None) -> str:
        """``value`` as tables print it: ``digits`` decimals, ``-`` when missing or undefined."""
        return "-" if value is None or not math.isfinite(value) else f"{value:.{self.digits}f}"


def as_rows(x: np.ndarray) -> np.ndarray:
    """``(N, L, K)`` or ``(N, P)`` -> ``(N, P)`` (a view where possible)."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"expected runs stacked as (N, P) or (N, L, H), got shape {x.shape}")
    return x.reshape(x.shape[0], -1)


def stack_runs(blocks: list[np.ndarray]) -> np.ndarray:
    """Blocks (cells) of n run indexes each -> ``(C, n)``, the blocks in the order of their first run:
    with the runs stored cell after cell (or seed after seed), each column is then evenly spaced
    and ``take_runs`` takes it as a view."""
    idx = np.stack(blocks)
    return idx[np.argsort(idx[:, 0], kind="stable")]


def take_runs(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``(c, N, P)`` rows of c copies of N runs and ``(C,)`` run indexes -> ``(c, C, P)``, ``x[:, index]``:
    a view when the indexes are evenly spaced (runs stored cell after cell: one seed of every
    cell), else a copy in C order (``np.take``: ``x[:, index]`` comes back in another order)."""
    index = np.asarray(index)
    if len(index) and (len(index) == 1 or index[1] > index[0]):
        step = int(index[1] - index[0]) if len(index) > 1 else 1
        if (np.diff(index) == step).all():
            return x[:, int(index[0]):int(index[-1]) + 1:step]
    return np.take(x, index, axis=1)


def pair_stack(stat: Statistic, x: np.ndarray) -> np.ndarray:
    """``(C, n, P) -> (C, n, n)``: ``stat`` between every two rows of each group (``stat.stack``
    when it has one, else ``stat.pairs`` over the pairs, a chunk at a time); the diagonal is each
    row with itself."""
    if stat.stack is not None:
        return stat.stack(x)
    c, n, p = x.shape
    i, j = np.triu_indices(n)  # the diagonal too
    group, i, j = np.repeat(np.arange(c), len(i)), np.tile(i, c), np.tile(j, c)  # (C * n (n + 1) / 2,)
    values = np.empty(len(group))
    step = max(1, _PAIR_CHUNK_ELEMENTS // max(p, 1))
    for start in range(0, len(group), step):
        part = slice(start, start + step)
        values[part] = stat.pairs(x[group[part], i[part]], x[group[part], j[part]])
    out = np.empty((c, n, n))
    out[group, i, j] = values
    out[group, j, i] = values
    return out


def pair_matrix(stat: Statistic, x: np.ndarray) -> np.ndarray:
    """``(n, P) -> (n, n)``: ``stat`` between every two rows (``stat.matrix`` when it has one)."""
    if stat.matrix is not None:
        return stat.matrix(x)
    x = np.asarray(x)
    return pair_stack(stat, x.reshape(1, len(x), -1))[0]
