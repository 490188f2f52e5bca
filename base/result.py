"""What one run returns: metrics plus named maps over model units (DESIGN.md decision 9).

A method reports what it found as maps: ``heads.gate`` (the final test-time gates),
``heads.log_alpha`` (their continuous scores), later ``heads.importance``,
``neurons.predictivity``, ... Each is an ``(L, K)`` array over one kind of unit, named
``<kind>.<what>``. The registry stores every map of every run and analysis asks for a map
by name, so a new method adds maps without touching either. A method that learned no map
of a kind reports none (plain fine-tuning has no gates), rather than a placeholder.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from base.naming import suggest

KINDS = ("heads", "neurons", "layers", "weights")
"""Unit kinds a map may be over: ``heads`` (L, H), ``neurons`` (L, I), ``layers`` (L, 1),
``weights`` (L, K) densities of a weight mask per block."""


def _suggest(word: str, choices: tuple[str, ...]) -> str:
    return suggest(word, choices, cutoff=0.0)


@dataclass(frozen=True)
class UnitMap:
    """One value per unit of one kind: ``values`` (L, K) float32, one row per layer."""

    values: np.ndarray
    """``(L, K)`` float32, C order (converted on construction)."""
    kind: str
    """One of ``KINDS``; a map's name starts with it (``heads.gate`` is a ``heads`` map)."""
    meaning: str
    """One line: what a value says (e.g. "test-time gate, 1 = head kept")."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown map kind '{self.kind}'{_suggest(self.kind, KINDS)} (kinds: {', '.join(KINDS)})")
        values = np.ascontiguousarray(self.values, dtype=np.float32)
        if values.ndim != 2 or 0 in values.shape:
            raise ValueError(f"a {self.kind} map must be (layers, units), got shape {values.shape}")
        values.flags.writeable = False
        object.__setattr__(self, "values", values)


def check_map_name(name: str, kind: str) -> None:
    """A map's name is ``<kind>.<what>``: ``heads.gate`` over heads, ``neurons.predictivity`` over neurons."""
    prefix, dot, what = name.partition(".")
    if not dot or not what or prefix != kind:
        raise ValueError(f"map '{name}' is a {kind} map: its name must be '{kind}.<what>', e.g. '{kind}.{what or prefix}'")


@dataclass(frozen=True)
class RunResult:
    run_key: str
    group_key: str
    metrics: dict[str, float]
    """Final values; a name may carry an evaluation-set suffix (``accuracy/ood``)."""
    maps: Mapping[str, UnitMap] = field(default_factory=dict)
    """Name (``<kind>.<what>``) -> map, e.g. ``heads.gate``, ``heads.log_alpha``."""
    trajectories: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Name of a map -> ``(E, L, K)`` float32: its value at each evaluation (MLflow artifact only)."""
    eval_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """``(E,)`` int: the step of each evaluation."""
    steps: int = 0
    seconds: float = 0.0  # wall time, filled in by experiments.run
    artifacts: Mapping[str, bytes] = field(default_factory=dict)
    """Large objects by file name (``masks.npz``): logged to the tracker, and kept by run key in
    the orchestrator's store (``RunContext.save_artifact``) where analysis reads them."""

    def __post_init__(self) -> None:
        for name, unit_map in self.maps.items():
            check_map_name(name, unit_map.kind)
        for name, trajectory in self.trajectories.items():
            if name not in self.maps:
                raise ValueError(f"trajectory of '{name}', which is not a map of this run{_suggest(name, tuple(self.maps))}")
            expected = (len(self.eval_steps), *self.maps[name].values.shape)
            if np.shape(trajectory) != expected:
                raise ValueError(f"trajectory of '{name}' must be (evals, layers, units) = {expected}, "
                                 f"got {np.shape(trajectory)}")

    def maps_npz(self) -> bytes:
        """``maps.npz``: each map (L, K) under its name, each trajectory (E, L, K) under
        ``trajectory/<name>``, ``eval_steps`` (E,), and ``meta`` (JSON text: name -> kind, meaning)."""
        arrays: dict[str, np.ndarray] = {name: m.values for name, m in self.maps.items()}
        arrays |= {f"trajectory/{name}": np.asarray(t, dtype=np.float32) for name, t in self.trajectories.items()}
        arrays["eval_steps"] = np.asarray(self.eval_steps, dtype=np.int64)
        meta = {name: {"kind": m.kind, "meaning": m.meaning} for name, m in self.maps.items()}
        arrays["meta"] = np.array(json.dumps(meta))
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()
