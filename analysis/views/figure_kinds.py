"""The figure kinds and the default resolution, apart from the drawing code (matplotlib), so the
CLI's ``figures --help`` lists them without importing it."""

FIGURE_KINDS = ("rgb", "grey", "agreement", "curves", "compare_maps", "pruning", "layers", "perturbation",
                "ffn_pruning", "cost")
"""Every kind ``figure_plan.figure`` draws and ``figure_plan.figure_plan`` plans: the CLI's ``figures`` writes them,
the service serves them, ``Sweep.figure`` returns them."""
DPI = 100
"""Dots per inch of a figure unless asked otherwise (``figures --dpi``)."""
DPI_RANGE = (10, 600)
"""The resolutions a figure is drawn at, CLI and service alike (a 6.4-inch-wide PNG at 600 dpi is 3,840 pixels
wide; below 10 nothing is legible)."""
