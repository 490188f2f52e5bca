"""analysis.questions.pruning: head_importance's <metric>_pruned_<pct> metrics as curves over seeds, and their plan entry."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np
import pytest

from analysis.data.select import QueryError
from analysis.data.sweep import SweepData
from analysis.questions import pruning
from analysis.views import figure_plan

PCTS = (0, 50, 100)


def _data() -> SweepData:
    """Two head_importance cells (recompute on / off) x 3 seeds, one pending run, and a finetune."""
    rows = []  # (group, method, status, seed, curve or None)
    rows += [("g-recompute", "head_importance", "finished", s, (0.9, 0.8 - 0.1 * s, 0.5)) for s in range(3)]
    rows += [("g-fixed", "head_importance", "finished", s, (0.9, 0.6, 0.5)) for s in range(2)]
    rows += [("g-fixed", "head_importance", "pending", 2, None), ("g-ft", "finetune", "finished", 0, None)]
    n = len(rows)
    metrics = {f"accuracy_pruned_{p}": np.array([np.nan if r[4] is None else r[4][i] for r in rows])
               for i, p in enumerate(PCTS)}
    metrics["loss_unrelated"] = np.zeros(n)
    metrics["accuracy"] = np.full(n, 0.9)
    text = lambda values: np.array(values, dtype=object)  # noqa: E731
    return SweepData(
        sweep_id="sw-test", version=(None, n), run_key=text([f"r{i}" for i in range(n)]),
        group_key=text([r[0] for r in rows]), status=text([r[2] for r in rows]),
        run_maps=np.empty(n, dtype=object),  # no maps: None each
        labels={"task": text(["sst2"] * n), "model": text(["minilm-l6"] * n), "method": text([r[1] for r in rows]),
                "pipeline": text(["none"] * n), "seed": np.array([r[3] for r in rows]),
                "sparsity": np.full(n, np.nan), "lambda": np.full(n, np.nan)},
        metrics=metrics,
        config={"head_importance.recompute": text([{"g-recompute": True, "g-fixed": False}.get(r[0]) for r in rows]),
                "seed": np.array([r[3] for r in rows], dtype=float)},
    )


def test_curve_names_are_parsed():
    names = ["accuracy_pruned_0", "accuracy_pruned_30/ood", "accuracy_pruned_30", "accuracy", "open_heads_pruned"]
    assert pruning.pruned_metrics(names) == {"accuracy": {0: "accuracy_pruned_0", 30: "accuracy_pruned_30"},
                                             "accuracy/ood": {30: "accuracy_pruned_30/ood"}}
    assert pruning.is_curve_point("f1_pruned_5/ood") and not pruning.is_curve_point("accuracy")


def test_one_line_per_cell_with_the_mean_and_std_over_its_seeds():
    lines = pruning.pruning_points(_data(), "accuracy")
    assert len(lines) == 2  # the finetune has no curve
    assert sorted(lines) == ["recompute=False (n=2)", "recompute=True (n=3)"]  # the pending run is left out
    recompute, fixed = lines["recompute=True (n=3)"], lines["recompute=False (n=2)"]
    np.testing.assert_allclose(recompute[0], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(recompute[1], [0.9, 0.7, 0.5])
    np.testing.assert_allclose(recompute[2], [0.0, 0.1, 0.0], atol=1e-12)  # std over seeds (ddof 1)
    np.testing.assert_allclose(fixed[1], [0.9, 0.6, 0.5])
    with pytest.raises(QueryError, match="no pruning curve of 'f1'"):
        pruning.pruning_points(_data(), "f1")


def test_the_plan_draws_pruning_curves_and_not_their_points_as_metrics():
    data = _data()
    plan = {name: (kind, params) for name, kind, params in figure_plan.figure_plan(data)}
    assert plan["pruning_sst2_accuracy.png"] == ("pruning", {"filters": {"task": ["sst2"]}, "metric": "accuracy"})
    assert not any("accuracy_pruned" in name for name in plan)
    png = figure_plan.figure(data, "pruning", {"task": ["sst2"]}, metric="accuracy")
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert image.shape[0] > 100 and image[..., :3].std() > 0.05  # a drawn figure, not a blank
