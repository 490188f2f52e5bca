"""Figures of head gates and agreement, as PNG bytes.

Arrays and labels in, PNG bytes out: no files, no registry. Built on
``matplotlib.figure.Figure`` directly, never pyplot, so there is no global
figure state and it is safe in threads (the Ray Serve API draws figures
concurrently) and under any backend.

Grids of heads are drawn with layer 1 at the TOP row and head 1 at the
left column (as the attention-head maps of Voita et al. and He & Choi are
read); axes are labelled "head" and "layer", both counted from 1.
"""

from __future__ import annotations

import textwrap

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.views.figure_kinds import DPI
from base.png import figure_png

_CELL_INCHES = 0.42  # side of one head's cell

# He & Choi's RGB seed map: head colour = (1 - z1, 1 - z2, 1 - z3). A channel is
# dark where its run keeps the head, so each colour names the runs that keep it.
_SEED_MAP_LEGEND = (
    ((0.0, 0.0, 0.0), "black: open in all 3 runs"),
    ((1.0, 1.0, 1.0), "white: closed in all 3 runs"),
    ((1.0, 0.0, 0.0), "red: open in 2, 3"),
    ((0.0, 1.0, 0.0), "green: open in 1, 3"),
    ((0.0, 0.0, 1.0), "blue: open in 1, 2"),
    ((0.0, 1.0, 1.0), "cyan: open in 1 only"),
    ((1.0, 0.0, 1.0), "magenta: open in 2 only"),
    ((1.0, 1.0, 0.0), "yellow: open in 3 only"),
)


def _png(fig: Figure) -> bytes:
    """Render at ``DPI`` through the one PNG encoder (``base.png``)."""
    return figure_png(fig, DPI)


def _grid_figure(layers: int, heads: int, extra_width: float = 0.0, title: str = "",
                 side_label: str = "") -> tuple[Figure, Axes]:
    """A figure for an L x H grid of cells, wide enough for the legend or colour bar (``extra_width``)
    and for each line of ``title`` whole (a small model's grid is narrower than its title), tall
    enough for the colour bar's ``side_label``."""
    lines = title.splitlines()
    width = max(4.0, _CELL_INCHES * heads + 1.6 + extra_width, 0.075 * max(map(len, lines), default=0))
    height = max(2.8, _CELL_INCHES * layers + 1.4, 0.075 * len(side_label) + 0.6 + 0.2 * len(lines))
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _label_head_grid(ax: Axes, layers: int, heads: int, title: str) -> None:
    """Ticks 1..H and 1..L at the cell centres (cell (l, h) spans l +- 0.5, h +- 0.5)."""
    ax.set_xticks(np.arange(heads), [str(h + 1) for h in range(heads)])
    ax.set_yticks(np.arange(layers), [str(layer + 1) for layer in range(layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.figure.suptitle(title, fontsize="medium")  # over the whole figure: a small grid is narrower than it
    ax.tick_params(length=0)


def _check_grid(gates: np.ndarray, name: str) -> np.ndarray:
    gates = np.asarray(gates, dtype=np.float64)
    if gates.ndim != 2:
        raise ValueError(f"{name} must be (layers, heads), got shape {gates.shape}")
    return gates


def rgb_seed_map_figure(z1: np.ndarray, z2: np.ndarray, z3: np.ndarray, title: str) -> Figure:
    """The Figure ``rgb_seed_map`` encodes."""
    grids = [_check_grid(z, f"z{i + 1}") for i, z in enumerate((z1, z2, z3))]
    if len({g.shape for g in grids}) != 1:
        raise ValueError(f"z1, z2, z3 differ in shape: {[g.shape for g in grids]}")
    z = np.stack(grids)  # (3, L, H)
    rgb = np.clip(1.0 - np.moveaxis(z, 0, -1), 0.0, 1.0)  # (L, H, 3)
    layers, heads = rgb.shape[:2]
    fig, ax = _grid_figure(layers, heads, extra_width=2.4, title=title)
    ax.imshow(rgb, origin="upper", interpolation="nearest", aspect="equal")
    _label_head_grid(ax, layers, heads, title)
    handles = [Patch(facecolor=c, edgecolor="0.4", label=text) for c, text in _SEED_MAP_LEGEND]
    ax.legend(
        handles=handles,
        title="colour = (1-z1, 1-z2, 1-z3)",
        title_fontsize="small",
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
    )
    return fig


def rgb_seed_map(z1: np.ndarray, z2: np.ndarray, z3: np.ndarray, title: str) -> bytes:
    """He & Choi's three-run map: head (l, h) coloured ``(1 - z1, 1 - z2, 1 - z3)`` as RGB.

    Args: three runs' gates, each ``(L, H)`` in [0, 1]. Layer 1 is the top row.
    Black = open in all three runs, white = closed in all; red / green / blue
    = open in two runs (closed in run 1 / 2 / 3); cyan / magenta / yellow =
    open in run 1 / 2 / 3 only. Fractional gates give the tints in between.
    """
    return _png(rgb_seed_map_figure(z1, z2, z3, title))


def grey_map_figure(gates: np.ndarray, title: str, label: str | None = None) -> Figure:
    """The Figure ``grey_map`` encodes."""
    gates = np.asarray(gates, dtype=np.float64)
    if gates.ndim == 2:
        gates = gates[None]
    if gates.ndim != 3:
        raise ValueError(f"gates must be (N, layers, heads), got shape {gates.shape}")
    mean = gates.mean(axis=0)  # (L, H): over ALL runs passed, not only the last task's
    layers, heads = mean.shape
    label = label or f"mean gate over {len(gates)} runs"
    fig, ax = _grid_figure(layers, heads, extra_width=1.0, title=title, side_label=label)
    image = ax.imshow(
        mean, cmap="Greys", vmin=0.0, vmax=1.0, origin="upper", interpolation="nearest"
    )
    _label_head_grid(ax, layers, heads, title)
    fig.colorbar(image, ax=ax, shrink=0.9, label=label)
    return fig


def grey_map(gates: np.ndarray, title: str, label: str | None = None) -> bytes:
    """Mean gate per head over every run given, ``(N, L, H)`` -> grey map (black = open in all);
    ``label`` names the colour bar (default: mean gate over N runs).

    (The reference script meant to average all tasks' runs but averaged only
    the last task; this averages exactly the runs passed in.)
    """
    return _png(grey_map_figure(gates, title, label))


def agreement_heatmap_figure(
    matrix: np.ndarray, labels: list[str], title: str, col_labels: list[str] | None = None
) -> Figure:
    """The Figure ``agreement_heatmap`` encodes (a notebook shows it as it is)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    col_labels = list(labels) if col_labels is None else list(col_labels)
    if matrix.shape != (len(labels), len(col_labels)):
        raise ValueError(
            f"matrix {matrix.shape} does not match {len(labels)} x {len(col_labels)} labels"
        )
    rows, cols = matrix.shape
    side = 0.55 if max(rows, cols) <= 20 else 8.0 / max(rows, cols)
    lines = title.splitlines() or [""]  # the title goes over the whole figure, each line whole
    fig = Figure(
        figsize=(max(4.0, side * cols + 2.8, 0.075 * max(map(len, lines))),
                 max(3.2, side * rows + 1.6) + 0.2 * len(lines)),
        dpi=DPI,
        layout="constrained",
    )
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.8")
    image = ax.imshow(matrix, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.9)
    if max(rows, cols) <= 20:
        ax.set_xticks(np.arange(cols), col_labels, rotation=45, ha="right", rotation_mode="anchor")
        ax.set_yticks(np.arange(rows), labels)
        for (i, j), value in np.ndenumerate(matrix):
            text = "–" if np.isnan(value) else f"{value:.2f}"
            colour = "white" if abs(value) > 0.6 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize="small", color=colour)
    fig.suptitle(title, fontsize="medium")  # over the whole figure: the lines are wider than the matrix
    ax.tick_params(length=0)
    return fig


def agreement_heatmap(
    matrix: np.ndarray, labels: list[str], title: str, col_labels: list[str] | None = None
) -> bytes:
    """Correlation matrix as a heat map, diverging colours fixed to [-1, 1] (red +, blue -).

    Args:
        matrix: ``(R, C)``; NaN cells are grey and marked "–".
        labels: R row labels (and the column labels unless ``col_labels`` is given).
    Values are written in the cells, and the labels on the axes, when both
    sides are at most 20; larger matrices are drawn without them.
    """
    return _png(agreement_heatmap_figure(matrix, labels, title, col_labels))


def metric_curves_figure(
    x_by_pipeline: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    xlabel: str,
    ylabel: str,
    title: str,
    dashed: frozenset[str] = frozenset(),
) -> Figure:
    """The Figure ``metric_curves`` encodes."""
    many = len(x_by_pipeline) > 4  # the legend goes below the axes, never over the lines
    fig = Figure(figsize=(6.4, 4.2 + (0.2 * len(x_by_pipeline) if many else 0)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    colour = None
    for name, (x, mean, std) in x_by_pipeline.items():
        x, mean, std = (np.asarray(a, dtype=np.float64) for a in (x, mean, std))
        style = {"linestyle": "--", "color": colour} if name in dashed and colour else {}
        (line,) = ax.plot(x, mean, marker="o", markersize=3, label=name, **style)
        colour = line.get_color()
        ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.fill(line, 72) for line in title.splitlines()), fontsize="medium")
    ax.grid(alpha=0.3)
    if x_by_pipeline:
        if many:
            fig.legend(title="mean ± std", fontsize="small", loc="outside lower center")
        else:
            ax.legend(title="mean ± std", fontsize="small")
    return fig


def metric_curves(
    x_by_pipeline: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    xlabel: str,
    ylabel: str,
    title: str,
    dashed: frozenset[str] = frozenset(),
) -> bytes:
    """One line per pipeline: ``{name: (x, mean, std)}``, each ``(K,)``; band = mean +- std. A line
    named in ``dashed`` is drawn dashed in the colour of the line before it (its pair)."""
    return _png(metric_curves_figure(x_by_pipeline, xlabel, ylabel, title, dashed))


def annotated_matrix_figure(
    matrix: np.ndarray, labels: list[str], notes: list[list[str]], title: str, colour_label: str
) -> Figure:
    """The Figure ``annotated_matrix`` encodes (a notebook shows it as it is)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape != (len(labels), len(labels)) or np.shape(notes) != matrix.shape:
        raise ValueError(f"matrix {matrix.shape}, notes {np.shape(notes)} and {len(labels)} labels do not match")
    n = len(labels)
    side = 1.05 if n <= 12 else 12.0 / n  # inches per cell: room for the value and its note
    longest = max((len(label) for label in labels), default=0)
    width = max(6.4, side * n + 2.2 + 0.07 * longest, 0.075 * max(map(len, title.splitlines())))
    fig = Figure(figsize=(width, max(4.4, side * n + 1.9 + 0.07 * longest)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.85")
    image = ax.imshow(matrix, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.9, label=colour_label)
    ax.set_xticks(np.arange(n), labels, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_yticks(np.arange(n), labels)
    if n <= 12:
        for (i, j), value in np.ndenumerate(matrix):
            colour = "white" if np.isfinite(value) and abs(value) > 0.6 else "black"
            text = "–" if np.isnan(value) else f"{value:.2f}"
            note = notes[i][j]
            ax.text(j, i - (0.13 if note else 0.0), text, ha="center", va="center", fontsize="medium", color=colour)
            if note:
                ax.text(j, i + 0.22, note, ha="center", va="center", fontsize="small", color=colour)
    fig.suptitle(title, fontsize="medium")  # over the whole figure: the lines are wider than the matrix
    ax.tick_params(length=0)
    return fig


def annotated_matrix(
    matrix: np.ndarray, labels: list[str], notes: list[list[str]], title: str, colour_label: str
) -> bytes:
    """A label x label matrix of correlations, colours fixed to [-1, 1] (red +, blue -), each cell
    with its value and, below it, a short note (``notes[i][j]``, e.g. its p); NaN cells grey, "–".
    Values and notes are written up to 12 labels."""
    return _png(annotated_matrix_figure(matrix, labels, notes, title, colour_label))


def bars_figure(values: dict[str, tuple[np.ndarray, np.ndarray]], rows: list[str], xlabel: str, title: str) -> Figure:
    """Horizontal bars, one row per name of ``rows`` and one bar per group: ``{group: (mean, std)}``,
    each ``(len(rows),)``, of values that are never negative (seconds); the error bar is the std,
    cut at 0. A NaN bar is drawn empty."""
    groups = list(values)
    height = 0.8 / max(len(groups), 1)
    fig = Figure(figsize=(6.4, max(2.8, 0.12 * len(rows) * max(len(groups), 1) + 0.25 * len(rows) + 1.6)),
                 dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for g, name in enumerate(groups):
        mean, std = (np.asarray(a, dtype=np.float64) for a in values[name])
        y = np.arange(len(rows)) - 0.4 + height * (g + 0.5)
        mean, std = np.nan_to_num(mean), np.nan_to_num(std)
        below = np.minimum(std, mean)  # a time is never negative: the band stops at 0
        ax.barh(y, mean, height=height, xerr=np.stack([below, std]), label=name, capsize=2)
    ax.set_yticks(np.arange(len(rows)), rows)
    ax.invert_yaxis()  # the first row at the top
    ax.set_xlabel(xlabel)
    ax.set_title("\n".join(textwrap.fill(line, 72) for line in title.splitlines()), fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    if len(groups) > 1:
        ax.legend(title="mean ± std", fontsize="small")
    return fig
