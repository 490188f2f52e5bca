"""Every random stream of a run derives from its one seed (STYLE.md: seed inside the worker)."""

from __future__ import annotations

import hashlib

import torch

STREAMS = ("gates", "decoder", "dropout", "model_init", "task_order")
"""The streams a run seeds from ``derive_seed(seed, stream)`` (the data order uses one stream per
epoch, ``data_order:<epoch>``; the gate noise draws from the ``gates`` generator; ``task_order``:
which task each step of a multi-task run draws from, experiments/methods/multitask.py)."""


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for one named stream, stable across processes and machines."""
    digest = hashlib.sha256(f"{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generator(seed: int, stream: str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded for ``stream``; no global RNG is touched."""
    return torch.Generator().manual_seed(derive_seed(seed, stream))


def sub_seeds(seed: int) -> dict[str, int]:
    """All derived seeds, logged with the run so any stream can be replayed."""
    return {stream: derive_seed(seed, stream) for stream in STREAMS}
