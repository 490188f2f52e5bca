"""The maps compare-maps compares and the runs it pairs: map names with their signs (``-heads.ablation_delta``),
matched runs (equal on every config key but the method's own), and the rows of ``relabel._tested``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.data.select import (
    QueryError,
    as_codes,
    axis_values,
    column,
    list_choices,
    map_stack,
    value_label,
    varying_config,
)
from analysis.data.sweep import SweepData
from analysis.questions.agreement.relabel import Rows
from analysis.questions.agreement.strata import check_across, joint_codes, setting_means
from base import outputs


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
    block = joint_codes([column(sel, key) for key in keys]) if keys else np.zeros(len(sel), dtype=np.int64)
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


def between_maps(sel: SweepData, specs: Sequence[MapSpec], notes: list[str]) -> Rows:
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
    return Rows([s.text for s in specs], np.stack([stacks[c // n][1][c % n] for c in codes.tolist()]),
                 (codes // n).astype(np.int64), pairs, same, [int(has.sum()) for has, _ in stacks], sub, keys)


def across_axis(sel: SweepData, spec: MapSpec, across: str, pool: Sequence[str], notes: list[str]) -> Rows:
    """One row per (setting of the other axes, value of ``across``): the mean map of its runs
    (over seeds; ``strata.strata``, as ``agreement``); the values of one setting are compared."""
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
    label_codes = [value_label(v) for v in values]
    found = setting_means(sub, x, across, label_codes, pool, notes)
    pairs = [(g[i], g[j]) for g in found.groups for i in range(len(g)) for j in range(i + 1, len(g))]
    settings = (f"of {', '.join(found.matched)} " if found.matched else "") + f"of the seed-mean maps of each {across}"
    return Rows(label_codes, found.means, found.label, np.array(pairs, dtype=np.int64), np.zeros(len(pairs), dtype=bool),
                found.n_runs, sub, found.matched, found.pooled, settings)


def plan_maps(data: SweepData) -> list[list[str]]:
    """The map sets worth a compare-maps figure: per kind, its maps when there are two or more,
    without a binarised map whose continuous companion is there (``heads.gate`` beside
    ``heads.log_alpha`` says nothing new) or a map derived from one there (``outputs.DERIVED``: ``heads.pruned_at``
    beside ``heads.importance``, rho 1 by construction), and only when some pair of them has matched runs."""
    by_kind: dict[str, list[str]] = {}
    for name in data.maps:
        by_kind.setdefault(name.partition(".")[0], []).append(name)
    plans = []
    for names in by_kind.values():
        names = [n for n in names if outputs.companion(n) not in names and outputs.DERIVED.get(n) not in names]
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
