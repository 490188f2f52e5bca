"""What a run trains, per parameter group, as settings: the learning rate, weight decay, schedule,
gradient clipping and Adam's betas and eps.

A method that trains declares ``optimisers(cfg) -> list[Group]`` from its config alone, before any
model is loaded: ``headsweep run CONFIG --dry-run`` and ``headsweep submit GRID --dry-run`` print it,
for a hub model too. The run builds its torch optimisers from the same keys;
tests/experiments/test_recipe_optimisers.py builds them on a tiny model for every paper recipe and
checks each declared group against those torch objects, and both against the reference code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BETAS = (0.9, 0.999)
EPS = 1e-8
"""torch's Adam defaults, what every optimiser of headsweep uses unless a method says otherwise."""
CONSTANT = "constant"


def linear(warmup_ratio: float) -> str:
    """The schedule of ``maths.schedules.linear_warmup_decay``: warm-up over ``warmup_ratio`` of the steps, then
    linear decay to 0 at the last."""
    return f"linear: warm-up {warmup_ratio:g}, decay to 0" if warmup_ratio else "linear decay to 0"


PARAMS = ("encoder", "decoder", "gates", "prompt", "read-out", "scores")
"""What a group's ``params`` may name, in the order a clip lists them."""


def clipped(max_norm: float | None, together: Sequence[str]) -> str:
    """``1 (encoder+decoder)``: the gradients of those groups clipped to one global norm; ``none``."""
    return "none" if max_norm is None else f"{max_norm:g} ({'+'.join(sorted(together, key=PARAMS.index))})"


@dataclass(frozen=True)
class Group:
    """One parameter group as a run trains it."""

    params: str
    """Which parameters, one of ``PARAMS``."""
    optimizer: str
    """torch's ``Adam`` or ``AdamW`` (decoupled weight decay), both bias-corrected."""
    lr: float
    """The peak learning rate (the schedule multiplies it)."""
    weight_decay: float
    """Of the group's matrices; biases and LayerNorm weights (1-D) get none unless ``decay_1d``."""
    schedule: str
    """``constant``, ``linear(...)``, or a method's own (IMP's rounds)."""
    clip: str
    """``clipped(...)``: the max global gradient norm and the groups whose gradients share it."""
    betas: tuple[float, float] = BETAS
    eps: float = EPS
    decay_1d: bool = False
    """Whether its 1-D parameters decay too (mask_train's trained classifier)."""

    def row(self) -> tuple[str, ...]:
        """The group as the dry-run prints it, in ``COLUMNS`` order."""
        decay = f"{self.weight_decay:g}" + (" (1-D too)" if self.decay_1d and self.weight_decay else "")
        return (self.params, self.optimizer, f"{self.lr:g}", decay, self.schedule, self.clip,
                f"({self.betas[0]:g}, {self.betas[1]:g})", f"{self.eps:g}")


COLUMNS = ("params", "optimizer", "lr", "weight decay", "schedule", "clip", "betas", "eps")


def fine_tuning(tc, together: Sequence[str] = ("encoder", "decoder"), schedule: str | None = None) -> list[Group]:
    """The groups of ``state.fine_tuning`` (AdamW over the encoder at ``train.lr`` and the task decoder at
    ``train.decoder_lr``, linear warm-up and decay, clipped to ``train.grad_clip`` with ``together``)."""
    schedule = linear(tc.warmup_ratio) if schedule is None else schedule
    clip = clipped(tc.grad_clip, together)
    return [Group("encoder", "AdamW", tc.lr, tc.weight_decay, schedule, clip),
            Group("decoder", "AdamW", tc.head_lr, tc.weight_decay, schedule, clip)]
