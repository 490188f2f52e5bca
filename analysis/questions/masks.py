"""Do runs keep the same weights? Intersection over union of stored weight masks.

A ``mask_train`` or ``imp`` run keeps its binary mask as the artifact ``masks.npz`` (one bit
per weight of every masked matrix, experiments/interventions/masks.py) in the orchestrator's store, and its
densities as unit maps (``heads.mask_density``, ...) in the registry. :func:`mask_iou`
compares the masks of pairs of runs that differ in one axis only:

- ``across="seed"``: every pair of seeds of a cell (runs equal on every other key);
- any other axis (``pipeline``, ``loss``, ``method``, ``task``, a config key): every pair of
  runs with different values of it that are equal on the other axes (``strata.strata``,
  seeds included: a pair shares its seed).

Per pair, the IoU of the kept weights ``|A & B| / |A | B|`` per matrix and pooled over all
of them (``experiments.interventions.masks.mask_iou``), beside what chance gives: two masks drawn at random
with the same density per matrix, ``E|A & B| / E|A | B| = p q / (p + q - p q)`` pooled the
same way. The result averages over pairs, also per layer and matrix role, and per pair of
values of the axis. The density maps' agreement with its permutation null is
``agreement(..., map_name="heads.mask_density")``.

The kept weights' IoU answers "do the masks agree?", not "did training agree?": every seed of a
``prune_only`` cell starts from the same magnitude mask of the pretrained weights and changes 1-2 %
of it, so its IoU (~0.97) mostly counts the shared start against a chance (~0.33) that assumes
none. Beside it, ``flips``: the IoU of what training changed, each run's entries flipped from its
own initial mask (``initial_masks.npz``, stored by mask_train from VERSION 4), two flips the same
when they flip the same entry the same way, against random flips of the same counts per matrix
(``flip_iou``). Runs without a stored initial mask (older runs, IMP) are left out of it, with a note.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

import numpy as np

from analysis.data.select import (
    Filters,
    QueryError,
    as_codes,
    column,
    group_indices,
    map_runs,
    select,
    value_label,
)
from analysis.data.sweep import SweepData
from analysis.questions.agreement.strata import check_across, strata
from base import outputs
from base.mask_format import chance_iou, read_masks
from base.mask_format import mask_iou as iou_of

DENSITY_MAP = outputs.HEAD_DENSITY.name
"""The map every masked run has: which runs have a stored mask to compare."""
MASKS_FILE = "masks.npz"
INITIAL_FILE = "initial_masks.npz"
"""The mask a mask_train run started from (its flips are the difference to ``MASKS_FILE``)."""
_LAYER = re.compile(r"^layer\.(\d+)\.(\w+)$")


def mask_iou(data: SweepData, across: str, load_masks: Callable[[str], bytes | None],
             filters: Filters | None = None, pool: Sequence[str] = (), max_runs: int = 200,
             load_initial: Callable[[str], bytes | None] | None = None) -> dict[str, Any]:
    """Mean IoU of the kept weights over pairs of runs that differ in ``across`` only (see the
    module docstring), with chance. ``load_masks(run_key)``: that run's ``masks.npz`` bytes, or
    None when it has none; ``max_runs`` bounds the masks read (about 1.4 MB each for MiniLM).
    ``load_initial(run_key)``: its ``initial_masks.npz`` (None: none), for ``flips``, the IoU of what
    training changed (None when no pair has both initial masks)."""
    check_across(across, data)
    sel, _, notes, _ = map_runs(select(data, filters), DENSITY_MAP, switch=False)
    if len(sel) == 0:
        raise QueryError(f"no finished run with a weight mask ({DENSITY_MAP}) in the selection")
    pairs, labels, matched = _pairs(sel, across, pool)
    if not pairs:
        raise QueryError(f"no two runs with masks differ in {across} only")
    keys = sorted({i for pair in pairs for i in pair[:2]})
    if len(keys) > max_runs:
        raise QueryError(f"{len(keys)} runs' masks is more than this answers at once ({max_runs}): filter the runs")
    masks, missing = {}, []
    for i in keys:
        data_bytes = load_masks(sel.run_key[i])
        if data_bytes is None:
            missing.append(sel.run_key[i])
        else:
            masks[i] = read_masks(data_bytes)
    if missing:
        notes.append(f"{len(missing)} runs have no stored {MASKS_FILE} and were left out (e.g. {missing[0]})")
    pairs = [p for p in pairs if p[0] in masks and p[1] in masks]
    if not pairs:
        raise QueryError(f"no pair of runs that differ in {across} only has both masks stored")

    per_pair = [pair_iou(masks[i], masks[j]) for i, j, _ in pairs]
    names = list(per_pair[0]["per_matrix"])
    n = len(labels)
    by_value, count = np.zeros((n, n)), np.zeros((n, n))
    for (_, _, (a, b)), result in zip(pairs, per_pair, strict=True):
        for u, v in ((a, b), (b, a)):
            by_value[u, v] += result["iou"]
            count[u, v] += 1
    with np.errstate(invalid="ignore"):
        matrix = np.where(count > 0, by_value / np.maximum(count, 1), np.nan)
    iou = float(np.mean([r["iou"] for r in per_pair]))
    chance = float(np.mean([r["chance"] for r in per_pair]))
    initial = {} if load_initial is None else {i: read_masks(b) for i in masks if (b := load_initial(sel.run_key[i]))}
    if load_initial is not None and len(initial) < len(masks):
        notes.append(f"{len(masks) - len(initial)} runs have no stored {INITIAL_FILE} (mask_train before VERSION 4, "
                     "IMP): left out of the flips")
    flips = _flips([(masks[i], masks[j], initial[i], initial[j]) for i, j, _ in pairs if i in initial and j in initial],
                   across)
    return {
        "across": across, "labels": labels, "pairs": len(pairs), "runs": len(masks),
        "iou": iou, "chance": chance, "excess": iou - chance,
        "matrix": [[None if np.isnan(v) else float(v) for v in row] for row in matrix],
        "per_matrix": {name: float(np.mean([r["per_matrix"][name] for r in per_pair])) for name in names},
        "per_role": _by_role({name: np.mean([r["per_matrix"][name] for r in per_pair]) for name in names}),
        "matched_on": matched, "notes": notes,
        "pooled": f"mean over {len(pairs)} pairs of runs that differ in {across} only",
        "flips": flips,
    }


def _flips(quads: list[tuple], across: str) -> dict[str, Any] | None:
    """``flip_iou`` averaged over pairs (final a, final b, initial a, initial b); None without any."""
    if not quads:
        return None
    per_pair = [flip_iou(*quad) for quad in quads]
    iou, chance = (_finite_mean([r[key] for r in per_pair]) for key in ("iou", "chance"))
    return {"iou": iou, "chance": chance, "excess": iou - chance, "pairs": len(quads),
            "flipped": float(np.mean([f for r in per_pair for f in r["flipped"]])),
            "pooled": f"mean over {len(quads)} pairs of runs that differ in {across} only, of the entries each run's "
                      "training flipped from its initial mask (same entry, same way); chance: random flips of the same "
                      "counts per matrix (kept ones among the initially removed, removed ones among the kept)"}


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def flip_iou(a: dict[str, np.ndarray], b: dict[str, np.ndarray], init_a: dict[str, np.ndarray],
             init_b: dict[str, np.ndarray]) -> dict[str, Any]:
    """IoU of what training changed in two runs, pooled over matrices, and its chance.

    Run ``a``'s flips are ``gained = a & ~init_a`` and ``lost = ~a & init_a``; two runs share a
    flip when both gain, or both lose, the same entry: ``|G_a & G_b| + |L_a & L_b|`` over
    ``|F_a| + |F_b| - shared``. Chance: each run's flips drawn at random in its matrix with the
    same counts, gains among the ``n0`` initially removed entries and losses among the ``n1``
    kept ones (a shared initial mask: exact; otherwise ``n0``, ``n1`` the two runs' mean), so
    ``E shared = g_a g_b / n0 + l_a l_b / n1``, as a ratio of expectations like ``chance_iou``.
    NaN where neither run flipped anything. ``flipped``: each run's fraction of entries flipped."""
    shared = union = expected = expected_union = 0.0
    flipped, size = [0, 0], 0
    for name in a:
        fa, fb, ia, ib = (np.asarray(m, dtype=bool) for m in (a[name], b[name], init_a[name], init_b[name]))
        gained_a, lost_a, gained_b, lost_b = fa & ~ia, ~fa & ia, fb & ~ib, ~fb & ib
        count_a, count_b = int(gained_a.sum() + lost_a.sum()), int(gained_b.sum() + lost_b.sum())
        both = int((gained_a & gained_b).sum() + (lost_a & lost_b).sum())
        shared, union = shared + both, union + count_a + count_b - both
        n1 = (int(ia.sum()) + int(ib.sum())) / 2
        n0 = ia.size - n1
        e = (gained_a.sum() * gained_b.sum() / n0 if n0 else 0.0) + (lost_a.sum() * lost_b.sum() / n1 if n1 else 0.0)
        expected, expected_union = expected + e, expected_union + count_a + count_b - e
        flipped, size = [flipped[0] + count_a, flipped[1] + count_b], size + ia.size
    nan = float("nan")
    return {"iou": shared / union if union else nan, "chance": float(expected / expected_union) if expected_union else nan,
            "flipped": (flipped[0] / size, flipped[1] / size)}


def stored_masks(root: str | None = None, name: str = MASKS_FILE) -> Callable[[str], bytes | None]:
    """``load_masks`` for :func:`mask_iou` (``name=INITIAL_FILE``: its ``load_initial``): a run's
    ``masks.npz`` from the orchestrator's store (``HEADSWEEP_CHECKPOINTS`` or the home's
    ``checkpoints`` folder), None when it has none."""
    from orchestrator.checkpoints import CheckpointStore

    store = CheckpointStore(root)
    return lambda run_key: store.get(run_key, name) if store.has(run_key, name) else None


def pair_iou(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
    """IoU of two runs' masks per matrix and pooled, and chance: random masks of the same densities."""
    per_matrix, overall = iou_of(a, b)
    return {"per_matrix": per_matrix, "iou": overall, "chance": chance_iou(a, b)}


def _pairs(sel: SweepData, across: str, pool: Sequence[str]) -> tuple[list, list[str], list[str]]:
    """[(run i, run j, (value index of i, of j))], the values' labels, the axes matched on."""
    if across == "seed":
        labels = [str(s) for s in sorted(set(sel.seed.tolist()))]
        at = {s: labels.index(str(s)) for s in set(sel.seed.tolist())}
        pairs = [(i, j, (at[sel.seed[i]], at[sel.seed[j]]))
                 for idx in group_indices(sel, ["group_key"]) for i, j in combinations(idx.tolist(), 2)]
        return pairs, labels, ["every key but the seed"]
    codes = as_codes(column(sel, across))
    values = sorted(set(codes.tolist()), key=str)
    labels = [value_label(v) for v in values]
    position = {v: k for k, v in enumerate(values)}
    blocks, axes = strata(sel, across, pool)
    seeds = sel.seed
    pairs = [(i, j, (position[codes[i]], position[codes[j]]))
             for block in blocks for i, j in combinations(block.tolist(), 2)
             if codes[i] != codes[j] and seeds[i] == seeds[j]]
    return pairs, labels, axes["matched"] + ["seed"]


def _by_role(per_matrix: dict[str, float]) -> dict[str, list[float]]:
    """``{role: [IoU of layer 0, layer 1, ...]}`` for the ``layer.<l>.<role>`` matrices."""
    roles: dict[str, dict[int, float]] = {}
    for name, value in per_matrix.items():
        match = _LAYER.match(name)
        if match:
            roles.setdefault(match[2], {})[int(match[1])] = float(value)
    return {role: [layers[k] for k in sorted(layers)] for role, layers in roles.items()}
