"""What a run records, as an injected interface (STYLE.md: torchtune's MetricLoggerInterface).

experiments/ only sees :class:`Tracker`; the MLflow implementation lives in
orchestrator/ (experiments never imports mlflow). :class:`MemoryTracker` is
the in-memory one for tests and for runs nobody tracks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Tracker(Protocol):
    def log_params(self, params: Mapping[str, object]) -> None:
        """Flattened config, logged once."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Searchable labels: task, model, method, pipeline, seed, run_key, versions, commit."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics of one evaluation step."""

    def log_artifact(self, name: str, data: bytes) -> None:
        """A file of the run (``maps.npz``, ``heads.gate.png``), given as its bytes."""


class MemoryTracker:
    """Keeps everything in dicts: params, tags, metrics[name] = [(step, value)], artifacts."""

    def __init__(self) -> None:
        self.params: dict[str, object] = {}
        self.tags: dict[str, str] = {}
        self.metrics: dict[str, list[tuple[int, float]]] = {}
        self.artifacts: dict[str, bytes] = {}

    def log_params(self, params: Mapping[str, object]) -> None:
        self.params.update(params)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update(tags)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.metrics.setdefault(name, []).append((step, float(value)))

    def log_artifact(self, name: str, data: bytes) -> None:
        self.artifacts[name] = bytes(data)
