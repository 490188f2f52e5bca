"""The sweep's summary metrics (analysis.views.summary) on the known sweep of conftest.py."""

import math

import pytest

from analysis.questions.agreement import across_runs
from analysis.views.summary import metric_key, summary_metrics

TASK_ACC, LAMBDAS, SEEDS = {"synthetic-cls": 0.7, "synthetic-tag": 0.8}, (0.01, 0.1), (0, 1, 2)  # conftest.py's


def test_each_cell_has_its_seed_means_named_as_its_figures(data):
    summary = summary_metrics(data, n_perm=50)
    assert summary["runs_finished"] == 30 and summary["runs_failed"] == 0  # 24 gated + 6 fine-tunes
    for lam in LAMBDAS:  # accuracy = TASK_ACC + 0.05 sp + 0.01 seed - 0.5 lambda, meaned over seeds 0-2
        expected = TASK_ACC["synthetic-cls"] + 0.05 + 0.01 * sum(SEEDS) / len(SEEDS) - 0.5 * lam
        assert summary[f"accuracy/synthetic-cls_minilm-l6_head_gates_sp_lambda-{lam:g}"] == pytest.approx(expected)
    assert summary["accuracy/synthetic-tag_minilm-l6_finetune"] == pytest.approx(TASK_ACC["synthetic-tag"] + 0.1)
    assert not any("open_heads/" in key and "finetune" in key for key in summary)  # a metric it lacks
    assert all(metric_key(key) == key for key in summary)  # names MLflow takes
    assert not any("/" in key and "agreement" not in key for key in summary_metrics(data, n_perm=0, max_cells=8))


def test_seed_agreement_comes_with_its_chance(data):
    summary = summary_metrics(data, n_perm=50)
    result = across_runs.agreement(data, "seed", n_perm=50)
    assert summary["agreement/seed/heads.gate/r"] == pytest.approx(result.mean_offdiag.observed)
    assert summary["agreement/seed/heads.gate/r"] > summary["agreement/seed/heads.gate/r_chance"] + 0.5
    assert summary["agreement/seed/heads.gate/r_p"] == pytest.approx(1 / 51)  # never below 1/(n+1)
    assert summary["agreement/seed/heads.gate/stem_cell"] > summary["agreement/seed/heads.gate/stem_cell_chance"]
    assert summary["agreement/seed/heads.gate/stem_cell_paper"] == pytest.approx(result.stem_cell_paper.observed)
    assert summary["agreement/seed/heads.gate/stem_cell_paper"] > summary["agreement/seed/heads.gate/stem_cell_paper_chance"]
    assert "agreement/seed/heads.log_alpha/r" in summary
    no_test = summary_metrics(data, n_perm=0)
    assert "agreement/seed/heads.gate/r_chance" not in no_test and not math.isnan(no_test["agreement/seed/heads.gate/r"])


def test_metric_key_replaces_what_mlflow_refuses():
    assert metric_key("accuracy/sst2_lambda=0.1 (dp)") == "accuracy/sst2_lambda_0.1 _dp_"
