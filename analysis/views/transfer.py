"""Prompt transferability as rows, JSON and a figure: the views of ``questions.transfer.Transfer``."""

from __future__ import annotations

import math

import numpy as np

from analysis.data.select import (
    Filters,
    describe,
    py,
)
from analysis.questions.transfer import (
    TABLES,
    TABLES_DRAWN,
    TRANSFER,
    Correlation,
    Transfer,
)


def transfer_rows(result: Transfer) -> list[dict]:
    """One row per ordered pair with a finished run: source, target, seeds, every table's value."""
    rows = []
    for i, source in enumerate(result.tasks):
        for j, target in enumerate(result.tasks):
            if result.seeds[i, j]:
                rows.append({"source": source, "target": target, "seeds": int(result.seeds[i, j]),
                             **{name: py(table[i, j]) for name, table in result.tables.items()}})
    return rows


def transfer_json(result: Transfer) -> dict:
    """Everything as plain JSON values."""
    return {
        "sweep": result.sweep_id, "model": result.model, "tasks": result.tasks, "runs": result.runs,
        "fraction": result.fraction, "noise_std": result.noise_std, "meaning": TABLES,
        "tables": {name: [[py(v) for v in r] for r in table] for name, table in result.tables.items()},
        "seeds": result.seeds.tolist(),
        "correlations": [_correlation_json(c) for c in result.correlations],
        "pooled": result.pooled, "notes": result.notes,
    }


def _correlation_json(c: Correlation) -> dict:
    out = {"overlap": c.overlap, "with": TRANSFER, "n_pairs": c.n_pairs, "rho": py(c.rho)}
    if c.tested is not None:
        out |= {"null": "transfer values shuffled among the pairs", "null_mean": py(c.tested.null_mean),
                "band_lo": py(c.tested.band_lo), "band_hi": py(c.tested.band_hi), "p_value": py(c.tested.p_value),
                "p_text": c.tested.p_text, "n_perm": c.tested.n_perm}
    return out


def panel_title(name: str, result: Transfer) -> str:
    """A table's title: what it shows (with the perturbed fraction and the noise for the drops)."""
    what = TABLES[name]
    if name.startswith("drop_"):
        what += f" ({100 * result.fraction:g} % of the neurons, noise std {result.noise_std:g})"
    return f"{name}: {what}"


def transfer_png(result: Transfer, filters: Filters | None = None) -> bytes:
    """The annotated task x task tables (transfer, both overlaps, both drops) and overlap vs
    transfer across pairs with each rho, as PNG bytes. Transfer and overlaps are coloured over the
    pairs of different tasks (their diagonal is 1 by construction: clipped), the two drops on one
    shared scale."""
    from matplotlib.figure import Figure

    from base.png import figure_png

    n = len(result.tasks)
    side = max(3.6, 0.9 * n + 1.6)
    fig = Figure(figsize=(3 * side + 1.0, 2 * side + 1.4), dpi=100, layout="constrained")
    axes = fig.subplots(2, 3)
    off = ~np.eye(n, dtype=bool)
    drops = np.concatenate([result.tables[name].ravel() for name in ("drop_top", "drop_random")])
    for ax, name in zip(axes.flat, TABLES_DRAWN, strict=False):
        table = result.tables[name]
        scale = drops if name.startswith("drop_") else table[off]
        _matrix(ax, table, result.tasks, _wrap(panel_title(name, result), 36), scale)
    _scatter(axes.flat[5], result)
    where = f" ({describe(filters)})" if filters else ""
    fig.suptitle(f"{result.sweep_id}{where}: prompt transfer between tasks, {result.model}\n"
                 f"rows = source task (its prompt, its skill neurons), columns = target task; "
                 f"seed means, {result.pooled}", fontsize="medium")
    return figure_png(fig)


def _fmt(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "undefined"


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _matrix(ax, table: np.ndarray, tasks: list[str], title: str, scale: np.ndarray) -> None:
    """``table`` annotated, coloured from the smallest to the largest finite value of ``scale``."""
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    finite = scale[np.isfinite(scale)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if high - low < 1e-9:  # one value: a range around it, so it is not drawn as the extreme
        low, high = low - 0.5, high + 0.5
    image = ax.imshow(table, cmap=cmap, vmin=low, vmax=high, interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    ax.set_xticks(np.arange(len(tasks)), tasks, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_yticks(np.arange(len(tasks)), tasks)
    ax.set_xlabel("target task")
    ax.set_ylabel("source task")
    for (i, j), value in np.ndenumerate(table):
        text = "–" if not np.isfinite(value) else f"{value:.2f}"
        ax.text(j, i, text, ha="center", va="center", fontsize="small",
                color="black" if np.isfinite(value) and value > (low + high) / 2 else "white")
    ax.set_title(title, fontsize="small")


def _scatter(ax, result: Transfer) -> None:
    off = ~np.eye(len(result.tasks), dtype=bool) & (result.seeds > 0)
    y = result.tables[TRANSFER][off]
    for c, marker in zip(result.correlations, ("o", "s"), strict=True):
        label = f"{c.overlap}: rho {_fmt(c.rho)}" + (f", {c.tested.p_text}" if c.tested is not None else "")
        ax.plot(result.tables[c.overlap][off], y, marker, alpha=0.8, label=label)
    ax.set_xlabel("overlap of the two prompts' neurons")
    ax.set_ylabel(TRANSFER)
    ax.set_title(_wrap(f"overlap vs transfer over {int(off.sum())} ordered pairs (Spearman rho, "
                       "p: transfer shuffled among pairs)", 36), fontsize="small")
    ax.legend(fontsize="x-small")
