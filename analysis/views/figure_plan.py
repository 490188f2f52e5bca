"""Figures of a selection as PNG bytes, and the plan of every figure worth drawing for a sweep.

Pure over a loaded :class:`SweepData` (drawing itself is ``analysis.views.figures``);
the CLI's ``figures``, the service's ``/figures`` and the sweep report all use it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from analysis import statistics
from analysis.data.select import (
    DEFAULT_MAP,
    Filters,
    QueryError,
    as_codes,
    axis_values,
    check_metric,
    column,
    config_keys_of,
    default_map,
    default_metric,
    describe,
    did_you_mean,
    group_indices,
    groups_in_cell_order,
    is_not_score,
    map_runs,
    map_stack,
    select,
    varying_config,
)
from analysis.data.sweep import CELL_LABELS, SCALE_LABELS, SweepData
from analysis.questions import neurons, pruning
from analysis.questions.agreement.across_runs import agreement
from analysis.questions.agreement.compare import compare_maps
from analysis.questions.agreement.maps import plan_maps
from analysis.questions.agreement.result import AgreementMatrix
from analysis.views import curves, figures
from analysis.views.compare_figure import compare_figure
from analysis.views.figure_kinds import FIGURE_KINDS
from base import outputs
from base.png import FORMATS, figure_bytes
from base.units import OPEN_THRESHOLD

CELL_AXES = CELL_LABELS
"""The labels that name a cell, seed aside (any other config key of a grid names it too)."""
OPEN_HEADS = outputs.OPEN_HEADS.name
PRUNED_ACCURACY = outputs.PRUNED.name(metric=outputs.ACCURACY.name)
CURVE_X = (*SCALE_LABELS, OPEN_HEADS)


def _title(data: SweepData, filters: Filters | None) -> str:
    return f"{data.sweep_id}: {describe(filters)}"


def _rgb(data: SweepData, filters: Filters | None, map_name: str = DEFAULT_MAP) -> Figure:
    sel, x, _, _ = map_runs(select(data, filters), map_name, switch=False)
    cells = [idx for idx in groups_in_cell_order(sel) if len(idx) >= 3]
    if not cells:
        raise QueryError(f"the rgb map needs a cell with 3 finished seeds; none in {describe(filters)}")
    if len(cells) > 1:
        raise QueryError(_several_cells(sel, cells, filters))
    idx = cells[0][np.argsort(sel.seed[cells[0]], kind="stable")][:3]
    seeds = ", ".join(str(s) for s in sel.seed[idx])
    title = f"{_cell_name(sel, idx[0])}: seeds {seeds}"
    z = x[idx]
    if map_name == DEFAULT_MAP:  # a head is open or closed as the counts say, never by its shade
        z = (z > OPEN_THRESHOLD).astype(np.float64)
        title += "\n" + _open_counts(sel, idx, z)
    return figures.rgb_seed_map_figure(z[0], z[1], z[2], title)


def _open_counts(sel: SweepData, idx: np.ndarray, is_open: np.ndarray) -> str:
    """``heads open (test-time gate > 0.001): 16, 14, 15; expected open 9.9, 9.1, 9.5`` of runs ``idx``
    (``is_open``: their (n, L, H) open heads); the expected ones when the runs report them."""
    text = f"heads open (test-time gate > {OPEN_THRESHOLD:g}): " + ", ".join(
        str(int(n)) for n in is_open.reshape(len(idx), -1).sum(axis=1))
    expected = sel.metrics.get(outputs.EXPECTED_OPEN_HEADS.name)
    if expected is not None and np.isfinite(expected[idx]).all():
        text += "; expected open " + ", ".join(f"{e:.1f}" for e in expected[idx])
    return text


def _cell_name(sel: SweepData, i: int, sep: str = " / ") -> str:
    """The labels of run ``i``'s cell that it has (``CELL_AXES``; a setting on a scale with its name)."""
    values = [column(sel, axis)[i] for axis in CELL_AXES]
    return sep.join(f"{axis} {value}" if axis in SCALE_LABELS else str(value)
                    for axis, value in zip(CELL_AXES, values, strict=True) if value not in (None, "") and value == value)


def cell_names(sel: SweepData, cells: list[np.ndarray]) -> list[str]:
    """A unique name per cell (``cells``: run indices of ``sel``) from its labels and any other key
    that tells the cells apart, never a hash, safe in a file name: ``synthetic-cue_minilm-l6_head_gates_dp_lambda-0.05``."""
    if not cells:
        return []
    firsts = sel.subset(np.array([idx[0] for idx in cells]))
    others = [k for k in _keys_apart(firsts) if k not in CELL_AXES and k != "group_key"]
    names = ["_".join([_cell_name(firsts, j, "_"), *(f"{k}-{column(firsts, k)[j]}" for k in others)])
             for j in range(len(cells))]
    return [_safe_name(name if names.count(name) == 1 else f"{name}_{j + 1}") for j, name in enumerate(names)]


def _several_cells(sel: SweepData, cells: list[np.ndarray], filters: Filters | None) -> str:
    """Why a one-cell figure refuses: how many cells match, and the values that tell them apart."""
    firsts = sel.subset(np.array([idx[0] for idx in cells]))
    keys = _keys_apart(firsts)
    codes = [as_codes(column(firsts, key)) for key in keys]
    named = [",".join(f"{key}:{col[i]}" for key, col in zip(keys, codes, strict=True)) for i in range(len(cells))]
    shown = "; ".join(named[:4]) + (f"; ... ({len(named)} in all)" if len(named) > 4 else "")
    return (f"{len(cells)} cells with 3 finished seeds match {describe(filters)}, and the rgb map draws one: "
            f"they differ in {', '.join(keys)}; add one cell's values to the filters ({shown})")


def _keys_apart(cells: SweepData) -> list[str]:
    """The axes (labels first, then other config keys) that tell these runs' cells apart, in order
    until they do."""
    labels = [axis for axis in CELL_AXES if len(axis_values(cells, axis)) > 1]
    covered = {key for axis in labels for key in config_keys_of(cells, axis)}
    candidates = labels + sorted(k for k in varying_config(cells) if k != "seed" and k not in covered)
    keys: list[str] = []
    for key in candidates:
        keys.append(key)
        if len(set(zip(*(as_codes(column(cells, k)).tolist() for k in keys), strict=True))) == len(cells):
            return keys
    return keys + ["group_key"]


def _grey(data: SweepData, filters: Filters | None, map_name: str = DEFAULT_MAP) -> Figure:
    sel, x, _, _ = map_runs(select(data, filters), map_name, switch=False)
    if len(sel) == 0:
        raise QueryError(f"no finished run with map {map_name} in {describe(filters)}")
    if map_name != DEFAULT_MAP:
        return figures.grey_map_figure(x, f"mean {map_name} over {len(sel)} runs\n{_title(sel, filters)}")
    is_open = x > OPEN_THRESHOLD  # the one definition of open, as every count
    counts = is_open.reshape(len(sel), -1).sum(axis=1)
    text = f"heads open (test-time gate > {OPEN_THRESHOLD:g}) in {len(sel)} runs: mean {counts.mean():.1f}"
    expected = sel.metrics.get(outputs.EXPECTED_OPEN_HEADS.name)
    if expected is not None and np.isfinite(expected).all():
        text += f", expected open {expected.mean():.1f}"
    return figures.grey_map_figure(is_open.astype(np.float64), f"{text}\n{_title(sel, filters)}",
                            label=f"fraction of {len(sel)} runs with the head open")


def agreement_png(result: AgreementMatrix, filters: Filters | None = None) -> bytes:
    """``result`` as an annotated heat map (``agreement_figure``), PNG bytes."""
    return figures.agreement_heatmap(result.matrix, result.labels, _agreement_title(result, filters))


def agreement_figure(result: AgreementMatrix, filters: Filters | None = None) -> Figure:
    """The heat map ``agreement_png`` encodes, as a matplotlib Figure (the Python API's)."""
    return figures.agreement_heatmap_figure(result.matrix, result.labels, _agreement_title(result, filters))


def _agreement_title(result: AgreementMatrix, filters: Filters | None) -> str:
    """The mean off-diagonal r and each other pairwise statistic (and, across seeds, the cells
    statistics: stem cell), each with its chance level under the within-layer null."""
    text = f"{result.map_name} r across {result.across}\n{describe(filters)}"
    for stat in statistics.asked("agreement"):  # short lines: the heat map of 2 labels is ~4 inches wide
        tested = result.statistics[stat.name]
        if math.isfinite(tested.observed) and (stat.shape == "pairs" or result.across == "seed"):
            text += f"\n{'mean ' if stat.shape == 'pairs' else ''}{stat.label} = {tested.observed:.2f}"
            within = tested.nulls.get("within_layers")
            if within is not None:
                text += f"\nchance {within.null_mean:.2f} (in layers), {within.p_text}"
    return text


def _open_heads(data: SweepData) -> np.ndarray:
    if OPEN_HEADS in data.metrics:
        return data.metrics[OPEN_HEADS]
    if DEFAULT_MAP not in data.maps:  # no run gates heads (a weight-mask sweep)
        return np.full(len(data), np.nan)
    values, has = map_stack(data, DEFAULT_MAP)
    flat = np.asarray(values, dtype=np.float64).reshape(len(data), -1)
    with np.errstate(invalid="ignore"):
        return np.where(has, (flat > OPEN_THRESHOLD).sum(axis=1), np.nan)


def curve_points(data: SweepData, metric: str, x: str, filters: Filters | None = None
                 ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{line: (x, mean, std)}`` of ``metric``, over runs that have it: one line per pipeline,
    per method and pipeline when the selection holds several methods (``mask_train ft_then_prune``).

    ``x`` a label on a scale (``SCALE_LABELS``): runs pooled per x value; ``x = open_heads``: one
    point per cell at its seeds' mean number of open heads.
    """
    if x not in CURVE_X:
        raise QueryError(f"unknown x '{x}'{did_you_mean(x, CURVE_X)} (one of {', '.join(CURVE_X)})")
    sel = select(data, filters)
    y = check_metric(sel, metric)
    xs = _open_heads(sel) if x == OPEN_HEADS else sel.axis(x)
    ok = ~np.isnan(y) & ~np.isnan(xs)
    if not ok.any():
        raise QueryError(f"no finished run has both {metric} and {x} in {describe(filters)}")
    sel, y, xs = sel.subset(ok), y[ok], xs[ok]
    several = len(axis_values(sel, "method")) > 1
    curves = {}
    pipelines = sel.axis("pipeline")
    for method, pipeline in sorted({(str(m), str(p)) for m, p in zip(sel.method, pipelines, strict=True)}):
        in_p = (sel.method == method) & (pipelines == pipeline)
        part = sel.subset(in_p)
        points = []
        for idx in group_indices(part, ["group_key" if x == OPEN_HEADS else x]):
            vals = y[in_p][idx]
            std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
            points.append((float(xs[in_p][idx].mean()), float(vals.mean()), std))
        points.sort()
        label = " ".join(part for part in ((method if several else ""), pipeline) if part) or method
        curves[label] = tuple(np.array(col) for col in zip(*points, strict=True))
    return curves


def _curves(data: SweepData, filters: Filters | None, metric: str | None, x: str | None) -> Figure:
    sel = select(data, filters)
    metric = metric or default_metric(sel)
    x = x or _default_x(sel)
    curves = curve_points(data, metric, x, filters)
    xlabel = {OPEN_HEADS: f"open heads (test-time gate > {OPEN_THRESHOLD:g})"}.get(x, x)
    return figures.metric_curves_figure(curves, xlabel, metric, f"{metric} vs {xlabel}\n{_title(sel, filters)}")


def _default_x(sel: SweepData) -> str:
    for axis in SCALE_LABELS:
        if np.unique(sel.axis(axis)[~np.isnan(sel.axis(axis))]).size >= 2:
            return axis
    return OPEN_HEADS


def figure_of(data: SweepData, kind: str, filters: Filters | None = None, across: str = "seed",
              metric: str | None = None, x: str | None = None, n_perm: int = 1000,
              max_run_perms: int | None = None, map: str | None = None, maps: list[str] | None = None) -> Figure:
    """One figure of the selection as a matplotlib Figure (``figure`` encodes it).

    ``rgb``: He & Choi's map of the one cell with 3 finished seeds that the
    filters select (its 3 lowest seeds; QueryError naming the cells, by what
    tells them apart, when several match); ``grey``: mean map over every selected run. Of
    ``heads.gate`` both draw open heads (test-time gate > OPEN_THRESHOLD, the one definition) and
    give each run's open and expected open heads in the title: the grey map is then the fraction of
    runs that keep each head open;
    ``agreement``: ``agreement(across)`` as an annotated heat map (title: the
    stem cell statistic and its null band); ``curves``: ``metric`` vs ``x``
    (default: the first label on a scale that varies, else open heads), mean line and std
    band per pipeline. ``max_run_perms``: see ``agreement``. ``map``: the
    unit map of rgb, grey, agreement and layers figures (default: the map most runs of the sweep have). ``compare_maps``: the annotated matrix of Spearman
    rho between ``maps`` (``analysis.questions.agreement.compare``). ``pruning``:
    head_importance's pruning curves of ``metric`` (``analysis.questions.pruning``, drawn by ``curves``), one line per cell.
    FFN neurons (``analysis.questions.neurons``), one line per cell: ``layers``: the best unit per layer of
    ``map`` (a neuron map); ``perturbation``: accuracy with noise on the top vs random neurons;
    ``ffn_pruning``: accuracy before and after keeping only the top neurons. ``cost``: where the runs'
    time goes, every ``cost.<part>_s`` timing in one figure (mean seconds per part, per method).
    """
    check_kind(kind)
    if kind in ("rgb", "grey", "layers"):
        map = map or default_map(data)
    if kind == "rgb":
        return _rgb(data, filters, map)
    if kind == "grey":
        return _grey(data, filters, map)
    if kind == "agreement":
        result = agreement(data, across, filters, n_perm=n_perm, max_run_perms=max_run_perms, map_name=map)
        return agreement_figure(result, filters)
    if kind == "curves":
        return _curves(data, filters, metric, x)
    if kind == "compare_maps":
        return compare_figure(compare_maps(data, maps or [], filters, n_perm=n_perm, max_run_perms=max_run_perms),
                              filters)
    if kind == "pruning":
        return curves.pruning_figure(data, filters, metric)
    if kind == "layers":
        return curves.layers_figure(data, filters, map)
    if kind == "perturbation":
        return curves.perturbation_figure(data, filters)
    if kind == "ffn_pruning":
        return curves.ffn_pruning_figure(data, filters)
    return _cost(data, filters)


def figure(data: SweepData, kind: str, filters: Filters | None = None, fmt: str = "png", dpi: float = figures.DPI,
           **params: Any) -> bytes:
    """``figure_of(data, kind, filters, **params)`` encoded as ``fmt`` (png, pdf or svg) at ``dpi``."""
    if fmt not in FORMATS:
        raise QueryError(f"unknown format '{fmt}'{did_you_mean(fmt, FORMATS)} (one of {', '.join(FORMATS)})")
    return figure_bytes(figure_of(data, kind, filters, **params), fmt, dpi)


def check_kind(kind: str) -> None:
    """QueryError naming an unknown figure kind, the nearest one and every kind."""
    if kind not in FIGURE_KINDS:
        raise QueryError(f"unknown figure kind '{kind}'{did_you_mean(kind, FIGURE_KINDS)} "
                         f"(one of {', '.join(FIGURE_KINDS)})")


COST = outputs.COST
"""The run-cost timings (``base.costs``): ``cost.<part>_s``, drawn together in one figure."""


def cost_parts(data: SweepData, filters: Filters | None = None
               ) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]], int, float]:
    """(the parts, ``{method [pipeline]: (mean, std) seconds per part}``, runs timed, their mean total
    seconds) of the selection's ``cost.<part>_s`` metrics; ``cost.total_s`` is the total, not a part."""
    sel = select(data, filters)
    parts = sorted(m for m in sel.metrics if COST.matches(m) and m != outputs.COST_TOTAL)
    timed = np.zeros(len(sel), dtype=bool)
    for name in parts:
        timed |= ~np.isnan(sel.metrics[name])
    if not timed.any():
        raise QueryError(f"no run has cost.<part>_s timings in {describe(filters)}")
    sel = sel.subset(timed)
    pipelines = sel.axis("pipeline")
    groups: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for method, pipeline in sorted({(str(m), str(p)) for m, p in zip(sel.method, pipelines, strict=True)}):
        idx = (sel.method == method) & (pipelines == pipeline)
        stack = np.stack([sel.metrics[name][idx] for name in parts], axis=1)  # (runs, parts)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a part some method never times: NaN, no bar
            groups[" ".join(p for p in (method, pipeline) if p and p != "nan")] = (
                np.nanmean(stack, axis=0), np.nan_to_num(np.nanstd(stack, axis=0)))
    total = sel.metrics.get(outputs.COST_TOTAL)
    mean_total = float(np.nanmean(total)) if total is not None and (~np.isnan(total)).any() else math.nan
    return [COST.parse(name)["part"] for name in parts], groups, len(sel), mean_total


def _cost(data: SweepData, filters: Filters | None) -> Figure:
    parts, groups, n, total = cost_parts(data, filters)
    head = f"where a run's time goes: mean seconds per part (cost.<part>_s) over {n} runs"
    if math.isfinite(total):
        head += f"; mean total {total:.1f} s per run"
    return figures.bars_figure(groups, parts, "seconds per run", f"{head}\n{_title(data, filters)}")


def figure_plan(data: SweepData, max_rgb: int = 24) -> list[tuple[str, str, dict[str, Any]]]:
    """Every figure worth drawing for a sweep: ``[(file name, kind, figure() kwargs)]``.

    An rgb map per cell with 3 finished seeds (the first ``max_rgb`` cells), a
    grey map of all runs and of each task, an agreement heat map across each
    axis that has 2 values (seed: a cell with 2 seeds), a compare-maps matrix per
    unit kind with two or more maps that some matched runs share (``maps.plan_maps``: a map derived
    from another, ``outputs.DERIVED``, left out), per task the curves of each metric (not losses, head
    counts or timings) vs each x that varies, and one figure of every ``cost.<part>_s`` timing.
    """
    sel = data.subset(data.has_gates)
    plan: list[tuple[str, str, dict[str, Any]]] = []
    cells = [idx for idx in groups_in_cell_order(sel) if len(idx) >= 3][:max_rgb]
    for name, idx in zip(cell_names(sel, cells), cells, strict=True):
        plan.append((f"rgb_{name}", "rgb", {"filters": {"group_key": [str(sel.group_key[idx[0]])]}}))
    if len(sel):
        plan.append(("grey_all", "grey", {}))
        tasks = axis_values(sel, "task")
        if len(tasks) > 1:
            plan += [(f"grey_task-{t}", "grey", {"filters": {"task": [t]}}) for t in tasks]
        if any(len(idx) >= 2 for idx in group_indices(sel, ["group_key"])):
            plan.append(("agreement_seed", "agreement", {"across": "seed"}))
        for across in ("task", "pipeline", "model"):
            if len(axis_values(sel, across)) >= 2:
                plan.append((f"agreement_{across}", "agreement", {"across": across}))
    density = outputs.HEAD_DENSITY.name
    if density in data.maps:  # weight masks: do seeds keep the same weights?
        masked = data.subset(data.map(density)[1])
        if any(len(idx) >= 2 for idx in group_indices(masked, ["group_key"])):
            plan.append(("agreement_seed_mask_density", "agreement", {"across": "seed", "map": density}))
    for map_name in (m for m in data.maps if m.startswith("neurons.")):  # FFN neurons: do seeds keep the same?
        finished = data.subset(data.map(map_name)[1])
        if any(len(idx) >= 2 for idx in group_indices(finished, ["group_key"])):
            plan.append((f"agreement_seed_{map_name}", "agreement", {"across": "seed", "map": map_name}))
        for task in axis_values(finished, "task"):
            plan.append((f"layers_{task}_{map_name}", "layers", {"filters": {"task": [task]}, "map": map_name}))
    for task in axis_values(data, "task"):  # skill neurons' perturbation and pruning, where runs report them
        part = select(data, {"task": [task]})
        found = neurons.noise_metrics(name for name, v in part.metrics.items() if (~np.isnan(v)).any())
        if found:
            plan.append((f"perturbation_{task}", "perturbation", {"filters": {"task": [task]}}))
        if PRUNED_ACCURACY in part.metrics and (~np.isnan(part.metrics[PRUNED_ACCURACY])).any():
            plan.append((f"ffn_pruning_{task}", "ffn_pruning", {"filters": {"task": [task]}}))
    for names in plan_maps(data):  # two or more maps of one kind: do the methods rank units alike?
        plan.append((f"compare_maps_{names[0].partition('.')[0]}", "compare_maps", {"maps": names}))
    plan += _curves_plan(data)
    if any(COST.matches(m) and (~np.isnan(v)).any() for m, v in data.metrics.items()):
        plan.append(("cost", "cost", {}))  # every timing in one figure, never a curve each
    return [(_safe_name(name) + ".png", kind, params) for name, kind, params in plan]


def _curves_plan(data: SweepData) -> list[tuple[str, str, dict[str, Any]]]:
    """Per task, the curves of each metric (not losses, head counts or timings) vs each x that varies,
    and head_importance's pruning curves."""
    plan: list[tuple[str, str, dict[str, Any]]] = []
    done = data.subset(~np.isnan(_open_heads(data)) | (data.status == "finished"))
    for task in axis_values(done, "task") if len(done) else []:
        part = select(done, {"task": [task]})
        xs = [a for a in SCALE_LABELS if np.unique(part.axis(a)[~np.isnan(part.axis(a))]).size >= 2]
        if part.has_gates.any():  # open heads are a head-gating sweep's x, not a mask sweep's
            xs.append(OPEN_HEADS)
        for metric in sorted(m for m in part.metrics if not is_not_score(m)
                             and not pruning.is_curve_point(m) and not COST.matches(m)):
            y = part.metrics[metric]
            for x in xs:  # only curves some run can draw (a mask run has no open heads, a finetune no sparsity)
                xv = _open_heads(part) if x == OPEN_HEADS else part.axis(x)
                if not (~np.isnan(y) & ~np.isnan(np.asarray(xv, dtype=float))).any():
                    continue
                plan.append((f"curves_{task}_{metric}_vs_{x}", "curves",
                             {"filters": {"task": [task]}, "metric": metric, "x": x}))
        for metric, points in sorted(pruning.pruned_metrics(part.metrics).items()):  # head_importance's curves
            if any((~np.isnan(part.metrics[name])).any() for name in points.values()):
                plan.append((f"pruning_{task}_{metric}", "pruning", {"filters": {"task": [task]}, "metric": metric}))
    return plan


def render_all(data: SweepData) -> list[tuple[str, bytes]]:
    """Every figure of ``figure_plan(data)`` drawn: ``[(file name, PNG bytes)]`` (the sweep report)."""
    return [(name, figure(data, kind, **params)) for name, kind, params in figure_plan(data)]


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
