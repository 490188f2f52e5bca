"""Compare-maps' label x label matrix of rho as a figure: annotated with each value and its p."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysis.data.select import Filters, describe, list_choices
from analysis.questions.agreement.result import RHO, AgreementMatrix
from analysis.statistics import STATISTICS

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _shown_null(result: AgreementMatrix) -> str | None:
    """The null the figure reports: within layers (the stricter), else across all units."""
    for null in ("within_layers", "all_units"):
        if any(null in p.rho.nulls for p in result.pairs):
            return null
    return None


def title(result: AgreementMatrix, filters: Filters | None = None) -> str:
    """What the figure shows: sweep, models, tasks, the question and the chance level."""
    where = f" ({describe(filters)})" if filters else ""
    head = f"{result.sweep_id}{where}: {list_choices(result.models, 3)}; {list_choices(result.tasks, 3)}"
    if result.across is None:
        what = f"{result.kind} maps, mean over matched runs"
    else:
        what = f"{result.maps[0]} across {result.across} (seed-mean maps)"
    rho = STATISTICS[RHO].computes
    null = _shown_null(result)
    if null is None:
        return f"{head}\n{what}\n{rho} (no permutation test)"
    means = [p.rho.nulls[null].null_mean for p in result.pairs if null in p.rho.nulls]
    chance = f"{means[0]:.2f}" if len(means) == 1 else f"{min(means):.2f} to {max(means):.2f}"
    shuffled = "units shuffled within layers" if null == "within_layers" else "units shuffled"
    others = "".join(f"\nmean {STATISTICS[name].label} {t.observed:.2f} (null mean {t.nulls[null].null_mean:.2f}, "
                     f"{t.nulls[null].p_text})" for name, t in result.statistics.items()
                     if name != RHO and null in t.nulls)
    return f"{head}\n{what}\n{rho} (null mean {chance}, {shuffled}; p in each cell){others}"


def compare_png(result: AgreementMatrix, filters: Filters | None = None) -> bytes:
    """The label x label matrix of rho, annotated with each value and its p, as PNG bytes."""
    from analysis.views import figures

    return figures.annotated_matrix(result.matrix, result.labels, _p_notes(result), title(result, filters),
                                    STATISTICS[RHO].computes)


def compare_figure(result: AgreementMatrix, filters: Filters | None = None) -> Figure:
    """The matrix ``compare_png`` encodes, as a matplotlib Figure (the Python API's)."""
    from analysis.views import figures

    return figures.annotated_matrix_figure(result.matrix, result.labels, _p_notes(result), title(result, filters),
                                           STATISTICS[RHO].computes)


def _p_notes(result: AgreementMatrix) -> list[list[str]]:
    """Each compared cell's p under the shown null (``_shown_null``), "" elsewhere."""
    null = _shown_null(result)
    notes = np.full(result.matrix.shape, "", dtype=object)
    at = {label: i for i, label in enumerate(result.labels)}
    for p in result.pairs:
        if null is not None and null in p.rho.nulls:
            notes[at[p.a], at[p.b]] = notes[at[p.b], at[p.a]] = p.rho.nulls[null].p_text.replace(" ", "")
    return notes.tolist()
