"""The checkpoint store: final weights of the runs that other runs start from (stages), and
the large artifacts of every run (a weight mask: ``masks.npz``), by run key.

DESIGN.md decision 10: a run named as ``init_from`` (or ``teacher``, ``bias_model``)
by another run keeps its final weights here, under its run key, so every dependant
(in this sweep or a later one) loads the same file instead of training it again.
The root is any fsspec URI: a local folder by default (``$HEADSWEEP_HOME/checkpoints``),
a shared filesystem or an object store on a cluster (``HEADSWEEP_CHECKPOINTS``,
e.g. ``s3://bucket/headsweep`` where s3fs is installed).

A write goes to a temporary name first and is moved into place, so a reader never
sees half a file, and a crashed writer leaves no checkpoint that looks complete.
"""

from __future__ import annotations

import io
import uuid
from typing import Any

import fsspec

from orchestrator import settings

FILE_NAME = "weights.pt"


class CheckpointStore:
    """``save`` / ``load`` / ``exists`` of one state dict per run key under ``root``."""

    def __init__(self, root: str | None = None):
        self.root = (root or settings.checkpoint_root()).rstrip("/")
        self.fs, self.base = fsspec.core.url_to_fs(self.root)

    def __reduce__(self) -> tuple[type, tuple[str]]:  # travels to Ray workers as its root only
        return CheckpointStore, (self.root,)

    def path(self, run_key: str) -> str:
        """Where the run's weights live (a path on ``self.fs``)."""
        return f"{self.base}/{run_key}/{FILE_NAME}"

    def exists(self, run_key: str) -> bool:
        """Whether the run's final weights are here."""
        return self.has(run_key, FILE_NAME)

    def save(self, run_key: str, state: dict[str, Any]) -> str:
        """Write ``state`` (tensors and plain values) for ``run_key``; returns its path."""
        import torch  # here: readers of artifacts (analysis) need no torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        return self.put(run_key, FILE_NAME, buffer.getvalue())

    def load(self, run_key: str) -> dict[str, Any]:
        """The state saved for ``run_key``; FileNotFoundError naming the run when there is none."""
        import torch

        if not self.has(run_key, FILE_NAME):
            raise FileNotFoundError(f"no checkpoint of run {run_key} in {self.root} (did its upstream run finish?)")
        return torch.load(io.BytesIO(self.get(run_key, FILE_NAME)), map_location="cpu", weights_only=True)

    def put(self, run_key: str, name: str, data: bytes) -> str:
        """Write file ``name`` of ``run_key`` (atomically: a temporary name, then moved); its path."""
        final = f"{self.base}/{run_key}/{name}"
        partial = f"{final}.partial-{uuid.uuid4().hex[:8]}"
        self.fs.makedirs(f"{self.base}/{run_key}", exist_ok=True)
        with self.fs.open(partial, "wb") as file:
            file.write(data)
        self.fs.mv(partial, final)
        return final

    def has(self, run_key: str, name: str) -> bool:
        return self.fs.exists(f"{self.base}/{run_key}/{name}")

    def get(self, run_key: str, name: str) -> bytes:
        """File ``name`` of ``run_key``; FileNotFoundError when it is not there."""
        with self.fs.open(f"{self.base}/{run_key}/{name}", "rb") as file:
            return file.read()
