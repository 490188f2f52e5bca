"""Skill-neuron predictivity maths (experiments/maths/predictivity.py) on synthetic activations."""

import pytest
import torch

from experiments.maths.predictivity import (
    balance,
    binary_subtasks,
    by_layer,
    combined_score,
    correct_counts,
    neuron_predictivity,
    predictivity_from_activations,
    random_like,
    skill_neuron_mask,
    subtask_labels,
    subtask_sums,
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
def test_a_planted_neuron_is_its_layer_s_top_skill_neuron_also_when_inverted(sign):
    y_train, y_dev = _labels(400, 2, 0), _labels(300, 2, 1)
    train, dev = _planted(400, y_train, 2, sign), _planted(300, y_dev, 3, sign)
    per_subtask = predictivity_from_activations(train, y_train, dev, y_dev, 2)
    assert per_subtask.shape == (1, L, U)
    assert per_subtask[0, 1].argmax().item() == 5 and per_subtask[0, 0].argmax().item() == 3
    assert per_subtask[0, 1, 5] > 0.95
    assert ((per_subtask >= 0.5) & (per_subtask <= 1.0)).all()
    mask = skill_neuron_mask(per_subtask, 0.125)  # one neuron of each layer
    assert mask.nonzero().tolist() == [[0, 3], [1, 5]]
    # the raw accuracy of an inverted neuron is low: Pred = 1 - Acc is what ranks it
    sub = subtask_labels(y_train, 2)
    baseline = subtask_sums(train, sub) / len(y_train)
    acc = correct_counts(dev, baseline, subtask_labels(y_dev, 2))[0, 2, 1, 5] / len(y_dev)
    assert (acc > 0.95) if sign > 0 else (acc < 0.05)


def test_binary_accuracy_is_the_papers_formula_by_hand():
    acts = torch.tensor([[0.0], [2.0], [3.0], [1.0], [5.0]]).view(5, 1, 1, 1)
    baseline = torch.tensor([1.5]).view(1, 1, 1, 1)
    y = torch.tensor([0, 1, 0, 0, 1])
    correct = correct_counts(acts, baseline, subtask_labels(y, 2))
    # a > 1.5: [F, T, T, F, T] vs y [0, 1, 0, 0, 1]: 4 of 5 right
    assert correct.item() == 4
    pred, position = neuron_predictivity(correct.view(1, 1, 1, 1), torch.tensor([5]))
    assert pred.item() == pytest.approx(0.8) and position.item() == 0


def test_binary_subtasks_follow_binarize_py():
    assert binary_subtasks(2) == [((0,), (1,))]
    assert binary_subtasks(3) == [((0,), (2,)), ((0, 2), (1,))]  # pn = [0, 2] (label // 2), neu = 1
    assert binary_subtasks(4) == [((1,), (3,)), ((0, 1, 3), (2,))]  # pn = [1, 3], neu = 2
    assert binary_subtasks(5)[2] == ((0, 1, 3, 4), (2,))  # ours: class vs rest
    with pytest.raises(ValueError, match="at least 2"):
        binary_subtasks(1)


def test_three_class_subtasks_find_their_detectors():
    n_train, n_dev = 600, 450
    y_train, y_dev = _labels(n_train, 3, 4), _labels(n_dev, 3, 5)

    def acts(n, y, seed):
        a = _noise(n, seed)
        a[:, 1, 0, 1] += 4.0 * (y == 2).float() - 4.0 * (y == 0).float()  # pn detector (class 1 in the middle)
        a[:, 1, 1, 2] += 4.0 * (y == 1).float()  # neutral detector
        return a

    per_subtask = predictivity_from_activations(acts(n_train, y_train, 6), y_train, acts(n_dev, y_dev, 7), y_dev, 3)
    assert per_subtask.shape == (2, L, U)
    assert per_subtask[0].flatten().argmax().item() == 0 * U + 1 and per_subtask[0, 0, 1] > 0.95
    assert per_subtask[1].flatten().argmax().item() == 1 * U + 2 and per_subtask[1, 1, 2] > 0.95
    # balanced subsets: a pure-noise neuron sits near 0.5 in both subtasks
    assert (combined_score(per_subtask)[0, [0, 4, 7]] < 0.62).all()
    # half of each layer's quota from pn, filled up from neu
    mask = skill_neuron_mask(per_subtask, 0.25)  # 2 per layer: 1 from pn, then 1 from neu
    assert mask.sum(dim=1).tolist() == [2, 2] and mask[0, 1] and mask[1, 2]


def test_a_subtask_without_examples_scores_chance():
    pred, _ = neuron_predictivity(torch.zeros(1, 1, 1, 3, dtype=torch.int64), torch.tensor([0]))
    torch.testing.assert_close(pred, torch.full((1, 1, 3), 0.5, dtype=torch.float64))


def test_sums_and_counts_add_up_over_batches():
    y = _labels(50, 3, 8)
    a = _noise(50, 9)
    sub = subtask_labels(y, 3)
    base = subtask_sums(a, sub) / (sub >= 0).sum(1).view(-1, 1, 1, 1)
    assert torch.equal(subtask_sums(a, sub), subtask_sums(a[:20], sub[:, :20]) + subtask_sums(a[20:], sub[:, 20:]))
    whole = correct_counts(a, base, sub)
    parts = correct_counts(a[:20], base, sub[:, :20]) + correct_counts(a[20:], base, sub[:, 20:])
    assert torch.equal(whole, parts)


def test_skill_neuron_mask_counts_and_ties():
    scores = torch.zeros(1, 2, 10)
    scores[0, 0, [7, 2]] = 1.0
    mask = skill_neuron_mask(scores, 0.2)  # int(0.2 * 10) = 2 per layer
    assert mask[0].nonzero().flatten().tolist() == [2, 7]
    assert mask[1].nonzero().flatten().tolist() == [0, 1]  # all tied: the lower index first
    assert skill_neuron_mask(scores, 0.01).sum(dim=1).tolist() == [1, 1]  # at least one per layer
    assert skill_neuron_mask(scores, 1.0).all()
    with pytest.raises(ValueError, match="fraction"):
        skill_neuron_mask(scores, 0.0)


def test_random_neurons_match_the_layers_and_are_uniform():
    mask = torch.zeros(L, U, dtype=torch.bool)
    mask[0, [1, 4]] = True
    mask[1, 7] = True
    chosen = by_layer(mask)
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


# ------------------------------------------------------------------------------ parity with the reference code


def _reference_balance(labels: list[int]) -> list[int]:
    """THU-KEG/Skill-Neuron src/helper/binarize.py:13-25 (``balance``), on a list of 0/1 labels: the
    indices its ``data.filter`` keeps."""
    pos = sum(labels)
    neg = len(labels) - pos
    ths = min(pos, neg)
    cnt = [0, 0]
    kept = []
    for i, label in enumerate(labels):
        cnt[label] += 1
        if cnt[label] < ths:
            kept.append(i)
    return kept


def _reference_binarize(labels: list[int], n: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """binarize.py:54-77: (index, label) of the "-pn" and "-neu" datasets of one split."""
    if n == 3:
        pn, neu = [0, 2], 1
    elif n == 4:
        pn, neu = [1, 3], 2
    data_pn = [(i, y // 2) for i, y in enumerate(labels) if y in pn]  # filter, then map label // 2
    data_neu = [(i, int(y == neu)) for i, y in enumerate(labels)]  # map label == neu
    keep_pn = _reference_balance([y for _, y in data_pn])
    keep_neu = _reference_balance([y for _, y in data_neu])
    return [data_pn[k] for k in keep_pn], [data_neu[k] for k in keep_neu]


@pytest.mark.parametrize("n", [3, 4])
def test_parity_subtask_subsets_equal_binarize_py(n):
    """Our subtask labels are binarize.py's "-pn" and "-neu" datasets, example for example
    (balance keeps the first min - 1 of each side: its filter counts, then keeps ``cnt < ths``).
    7da99f0 had one-vs-rest subtasks on every example (no ``subtask_labels``)."""
    labels = [0, 2, 1, 1, 2, 0, 2, 2, 1, 0, 3 % n, 2, 1, 1, 0, 2, 1, (n - 1), 0, 1]
    pn, neu = _reference_binarize(labels, n)
    ours = subtask_labels(torch.tensor(labels), n)
    assert ours.shape == (2, len(labels))
    for row, reference in zip(ours, (pn, neu), strict=True):
        assert [(i, int(y)) for i, y in enumerate(row.tolist()) if y >= 0] == reference
    assert balance(torch.tensor([1, 1, 0, 1, 0, 0, 1])).tolist() == [1, 1, 0, -1, 0, -1, -1]  # min 3: keep 2 each
    assert subtask_labels(torch.tensor([1, 1, 0, 1]), 2).tolist() == [[1, 1, 0, 1]]  # binary: not balanced


def _reference_probe(train_acts, dev_acts, dev_labels):
    """trainer.py:251-293 with the prompt's activations already cut to ``[:, :prompt_size]``:
    ``probe_avg`` sums each batch's (B, P, I) activations per layer and divides by the data set's
    size; ``probe_acc`` adds ``(hidden > ths[k]) == label`` over dev and divides by its size.
    Activations here are (N, L, P, I) as ``hidden[k][0]`` is (B, P, I) per layer k."""
    num_layers = train_acts.shape[1]
    ths = [sum(train_acts[i, k].numpy().astype("float64") for i in range(len(train_acts))) / len(train_acts)
           for k in range(num_layers)]
    acctable = []
    label = dev_labels.unsqueeze(1).unsqueeze(1).numpy()  # (N, 1, 1)
    for k in range(num_layers):
        pred = dev_acts[:, k].numpy() > ths[k]  # (N, P, I)
        acctable.append((pred == label).sum(axis=0))
    return torch.tensor(ths), torch.tensor([a / len(dev_acts) for a in acctable])  # (L, P, I) each


def _reference_finfo(acc: torch.Tensor, p: float, width: int) -> torch.Tensor:
    """skillneuron.py:26-42 (``finfo``, type mean): acc (runs, L, P, I) -> (L, I) bool, the top
    ``int(p * width)`` of each layer by ``abs(acc - 0.5)`` maxed over positions, meaned over runs."""
    acc = abs(acc - 0.5)
    h = acc.max(axis=2).values.mean(axis=0)
    inf = []
    for layer in range(acc.shape[1]):
        idx = sorted(range(width), key=lambda i: -h[layer][i])
        inf.append(torch.zeros(width))
        for j in range(int(p * width)):
            inf[-1][idx[j]] = 1
    return torch.stack(inf).bool()


def _reference_multiclass(acc_pn: torch.Tensor, acc_neu: torch.Tensor, p: float, width: int) -> torch.Tensor:
    """skillneuron.py:76-97: ``finfo`` at p on the pn predictivities, then each layer filled up to
    ``int(width * 2 * p)`` from the neu ranking (saved as the skill neurons at 2p)."""
    info = _reference_finfo(acc_pn, p, width)
    acc = abs(acc_neu - 0.5)
    h = acc.max(axis=2).values.mean(axis=0)
    for layer in range(acc.shape[1]):
        order = sorted(range(width), key=lambda k: -h[layer][k])
        j = 0
        while info[layer].sum() != int(width * 2 * p):
            info[layer][order[j]] = 1
            j += 1
    return info


def _same_selection(ours: torch.Tensor, reference: torch.Tensor, scores: torch.Tensor) -> None:
    """Equal masks up to the order among exact ties: the reference sorts by ``abs(acc - 0.5)``, in
    which ``acc = k / N`` and ``1 - k / N`` (equal predictivity) differ by floating-point noise;
    ours breaks such ties to the lower index. Same count per layer, same selected scores."""
    assert torch.equal(ours.sum(dim=1), reference.sum(dim=1))
    for layer in range(len(scores)):
        a = torch.sort(scores[layer][ours[layer]]).values
        b = torch.sort(scores[layer][reference[layer]]).values
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    differ = (ours != reference).sum().item()
    assert differ <= 0.1 * ours.numel(), differ  # only at tied cuts


def _acts(n: int, seed: int, labels: torch.Tensor, width: int = 50) -> torch.Tensor:
    """(N, P, L, I) activations with a few neurons tracking the labels, rounded to 1/8 so that
    ties (at the baseline, and among scores) happen."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 4, 3, width, generator=g)
    a[:, :, :, :10] += (labels.float().view(-1, 1, 1, 1) - 0.5) * torch.linspace(0, 2, 10)
    return (a * 8).round() / 8


def test_parity_binary_predictivity_and_per_layer_selection_equal_the_reference():
    """Baseline per layer / position / neuron from the training set, Acc on dev, max over positions,
    then each layer's top int(p * I) (``finfo``), on one run; 7da99f0 took the global top
    round(p * L * I) across layers instead (``rank_neurons``), so its selection differs."""
    y_train, y_dev = _labels(40, 2, 11), _labels(30, 2, 12)
    train, dev = _acts(40, 13, y_train), _acts(30, 14, y_dev)
    ths, acc = _reference_probe(train.permute(0, 2, 1, 3), dev.permute(0, 2, 1, 3), y_dev)
    per_subtask = predictivity_from_activations(train, y_train, dev, y_dev, 2)
    torch.testing.assert_close(per_subtask[0], (acc - 0.5).abs().max(dim=1).values + 0.5, rtol=0, atol=1e-12)
    for p in (0.02, 0.1, 0.2, 0.5):
        reference = _reference_finfo(acc.unsqueeze(0), p, 50)
        _same_selection(skill_neuron_mask(per_subtask, p), reference, per_subtask[0])
    # finfo's mean over runs: averaging our per-run predictivity first gives the same selection
    acc2 = _reference_probe(train.permute(0, 2, 1, 3), _acts(30, 15, y_dev).permute(0, 2, 1, 3), y_dev)[1]
    second = predictivity_from_activations(train, y_train, _acts(30, 15, y_dev), y_dev, 2)
    mean = (per_subtask + second) / 2
    _same_selection(skill_neuron_mask(mean, 0.1), _reference_finfo(torch.stack([acc, acc2]), 0.1, 50), mean[0])


def test_parity_multiclass_selection_equals_the_reference_fill():
    """Three classes: the pn subtask's top p of each layer, filled up to 2p from the neu ranking
    (skillneuron.py:76-97), each subtask's predictivity from its balanced subsets."""
    y_train, y_dev = _labels(90, 3, 21), _labels(60, 3, 22)
    train, dev = _acts(90, 23, y_train), _acts(60, 24, (y_dev == 1).long())
    per_subtask = predictivity_from_activations(train, y_train, dev, y_dev, 3)
    accs = []
    for s in range(2):
        sub_train, sub_dev = subtask_labels(y_train, 3)[s], subtask_labels(y_dev, 3)[s]
        tr, dv = train[sub_train >= 0], dev[sub_dev >= 0]  # the reference's "-pn" / "-neu" data sets
        accs.append(_reference_probe(tr.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3), sub_dev[sub_dev >= 0])[1])
        torch.testing.assert_close(per_subtask[s], (accs[-1] - 0.5).abs().max(dim=1).values + 0.5, rtol=0, atol=1e-12)
    for p in (0.01, 0.05, 0.1):
        reference = _reference_multiclass(accs[0].unsqueeze(0), accs[1].unsqueeze(0), p, 50)
        ours = skill_neuron_mask(per_subtask, 2 * p)
        assert torch.equal(ours.sum(dim=1), reference.sum(dim=1))
        if int(p * 50) == 0:  # pn's share is empty (ours would floor a lone subtask's count at 1)
            _same_selection(ours, reference, per_subtask[1])
            continue
        first = skill_neuron_mask(per_subtask[:1], p)  # pn's share: its top p of each layer
        _same_selection(first, _reference_finfo(accs[0].unsqueeze(0), p, 50), per_subtask[0])
        assert (ours & first).sum() == first.sum()
        _same_selection(ours & ~first, reference & ~_reference_finfo(accs[0].unsqueeze(0), p, 50), per_subtask[1])
