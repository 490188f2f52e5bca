"""Neuron predictivity of skill neurons (Wang et al. 2022, "Finding Skill Neurons in Pre-trained
Transformer-based Language Models"; ../shared/PAPERS.md; reference code THU-KEG/Skill-Neuron).

A neuron's activation ``a`` (FFN, after the non-linearity) at one soft-prompt position is
read as a classifier "label 1 iff ``a > a_bsl``", where the baseline ``a_bsl`` is its mean
activation over the training set (per layer, position and neuron; reference
``trainer.probe_avg``). On dev (``trainer.probe_acc``):

    Acc  = mean over dev of 1[(a > a_bsl) == y]
    Pred = max(Acc, 1 - Acc)          (a neuron that is LOW for label 1 predicts as well)

and a neuron's predictivity is the max of ``Pred`` over the prompt positions (``skillneuron.finfo``:
``abs(acc - 0.5).max(axis=positions)``, then the mean over runs, which analysis/ takes). ``Pred``
lies in ``[0.5, 1]``.

Binary SUBTASKS. A binary task is one subtask (class 1 vs 0) on all of its examples. A
multi-class task is split as the reference's ``helper/binarize.py`` splits it, into binary
tasks on class-balanced subsets of each split:

- 3 classes (negative, neutral, positive): "pn" = class 0 vs class 2 (1 iff class 2), and
  "neu" = class 1 vs the rest (1 iff class 1);
- 4 classes (conflict, negative, neutral, positive): "pn" = class 1 vs class 3, "neu" =
  class 2 vs the rest;
- other counts: the reference has no split (``binarize.py`` fails); ours, an extension: one
  subtask per class, class ``c`` vs the rest, balanced the same way.

Balancing (``binarize.balance``) keeps, in the split's order, the first ``m - 1`` examples of
each side, ``m`` the smaller side's size (its filter counts an example, then keeps it iff
the count is ``< m``). Each subtask has its own baseline (the mean over ITS training subset)
and its own ``Acc`` (over ITS dev subset), as the reference's prompts trained on ``<task>-pn``
and ``<task>-neu`` do. (The reference trains one prompt per subtask; we read one prompt
trained on the whole task: see experiments/methods/skill_neurons.py.)

Skill neurons (``skillneuron.finfo``): the top ``int(p * I)`` neurons of EACH layer by
predictivity, ties to the lower index. A multi-class task takes the top ``p/2`` of each layer
by "pn", then fills each layer up to ``p`` from "neu"'s ranking, skipping neurons already in
(``skillneuron.main``, multi_class). With ``S`` subtasks ours fills in turn: subtask ``s`` up to
``count * (s + 1) // S`` per layer, ``count = max(1, int(p * I))`` (the same for ``S <= 2``
while ``p * I >= 1``; the floor of 1 keeps a tiny model's layers from getting none).

The ``neurons.predictivity`` map gives each neuron one score: its best subtask's (max over
subtasks; the predictivity itself for a binary task), our choice for a multi-class map.
"""

from __future__ import annotations

import torch


def binary_subtasks(num_classes: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(label-0 classes, label-1 classes)`` of each binary subtask (module docstring)."""
    if num_classes < 2:
        raise ValueError(f"predictivity needs at least 2 classes, got {num_classes}")
    if num_classes == 2:
        return [((0,), (1,))]
    if num_classes == 3:  # binarize.py: pn = [0, 2], neu = 1
        return [((0,), (2,)), ((0, 2), (1,))]
    if num_classes == 4:  # binarize.py: pn = [1, 3], neu = 2
        return [((1,), (3,)), ((0, 1, 3), (2,))]
    return [(tuple(o for o in range(num_classes) if o != c), (c,)) for c in range(num_classes)]


def balance(binary: torch.Tensor) -> torch.Tensor:
    """``binarize.balance``: ``binary`` ``(N,)`` in {-1 (not in the subtask), 0, 1} -> the same with
    all but the first ``m - 1`` examples of each side set to -1, ``m`` the smaller side's size."""
    kept = binary.clone()
    m = min(int((binary == 0).sum()), int((binary == 1).sum()))
    for side in (0, 1):
        index = (binary == side).nonzero().flatten()
        kept[index[max(m - 1, 0):]] = -1
    return kept


def subtask_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(S, N)`` int64: each example's label in each binary subtask, -1 where it is not in the
    subtask's (balanced, for ``C > 2``) subset. ``labels`` ``(N,)`` in ``[0, C)``, in the split's order."""
    labels = labels.long().flatten()
    rows = []
    for zeros, ones in binary_subtasks(num_classes):
        binary = torch.full_like(labels, -1)
        binary[torch.isin(labels, torch.tensor(zeros))] = 0
        binary[torch.isin(labels, torch.tensor(ones))] = 1
        rows.append(binary if num_classes == 2 else balance(binary))
    return torch.stack(rows)


def subtask_sums(activations: torch.Tensor, sub_labels: torch.Tensor) -> torch.Tensor:
    """``(S, *U)`` float64: the sum of ``activations`` ``(N, *U)`` over each subtask's examples
    (``sub_labels`` ``(S, N)`` >= 0); sums of batches add up, and / the counts give the baselines."""
    if sub_labels.dim() != 2 or sub_labels.shape[1] != activations.shape[0]:
        raise ValueError(f"sub_labels {tuple(sub_labels.shape)} must be (S, N) for activations "
                         f"{tuple(activations.shape)}")
    member = (sub_labels >= 0).to(torch.float64)  # (S, N)
    flat = activations.to(torch.float64).flatten(1)  # (N, U)
    return (member @ flat).reshape(len(sub_labels), *activations.shape[1:])


def correct_counts(activations: torch.Tensor, baselines: torch.Tensor, sub_labels: torch.Tensor) -> torch.Tensor:
    """``(S, *U)`` int64: per subtask ``s``, how many of its examples have ``(a > a_bsl[s]) == y_s``.

    ``activations`` ``(N, *U)``, ``baselines`` ``(S, *U)``, ``sub_labels`` ``(S, N)`` (-1: not in
    the subtask). Counts of several batches add up.
    """
    if baselines.shape[1:] != activations.shape[1:] or sub_labels.shape != (len(baselines), len(activations)):
        raise ValueError(f"activations {tuple(activations.shape)}, baselines {tuple(baselines.shape)} and "
                         f"sub_labels {tuple(sub_labels.shape)} must be (N, *U), (S, *U) and (S, N)")
    acts = activations.to(torch.float64)
    out = []
    for baseline, y in zip(baselines, sub_labels, strict=True):
        member = y >= 0
        above = acts[member] > baseline  # (N_s, *U)
        target = y[member].bool().view(-1, *([1] * (acts.dim() - 1)))
        out.append((above == target).sum(dim=0))
    return torch.stack(out).to(torch.int64)


def predictivity(accuracy: torch.Tensor) -> torch.Tensor:
    """``Pred = max(Acc, 1 - Acc)``: in ``[0.5, 1]``."""
    return torch.maximum(accuracy, 1 - accuracy)


def neuron_predictivity(correct: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per subtask and neuron, ``Pred`` maxed over the prompt positions, and that position.

    ``correct`` ``(S, P, L, I)`` from :func:`correct_counts`, ``sizes`` ``(S,)`` dev examples per
    subtask (a subtask without any scores 0.5: no evidence). Returns ``(S, L, I)`` float64
    predictivity and ``(S, L, I)`` int64 argmax position (the first on ties).
    """
    if correct.dim() != 4 or sizes.shape != correct.shape[:1]:
        raise ValueError(f"correct must be (subtasks, positions, layers, neurons) and sizes (subtasks,), got "
                         f"{tuple(correct.shape)} and {tuple(sizes.shape)}")
    sizes = sizes.to(torch.float64).view(-1, 1, 1, 1)
    accuracy = torch.where(sizes > 0, correct.to(torch.float64) / sizes.clamp(min=1), 0.5)
    return predictivity(accuracy).max(dim=1)


def combined_score(per_subtask: torch.Tensor) -> torch.Tensor:
    """``(L, I)``: a neuron's predictivity for the task, its best subtask's (max over ``S``)."""
    return per_subtask.max(dim=0).values


def skill_neuron_mask(per_subtask: torch.Tensor, fraction: float) -> torch.Tensor:
    """``(L, I)`` bool: the skill neurons at ``fraction`` (reference ``finfo``): per layer, the top
    ``count = max(1, int(fraction * I))`` by predictivity, subtasks filling in turn (subtask ``s``
    up to ``count * (s + 1) // S``, skipping neurons already in); ties to the lower index."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    num_sub, num_layers, inner = per_subtask.shape
    count = max(1, int(fraction * inner))
    mask = torch.zeros(num_layers, inner, dtype=torch.bool)
    for s in range(num_sub):
        quota = count * (s + 1) // num_sub
        for layer in range(num_layers):
            order = torch.sort(per_subtask[s, layer], descending=True, stable=True).indices
            fresh = order[~mask[layer, order]]
            need = quota - int(mask[layer].sum())
            if need > 0:
                mask[layer, fresh[:need]] = True
    return mask


def by_layer(mask: torch.Tensor) -> dict[int, torch.Tensor]:
    """``(L, I)`` bool -> {layer: sorted LongTensor of its chosen neurons}, every layer listed."""
    return {layer: row.nonzero().flatten() for layer, row in enumerate(mask)}


def random_like(chosen: dict[int, torch.Tensor], inner: int, generator: torch.Generator) -> dict[int, torch.Tensor]:
    """As many neurons per layer as ``chosen`` has there, drawn uniformly from that layer's ``inner``
    neurons without replacement: the control of the perturbation check (reference
    ``trainer.addmask(cmp=True)``: the first ``N`` of a ``randperm``; they may include chosen ones,
    by chance only). ``generator`` draws them."""
    out = {}
    for layer, index in chosen.items():
        if index.numel() > inner:
            raise ValueError(f"layer {layer}: {index.numel()} neurons asked of {inner}")
        out[layer] = torch.sort(torch.randperm(inner, generator=generator)[: index.numel()]).values
    return out


def predictivity_from_activations(train: torch.Tensor, train_labels: torch.Tensor, dev: torch.Tensor,
                                  dev_labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The whole recipe on activations in memory: ``train`` ``(N_tr, P, L, I)``, ``dev``
    ``(N_dev, P, L, I)`` -> ``(S, L, I)`` predictivity (each subtask's baseline = the mean over
    its training examples)."""
    sub_train, sub_dev = subtask_labels(train_labels, num_classes), subtask_labels(dev_labels, num_classes)
    sizes = (sub_train >= 0).sum(dim=1).to(torch.float64).clamp(min=1)
    baselines = subtask_sums(train, sub_train) / sizes.view(-1, *([1] * (train.dim() - 1)))
    correct = correct_counts(dev, baselines, sub_dev)
    return neuron_predictivity(correct, (sub_dev >= 0).sum(dim=1))[0]
