"""The figures a single run draws: its final gate map (layers x heads) and any other unit map, as PNG bytes.

Uses ``matplotlib.figure.Figure`` directly (no pyplot, no global state), so it
is safe inside Ray workers and threads.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from base.png import figure_png
from base.units import OPEN_THRESHOLD


def gate_map_png(gates: np.ndarray, title: str, expected_open: float | None = None) -> bytes:
    """Heat map of gates (L, H) in [0, 1]: layer 1 at the top, white = closed, dark = open.

    The title counts the open heads (test-time gate > OPEN_THRESHOLD, outlined: the one definition)
    and, when given, ``expected_open`` beside them: the sum over heads of P(gate != 0) under the
    training noise, what the L0 penalty counts (``gates.prob_open``)."""
    num_layers, num_heads = gates.shape
    fig = Figure(figsize=(max(4.0, 0.45 * num_heads + 1.5), max(2.5, 0.4 * num_layers + 1.2)), dpi=100)
    ax = fig.subplots()
    image = ax.imshow(gates, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(num_heads), [str(h + 1) for h in range(num_heads)])
    ax.set_yticks(range(num_layers), [str(layer + 1) for layer in range(num_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    is_open = gates > OPEN_THRESHOLD  # outlined: a gate of 0.01 is open but prints nearly white
    # one collection, not a patch per head: add_patch updates the axes' limits each time (a fifth
    # of a run's gate map, issue 19)
    ax.add_collection(PatchCollection([Rectangle((head - 0.5, layer - 0.5), 1, 1) for layer, head in
                                       zip(*np.nonzero(is_open), strict=True)],
                                      facecolor="none", edgecolor="tab:orange", linewidth=1.5), autolim=False)
    counts = f"{int(is_open.sum())}/{gates.size} heads open (test-time gate > {OPEN_THRESHOLD:g}, outlined)"
    if expected_open is not None:
        counts += f"\nexpected open {expected_open:.1f} (sum of P(gate > 0) in training)"
    ax.set_title(f"{title}\n{counts}", fontsize=9)
    fig.colorbar(image, ax=ax, label="gate")
    _margins(fig, title_lines=ax.get_title().count("\n") + 1)
    return figure_png(fig)


def _margins(fig: Figure, title_lines: int) -> None:
    """Fixed margins in inches for a heat map with numbered ticks, axis labels, a colour bar and a
    title of ``title_lines`` lines at 9 pt: what ``tight_layout`` finds for the gate map, without
    measuring every text first (40 % of drawing it: 0.11-0.14 s instead of 0.18-0.22 s, issue 19)."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=0.55 / width, right=1 - 0.1 / width, bottom=0.5 / height,
                        top=1 - (0.12 + 0.16 * title_lines) / height)


def _wrap(title: str, width_inches: float, fontsize: float = 9) -> str:
    """``title`` with each line broken to fit a figure ``width_inches`` wide (a long meaning
    would otherwise run off both edges)."""
    chars = max(20, int(width_inches * 100 / fontsize))  # the title centres on the axes, left of the colour bar
    return "\n".join(textwrap.fill(line, chars) for line in title.split("\n"))


def map_png(values: np.ndarray, title: str, label: str, units: list[str] | None = None, xlabel: str = "unit") -> bytes:
    """Heat map of any (L, K) map, layer 1 at the top, on the map's own value range; ``units``
    names the columns (a weight mask's matrices), else they are numbered when few."""
    num_layers, num_units = values.shape
    width = max(6.5, 0.9 * num_units + 2.0) if units is not None else max(4.0, 0.45 * num_units + 1.5)
    width = min(16.0, width)
    title = _wrap(title, width)
    fig = Figure(figsize=(width, max(2.5, 0.4 * num_layers + 1.2 + 0.16 * title.count("\n"))), dpi=100)
    ax = fig.subplots()
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    if low < 0 < high:  # signed (an ablation's change in the metric): white at 0, red below, blue above
        bound = max(-low, high)
        image = ax.imshow(values, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto", interpolation="nearest")
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto", interpolation="nearest")
    ax.set_yticks(range(num_layers), [str(layer + 1) for layer in range(num_layers)])
    if units is not None:
        ax.set_xticks(range(num_units), units, rotation=30, ha="right")
    elif num_units <= 32:  # numbered from 1, like the layers and the gate map's heads
        ax.set_xticks(range(num_units), [str(unit + 1) for unit in range(num_units)])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    fig.tight_layout()
    return figure_png(fig)
