"""Training losses over task logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Label of a position that is not scored (padding, sub-word continuations)."""


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over (B, C) logits with (B,) labels, or (B, T, C) with (B, T);
    positions labelled ``IGNORE_INDEX`` are not scored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
