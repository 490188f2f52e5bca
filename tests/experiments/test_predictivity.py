"""Skill-neuron predictivity maths (experiments/maths/predictivity.py) on synthetic activations."""

import pytest
import torch

from experiments.maths.predictivity import (
    above_baseline_counts,
    by_layer,
    combined_score,
    neuron_predictivity,
    predictivity_from_activations,
    random_like,
    rank_neurons,
    subtask_accuracy,
)

P, L, U = 3, 2, 8  # prompt positions, layers, neurons


def _noise(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, P, L, U, generator=torch.Generator().manual_seed(seed))


def _planted(n: int, labels: torch.Tensor, seed: int, sign: float = 1.0) -> torch.Tensor:
    """Noise, plus layer 1 / neuron 5 at position 2 tracking the label (inverted with sign=-1),
    plus layer 0 / neuron 3 at position 0 tracking it weakly."""
    acts = _noise(n, seed)
    acts[:, 2, 1, 5] += sign * 4.0 * (labels.float() - 0.5)
    acts[:, 0, 0, 3] += 0.6 * (labels.float() - 0.5)
    return acts


def _labels(n: int, classes: int, seed: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["planted", "inverted"])
def test_a_planted_neuron_ranks_first_also_when_it_is_inverted(sign):
    y_train, y_dev = _labels(400, 2, 0), _labels(300, 2, 1)
    per_subtask = predictivity_from_activations(_planted(400, y_train, 2, sign), _planted(300, y_dev, 3, sign), y_dev, 2)
    assert per_subtask.shape == (1, L, U)
    order, owner = rank_neurons(per_subtask)
    assert order[0].tolist() == [1, 5] and owner.tolist() == [0] * (L * U)
    assert order[1].tolist() == [0, 3]  # the weak one second
    assert per_subtask[0, 1, 5] > 0.95
    assert ((per_subtask >= 0.5) & (per_subtask <= 1.0)).all()
    # the raw accuracy of an inverted neuron is low: Pred = 1 - Acc is what ranks it
    baseline = _planted(400, y_train, 2, sign).to(torch.float64).mean(0)
    counts = above_baseline_counts(_planted(300, y_dev, 3, sign).double(), baseline, y_dev, 2)
    acc = subtask_accuracy(counts, torch.bincount(y_dev, minlength=2))[0, 2, 1, 5]
    assert (acc > 0.95) if sign > 0 else (acc < 0.05)


def test_binary_accuracy_is_the_papers_formula_by_hand():
    acts = torch.tensor([[0.0], [2.0], [3.0], [1.0], [5.0]]).view(5, 1, 1, 1)
    baseline = torch.tensor([1.5]).view(1, 1, 1)
    y = torch.tensor([0, 1, 0, 0, 1])
    counts = above_baseline_counts(acts, baseline, y, 2)
    acc = subtask_accuracy(counts, torch.bincount(y, minlength=2))
    # a > 1.5: [F, T, T, F, T] vs y [0, 1, 0, 0, 1]: 4 of 5 right
    assert acc.item() == pytest.approx(0.8)
    pred, position = neuron_predictivity(counts.view(2, 1, 1, 1), torch.bincount(y, minlength=2))
    assert pred.item() == pytest.approx(0.8) and position.item() == 0


def test_one_vs_rest_on_a_three_class_toy():
    n_train, n_dev = 600, 450
    y_train, y_dev = _labels(n_train, 3, 4), _labels(n_dev, 3, 5)

    def acts(n, y, seed):
        a = _noise(n, seed)
        for c, (layer, neuron) in enumerate([(0, 1), (1, 2), (1, 7)]):  # one detector per class
            a[:, 1, layer, neuron] += 4.0 * (y == c).float()
        return a

    per_subtask = predictivity_from_activations(acts(n_train, y_train, 6), acts(n_dev, y_dev, 7), y_dev, 3)
    assert per_subtask.shape == (3, L, U)
    for c, (layer, neuron) in enumerate([(0, 1), (1, 2), (1, 7)]):
        assert per_subtask[c].flatten().argmax().item() == layer * U + neuron  # each subtask finds its detector
        assert per_subtask[c, layer, neuron] > 0.9
    # balanced accuracy: pure-noise neurons sit near 0.5, not at 1 - 1/C = 0.67 as plain accuracy would put them
    noise_units = combined_score(per_subtask).flatten()[[0, 4, 9]]
    assert (noise_units < 0.62).all()
    order, owner = rank_neurons(per_subtask)
    assert {tuple(u) for u in order[:3].tolist()} == {(0, 1), (1, 2), (1, 7)}
    assert owner[:3].tolist() == [0, 1, 2]  # round robin: one neuron per subtask
    for k in range(1, L * U + 1):  # any prefix: equal numbers per subtask, within one
        counts = torch.bincount(owner[:k], minlength=3)
        assert counts.max() - counts.min() <= 1
    assert sorted((order[:, 0] * U + order[:, 1]).tolist()) == list(range(L * U))  # every neuron once


def test_a_dead_neuron_scores_chance_in_one_vs_rest():
    y = torch.tensor([0, 0, 0, 0, 1, 2])
    counts = torch.zeros(3, 1)  # never above its baseline
    acc = subtask_accuracy(counts, torch.bincount(y, minlength=3))
    torch.testing.assert_close(acc, torch.full((3, 1), 0.5, dtype=torch.float64))


def test_counts_add_up_over_batches():
    y = _labels(50, 3, 8)
    a = _noise(50, 9)
    base = a.double().mean(0)
    whole = above_baseline_counts(a, base, y, 3)
    parts = above_baseline_counts(a[:20], base, y[:20], 3) + above_baseline_counts(a[20:], base, y[20:], 3)
    assert torch.equal(whole, parts) and whole.sum() == (a > base).sum()


def test_random_neurons_match_the_layers_and_are_uniform():
    chosen = by_layer(torch.tensor([[0, 1], [0, 4], [1, 7]]), L)
    assert {k: v.tolist() for k, v in chosen.items()} == {0: [1, 4], 1: [7]}
    gen = torch.Generator().manual_seed(0)
    hits = torch.zeros(U)
    for _ in range(400):
        rand = random_like(chosen, U, gen)
        assert {k: len(set(v.tolist())) for k, v in rand.items()} == {0: 2, 1: 1}  # distinct, as many per layer
        hits[rand[0]] += 1
    assert hits.min() > 60 and hits.max() < 140  # each of 8 neurons drawn ~100 times of 400 x 2
    with pytest.raises(ValueError, match="layer 0"):
        random_like({0: torch.arange(9)}, 8, torch.Generator())
