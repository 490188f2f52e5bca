"""The one figure-to-PNG encoder: every figure headsweep draws (a run's maps, the analysis'
matrices and curves) becomes bytes here, so every PNG is written the same way."""

from __future__ import annotations

import io

from matplotlib.figure import Figure


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """``fig`` as PNG bytes, at ``dpi`` (None = the figure's own); no tight bounding box, so the
    figure's transforms map to pixels as drawn."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi if dpi is not None else "figure")
    return buf.getvalue()
