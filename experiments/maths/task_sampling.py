"""Which task each step of multi-task training draws its batch from (He & Choi 2021).

A batch comes from task t with probability ``p_t = n_t ** alpha / sum_s n_s ** alpha``
(``n_t``: task t's training examples; ``alpha = 0.8`` in the paper): between
proportional sampling (``alpha = 1``, the big task dominates) and uniform
(``alpha = 0``). The whole schedule is drawn up front from one generator, so the task
of step s is a pure function of (seed, sizes, steps): a resumed run draws the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ALPHA = 0.8
"""He & Choi (2021): batches drawn with probability proportional to ``n_t ** 0.8``."""


def task_probabilities(sizes: Sequence[int], alpha: float = ALPHA) -> torch.Tensor:
    """``(T,)`` float64 probabilities ``n_t ** alpha / sum_s n_s ** alpha``; ValueError for a size < 1.

    >>> task_probabilities([100, 100]).tolist()
    [0.5, 0.5]
    >>> [round(p, 4) for p in task_probabilities([1000, 10], alpha=0.8).tolist()]
    [0.9755, 0.0245]
    """
    n = torch.as_tensor(list(sizes), dtype=torch.float64)
    if n.numel() == 0 or (n < 1).any():
        raise ValueError(f"every task needs at least one training example, got sizes {list(sizes)}")
    weights = n**alpha
    return weights / weights.sum()


def task_schedule(probabilities: torch.Tensor, steps: int, generator: torch.Generator) -> torch.Tensor:
    """``(steps,)`` long: the task index of each step, drawn independently from ``probabilities``."""
    return torch.multinomial(probabilities.float(), steps, replacement=True, generator=generator)


def batch_positions(schedule: torch.Tensor, num_tasks: int) -> torch.Tensor:
    """``(steps,)`` long: how many earlier steps drew the same task as step s (its batch number
    within its own task's data order).

    >>> batch_positions(torch.tensor([0, 1, 0, 0, 1]), 2).tolist()
    [0, 0, 1, 2, 1]
    """
    onehot = torch.nn.functional.one_hot(schedule, num_tasks)  # (S, T)
    before = onehot.cumsum(dim=0) - onehot  # (S, T): draws of each task before step s
    return before.gather(1, schedule[:, None]).squeeze(1)
