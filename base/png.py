"""The one figure encoder (PNG, PDF, SVG): every figure headsweep draws (a run's maps, the analysis'
matrices and curves) becomes bytes here, so every PNG is written the same way."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


MEDIA_TYPES = {"png": "image/png", "pdf": "application/pdf", "svg": "image/svg+xml"}
"""Each file format a figure is written in, with its media type: PNG (screens, MLflow), PDF and SVG
(vector, for a paper)."""
FORMATS = tuple(MEDIA_TYPES)


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """``fig`` as PNG bytes, at ``dpi`` (None = the figure's own); no tight bounding box, so the
    figure's transforms map to pixels as drawn."""
    return figure_bytes(fig, "png", dpi)


def figure_bytes(fig: Figure, fmt: str = "png", dpi: float | None = None) -> bytes:
    """``fig`` encoded as ``fmt`` (one of ``FORMATS``) at ``dpi`` (None = the figure's own; in a PDF
    or SVG it sets only the resolution of raster images, such as heat maps). Without a creation
    date, so the same figure gives the same bytes."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown figure format '{fmt}' (one of {', '.join(FORMATS)})")
    import matplotlib

    buf = io.BytesIO()
    undated = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt)
    # TrueType (Type 42) fonts in a PDF, not matplotlib's default Type 3, which journals' checks refuse
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        fig.savefig(buf, format=fmt, dpi=dpi if dpi is not None else "figure", metadata=undated)
    return buf.getvalue()
