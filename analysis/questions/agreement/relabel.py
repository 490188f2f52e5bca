"""Compare-maps' permutation null: the units relabelled at random, one relabelling per label and
permutation, shared by all of that label's maps (within each layer, or across all units).

See ``compare`` for why: the question is whether maps A and B rank the units alike, and the null
keeps what that question does not deny (the runs of one map agree with each other). For
standardised ranks ``u`` (pairs of rows ``u1``, ``u2``), mean_q u1_q . pi(u2_q) = sum_j M[j, pi(j)]
with ``M = u1^T u2 / n``, a ``(P, P)`` matrix built once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis import statistics
from analysis.data.sweep import SweepData
from analysis.questions.agreement.result import RHO
from analysis.questions.agreement.shuffles import MAX_PAIR_WORK
from analysis.statistics import spearman
from analysis.statistics.base import Statistic
from analysis.statistics.nulls import NULLS, null_result
from analysis.statistics.topk import in_top_k, top_k_size

CROSS_ELEMENTS = 16_000_000
"""Largest total size of the ``(P, P)`` matrices ``M`` (one per pair of labels) built for the null;
above it (neuron maps) each relabelled copy is gathered instead."""


_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class Rows:
    """The maps to compare as rows, and which rows are compared: what ``relabelled_tests`` tests."""

    labels: list[str]
    rows: np.ndarray
    """``(R, L, K)`` float64 maps, signs applied: a run's map, or a setting's mean map (``across``)."""
    label: np.ndarray
    """``(R,)`` int: each row's label."""
    pairs: np.ndarray
    """``(Q, 2)`` rows compared, ``label[pairs[:, 0]] < label[pairs[:, 1]]``."""
    same_run: np.ndarray
    """``(Q,)`` bool: the two rows are one run's two maps."""
    n_runs: list[int]
    runs: SweepData
    """The runs behind the rows."""
    matched_on: list[str]
    pooled_axes: list[str] = field(default_factory=list)
    settings: str = ""
    """``across``: what a compared setting is, in words (``of head_gates.lambda of the seed-mean maps ...``)."""


def _null_perms(rng: np.random.Generator, n_perm: int, n_labels: int, layers: int, units: int,
                null: str) -> np.ndarray:
    """``(n_perm, n_labels, P)`` int32 unit relabellings (within each layer, or across all units),
    label 0's the identity: relabelling every label by one more permutation changes no statistic
    (only ``pi_b o pi_a^-1`` enters one), so label 0 need not be drawn."""
    p = layers * units
    shape = (n_perm, n_labels - 1, layers, units) if null == "within_layers" else (n_perm, n_labels - 1, p)
    drawn = np.broadcast_to(np.arange(p, dtype=np.int32).reshape(shape[2:]), shape).copy()
    rng.permuted(drawn, axis=-1, out=drawn)
    perms = np.empty((n_perm, n_labels, p), dtype=np.int32)
    perms[:, 0] = np.arange(p, dtype=np.int32)
    perms[:, 1:] = drawn.reshape(n_perm, n_labels - 1, p)
    return perms


def _inverse(perms: np.ndarray) -> np.ndarray:
    """``(c, P)`` permutations -> their inverses (one scatter, no sort)."""
    c, p = perms.shape
    inverse = np.empty(c * p, dtype=perms.dtype)
    inverse[(perms + np.arange(0, c * p, p, dtype=np.int64)[:, None]).ravel()] = np.tile(np.arange(p, dtype=perms.dtype), c)
    return inverse.reshape(c, p)


def _relabelled(u1: np.ndarray, u2: np.ndarray, sigma: np.ndarray, cross: np.ndarray | None) -> np.ndarray:
    """``(c,)`` mean over rows of ``u1_q . u2_q[sigma]`` for each relabelling ``sigma`` (``(c, P)``)."""
    if cross is not None:
        return cross[np.arange(sigma.shape[1]), sigma].sum(axis=1)
    n, p = u1.shape
    out = np.empty(len(sigma))
    # (P * n,), (P, n): rows gather fast; float32 halves the memory traffic (~1e-7 in a null value)
    u1t, u2t = np.ascontiguousarray(u1.T, dtype=np.float32).ravel(), np.ascontiguousarray(u2.T, dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // max(n * p, 1))
    for start in range(0, len(sigma), step):
        part = sigma[start:start + step]  # (c, P)
        out[start:start + len(part)] = u2t[part].reshape(len(part), -1) @ u1t / n
    return out


def _relabelled_pairs(stat: Statistic, r1: np.ndarray, r2: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """``(c,)`` mean over rows of ``stat.pairs(r1_q, r2_q[sigma])`` for each relabelling ``sigma``
    (``(c, P)``): any pairwise statistic on the relabelled maps, a chunk of relabellings at a time."""
    q, p = r1.shape
    out = np.empty(len(sigma))
    step = max(1, _CHUNK_ELEMENTS // max(q * p, 1))
    for start in range(0, len(sigma), step):
        part = sigma[start:start + step]  # (c, P)
        relabelled = r2[:, part].transpose(1, 0, 2).reshape(-1, p)  # (c * Q, P): copy-major
        same = np.broadcast_to(r1, (len(part), q, p)).reshape(-1, p)
        out[start:start + len(part)] = stat.pairs(same, relabelled).reshape(len(part), q).mean(axis=1)
    return out


def relabelled_tests(compared: Rows, n_perm: int, seed: int, top: float) -> dict[str, Any]:
    """Every statistic compare-maps asks (``statistics.asked("compare_maps")``), with its nulls, for
    each pair of labels of ``compared``: the pairwise ones (``rho``, the matrix's, through its
    standardised ranks; the others through their ``pairs``) tested against the same relabellings,
    the top-k ones beside their chance.

    Returns ``{"by_pair": {(a, b): (n, n_same_run, {name: (value, nulls)}, {top-k name: value})},
    "offdiag": {name: (value, nulls)}, "k", "chance": {top-k name: chance}, "undefined", "left_out"}``
    (pairs with a constant map are left out, counted in ``undefined``; ``left_out``: the pairwise
    statistics too costly for this question, ``MAX_PAIR_WORK``).
    """
    rows, label, pairs, n_labels = compared.rows, compared.label, compared.pairs, len(compared.labels)
    layers, units = rows.shape[1:]
    p = layers * units
    flat = rows.reshape(len(rows), p)  # (R, P)
    ranks, u, defined = spearman.standardised_ranks(flat)  # a constant map's correlation is undefined
    ok = defined[pairs[:, 0]] & defined[pairs[:, 1]]
    undefined, pairs, same = int((~ok).sum()), pairs[ok], compared.same_run[ok]
    k = top_k_size(top, p)
    in_top = in_top_k(ranks, k, np.random.default_rng([seed, 7]))  # ties broken at random
    shared = (in_top[pairs[:, 0]] & in_top[pairs[:, 1]]).sum(axis=1)
    asked = statistics.asked("compare_maps")
    work = len(pairs) * p * (1 + len(NULLS) * n_perm)
    others = [stat for stat in asked if stat.shape == "pairs" and stat.name != RHO]
    left_out = [stat.name for stat in others if work > MAX_PAIR_WORK]
    others = [stat for stat in others if stat.name not in left_out]
    values = {RHO: np.einsum("qp,qp->q", u[pairs[:, 0]], u[pairs[:, 1]]),
              **{stat.name: stat.pairs(flat[pairs[:, 0]], flat[pairs[:, 1]]) for stat in others}}
    which = label[pairs[:, 0]] * n_labels + label[pairs[:, 1]]
    groups = {(int(c) // n_labels, int(c) % n_labels): np.flatnonzero(which == c) for c in np.unique(which)}
    nulls_asked = [name for name in NULLS if n_perm and not (name == "within_layers" and units == 1)]
    nulls = _relabelled_nulls(u, flat, pairs, groups, others, nulls_asked, n_perm, seed, (n_labels, layers, units))
    top_k = [stat for stat in asked if stat.shape == "top_k"]
    by_pair = {}
    for key, idx in groups.items():
        tested = {name: _tested(float(value[idx].mean()), nulls[name][key]) for name, value in values.items()}
        by_pair[key] = (len(idx), int(same[idx].sum()), tested,
                        {stat.name: float(np.mean(stat.top_k(shared[idx], k))) for stat in top_k})
    offdiag = {name: _tested(float(np.mean([v[2][name][0] for v in by_pair.values()])) if by_pair else math.nan,
                             {null: np.mean([nulls[name][key][null] for key in groups], axis=0)
                              for null in nulls_asked if groups})
               for name in values}
    return {"by_pair": by_pair, "offdiag": offdiag, "k": k, "chance": {stat.name: stat.chance(p, k) for stat in top_k},
            "undefined": undefined, "left_out": (left_out, work)}


def _tested(observed: float, nulls: dict[str, np.ndarray]) -> tuple[float, dict]:
    """An observed value with each null's result (``{null: its drawn values}``)."""
    return observed, {null: null_result(observed, drawn, null) for null, drawn in nulls.items()}


def _relabelled_nulls(u: np.ndarray, flat: np.ndarray, pairs: np.ndarray, groups: dict, others: list[Statistic],
                      nulls_asked: list[str], n_perm: int, seed: int, shape: tuple[int, int, int]) -> dict:
    """``{statistic: {pair of labels: {null: (n_perm,) values}}}``: ``rho`` (standardised ranks ``u``,
    through the ``(P, P)`` cross matrices when they fit) and every other pairwise statistic (``flat``
    maps) of each pair of labels, under the same relabellings, a chunk of them at a time."""
    n_labels, layers, units = shape
    p = layers * units
    sides = {key: (u[pairs[idx, 0]], u[pairs[idx, 1]]) for key, idx in groups.items()}
    cross = {key: u1.T @ u2 / len(u1) for key, (u1, u2) in sides.items()} \
        if len(groups) * p * p <= CROSS_ELEMENTS else {}  # (P, P) each: the null in P operations per draw
    names = [RHO, *(stat.name for stat in others)]
    nulls: dict[str, dict[tuple[int, int], dict[str, np.ndarray]]] = {name: {key: {} for key in groups}
                                                                      for name in names}
    rng = np.random.default_rng(seed)
    step = max(1, _CHUNK_ELEMENTS // (n_labels * p))
    for null in nulls_asked:
        drawn = {name: {key: np.empty(n_perm) for key in groups} for name in names}
        for start in range(0, n_perm, step):
            perms = _null_perms(rng, min(step, n_perm - start), n_labels, layers, units, null)  # (c, labels, P)
            inverse = {a: _inverse(perms[:, a]) for a in {a for a, _ in groups if a}}
            done = slice(start, start + len(perms))
            for (a, b), (u1, u2) in sides.items():
                # relabelling a by pi_a and b by pi_b = comparing a with b relabelled by pi_b o pi_a^-1
                sigma = perms[:, b] if a == 0 else np.take_along_axis(perms[:, b], inverse[a], axis=-1)
                drawn[RHO][(a, b)][done] = _relabelled(u1, u2, sigma, cross.get((a, b)))
                idx = groups[(a, b)]
                for stat in others:
                    drawn[stat.name][(a, b)][done] = _relabelled_pairs(stat, flat[pairs[idx, 0]], flat[pairs[idx, 1]],
                                                                       sigma)
        for name in names:
            for key in groups:
                nulls[name][key][null] = drawn[name][key]
    return nulls
