"""Debiasing objectives end to end on a tiny model: their stages, and what each loss reads."""

import copy

import pytest
import torch

from base.sections import ConfigError
from experiments import parse_config
from experiments.components.debias import loss_stages

TINY = {
    "model": "tiny-bert", "method": "finetune",
    "task": {"name": "synthetic-shortcut", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 3, "batch_size": 8, "eval_every": 3, "lr": 1e-3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(loss: str, **extra):
    return parse_config({**copy.deepcopy(TINY), "finetune": {"loss": loss}, **extra})


def test_each_loss_names_the_stages_it_reads():
    assert loss_stages("ce") == {}
    assert _cfg("ce").upstreams == {}
    assert {role: up.method for role, up in _cfg("poe").upstreams.items()} == {"bias_model": "bias_only"}
    assert {role: up.method for role, up in _cfg("conf_reg").upstreams.items()} == {
        "bias_model": "bias_only", "teacher": "finetune"}
    assert _cfg("conf_reg").upstreams["teacher"].section.loss == "ce"  # the teacher is plain fine-tuning


def test_conf_reg_with_a_teacher_that_is_no_task_model_fails_at_validation():
    with pytest.raises(ConfigError, match=r"finetune.loss: conf_reg needs a teacher stage that predicts the task's labels"):
        _cfg("conf_reg", teacher={"method": "bias_only"})


@pytest.mark.parametrize("loss", ["poe", "reweight", "conf_reg"])
def test_a_debiasing_run_reads_its_stages_and_trains(loss, run_chain):
    result, store = run_chain(_cfg(loss))
    assert result.steps == 3 and 0.0 <= result.metrics["accuracy/ood"] <= 1.0
    assert len(store) == 1 + len(_cfg(loss).upstreams)
