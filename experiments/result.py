"""What one run returns: final metrics and gates, the gate trajectory, and its keys."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunResult:
    run_key: str
    group_key: str
    metrics: dict[str, float]
    gates: np.ndarray  # (L, H) float32: final effective gates (1 = head kept)
    scores: np.ndarray | None  # (L, H) float32 per-head score (log_alpha, importance), if any
    trajectory: np.ndarray  # (E, L, H) float32: effective gates at each evaluation
    eval_steps: np.ndarray  # (E,) int: the step of each evaluation
    steps: int
    seconds: float = 0.0  # wall time, filled in by experiments.run

    def gates_npz(self) -> bytes:
        """``gates.npz``: final (L, H), trajectory (E, L, H), eval_steps (E,), scores (L, H)."""
        arrays = {"final": self.gates, "trajectory": self.trajectory, "eval_steps": self.eval_steps}
        if self.scores is not None:
            arrays["scores"] = self.scores
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()
