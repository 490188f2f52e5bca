"""The collapse flag: a real tiny run whose training blows up predicts one class and is flagged
(``collapsed`` metric 1, tag ``true``); a run that learns is not; the judgement itself is pure."""

import math

import pytest
import torch

from base import collapse
from experiments import RunContext, parse_config, run
from experiments.training.tracking import MemoryTracker

BASE = {
    "model": "tiny-bert",
    "method": "finetune",
    "task": {"name": "synthetic-tag", "num_train": 128, "num_eval": 64, "max_length": 24},
    "train": {"max_steps": 40, "batch_size": 16, "eval_every": 40},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _run(lr: float):
    tracker = MemoryTracker()
    cfg = parse_config({**BASE, "train": {**BASE["train"], "lr": lr}})
    return run(cfg, RunContext(tracker=tracker)), tracker


def test_a_run_trained_at_a_huge_lr_is_flagged_and_one_that_learns_is_not():
    blown, blown_log = _run(lr=1.0)
    learnt, learnt_log = _run(lr=1e-3)
    assert blown.metrics[collapse.COLLAPSED] == 1.0, blown.metrics
    assert blown.metrics[collapse.TOP_CLASS_SHARE] == 1.0 or abs(blown.metrics[collapse.LOSS_VS_UNIFORM] - 1) <= 0.02
    assert blown_log.tags[collapse.COLLAPSED] == "true"
    assert learnt.metrics[collapse.COLLAPSED] == 0.0 and learnt_log.tags[collapse.COLLAPSED] == "false"
    assert learnt.metrics["accuracy"] > 0.7 and learnt.metrics[collapse.TOP_CLASS_SHARE] < 1.0, learnt.metrics
    assert blown_log.metrics[collapse.COLLAPSED][-1][1] == 1.0  # logged to the tracker too


@pytest.mark.parametrize(("metrics", "expected"), [
    ({"top_class_share": 1.0, "loss_vs_uniform": 3.0}, True),  # one class, however confident
    ({"top_class_share": 0.6, "loss_vs_uniform": 1.01}, True),  # no better than the uniform guess
    ({"top_class_share": 0.6, "loss_vs_uniform": 0.5}, False),
    ({"top_class_share": math.nan, "loss_vs_uniform": 0.99}, True),
    ({"accuracy": 0.9}, None),  # no classifier evaluated: no judgement
])
def test_collapsed_judges_the_dev_measures(metrics, expected):
    assert collapse.collapsed(metrics) is expected


def test_measure_is_the_top_share_and_the_loss_over_ln_k():
    assert collapse.measure(3, 4, math.log(3), 3) == {"top_class_share": 0.75, "loss_vs_uniform": pytest.approx(1.0)}
    assert math.isnan(collapse.measure(0, 0, 1.0, 2)["top_class_share"])
