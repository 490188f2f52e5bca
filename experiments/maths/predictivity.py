"""Neuron predictivity of skill neurons (Wang et al. 2022, "Finding Skill Neurons in Pre-trained
Transformer-based Language Models"; ../shared/PAPERS.md).

A neuron's activation ``a`` (FFN, after the non-linearity) at one soft-prompt position is
read as a classifier "label 1 iff ``a > a_bsl``", where the baseline ``a_bsl`` is its mean
activation over the training set (per layer, position and neuron). On dev:

    Acc  = mean over dev of 1[(a > a_bsl) == y]
    Pred = max(Acc, 1 - Acc)          (a neuron that is LOW for label 1 predicts as well)

and a neuron's predictivity is the max of ``Pred`` over the prompt positions. ``Pred`` lies
in ``[0.5, 1]``.

Multi-class tasks (``C > 2``) are split into ``C`` one-vs-rest subtasks (class ``c`` vs the
rest, as the paper does). Our choices, where the paper leaves them open:

- a subtask's ``Acc`` is the BALANCED accuracy ``(TPR + TNR) / 2``: with plain accuracy a
  neuron that never fires scores ``1 - 1/C`` on every subtask (it predicts "rest"), so a
  dead neuron would beat most live ones. For ``C = 2`` there is one subtask (class 1 vs 0;
  class 0 vs 1 has the same ``Pred``) scored with the paper's plain accuracy;
- a neuron's single score (the ``neurons.predictivity`` map) is its best subtask's: the max
  of ``Pred`` over subtasks ("it predicts at least one class");
- the ranked list takes the subtasks in turn (round robin: subtask 0's best neuron, subtask
  1's best, ..., then each one's next best not yet taken), so the top ``k`` hold equal
  numbers of neurons per subtask (differing by at most one) — the paper's "equal numbers of
  neurons per subtask".

All of it works from per-class counts of "above baseline" (:func:`above_baseline_counts`),
which add up over batches: a pass over dev never holds every activation at once.
"""

from __future__ import annotations

import torch


def above_baseline_counts(activations: torch.Tensor, baseline: torch.Tensor, labels: torch.Tensor,
                          num_classes: int) -> torch.Tensor:
    """``(C, *U)`` int64: per class ``c``, how many examples of class ``c`` have ``a > a_bsl``.

    ``activations`` ``(N, *U)`` (units ``U``: e.g. positions x layers x neurons), ``baseline``
    ``(*U)``, ``labels`` ``(N,)`` in ``[0, C)``. Counts of several batches add up.
    """
    if activations.shape[1:] != baseline.shape or labels.shape != activations.shape[:1]:
        raise ValueError(f"activations {tuple(activations.shape)} must be (N, *baseline.shape) with "
                         f"baseline {tuple(baseline.shape)} and labels {tuple(labels.shape)} (N,)")
    above = (activations > baseline).flatten(1).to(torch.float64)  # (N, U)
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float64)  # (N, C)
    return (onehot.T @ above).round().to(torch.int64).reshape(num_classes, *baseline.shape)


def num_subtasks(num_classes: int) -> int:
    """1 for a binary task (class 1 vs 0), ``C`` one-vs-rest subtasks otherwise."""
    if num_classes < 2:
        raise ValueError(f"predictivity needs at least 2 classes, got {num_classes}")
    return 1 if num_classes == 2 else num_classes


def subtask_accuracy(counts: torch.Tensor, class_sizes: torch.Tensor) -> torch.Tensor:
    """``(S, *U)`` float64: ``Acc`` of "positive iff ``a > a_bsl``" for each subtask.

    ``counts`` ``(C, *U)`` from :func:`above_baseline_counts`, ``class_sizes`` ``(C,)``: dev
    examples per class. Binary: plain accuracy with class 1 positive,
    ``(count_1 + n_0 - count_0) / N``. ``C > 2``: for each class ``c``, the balanced accuracy of
    ``c`` vs the rest, ``(count_c / n_c + (sum_{c' != c} n_c' - count_c') / (N - n_c)) / 2``;
    a class absent from dev gives its subtask 0.5 (no evidence either way).
    """
    counts, sizes = counts.to(torch.float64), class_sizes.to(torch.float64)
    if counts.shape[0] != sizes.shape[0]:
        raise ValueError(f"counts have {counts.shape[0]} classes, class_sizes {sizes.shape[0]}")
    shape = (-1,) + (1,) * (counts.dim() - 1)
    total = sizes.sum()
    if num_subtasks(len(sizes)) == 1:
        return ((counts[1] + sizes[0] - counts[0]) / total).unsqueeze(0)
    below = sizes.view(shape) - counts  # (C, *U): examples of class c at or below the baseline
    tpr = counts / sizes.view(shape)
    tnr = (below.sum(0, keepdim=True) - below) / (total - sizes).view(shape)
    balanced = (tpr + tnr) / 2
    present = ((sizes > 0) & (sizes < total)).view(shape)
    return torch.where(present, balanced, torch.full_like(balanced, 0.5))


def predictivity(accuracy: torch.Tensor) -> torch.Tensor:
    """``Pred = max(Acc, 1 - Acc)``: in ``[0.5, 1]``."""
    return torch.maximum(accuracy, 1 - accuracy)


def neuron_predictivity(counts: torch.Tensor, class_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per subtask and neuron, ``Pred`` maxed over the prompt positions, and that position.

    ``counts`` ``(C, P, L, I)``. Returns ``(S, L, I)`` float64 predictivity and ``(S, L, I)``
    int64 argmax position (the first on ties).
    """
    if counts.dim() != 4:
        raise ValueError(f"counts must be (classes, positions, layers, neurons), got {tuple(counts.shape)}")
    pred = predictivity(subtask_accuracy(counts, class_sizes))  # (S, P, L, I)
    return pred.max(dim=1)


def combined_score(per_subtask: torch.Tensor) -> torch.Tensor:
    """``(L, I)``: a neuron's predictivity for the task, its best subtask's (max over ``S``)."""
    return per_subtask.max(dim=0).values


def rank_neurons(per_subtask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every neuron once, best first: ``(L * I, 2)`` int64 rows ``(layer, neuron)`` and ``(L * I,)``
    the subtask that ranked it. Subtasks take turns (round robin), each contributing its best
    neuron not yet taken, so any prefix holds equal numbers per subtask (within one). Within a
    subtask, ties keep the (layer, neuron) order."""
    num_sub, num_layers, inner = per_subtask.shape
    orders = [torch.argsort(-s.flatten(), stable=True).tolist() for s in per_subtask]
    if num_sub == 1:
        flat, owner = torch.tensor(orders[0]), torch.zeros(num_layers * inner, dtype=torch.int64)
    else:
        taken = torch.zeros(num_layers * inner, dtype=torch.bool)
        pointers, picked, owners = [0] * num_sub, [], []
        while len(picked) < num_layers * inner:
            for s in range(num_sub):
                order = orders[s]
                while pointers[s] < len(order) and taken[order[pointers[s]]]:
                    pointers[s] += 1
                if pointers[s] < len(order):
                    unit = order[pointers[s]]
                    taken[unit] = True
                    picked.append(unit)
                    owners.append(s)
        flat, owner = torch.tensor(picked), torch.tensor(owners)
    return torch.stack([flat // inner, flat % inner], dim=1), owner


def by_layer(units: torch.Tensor, num_layers: int) -> dict[int, torch.Tensor]:
    """``(k, 2)`` rows ``(layer, neuron)`` -> {layer: sorted LongTensor of its neurons}, every layer listed."""
    return {layer: torch.sort(units[units[:, 0] == layer, 1]).values for layer in range(num_layers)}


def random_like(chosen: dict[int, torch.Tensor], inner: int, generator: torch.Generator) -> dict[int, torch.Tensor]:
    """As many neurons per layer as ``chosen`` has there, drawn uniformly from that layer's ``inner``
    neurons without replacement: the control of the perturbation check (same layers, random
    neurons; they may include chosen ones, by chance only). ``generator`` draws them."""
    out = {}
    for layer, index in chosen.items():
        if index.numel() > inner:
            raise ValueError(f"layer {layer}: {index.numel()} neurons asked of {inner}")
        out[layer] = torch.sort(torch.randperm(inner, generator=generator)[: index.numel()]).values
    return out


def predictivity_from_activations(train: torch.Tensor, dev: torch.Tensor, dev_labels: torch.Tensor,
                                  num_classes: int) -> torch.Tensor:
    """The whole recipe on activations in memory: ``train`` ``(N_tr, P, L, I)``, ``dev``
    ``(N_dev, P, L, I)`` -> ``(S, L, I)`` predictivity (baseline = the train mean)."""
    baseline = train.to(torch.float64).mean(dim=0)
    counts = above_baseline_counts(dev.to(torch.float64), baseline, dev_labels, num_classes)
    sizes = torch.bincount(dev_labels.long(), minlength=num_classes)
    return neuron_predictivity(counts, sizes)[0]
