"""Pure maths of the methods: schedules and losses, against numbers written out by hand."""

import math

import pytest
import torch

from experiments.maths.losses import IGNORE_INDEX, task_loss
from experiments.maths.schedules import linear_warmup_decay


def test_linear_warmup_decay_by_hand():
    assert [linear_warmup_decay(s, 4, 0.5) for s in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert [linear_warmup_decay(s, 10, 0.1) for s in (0, 1, 5, 10)] == [1.0, 1.0, pytest.approx(5 / 9), 0.0]


def test_no_warmup_decays_from_one_and_never_goes_negative():
    assert linear_warmup_decay(0, 8, 0.0) == 1.0
    assert linear_warmup_decay(12, 8, 0.0) == 0.0
    assert linear_warmup_decay(0, 1, 0.0) == 1.0


def test_task_loss_on_classification_logits():
    logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]])  # (B, C)
    labels = torch.tensor([0, 1])
    expected = (math.log(2) + (math.log(math.exp(2) + 1) - 0.0)) / 2
    assert task_loss(logits, labels).item() == pytest.approx(expected)


def test_task_loss_on_tags_skips_ignored_positions():
    logits = torch.zeros(1, 3, 4)  # (B, T, C): uniform over 4 tags
    logits[0, 2] = torch.tensor([9.0, 0.0, 0.0, 0.0])
    labels = torch.tensor([[1, 2, IGNORE_INDEX]])
    assert task_loss(logits, labels).item() == pytest.approx(math.log(4))  # position 2 not scored
