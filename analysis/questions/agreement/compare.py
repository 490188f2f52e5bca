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
  every other axis (``queries.strata``, as ``agreement`` does) and averaged over those settings.

Signs: rho keeps its sign. A map whose important units are its smallest values
(``heads.ablation_delta``: removing an important head lowers the metric) is named with a
leading ``-`` to flip it (``-heads.ablation_delta``); top-k takes the largest values after the flip.

The permutation null relabels the units at random, one relabelling per label and permutation,
shared by all of that label's maps (within each layer, or across all units: ``stats.NULLS``).
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis import statistics, stats
from analysis.loading import SweepData
from analysis.queries import (
    MAX_PAIR_WORK,
    Tested,
    _joint_codes,
    check_across,
    null_summaries,
    strata,
    tested_json,
)
from analysis.select import (
    COMPANIONS,
    Filters,
    QueryError,
    as_codes,
    axis_values,
    column,
    describe,
    list_choices,
    map_stack,
    py,
    select,
    value_label,
    varying_config,
)
from analysis.statistics import STATISTICS, spearman
from analysis.statistics.base import Statistic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MATRIX = "rho"
"""The statistic of compare-maps' matrix (``statistics.STATISTICS``): Spearman rho."""
DEFAULT_TOP = 0.1
"""Top-k overlap of the top 10 % of units by default."""
_CROSS_ELEMENTS = 16_000_000
"""Largest total size of the ``(P, P)`` matrices ``M`` (one per pair of labels) built for the null;
above it (neuron maps) each relabelled copy is gathered instead."""
_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class MapSpec:
    """A map as named on the command line: ``-heads.ablation_delta`` is that map times -1."""

    text: str
    name: str
    sign: float

    @property
    def kind(self) -> str:
        return self.name.partition(".")[0]


def parse_maps(texts: Sequence[str]) -> list[MapSpec]:
    """``["heads.importance", "-heads.ablation_delta"]`` -> specs (a leading ``-`` flips the sign)."""
    specs: list[MapSpec] = []
    for raw in texts:
        text = str(raw).strip()
        flip = text.startswith("-")
        name = text[1:].strip() if flip else text
        if not name:
            raise QueryError(f"empty map name '{text}': name a map such as heads.importance "
                             f"(a leading '-' flips its sign)")
        spec = MapSpec(("-" if flip else "") + name, name, -1.0 if flip else 1.0)
        if spec.text in (s.text for s in specs):
            raise QueryError(f"map '{spec.text}' is named twice")
        specs.append(spec)
    return specs


@dataclass(frozen=True)
class PairResult:
    """One pair of labels (maps, or values of the ``across`` axis)."""

    a: str
    b: str
    n_pairs: int
    """Pairs of runs compared (several maps), or settings of the other axes (``across``)."""
    n_same_run: int
    """Of those, pairs that are one run with both maps."""
    statistics: dict[str, Tested]
    """Each pairwise statistic of ``statistics.asked("compare_maps")`` by name (``rho``: Spearman,
    the matrix's): its mean over the pairs, against the nulls (empty when n_perm = 0)."""
    top_k: dict[str, float]
    """Each top-k statistic by name (``overlap``: |top-k of a & top-k of b| / k, ``jaccard``): its
    mean over the pairs (NaN without pairs)."""

    @property
    def rho(self) -> Tested:
        """Mean Spearman rho over the pairs, against the nulls."""
        return self.statistics[MATRIX]

    def __getattr__(self, name: str) -> Any:
        """``pair.overlap``, ``pair.rbo``: the statistic of that name."""
        for table in (self.__dict__.get("statistics", {}), self.__dict__.get("top_k", {})):
            if name in table:
                return table[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or statistic {name!r}")


@dataclass(frozen=True)
class Comparison:
    """What ``compare_maps`` answers (``compare_json`` is its JSON, for the CLI and the service)."""

    sweep_id: str
    maps: list[str]
    across: str | None
    """None: several maps compared with each other; else the axis one map is compared across."""
    kind: str
    shape: tuple[int, int]
    labels: list[str]
    matrix: np.ndarray
    """``(n, n)`` mean Spearman rho between labels; diagonal 1; NaN where no pair was compared."""
    n_runs: list[int]
    """Runs behind each label."""
    pairs: list[PairResult]
    statistics: dict[str, Tested]
    """Each pairwise statistic by name: the mean over the compared pairs of labels of its value,
    against the same relabellings; the matrix's (rho) is ``mean_offdiag``."""
    top: float
    k: int
    chance: dict[str, float]
    """Each top-k statistic's value for two independent random top-k sets (``overlap``: k / P, the
    hypergeometric mean); also ``result.chance_<name>``."""
    models: list[str]
    tasks: list[str]
    matched_on: list[str]
    """Config keys every compared pair of runs agrees on."""
    pooled_axes: list[str]
    notes: list[str]

    @property
    def mean_offdiag(self) -> Tested:
        """Mean over the compared pairs of labels of their rho, against the same relabellings."""
        return self.statistics[MATRIX]

    def __getattr__(self, name: str) -> Any:
        """``result.rbo``: a pairwise statistic's mean; ``result.chance_overlap``: a top-k statistic's chance."""
        tested, chance = self.__dict__.get("statistics", {}), self.__dict__.get("chance", {})
        if name in tested:
            return tested[name]
        if name.startswith("chance_") and name[len("chance_"):] in chance:
            return chance[name[len("chance_"):]]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or statistic {name!r}")


@dataclass(frozen=True)
class _Rows:
    """The maps to compare as rows, and which rows are compared: what ``_tested`` tests."""

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


# --------------------------------------------------------------------------- the maths


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


def _tested(compared: _Rows, n_perm: int, seed: int, top: float) -> dict[str, Any]:
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
    k = min(p, max(1, math.ceil(top * p - 1e-9)))  # the tolerance keeps 0.1 * 30 from becoming 4
    # ties broken at random, as topk.topk_overlap: distinct average ranks differ by 1 or more, so
    # noise below 0.5 reorders tied units only
    key = ranks + 0.5 * np.random.default_rng([seed, 7]).random(ranks.shape)
    in_top = np.zeros(ranks.shape, dtype=bool)
    np.put_along_axis(in_top, np.argpartition(-key, k - 1, axis=-1)[:, :k], True, axis=-1)
    shared = (in_top[pairs[:, 0]] & in_top[pairs[:, 1]]).sum(axis=1)
    asked = statistics.asked("compare_maps")
    work = len(pairs) * p * (1 + len(stats.NULLS) * n_perm)
    others = [stat for stat in asked if stat.shape == "pairs" and stat.name != MATRIX]
    left_out = [stat.name for stat in others if work > MAX_PAIR_WORK]
    others = [stat for stat in others if stat.name not in left_out]
    values = {MATRIX: np.einsum("qp,qp->q", u[pairs[:, 0]], u[pairs[:, 1]]),
              **{stat.name: stat.pairs(flat[pairs[:, 0]], flat[pairs[:, 1]]) for stat in others}}
    which = label[pairs[:, 0]] * n_labels + label[pairs[:, 1]]
    groups = {(int(c) // n_labels, int(c) % n_labels): np.flatnonzero(which == c) for c in np.unique(which)}
    nulls_asked = [name for name in stats.NULLS if n_perm and not (name == "within_layers" and units == 1)]
    sides = {key: (u[pairs[idx, 0]], u[pairs[idx, 1]]) for key, idx in groups.items()}
    cross = {key: u1.T @ u2 / len(u1) for key, (u1, u2) in sides.items()} \
        if len(groups) * p * p <= _CROSS_ELEMENTS else {}  # (P, P) each: the null in P operations per draw
    nulls: dict[str, dict[tuple[int, int], dict[str, np.ndarray]]] = {name: {key: {} for key in groups}
                                                                      for name in values}
    rng = np.random.default_rng(seed)
    step = max(1, _CHUNK_ELEMENTS // (n_labels * p))
    for null in nulls_asked:
        drawn = {name: {key: np.empty(n_perm) for key in groups} for name in values}
        for start in range(0, n_perm, step):
            perms = _null_perms(rng, min(step, n_perm - start), n_labels, layers, units, null)  # (c, labels, P)
            inverse = {a: _inverse(perms[:, a]) for a in {a for a, _ in groups if a}}
            done = slice(start, start + len(perms))
            for (a, b), (u1, u2) in sides.items():
                # relabelling a by pi_a and b by pi_b = comparing a with b relabelled by pi_b o pi_a^-1
                sigma = perms[:, b] if a == 0 else np.take_along_axis(perms[:, b], inverse[a], axis=-1)
                drawn[MATRIX][(a, b)][done] = _relabelled(u1, u2, sigma, cross.get((a, b)))
                idx = groups[(a, b)]
                for stat in others:
                    drawn[stat.name][(a, b)][done] = _relabelled_pairs(stat, flat[pairs[idx, 0]], flat[pairs[idx, 1]],
                                                                       sigma)
        for name in values:
            for key in groups:
                nulls[name][key][null] = drawn[name][key]
    top_k = [stat for stat in asked if stat.shape == "top_k"]
    by_pair = {}
    for key, idx in groups.items():
        tested = {}
        for name, value in values.items():
            observed = float(value[idx].mean())
            tested[name] = (observed, {null: stats.null_result(observed, null_values, null)
                                       for null, null_values in nulls[name][key].items()})
        by_pair[key] = (len(idx), int(same[idx].sum()), tested,
                        {stat.name: float(np.mean(stat.top_k(shared[idx], k))) for stat in top_k})
    offdiag = {}
    for name in values:
        mean = float(np.mean([v[2][name][0] for v in by_pair.values()])) if by_pair else math.nan
        offdiag[name] = (mean, {null: stats.null_result(mean, np.mean([nulls[name][key][null] for key in groups],
                                                                      axis=0), null)
                                for null in nulls_asked if groups})
    return {"by_pair": by_pair, "offdiag": offdiag, "k": k, "chance": {stat.name: stat.chance(p, k) for stat in top_k},
            "undefined": undefined, "left_out": (left_out, work)}


# --------------------------------------------------------------------------- matching runs


def _stacks(sel: SweepData, specs: Sequence[MapSpec]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per map: (``(N,)`` bool the run has it, ``(N, L, K)`` float64 values times its sign)."""
    kinds = {spec.kind for spec in specs}
    known = sel.maps
    for spec in specs:
        if spec.name not in known:
            map_stack(sel, spec.name)  # raises the one-line unknown-map error, with a suggestion
    if len(kinds) > 1:
        raise QueryError("maps of different kinds: " + ", ".join(f"{s.name} ({s.kind})" for s in specs)
                         + "; compare maps over the same units")
    out = []
    for spec in specs:
        values, has = map_stack(sel, spec.name)
        has = np.asarray(has, dtype=bool)
        x = np.asarray(values, dtype=np.float64)
        if not has.any():
            raise QueryError(f"no finished run with map {spec.name} in the selection")
        if np.isnan(x[has]).any():
            raise QueryError(f"{spec.name}: runs of different sizes in the selection (models: "
                             f"{', '.join(axis_values(sel.subset(has), 'model'))}); filter by model")
        out.append((has, x * spec.sign))
    shapes = {spec.text: tuple(x[has].shape[1:]) for spec, (has, x) in zip(specs, out, strict=True)}
    if len(set(shapes.values())) > 1:
        raise QueryError("maps of different shapes: " + ", ".join(f"{n} {s}" for n, s in shapes.items())
                         + "; compare maps of one model (filter by model)")
    return out


def matching_keys(sel: SweepData) -> list[str]:
    """The config keys two runs must agree on to be compared across methods: every key that varies,
    except ``method`` and the keys of the methods' own sections (``head_gates.lambda``)."""
    methods = {str(m) for m in sel.method.tolist()}
    return [key for key in sorted(varying_config(sel)) if key != "method" and key.partition(".")[0] not in methods]


def matched_pairs(sel: SweepData, has_a: np.ndarray, has_b: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """``(Q, 2)`` indexes (run with A, run with B): a run with both maps with itself, else each run
    with A only with every run with B only that is equal on every key of ``keys``."""
    both = np.flatnonzero(has_a & has_b)
    a_only, b_only = np.flatnonzero(has_a & ~has_b), np.flatnonzero(has_b & ~has_a)
    block = _joint_codes([column(sel, key) for key in keys]) if keys else np.zeros(len(sel), dtype=np.int64)
    order = b_only[np.argsort(block[b_only], kind="stable")]
    lo = np.searchsorted(block[order], block[a_only], "left")
    counts = np.searchsorted(block[order], block[a_only], "right") - lo
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    cross = np.stack([np.repeat(a_only, counts), order[np.repeat(lo, counts) + within]], axis=1)
    return np.concatenate([np.stack([both, both], axis=1), cross]).astype(np.int64)


def _why_unmatched(sel: SweepData, has_a: np.ndarray, has_b: np.ndarray, keys: Sequence[str]) -> str:
    apart = [key for key in keys if not set(as_codes(column(sel, key))[has_a]) & set(as_codes(column(sel, key))[has_b])]
    if apart:
        return f"their runs never share a value of {', '.join(apart)}"
    return f"no run with one equals a run with the other on all of {', '.join(keys)}"


# --------------------------------------------------------------------------- the question


def compare_maps(data: SweepData, maps: Sequence[str], filters: Filters | None = None, across: str | None = None,
                 top: float = DEFAULT_TOP, n_perm: int = 1000, seed: int = 0, pool: Sequence[str] = (),
                 max_run_perms: int | None = None) -> Comparison:
    """Spearman rho, permutation nulls and top-k overlap between maps, or one map across an axis.

    ``maps``: names, each optionally prefixed with ``-`` (flipped). Two or more without
    ``across``; exactly one with it. ``top``: the fraction of units in the top-k sets.
    ``n_perm``: relabellings per null (0 = no test). ``max_run_perms``: refuse more than this
    many pairs x permutations when the null cannot use the cross-product shortcut (large maps).
    """
    specs = parse_maps(maps)
    across = across or None
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
    sel = select(data, filters)
    notes: list[str] = []
    compared = _between_maps(sel, specs, notes) if across is None else _across_axis(sel, specs[0], across, pool, notes)
    labels, p = compared.labels, compared.rows.shape[1] * compared.rows.shape[2]
    gathered = len(labels) * (len(labels) - 1) // 2 * p * p > _CROSS_ELEMENTS  # see _tested
    if max_run_perms is not None and gathered and len(compared.pairs) * n_perm > max_run_perms:
        raise QueryError(f"{len(compared.pairs)} pairs with {n_perm} permutations is more than this service "
                         f"answers ({max_run_perms:,} pairs x permutations): lower n_perm (to "
                         f"{max(max_run_perms // len(compared.pairs), 0)} or less) or filter the runs")
    tested = _tested(compared, n_perm, seed, float(top))
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
    matrix = np.full((len(labels), len(labels)), np.nan)
    results = []
    for (a, b), (n, n_same, values, top_k) in sorted(tested["by_pair"].items()):
        rho, nulls = values[MATRIX]
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
    shape = (int(compared.rows.shape[1]), int(compared.rows.shape[2]))
    over = f"mean over {len(results)} pairs of {'maps' if across is None else across + ' values'}"
    return Comparison(
        sweep_id=data.sweep_id, maps=[s.text for s in specs], across=across, kind=specs[0].kind, shape=shape,
        labels=labels, matrix=matrix, n_runs=compared.n_runs, pairs=results,
        statistics=_all_tested(tested["offdiag"], left_out, over), top=float(top), k=tested["k"],
        chance=tested["chance"], models=[str(m) for m in axis_values(compared.runs, "model")],
        tasks=[str(t) for t in axis_values(compared.runs, "task")], matched_on=compared.matched_on,
        pooled_axes=compared.pooled_axes, notes=notes)


def _all_tested(values: dict[str, tuple[float, dict]], left_out: list[str], pooled: str) -> dict[str, Tested]:
    """Every pairwise statistic of compare-maps, in order: ``values`` ``{name: (value, nulls)}``
    tested, those ``left_out`` NaN (``pooled`` says why)."""
    return {stat.name: Tested(*values[stat.name], pooled) if stat.name in values
            else Tested(math.nan, {}, "left out: too many pairs x units x permutations (see notes)")
            for stat in statistics.asked("compare_maps") if stat.shape == "pairs"}


def _between_maps(sel: SweepData, specs: Sequence[MapSpec], notes: list[str]) -> _Rows:
    """One row per (map, run) that some pair of maps compares: a run with both maps with itself,
    else matched runs (``matched_pairs``); a pair of maps without any is a note."""
    stacks = _stacks(sel, specs)
    any_map = np.logical_or.reduce([has for has, _ in stacks])
    sub = sel.subset(any_map)
    stacks = [(has[any_map], x[any_map]) for has, x in stacks]
    keys = matching_keys(sub)
    n = len(sub)
    found: list[tuple[int, int, np.ndarray]] = []
    for a in range(len(specs)):
        for b in range(a + 1, len(specs)):
            runs = matched_pairs(sub, stacks[a][0], stacks[b][0], keys)
            if len(runs) == 0:
                notes.append(f"{specs[a].text} and {specs[b].text}: no matched runs ("
                             f"{_why_unmatched(sub, stacks[a][0], stacks[b][0], keys)})")
                continue
            found.append((a, b, runs))
    if not found:
        raise QueryError("no pair of maps has matched runs (the same run, or runs equal on every key but "
                         "the method's own): " + "; ".join(notes))
    codes = np.unique(np.concatenate([np.concatenate([a * n + runs[:, 0], b * n + runs[:, 1]])
                                      for a, b, runs in found]))  # every (map, run) row used, once
    pairs = np.concatenate([np.stack([np.searchsorted(codes, a * n + runs[:, 0]),
                                      np.searchsorted(codes, b * n + runs[:, 1])], axis=1) for a, b, runs in found])
    same = np.concatenate([runs[:, 0] == runs[:, 1] for _, _, runs in found])
    return _Rows([s.text for s in specs], np.stack([stacks[c // n][1][c % n] for c in codes.tolist()]),
                 (codes // n).astype(np.int64), pairs, same, [int(has.sum()) for has, _ in stacks], sub, keys)


def _across_axis(sel: SweepData, spec: MapSpec, across: str, pool: Sequence[str], notes: list[str]) -> _Rows:
    """One row per (setting of the other axes, value of ``across``): the mean map of its runs
    (over seeds; ``queries.strata``, as ``agreement``); the values of one setting are compared."""
    check_across(across, sel)
    if across == "run":
        raise QueryError("compare-maps compares mean maps of an axis's values; run x run agreement is "
                         "agreement's (agreement --across run)")
    ((has, x),) = _stacks(sel, [spec])
    sub, x = sel.subset(has), x[has]
    values = axis_values(sub, across)
    if len(values) < 2:
        raise QueryError(f"comparing across {across} needs at least 2 values of {across} among the runs with "
                         f"{spec.name}, found {len(values)}: {list_choices([value_label(v) for v in values])}")
    blocks, axes = strata(sub, across, pool)
    codes, label_codes = as_codes(column(sub, across)), [value_label(v) for v in values]
    rows, label, pairs, used = [], [], [], 0
    for block in blocks:
        present = [i for i, c in enumerate(label_codes) if (codes[block] == c).any()]
        if len(present) < 2:
            continue
        used += 1
        first = len(rows)
        for i in present:
            rows.append(x[block[codes[block] == label_codes[i]]].mean(axis=0))
            label.append(i)
        pairs += [(first + i, first + j) for i in range(len(present)) for j in range(i + 1, len(present))]
    if not pairs:
        raise QueryError(f"no two values of {across} share a setting of the other axes "
                         f"({', '.join(axes['matched'])}); pool some with pool=...")
    if used < len(blocks):
        notes.append(f"{len(blocks) - used} of {len(blocks)} settings of {', '.join(axes['matched'])} have "
                     f"only one value of {across} and were left out")
    matched = axes["matched"]
    settings = (f"of {', '.join(matched)} " if matched else "") + f"of the seed-mean maps of each {across}"
    return _Rows(label_codes, np.stack(rows), np.array(label), np.array(pairs, dtype=np.int64),
                 np.zeros(len(pairs), dtype=bool), [int((codes == c).sum()) for c in label_codes], sub, matched,
                 axes["pooled"], settings)


# --------------------------------------------------------------------------- answers


def compare_json(result: Comparison) -> dict[str, Any]:
    """A ``Comparison`` as plain JSON values (the CLI's --format json and the service share it): per
    pair the matrix's rho (with ``pooled`` and ``nulls``), every other pairwise statistic tested
    under its name and every top-k one's value; overall ``mean_offdiag`` (rho's), the other pairwise
    statistics' means under their names and each top-k one's ``chance_<name>``."""
    others = [name for name in result.statistics if name != MATRIX]

    def pair_json(p: PairResult) -> dict[str, Any]:
        return {"a": p.a, "b": p.b, "n_pairs": p.n_pairs, "n_same_run": p.n_same_run, "rho": py(p.rho.observed),
                "pooled": p.rho.pooled, "nulls": null_summaries(p.rho),
                **{name: py(value) for name, value in p.top_k.items()},
                **{name: tested_json(p.statistics[name]) for name in others}}

    return {
        "sweep": result.sweep_id, "maps": result.maps, "across": result.across, "kind": result.kind,
        "shape": list(result.shape), "labels": result.labels,
        "matrix": [[py(v) for v in row] for row in result.matrix], "n_runs": result.n_runs,
        "pairs": [pair_json(p) for p in result.pairs], "mean_offdiag": tested_json(result.mean_offdiag),
        **{name: tested_json(result.statistics[name]) for name in others},
        "top": result.top, "k": result.k, **{f"chance_{name}": value for name, value in result.chance.items()},
        "models": result.models, "tasks": result.tasks,
        "matched_on": result.matched_on, "pooled_axes": result.pooled_axes, "notes": result.notes,
    }


def compare_rows(result: Comparison) -> list[dict[str, Any]]:
    """One flat row per pair of labels (the CLI's --format csv): each pairwise statistic and its
    nulls (rho's unprefixed), then top-k and each top-k statistic beside its chance."""
    rows = []
    for p in result.pairs:
        row = {"a": p.a, "b": p.b, "n_pairs": p.n_pairs}
        for name, tested in p.statistics.items():
            prefix = "" if name == MATRIX else f"{name}_"
            row[name] = py(tested.observed)
            for null in null_summaries(tested):
                row.update({f"{prefix}{key}_{null['null']}": null[key]
                            for key in ("null_mean", "band_lo", "band_hi", "excess", "p_value")})
        row["top_k"] = result.k
        for name, value in p.top_k.items():
            row.update({name: py(value), f"chance_{name}": result.chance[name]})
        rows.append(row)
    return rows


def plan_maps(data: SweepData) -> list[list[str]]:
    """The map sets worth a compare-maps figure: per kind, its maps when there are two or more,
    without a binarised map whose continuous companion is there (``heads.gate`` beside
    ``heads.log_alpha`` says nothing new), and only when some pair of them has matched runs."""
    by_kind: dict[str, list[str]] = {}
    for name in data.maps:
        by_kind.setdefault(name.partition(".")[0], []).append(name)
    plans = []
    for names in by_kind.values():
        names = [n for n in names if COMPANIONS.get(n) not in names]
        if len(names) < 2:
            continue
        try:
            stacks = _stacks(data, [MapSpec(n, n, 1.0) for n in names])
        except QueryError:
            continue
        any_map = np.logical_or.reduce([has for has, _ in stacks])
        sub = data.subset(any_map)
        keys = matching_keys(sub)
        has = [h[any_map] for h, _ in stacks]
        if any(len(matched_pairs(sub, has[a], has[b], keys)) for a in range(len(has)) for b in range(a + 1, len(has))):
            plans.append(names)
    return plans


def _shown_null(result: Comparison) -> str | None:
    """The null the figure reports: within layers (the stricter), else across all units."""
    for null in ("within_layers", "all_units"):
        if any(null in p.rho.nulls for p in result.pairs):
            return null
    return None


def title(result: Comparison, filters: Filters | None = None) -> str:
    """What the figure shows: sweep, models, tasks, the question and the chance level."""
    where = f" ({describe(filters)})" if filters else ""
    head = f"{result.sweep_id}{where}: {list_choices(result.models, 3)}; {list_choices(result.tasks, 3)}"
    if result.across is None:
        what = f"{result.kind} maps, mean over matched runs"
    else:
        what = f"{result.maps[0]} across {result.across} (seed-mean maps)"
    rho = STATISTICS[MATRIX].computes
    null = _shown_null(result)
    if null is None:
        return f"{head}\n{what}\n{rho} (no permutation test)"
    means = [p.rho.nulls[null].null_mean for p in result.pairs if null in p.rho.nulls]
    chance = f"{means[0]:.2f}" if len(means) == 1 else f"{min(means):.2f} to {max(means):.2f}"
    shuffled = "units shuffled within layers" if null == "within_layers" else "units shuffled"
    others = "".join(f"\nmean {STATISTICS[name].label} {t.observed:.2f} (null mean {t.nulls[null].null_mean:.2f}, "
                     f"{t.nulls[null].p_text})" for name, t in result.statistics.items()
                     if name != MATRIX and null in t.nulls)
    return f"{head}\n{what}\n{rho} (null mean {chance}, {shuffled}; p in each cell){others}"


def compare_png(result: Comparison, filters: Filters | None = None) -> bytes:
    """The label x label matrix of rho, annotated with each value and its p, as PNG bytes."""
    from analysis import figures

    return figures.annotated_matrix(result.matrix, result.labels, _p_notes(result), title(result, filters),
                                    STATISTICS[MATRIX].computes)


def compare_figure(result: Comparison, filters: Filters | None = None) -> Figure:
    """The matrix ``compare_png`` encodes, as a matplotlib Figure (the Python API's)."""
    from analysis import figures

    return figures.annotated_matrix_figure(result.matrix, result.labels, _p_notes(result), title(result, filters),
                                           STATISTICS[MATRIX].computes)


def _p_notes(result: Comparison) -> list[list[str]]:
    """Each compared cell's p under the shown null (``_shown_null``), "" elsewhere."""
    null = _shown_null(result)
    notes = np.full(result.matrix.shape, "", dtype=object)
    at = {label: i for i, label in enumerate(result.labels)}
    for p in result.pairs:
        if null is not None and null in p.rho.nulls:
            notes[at[p.a], at[p.b]] = notes[at[p.b], at[p.a]] = p.rho.nulls[null].p_text.replace(" ", "")
    return notes.tolist()
