"""Do different maps rank the units alike? ``headsweep compare-maps``, across methods and across tasks.

Two questions, one answer: a matrix over labels and, per pair of labels, a tested Spearman rho
beside the top-k overlap and its chance level, and every other statistic compare-maps asks
(``statistics.asked("compare_maps")``: RBO, ...) tested against the same relabellings.

- Several maps (``heads.log_alpha heads.importance -heads.ablation_delta``), one label per map.
  For each pair of maps (A, B): Spearman rho between A and B over the units (flattened), per
  pair of runs, averaged over the pairs. A run that has both maps is compared with itself;
  otherwise each run with A is paired with every run with B that is equal on every config key
  that varies, except the method and the methods' own sections (the same model, task, seed and
  stage it starts from: ``heads.log_alpha`` of a ``head_gates`` SP run and ``heads.importance``
  of a ``head_importance`` run of the same fine-tune).
- One map ``across`` an axis (``neurons.predictivity --across task``), one label per value:
  Spearman rho between the values' mean maps (over seeds), compared only between runs equal on
  every other axis (``strata.strata``, as ``agreement`` does) and averaged over those settings.

Signs: rho keeps its sign. A map whose important units are its smallest values
(``heads.ablation_delta``: removing an important head lowers the metric) is named with a
leading ``-`` to flip it (``-heads.ablation_delta``); top-k takes the largest values after the flip.

The permutation null (``relabel``) relabels the units at random, one relabelling per label and permutation,
shared by all of that label's maps (within each layer, or across all units: ``NULLS``).
The question is whether A and B rank the units alike; the null keeps what that question does
not deny, that the runs of one map agree with each other (seeds of one method find the same
heads). Shuffling every run on its own would also destroy that agreement and give a band too
narrow by about the square root of the number of pairs. The statistic of a relabelling is cheap:
for standardised ranks ``u`` (pairs of rows ``u1``, ``u2``), mean_q u1_q . pi(u2_q) =
sum_j M[j, pi(j)] with ``M = u1^T u2 / n``, a ``(P, P)`` matrix built once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from analysis import statistics
from analysis.data.select import (
    Filters,
    QueryError,
    axis_values,
    default_map,
    describe,
    map_runs,
    select,
)
from analysis.data.sweep import SweepData
from analysis.questions.agreement import relabel
from analysis.questions.agreement.maps import across_axis, between_maps, parse_maps
from analysis.questions.agreement.relabel import Rows, relabelled_tests
from analysis.questions.agreement.result import RHO, AgreementMatrix, PairResult, Tested
from analysis.questions.agreement.shuffles import MAX_PAIR_WORK
from analysis.statistics import topk
from analysis.statistics.spearman import mean_spearman_between

DEFAULT_TOP = 0.1
"""Top-k overlap of the top 10 % of units by default."""


# --------------------------------------------------------------------------- the question


def compare_maps(data: SweepData, maps: Sequence[str], filters: Filters | None = None, across: str | None = None,
                 top: float = DEFAULT_TOP, n_perm: int = 1000, seed: int = 0, pool: Sequence[str] = (),
                 max_run_perms: int | None = None) -> AgreementMatrix:
    """Spearman rho, permutation nulls and top-k overlap between maps, or one map across an axis.

    ``maps``: names, each optionally prefixed with ``-`` (flipped). Two or more without
    ``across``; exactly one with it. ``top``: the fraction of units in the top-k sets.
    ``n_perm``: relabellings per null (0 = no test). ``max_run_perms``: refuse more than this
    many pairs x permutations when the null cannot use the cross-product shortcut (large maps).
    """
    specs = parse_maps(maps)
    across = across or None
    _check_question(specs, across, top, n_perm, pool)
    sel = select(data, filters)
    notes: list[str] = []
    compared = between_maps(sel, specs, notes) if across is None else across_axis(sel, specs[0], across, pool, notes)
    labels, p = compared.labels, compared.rows.shape[1] * compared.rows.shape[2]
    gathered = len(labels) * (len(labels) - 1) // 2 * p * p > relabel.CROSS_ELEMENTS  # see relabelled_tests
    if max_run_perms is not None and gathered and len(compared.pairs) * n_perm > max_run_perms:
        raise QueryError(f"{len(compared.pairs)} pairs with {n_perm} permutations is more than this service "
                         f"answers ({max_run_perms:,} pairs x permutations): lower n_perm (to "
                         f"{max(max_run_perms // len(compared.pairs), 0)} or less) or filter the runs")
    tested = relabelled_tests(compared, n_perm, seed, float(top))
    if not tested["by_pair"]:
        raise QueryError(f"nothing left to compare: in all {tested['undefined']} pairs a map is constant "
                         f"(every unit equal), which ranks no unit above another")
    if tested["undefined"]:
        notes.append(f"{tested['undefined']} pairs left out: a map constant in a run (every unit equal) "
                     f"has no ranking")
    left_out, work = tested["left_out"]
    if left_out:
        notes.append(f"{', '.join(left_out)} left out: {work:,} pairs x units x copies is more than "
                     f"{MAX_PAIR_WORK:,}; filter the runs or lower n_perm")
    matrix, results = _pairs(compared, tested, across, notes)
    shape = (int(compared.rows.shape[1]), int(compared.rows.shape[2]))
    over = f"mean over {len(results)} pairs of {'maps' if across is None else across + ' values'}"
    return AgreementMatrix(
        RHO, across, labels, matrix, compared.n_runs, _all_tested(tested["offdiag"], left_out, over),
        sweep_id=data.sweep_id, maps=[s.text for s in specs], kind=specs[0].kind, shape=shape,
        pairs=results, top=float(top), k=tested["k"],
        chance=tested["chance"], models=[str(m) for m in axis_values(compared.runs, "model")],
        tasks=[str(t) for t in axis_values(compared.runs, "task")], matched_on=compared.matched_on,
        pooled_axes=compared.pooled_axes, notes=notes)


def _check_question(specs: list, across: str | None, top: float, n_perm: int, pool: Sequence[str]) -> None:
    """The question's parameters, each a QueryError that says what to give instead."""
    if not (isinstance(top, int | float) and 0.0 < top <= 1.0):
        raise QueryError(f"top must be a fraction of the units in (0, 1], got {top} (e.g. 0.1: the top 10 %)")
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    if across is None and len(specs) < 2:
        raise QueryError("give two or more maps to compare (e.g. heads.log_alpha heads.importance), "
                         "or one map with across (e.g. across task)")
    if across is None and pool:
        raise QueryError("pool averages over axes when comparing one map across an axis: give across too")
    if across is not None and len(specs) != 1:
        raise QueryError(f"across compares one map across the values of an axis; got {len(specs)} maps "
                         f"({', '.join(s.text for s in specs)})")


def _pairs(compared: Rows, tested: dict[str, Any], across: str | None,
           notes: list[str]) -> tuple[np.ndarray, list[PairResult]]:
    """The label x label rho matrix and each pair's result, in label order; a note for each pair of
    maps ranked in opposite orders (below chance: a map to flip)."""
    labels, (left_out, _) = compared.labels, tested["left_out"]
    matrix = np.full((len(labels), len(labels)), np.nan)
    results = []
    for (a, b), (n, n_same, values, top_k) in sorted(tested["by_pair"].items()):
        rho, nulls = values[RHO]
        matrix[a, b] = matrix[b, a] = rho
        matrix[a, a] = matrix[b, b] = 1.0
        if across is not None:
            pooled = f"mean over {n} setting{'s' if n != 1 else ''} {compared.settings}"
        elif n_same == n:
            pooled = f"mean over {n} runs that have both maps"
        else:
            pooled = f"mean over {n} pairs of matched runs" + (f" ({n_same} of them one run)" if n_same else "")
        results.append(PairResult(labels[a], labels[b], n, n_same, _all_tested(values, left_out, pooled), top_k))
        all_units = nulls.get("all_units")
        if across is None and all_units is not None and all_units.observed < all_units.band_lo:
            notes.append(f"{labels[a]} and {labels[b]} rank the units in opposite orders (rho {rho:.2f}, below "
                         f"chance): if one map's important units are its smallest values, flip it with a "
                         f"leading '-'")
    return matrix, results


def _all_tested(values: dict[str, tuple[float, dict]], left_out: list[str], pooled: str) -> dict[str, Tested]:
    """Every pairwise statistic of compare-maps, in order: ``values`` ``{name: (value, nulls)}``
    tested, those ``left_out`` NaN (``pooled`` says why)."""
    return {stat.name: Tested(*values[stat.name], pooled) if stat.name in values
            else Tested(math.nan, {}, "left out: too many pairs x units x permutations (see notes)")
            for stat in statistics.asked("compare_maps") if stat.shape == "pairs"}


def spearman(data: SweepData, a: Filters, b: Filters, map_name: str | None = None, k_frac: float = DEFAULT_TOP,
            filters: Filters | None = None, n_perm: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Do two groups of runs rank the units of ``map_name`` alike? (``headsweep spearman``, ``/spearman``)

    compare-maps' question over two labels, the groups' mean maps (``relabelled_tests``):
    ``spearman``, Spearman rho between the two mean maps (a :class:`Tested`), against both nulls
    (group b's mean map's units relabelled within layers / across all units); ``jaccard`` /
    ``overlap`` / ``k``: agreement of the two mean maps' top ``k_frac`` units (``topk.in_top_k``,
    ties broken at random), beside ``chance_jaccard`` / ``chance_overlap``; ``mean_pairwise``: mean
    rho over every (run of a, run of b) pair (``mean_spearman_between``, lower: it also
    counts single-run noise). ``map_name``: default the map most runs of the sweep have.
    """
    map_name = map_name or default_map(data)
    if not (isinstance(k_frac, int | float) and 0.0 < k_frac <= 1.0):
        raise QueryError(f"top must be a fraction in (0, 1], got {k_frac}")
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    base = select(data, filters)
    stacks = []
    for name, group in (("a", a), ("b", b)):
        sel, x, _, _ = map_runs(select(base, group), map_name, switch=False)
        if len(sel) == 0:
            raise QueryError(f"group {name} ({describe(group)}) has no finished run with map {map_name}")
        stacks.append(x)
    xa, xb = stacks
    if xa.shape[1:] != xb.shape[1:]:
        raise QueryError(f"groups a and b have different map shapes: {xa.shape[1:]} vs {xb.shape[1:]}")
    means = np.stack([xa.mean(axis=0), xb.mean(axis=0)])  # (2, L, K)
    compared = Rows(["a", "b"], means, np.array([0, 1]), np.array([[0, 1]]), np.zeros(1, dtype=bool),
                    [len(xa), len(xb)], base, [])
    with ThreadPoolExecutor(max_workers=1) as pool:  # ranking every run (sorts release the GIL) meanwhile
        pairwise = pool.submit(mean_spearman_between, xa, xb)
        tested = relabelled_tests(compared, n_perm, seed, float(k_frac))
        mean_pairwise = pairwise.result()
    if tested["by_pair"]:
        (_, _, values, top_k), = tested["by_pair"].values()
        rho, top = Tested(*values[RHO], "the two groups' mean maps"), {**top_k, "k": tested["k"]}
        top |= {f"chance_{name}": value for name, value in tested["chance"].items()}
    else:  # a constant mean map ranks no unit above another: rho is undefined, its top-k sets are not
        rho = Tested(math.nan, {}, "the two groups' mean maps")
        top = topk.topk_overlap(means[0], means[1], float(k_frac), np.random.default_rng([seed, 7]))
    return {"map": map_name, "n_a": len(xa), "n_b": len(xb), "spearman": rho, "mean_pairwise": mean_pairwise,
            "k_frac": float(k_frac), **top, "notes": []}
