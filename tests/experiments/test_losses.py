"""Debiasing losses against plain numpy on three examples, and their cross-entropy special cases."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from experiments.maths.losses import conf_reg_loss, poe_loss, reweight_loss, task_loss

LOGITS = np.array([[2.0, 0.5, -1.0], [0.0, 1.0, 0.0], [-0.5, 0.3, 1.2]])  # (B=3, C=3)
LABELS = np.array([0, 2, 2])
BIAS_PROBS = np.array([[0.7, 0.2, 0.1], [0.3, 0.3, 0.4], [0.05, 0.15, 0.8]])  # p_b rows sum to 1
TEACHER = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _ce(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-example cross-entropy (B,)."""
    return -_log_softmax(z)[np.arange(len(y)), y]


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float32)


def _labels() -> torch.Tensor:
    return torch.tensor(LABELS)


def _bias_of_label() -> np.ndarray:
    return BIAS_PROBS[np.arange(3), LABELS]  # (0.7, 0.4, 0.8)


def test_poe_by_hand():
    expected = _ce(_log_softmax(LOGITS) + np.log(BIAS_PROBS), LABELS).mean()
    got = poe_loss(_t(LOGITS), _labels(), _t(np.log(BIAS_PROBS)))
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.4948, abs=1e-4)  # pinned


def test_reweight_by_hand():
    w = 1.0 - _bias_of_label()  # (0.3, 0.6, 0.2)
    expected = (w * _ce(LOGITS, LABELS)).sum() / w.sum()
    got = reweight_loss(_t(LOGITS), _labels(), _t(_bias_of_label()))
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.9963, abs=1e-4)  # pinned: (0.3 * 0.2413 + 0.6 * 1.5514 + 0.2 * 0.4632) / 1.1


def test_conf_reg_by_hand():
    scaled = TEACHER ** (1.0 - _bias_of_label())[:, None]
    targets = scaled / scaled.sum(axis=1, keepdims=True)
    expected = -(targets * _log_softmax(LOGITS)).sum(axis=1).mean()
    got = conf_reg_loss(_t(LOGITS), _labels(), _t(TEACHER), _t(_bias_of_label()))
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(1.2677, abs=1e-4)  # pinned


def test_uniform_bias_makes_poe_cross_entropy():
    logits, labels = _t(LOGITS), _labels()
    uniform = torch.full((3, 3), -np.log(3.0))
    torch.testing.assert_close(poe_loss(logits, labels, uniform), task_loss(logits, labels))


def test_constant_bias_makes_reweight_cross_entropy():
    logits, labels = _t(LOGITS), _labels()
    torch.testing.assert_close(reweight_loss(logits, labels, torch.full((3,), 0.25)), task_loss(logits, labels))


def test_ignorant_bias_and_one_hot_teacher_make_conf_reg_cross_entropy():
    logits, labels = _t(LOGITS), _labels()
    one_hot = F.one_hot(labels, 3).float()
    torch.testing.assert_close(conf_reg_loss(logits, labels, one_hot, torch.zeros(3)), task_loss(logits, labels))


def test_conf_reg_target_is_uniform_when_the_bias_is_certain():
    logits, labels = _t(LOGITS), _labels()
    got = conf_reg_loss(logits, labels, _t(TEACHER), torch.ones(3))
    expected = -_log_softmax(LOGITS).mean(axis=1).mean()  # uniform targets 1/3
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_losses_give_gradients_to_the_logits_only():
    logits = _t(LOGITS).requires_grad_()
    bias = _t(np.log(BIAS_PROBS)).requires_grad_(False)
    (poe_loss(logits, _labels(), bias) + reweight_loss(logits, _labels(), _t(_bias_of_label()))
     + conf_reg_loss(logits, _labels(), _t(TEACHER), _t(_bias_of_label()))).backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
