"""What the caller lends a run: the seam between one run and whoever runs it.

A run never knows whether the CLI, a Ray trial or a test called it. It sees a
:class:`RunContext`: where to log (``Tracker``), where to checkpoint
(``Checkpointer``), whether to stop, which device, and for stages (runs that
start from other runs) where upstream weights come from and where its own final
weights go. The orchestrator implements these protocols (Tune checkpoints,
MLflow, the checkpoint store); tests use the in-memory defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from base.costs import Costs
from experiments.training.tracking import MemoryTracker, Tracker

__all__ = ["Checkpointer", "RunCancelled", "RunContext", "Tracker"]


class RunCancelled(Exception):
    """Raised inside a run when its context says stop (a cancelled sweep)."""


class Checkpointer(Protocol):
    """Keeps the latest mid-run checkpoint (``RunState.state_dict()``) of ONE run, for resume."""

    def save(self, state: dict[str, Any]) -> None:
        """Keep ``state`` (it may skip saves it finds too frequent); ``state["step"]`` is its step."""

    def load(self) -> dict[str, Any] | None:
        """The latest saved state, or None on a fresh start."""


@dataclass
class RunContext:
    """What the caller lends a run: where to log, progress, checkpoints, cancellation, stages."""

    tracker: Tracker = field(default_factory=MemoryTracker)
    on_progress: Callable[[int, int, Mapping[str, float]], None] | None = None
    """Called after every optimiser step with (step, total, the step's values: ``loss``, ``open_heads``, ...)."""
    checkpointer: Checkpointer | None = None
    should_stop: Callable[[], bool] = lambda: False
    device: str = "cpu"
    load_upstream: Callable[[str], dict] | None = None
    """Stages: role (``"init_from"``, ``"teacher"``, ``"bias_model"``, ``"source"``) -> that upstream run's
    saved final weights (a ``RunState.weights()`` state dict). None: the run has no upstream."""
    save_artifact: Callable[[str, bytes], None] | None = None
    """Keeps a large artifact of the run (``RunResult.artifacts``: name, bytes) by its run key."""
    save_weights: Callable[[dict], None] | None = None
    """Stages: when set, the run hands its final weights (``RunState.weights()``: encoder and
    decoders) to it once, at the end (``loop.train_steps`` does); other runs start from them."""
    costs: Costs = field(default_factory=Costs)
    """Where the run's parts are timed (``cost.<part>_s``): the caller starts it when the run starts
    (a trial: when it is entered) and records it; the runner times the parts it sees."""

    def progress(self, step: int, total: int, metrics: Mapping[str, float]) -> None:
        """Report one step; raises :class:`RunCancelled` when the caller asked the run to stop."""
        if self.should_stop():
            raise RunCancelled(f"stopped at step {step} of {total}")
        if self.on_progress is not None:
            self.on_progress(step, total, metrics)
