"""Statistics of runs tested against the permutation nulls (``statistics.nulls.NULLS``: each run's
units shuffled within layers / across all units), the shuffles drawn once for several statistics.

No global RNG: a generator seeded ``seed`` draws the shuffles, so the same question gets the same answer."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from analysis.questions.agreement.result import Tested
from analysis.statistics import nulls
from analysis.statistics.base import Statistic

_COPY_CHUNK_ELEMENTS = 1_000_000
"""Shuffled copies x runs x units handed to the statistics at once in a permutation null (each
array of a chunk is ~8 MB; RBO's temporaries are a few of them)."""


MAX_PAIR_WORK = 50_000_000
"""Largest work of a pairwise statistic beside the matrix's, in compared pairs x units x copies (the
maps and ``len(nulls.NULLS) * n_perm`` shuffles): larger questions leave it out. Pearson's matrix
is one product per copy; RBO sorts every map of every pair, ~0.2 us per pair and unit (seconds at
this bound)."""


_OnCopies = Callable[[np.ndarray], dict[str, np.ndarray]]


def statistics_on_copies(stats_: list[Statistic], x: np.ndarray, fast: Callable[[Statistic, np.ndarray], np.ndarray] | None,
               slow: Callable[[Statistic, np.ndarray], float]) -> tuple[np.ndarray, _OnCopies]:
    """Every statistic on every shuffled copy of the runs ``x`` ``(N, L, K)``: ``(what to shuffle,
    (N, L, K); its shuffled copies (c, N, L, K) -> {name: (c,)})``.

    A statistic with ``rows`` (when ``fast`` is given) reads its rows, computed once and
    shuffled: ``fast(stat, (c, N, P) rows)``; any other one the shuffled maps, one copy at a time:
    ``slow(stat, (N, L, K) copy)``. When every statistic reads the same rows, those are shuffled;
    else the runs' ``nulls.positions``, and each statistic gathers what it reads."""
    flat = x.reshape(len(x), -1)
    rows = {stat.rows: stat.rows(flat) for stat in stats_ if fast is not None and stat.rows is not None}
    if len(rows) == 1 and all(stat.rows in rows for stat in stats_):
        shared = next(iter(rows.values()))
        return shared.reshape(x.shape), lambda copies: {
            stat.name: fast(stat, copies.reshape(len(copies), len(x), -1)) for stat in stats_}

    def on_copies(order: np.ndarray) -> dict[str, np.ndarray]:
        shuffled = {fn: nulls.gather(r, order) for fn, r in rows.items()}
        out = {}
        for stat in stats_:
            if stat.rows in shuffled:
                out[stat.name] = fast(stat, shuffled[stat.rows])
            else:
                out[stat.name] = np.array([slow(stat, copy) for copy in nulls.gather(flat, order).reshape(
                    len(order), *x.shape)])
        return out

    return nulls.positions(x.shape), on_copies


def tested_together(observed: dict[str, float], x: np.ndarray, n_perm: int, seed: int, pooled: dict[str, str],
                   on_copies: tuple[np.ndarray, _OnCopies]) -> dict[str, Tested]:
    """Statistics of the same runs ``x`` ``(N, L, K)``, each against both nulls (a generator seeded ``seed``), the
    shuffles drawn once for all of them
    (``on_copies``: what to shuffle and the statistics of its copies, ``statistics_on_copies``)."""
    if n_perm == 0 or len(x) == 0 or not observed:
        return {name: Tested(value, {}, pooled[name]) for name, value in observed.items()}
    shuffled, batch_fn = on_copies
    found = nulls.joint_nulls(batch_fn, observed, shuffled, n_perm, np.random.default_rng(seed), _COPY_CHUNK_ELEMENTS)
    return {name: Tested(value, found[name], pooled[name]) for name, value in observed.items()}
