"""analysis.views.figures: valid PNGs of the right size, and pixels that follow the gate values."""

import io

import matplotlib.image
import numpy as np
import pytest
from matplotlib import colormaps

from analysis.views import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _decode(png: bytes) -> np.ndarray:
    assert png[:8] == PNG_MAGIC
    return matplotlib.image.imread(io.BytesIO(png), format="png")  # (rows, cols, 4) float in [0, 1]


def _render(fig):
    """PNG of a private ``_..._figure`` builder's figure, decoded, with that figure's axes."""
    image = _decode(figures._png(fig))
    width, height = fig.bbox.width, fig.bbox.height  # pixels: savefig uses the figure's own DPI
    assert image.shape[:2] == (round(height), round(width))
    return image, fig.axes[0]


def _pixel(image, ax, layer: int, head: int, offset=(0.0, 0.0)) -> np.ndarray:
    """RGB at the centre of cell (layer, head) (+ offset in cells), via the axes' data transform."""
    # display pixels, origin at the bottom left; image rows count from the top
    x, y = ax.transData.transform((head + offset[0], layer + offset[1]))
    return image[int(round(image.shape[0] - y)), int(round(x)), :3]


# Eight heads in layer 0 cover every open/closed pattern of three runs (1 = open).
PATTERNS = {  # head: (z1, z2, z3) -> expected RGB = 1 - z
    0: (1, 1, 1),  # black
    1: (0, 0, 0),  # white
    2: (1, 0, 0),  # cyan: open in run 1 only
    3: (0, 1, 0),  # magenta: run 2 only
    4: (0, 0, 1),  # yellow: run 3 only
    5: (1, 1, 0),  # blue: runs 1, 2
    6: (0, 1, 1),  # red: runs 2, 3
    7: (1, 0, 1),  # green: runs 1, 3
}


def _seed_runs(layers=6, heads=12):
    z = np.zeros((3, layers, heads))
    for head, pattern in PATTERNS.items():
        z[:, 0, head] = pattern
    z[:, layers - 1, 0] = (1.0, 0.0, 0.0)  # bottom-left cyan: layer 1 must be at the top
    z[:, 2, 9] = (0.5, 0.5, 0.5)  # half-open everywhere: mid grey
    return z


def test_rgb_seed_map_png_and_size():
    z = _seed_runs()
    png = figures.rgb_seed_map(z[0], z[1], z[2], "three seeds")
    image, _ = _render(figures.rgb_seed_map_figure(z[0], z[1], z[2], "three seeds"))
    assert _decode(png).shape == image.shape


def test_rgb_seed_map_cell_colours_follow_the_gates():
    z = _seed_runs()
    image, ax = _render(figures.rgb_seed_map_figure(z[0], z[1], z[2], "three seeds"))
    for head, pattern in PATTERNS.items():
        expected = 1.0 - np.array(pattern, dtype=float)
        np.testing.assert_allclose(
            _pixel(image, ax, 0, head), expected, atol=0.02, err_msg=f"head {head}"
        )
    # cyan = open only in run 1, named explicitly as the brief asks
    np.testing.assert_allclose(_pixel(image, ax, 0, 2), [0.0, 1.0, 1.0], atol=0.02)
    np.testing.assert_allclose(_pixel(image, ax, 2, 9), [0.5, 0.5, 0.5], atol=0.02)


def test_rgb_seed_map_layer_one_is_the_top_row():
    z = _seed_runs()
    image, ax = _render(figures.rgb_seed_map_figure(z[0], z[1], z[2], "t"))
    _, y_layer1 = ax.transData.transform((0, 0))
    _, y_last = ax.transData.transform((0, 5))
    assert y_layer1 > y_last  # display y grows upwards: layer 1 is drawn above layer 6
    np.testing.assert_allclose(_pixel(image, ax, 5, 0), [0.0, 1.0, 1.0], atol=0.02)
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3", "4", "5", "6"]


def test_rgb_seed_map_legend_names_the_colours_correctly():
    z = _seed_runs()
    fig = figures.rgb_seed_map_figure(z[0], z[1], z[2], "t")
    legend = fig.axes[0].get_legend()
    entries = {
        text.get_text(): tuple(handle.get_facecolor()[:3])
        for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }
    assert entries["black: open in all 3 runs"] == (0.0, 0.0, 0.0)
    assert entries["white: closed in all 3 runs"] == (1.0, 1.0, 1.0)
    assert entries["cyan: open in 1 only"] == (0.0, 1.0, 1.0)
    assert entries["red: open in 2, 3"] == (1.0, 0.0, 0.0)
    # every legend colour is what (1 - z1, 1 - z2, 1 - z3) gives for the runs it names
    for label, colour in entries.items():
        if "open in" in label and "all" not in label:
            runs = {int(c) for c in label.split("open in")[1] if c.isdigit()}
            assert colour == tuple(0.0 if r in runs else 1.0 for r in (1, 2, 3)), label


def test_rgb_seed_map_rejects_mismatched_runs():
    with pytest.raises(ValueError, match="differ in shape"):
        figures.rgb_seed_map(np.zeros((6, 12)), np.zeros((6, 12)), np.zeros((6, 11)), "t")


def test_grey_map_averages_all_runs():
    gates = np.zeros((4, 6, 12))
    gates[:, 0, 0] = 1.0  # open in every run: black
    gates[:2, 1, 1] = 1.0  # open in half the runs: mid grey (a last-run-only mean would be white)
    image, ax = _render(figures.grey_map_figure(gates, "all tasks"))
    assert _pixel(image, ax, 0, 0).max() < 0.1
    assert _pixel(image, ax, 5, 11).min() > 0.95
    expected = colormaps["Greys"](0.5)[:3]
    np.testing.assert_allclose(_pixel(image, ax, 1, 1), expected, atol=0.02)
    assert len(image) > 0 and _decode(figures.grey_map(gates, "all tasks")).shape == image.shape


def test_agreement_heatmap_colours_and_annotations():
    matrix = np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, np.nan], [0.0, np.nan, 1.0]])
    fig = figures.agreement_heatmap_figure(matrix, ["a", "b", "c"], "agreement")
    image, ax = _render(fig)
    corner = (0.35, 0.35)  # off-centre: the centre holds the annotation text
    cmap = colormaps["RdBu_r"]
    np.testing.assert_allclose(_pixel(image, ax, 0, 0, corner), cmap(1.0)[:3], atol=0.02)
    np.testing.assert_allclose(_pixel(image, ax, 0, 1, corner), cmap(0.0)[:3], atol=0.02)
    np.testing.assert_allclose(_pixel(image, ax, 0, 2, corner), cmap(0.5)[:3], atol=0.02)
    np.testing.assert_allclose(
        _pixel(image, ax, 1, 2, corner), [0.8, 0.8, 0.8], atol=0.02
    )  # NaN grey
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(["1.00", "-1.00", "0.00", "-1.00", "1.00", "–", "0.00", "–", "1.00"])
    png = figures.agreement_heatmap(matrix, ["a", "b", "c"], "agreement")
    assert _decode(png).shape == image.shape


def test_agreement_heatmap_large_matrix_has_no_cell_text():
    rng = np.random.default_rng(0)
    matrix = np.corrcoef(rng.random((30, 50)))
    fig = figures.agreement_heatmap_figure(matrix, [str(i) for i in range(30)], "30 runs")
    assert not fig.axes[0].texts
    _decode(figures._png(fig))
    with pytest.raises(ValueError, match="labels"):
        figures.agreement_heatmap(matrix, ["a"], "t")



def test_an_agreement_heatmap_s_long_title_fits_its_figure():
    """Agreement's title stacks every statistic with its chance level (ten lines, some wider than a
    3 x 3 matrix): each line is drawn whole inside the figure, above the matrix."""
    title = "heads.gate r across seed\nall runs\n" + "\n".join(
        f"stem cell (paper) = 0.28\nchance 0.27 (in layers), p < 0.001 {i}" for i in range(4))
    fig = figures.agreement_heatmap_figure(np.eye(3), ["0", "1", "2"], title)
    _render(fig)  # drawn as it is saved: the layout places the title and the matrix
    box, axes = fig.texts[0].get_window_extent(), fig.axes[0].get_window_extent()
    assert fig.texts[0].get_text() == title
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    assert box.y0 >= axes.y1  # above the matrix, not over it

def test_metric_curves_one_line_and_band_per_pipeline():
    x = np.linspace(0.0, 0.9, 10)
    curves = {
        "ft_then_prune": (x, 0.9 - 0.3 * x, 0.02 + 0 * x),
        "prune_only": (x, 0.8 - 0.2 * x, 0.05 + 0 * x),
    }
    fig = figures.metric_curves_figure(curves, "sparsity", "accuracy", "accuracy vs sparsity")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == list(curves)
    assert len(ax.collections) == 2  # the std bands
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(curves)
    image = _decode(figures.metric_curves(curves, "sparsity", "accuracy", "accuracy vs sparsity"))
    assert image.shape[:2] == (round(fig.bbox.height), round(fig.bbox.width))


def test_figures_never_import_pyplot():
    """pyplot keeps global figure state; the Serve API draws from several threads."""
    import subprocess
    import sys

    code = "import sys, analysis.views.figures; print('matplotlib.pyplot' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
