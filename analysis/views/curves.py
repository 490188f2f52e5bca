"""Curve figures of one line per cell (mean over seeds, band = std): head_importance's pruning curves
and the FFN-neuron figures (predictivity per layer, perturbation, FFN pruning)."""

from __future__ import annotations

from matplotlib.figure import Figure

from analysis.data.select import Filters, describe, select
from analysis.data.sweep import SweepData
from analysis.questions.neurons import ffn_pruning_points, layer_points, perturbation_points
from analysis.questions.pruning import pruned_metrics, pruning_points
from analysis.views import figures
from base import outputs

ACCURACY = outputs.ACCURACY.name


def _where(sel: SweepData) -> str:
    return ", ".join(sorted(set(sel.task.tolist())))


def layers_figure(data: SweepData, filters: Filters | None = None, map_name: str = outputs.PREDICTIVITY.name) -> Figure:
    lines = layer_points(data, map_name, filters)
    title = (f"best neuron per layer of {map_name} ({_where(select(data, filters))}); chance 0.5\n"
             f"mean, band = std over seeds\n{data.sweep_id}: {describe(filters)}")
    return figures.metric_curves_figure(lines, "layer", f"max over the layer's units of {map_name}", title)


def perturbation_figure(data: SweepData, filters: Filters | None = None) -> Figure:
    lines = perturbation_points(data, filters)
    title = (f"accuracy with Gaussian noise on each run's top neurons vs as many random ones "
             f"({_where(select(data, filters))})\n{data.sweep_id}: {describe(filters)}")
    dashed = frozenset(label for label in lines if label.endswith(": random"))
    return figures.metric_curves_figure(lines, "fraction of FFN neurons perturbed (solid: top, dashed: random)",
                                 ACCURACY, title, dashed)


def ffn_pruning_figure(data: SweepData, filters: Filters | None = None) -> Figure:
    lines = ffn_pruning_points(data, filters)
    title = (f"accuracy keeping only the top skill neurons of the pruned layers' FFN "
             f"({_where(select(data, filters))})\nthe rest folded into the output bias, no re-tuning; "
             f"mean, band = std over seeds\n{data.sweep_id}: {describe(filters)}")
    return figures.metric_curves_figure(lines, "fraction of the pruned layers' FFN neurons kept", ACCURACY, title)


def pruning_figure(data: SweepData, filters: Filters | None = None, metric: str | None = None) -> Figure:
    """The pruning curves of ``metric`` (default: the first curve, accuracy when there):
    mean line and std band over seeds per cell."""
    sel = select(data, filters)
    curves = sorted(pruned_metrics(sel.metrics))
    metric = metric or (ACCURACY if ACCURACY in curves else (curves or [ACCURACY])[0])
    lines = pruning_points(data, metric, filters)
    where = ", ".join(sorted({f"{t} / {m}" for t, m in zip(sel.task, sel.model, strict=True)}))
    title = (f"{metric} vs fraction of heads pruned (least important first)\n"
             f"{where}; mean, band = std over seeds\n{data.sweep_id}: {describe(filters)}")
    return figures.metric_curves_figure(lines, "fraction of heads pruned", metric, title)
