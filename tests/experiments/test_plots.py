"""The run's own figures: what a user reads off a gate map must match the counts."""

import io

import matplotlib.image
import numpy as np

from experiments.harness.plots import gate_map_png, map_png


def _pixels(png: bytes) -> np.ndarray:
    return matplotlib.image.imread(io.BytesIO(png))[..., :3]


def _orange(image: np.ndarray) -> int:
    """Pixels of the outline colour (matplotlib's tab:orange, #ff7f0e)."""
    return int((np.abs(image - np.array([1.0, 0.498, 0.055])).max(axis=-1) < 0.06).sum())


def test_an_open_head_is_outlined_even_when_its_gate_prints_white():
    closed = np.zeros((6, 12))
    nearly_white = closed.copy()
    nearly_white[2, 5] = 0.01  # open (> 1e-3) but indistinguishable from white in Greys
    assert _orange(_pixels(gate_map_png(closed, "t"))) == 0
    one = _orange(_pixels(gate_map_png(nearly_white, "t")))
    assert one > 50
    two = nearly_white.copy()
    two[4, 7] = 0.9
    assert _orange(_pixels(gate_map_png(two, "t"))) > 1.6 * one


def test_a_signed_map_is_white_at_zero():
    values = np.zeros((2, 4))
    values[0, 0], values[1, 3] = -0.2, 0.1
    image = _pixels(map_png(values, "t", "delta", xlabel="head"))
    assert (image.min(axis=-1) > 0.95).mean() > 0.3  # the zero cells are white, not viridis purple
