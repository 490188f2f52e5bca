"""Figures of FFN-neuron sweeps (skill neurons, Wang et al. 2022): predictivity per layer, the
perturbation curves (noise on a run's top neurons vs as many random ones) and what FFN pruning keeps.

Each is one line per cell (the runs sharing a ``group_key``: every seed of one configuration, e.g.
the pretrained model and its random-initialised control), labelled by what tells the cells apart;
points are means over the cell's seeds, bands their standard deviation. Pure over a loaded SweepData.
"""

from __future__ import annotations

import numpy as np

from analysis.data.select import (
    Filters,
    QueryError,
    describe,
    groups_in_cell_order,
    map_runs,
    select,
)
from analysis.data.sweep import SweepData
from analysis.questions.pruning import cell_labels
from base import outputs

ACCURACY = outputs.ACCURACY.name
PRUNED_ACCURACY = outputs.PRUNED.name(metric=ACCURACY)
KEPT_FRACTION = outputs.PRUNED_KEPT_FRACTION.name

NOISE = outputs.NOISE
"""``accuracy_noise_top_0.01``: accuracy with Gaussian noise on the run's top 1 % neurons (``random``:
on as many random neurons of the same layers); skill_neurons' perturbation metrics."""
NOISE_OF_ACCURACY = NOISE.pattern.replace("<metric>", ACCURACY)
"""How an error names them: ``accuracy_noise_<top|random>_<fraction>``."""
Lines = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def noise_metrics(names) -> dict[str, dict[float, str]]:
    """``{which: {fraction: metric name}}`` of the perturbation metrics of accuracy among ``names``."""
    found: dict[str, dict[float, str]] = {}
    for name in names:
        match = NOISE.parse(name)
        if match and match["metric"] == ACCURACY:
            found.setdefault(match["which"], {})[float(match["fraction"])] = name
    return found


def _mean_std(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (ddof 1; 0 for one run) over axis 0, ignoring the NaN rows of unfinished runs."""
    values = values[~np.isnan(values).all(axis=tuple(range(1, values.ndim)))]
    std = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros(values.shape[1:])
    return values.mean(axis=0), std


def _cells(sel: SweepData, has: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(line label with its n, run indices) of each cell with a run that ``has`` what is drawn."""
    cells = [idx for idx in groups_in_cell_order(sel) if has[idx].any()]
    if not cells:
        return []
    labels = cell_labels(sel.subset(np.array([idx[0] for idx in cells])))
    return [(f"{label} (n={int(has[idx].sum())})", idx[has[idx]]) for label, idx in zip(labels, cells, strict=True)]


def layer_points(data: SweepData, map_name: str = outputs.PREDICTIVITY.name, filters: Filters | None = None) -> Lines:
    """``{cell: (layer 1..L, mean best unit per layer, std)}``: each layer's largest value of the map
    (its best neuron's predictivity), averaged over the cell's seeds."""
    sel, x, _, _ = map_runs(select(data, filters), map_name, switch=False)
    if len(sel) == 0:
        raise QueryError(f"no finished run with map {map_name} in {describe(filters)}")
    best = x.max(axis=2)  # (N, L)
    layers = np.arange(1, best.shape[1] + 1, dtype=np.float64)
    return {label: (layers, *_mean_std(best[idx])) for label, idx in _cells(sel, np.ones(len(sel), bool))}


def perturbation_points(data: SweepData, filters: Filters | None = None) -> Lines:
    """``{"<cell>: top" | "<cell>: random": (fraction perturbed, mean accuracy, std)}``, from 0 (the
    run's own accuracy, no noise) to each fraction both were perturbed at; each cell's two lines in a row."""
    sel = select(data, filters)
    found = noise_metrics(sel.metrics)
    if not found or ACCURACY not in sel.metrics:
        raise QueryError(f"no run reports {NOISE_OF_ACCURACY} in {describe(filters)}")
    fractions = sorted(set(found.get("top", {})) & set(found.get("random", {})))
    ys = {which: np.stack([sel.metrics[ACCURACY], *(sel.metrics[found[which][f]] for f in fractions)], axis=1)
          for which in ("top", "random")}
    lines: Lines = {}
    for label, idx in _cells(sel, ~np.isnan(ys["top"]).any(axis=1) & ~np.isnan(ys["random"]).any(axis=1)):
        for which in ("top", "random"):  # a cell's pair of lines, side by side (drawn in one colour)
            lines[f"{label}: {which}"] = (np.array([0.0, *fractions]), *_mean_std(ys[which][idx]))
    if not lines:
        raise QueryError(f"no finished run has the {NOISE_OF_ACCURACY} metrics in {describe(filters)}")
    return lines


def ffn_pruning_points(data: SweepData, filters: Filters | None = None) -> Lines:
    """``{cell: (fraction of the pruned layers' FFN neurons kept: (kept, 1), mean accuracy, std)}``."""
    sel = select(data, filters)
    if not {PRUNED_ACCURACY, KEPT_FRACTION, ACCURACY} <= set(sel.metrics):
        raise QueryError(f"no run reports {PRUNED_ACCURACY} (skill_neurons.prune_fraction) in {describe(filters)}")
    kept = sel.metrics[KEPT_FRACTION]
    ys = np.stack([sel.metrics[PRUNED_ACCURACY], sel.metrics[ACCURACY]], axis=1)
    lines: Lines = {}
    for label, idx in _cells(sel, ~np.isnan(ys).any(axis=1) & ~np.isnan(kept)):
        lines[label] = (np.array([float(np.mean(kept[idx])), 1.0]), *_mean_std(ys[idx]))
    if not lines:
        raise QueryError(f"no finished run has pruned_accuracy in {describe(filters)}")
    return lines


