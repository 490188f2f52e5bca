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


def cubic_sparsity(step: int, s_init: float, s_final: float, t0: int, tf: int) -> float:
    """Target sparsity at ``step`` of Zhu & Gupta's gradual pruning (2017, "To prune, or not to prune").

    ``s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (tf - t0)) ** 3`` for ``t0 <= t <= tf``;
    ``s_i`` before ``t0`` and ``s_f`` from ``tf`` on. Moves fast at first and
    flattens out towards ``s_f``: a quarter of the way, 58 % of the change is done;
    half-way, 7/8 of it (``s_f + (s_i - s_f) / 8``). A constant sparsity is
    ``s_init == s_final``. ``tf <= t0`` jumps to ``s_f`` at ``t0``.

    >>> [round(cubic_sparsity(t, 0.7, 0.9, 0, 10), 4) for t in (0, 5, 10)]
    [0.7, 0.875, 0.9]
    """
    if step < t0:
        return s_init
    if step >= tf:
        return s_final
    remaining = 1.0 - (step - t0) / (tf - t0)
    return s_final + (s_init - s_final) * remaining**3


def restarted_linear_decay(step: int, period: int, total: int) -> float:
    """LR multiplier of 0-based ``step`` when a linear decay over ``total`` steps, without warm-up,
    is rebuilt every ``period`` steps: ``(total - step % period) / total``.

    The reference IMP (trainer_imp.py ``pruning_and_save``) rebuilds its optimiser and
    ``get_linear_schedule_with_warmup(optimizer, 0, t_total)`` at every pruning, every
    ``t_total / 10`` steps, so each round decays the lr from 1 to 0.9 only.

    >>> [restarted_linear_decay(s, 2, 10) for s in range(4)]
    [1.0, 0.9, 1.0, 0.9]
    """
    return max(0.0, (total - step % period) / total)
