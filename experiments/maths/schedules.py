"""Learning-rate schedules: plain functions of the step (nanoGPT's ``get_lr(it)``), no state."""

from __future__ import annotations


def linear_warmup_decay(step: int, total: int, warmup_ratio: float) -> float:
    """LR multiplier of 0-based ``step`` in a phase of ``total`` steps: linear warm-up over the
    first ``int(warmup_ratio * total)`` steps to 1, then linear decay to 0 at ``total``.

    >>> [linear_warmup_decay(s, 4, 0.5) for s in range(5)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    """
    warmup = int(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))
