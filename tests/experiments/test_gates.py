"""Hard Concrete gate maths against the numbers in PAPERS.md."""

import math

import pytest
import torch

from experiments.interventions.gates import HeadGates
from experiments.maths import hard_concrete as gates
from experiments.maths.hard_concrete import (
    eval_gates,
    init_log_alpha,
    l0_penalty,
    open_heads,
    prob_open,
    sample_gates,
)


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_constants_are_the_reference_ones():
    assert (gates.BETA, gates.LIMIT_L, gates.LIMIT_R) == (0.33, -0.1, 1.1)
    assert (gates.EPS, gates.OPEN_THRESHOLD) == (1e-6, 1e-3)


def test_prob_open_pinned_at_zero():
    assert prob_open(torch.tensor(0.0)).item() == pytest.approx(0.6881, abs=1e-4)
    # = sigmoid(log_alpha + 0.7913)
    x = torch.tensor([-3.0, -1.0, 0.5, 2.0])
    torch.testing.assert_close(prob_open(x), torch.sigmoid(x + 0.7913), atol=1e-4, rtol=0)


def test_eval_gates_pinned_values():
    assert eval_gates(torch.tensor(0.0)).item() == 0.5
    closed = eval_gates(torch.tensor([-2.3980, -5.0, -100.0]))
    assert torch.equal(closed, torch.zeros(3))
    opened = eval_gates(torch.tensor([2.3980, 5.0, 100.0]))
    assert torch.equal(opened, torch.ones(3))
    # strictly inside (0, 1) just inside the boundaries
    inner = eval_gates(torch.tensor([-2.39, 2.39]))
    assert ((inner > 0) & (inner < 1)).all()


def test_init_bound_for_twelve_heads():
    log_alpha = init_log_alpha(6, 12, _generator(3))
    bound = math.sqrt(6 / 13)
    assert bound == pytest.approx(0.679, abs=1e-3)
    assert log_alpha.shape == (6, 12)
    assert log_alpha.abs().max().item() <= bound
    # really spread over the interval, not a constant
    assert log_alpha.max().item() > 0.4 * bound and log_alpha.min().item() < -0.4 * bound


@pytest.mark.parametrize("value", [-2.0, -0.5, 0.0, 1.0])
def test_empirical_open_rate_matches_prob_open(value):
    log_alpha = torch.full((10_000,), value)
    z = sample_gates(log_alpha, _generator(11))
    assert ((z >= 0) & (z <= 1)).all()
    rate = (z > 0).float().mean().item()
    assert rate == pytest.approx(prob_open(torch.tensor(value)).item(), abs=0.01)


def test_same_seed_same_samples_and_different_seed_differs():
    log_alpha = torch.zeros(3, 4)
    a = sample_gates(log_alpha, _generator(5))
    b = sample_gates(log_alpha, _generator(5))
    c = sample_gates(log_alpha, _generator(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sampling_leaves_global_rng_alone():
    state = torch.get_rng_state()
    sample_gates(torch.zeros(4, 4), _generator(0))
    init_log_alpha(2, 4, _generator(0))
    assert torch.equal(state, torch.get_rng_state())


def test_gradients_reach_log_alpha():
    log_alpha = torch.zeros(2, 3, requires_grad=True)
    sample_gates(log_alpha, _generator(1)).sum().backward()
    assert log_alpha.grad is not None and log_alpha.grad.abs().sum() > 0

    log_alpha.grad = None
    l0_penalty(log_alpha).backward()
    # d/dx sigmoid(x + c) at x = 0, divided by L = 2 (mean over layers)
    p = prob_open(torch.tensor(0.0)).item()
    torch.testing.assert_close(log_alpha.grad, torch.full((2, 3), p * (1 - p) / 2))


def test_l0_penalty_is_mean_over_layers_of_per_layer_sums():
    log_alpha = torch.tensor([[0.0, 0.0, 0.0], [-10.0, 10.0, 0.0]])
    p0 = 1 / (1 + math.exp(-0.33 * math.log(11)))  # P(open) at 0 = 0.6881
    p_neg = 1 / (1 + math.exp(10 - 0.33 * math.log(11)))
    p_pos = 1 / (1 + math.exp(-10 - 0.33 * math.log(11)))
    expected = ((3 * p0) + (p_neg + p_pos + p0)) / 2
    assert l0_penalty(log_alpha).item() == pytest.approx(expected, abs=1e-6)
    assert l0_penalty(log_alpha).dim() == 0


def test_open_heads_threshold():
    z = torch.tensor([0.0, 1e-3, 2e-3, 1.0])
    assert open_heads(z).tolist() == [False, False, True, True]
    assert open_heads(z, threshold=0.5).tolist() == [False, False, False, True]


def test_head_gates_module_modes_and_reproducibility():
    module = HeadGates(2, 4, _generator(7))
    assert module.log_alpha.shape == (2, 4)
    assert torch.equal(module.log_alpha.detach(), init_log_alpha(2, 4, _generator(7)))

    module.train()
    first, second = module(), module()
    assert not torch.equal(first, second)  # fresh noise each call
    again = HeadGates(2, 4, _generator(7)).train()
    assert torch.equal(again(), first)  # same seed, same stream

    module.eval()
    torch.testing.assert_close(module(), eval_gates(module.log_alpha))
    assert torch.equal(module(), module())

    module.train()
    (module().sum() + module.penalty()).backward()
    assert module.log_alpha.grad is not None
