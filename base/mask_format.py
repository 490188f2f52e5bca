"""A weight mask as stored and compared, shared by experiments and analysis (numpy only, no torch).

A mask is ``{matrix name: bool (out, in)}``, True = kept (experiments/interventions/masks.py). A run's
mask is kept as ``masks.npz`` (``pack_masks``): each matrix bit-packed, 1 bit per weight, in
a compressed ``.npz`` with the names and shapes as JSON, ~1/32 of the fp32 weights covered.
Inputs may be numpy arrays or CPU torch tensors (``np.asarray`` reads both).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

_SHAPES_KEY = "__shapes__"


def _bool(mask: Any) -> np.ndarray:
    return np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask).astype(bool)


def pack_masks(masks: Mapping[str, Any]) -> bytes:
    """Bytes of a compressed ``.npz``: each mask bit-packed (``np.packbits``) under its name,
    plus the names and shapes as JSON."""
    arrays = {name: np.packbits(_bool(m).ravel()) for name, m in masks.items()}
    if _SHAPES_KEY in arrays:
        raise ValueError(f"{_SHAPES_KEY!r} is reserved")
    arrays[_SHAPES_KEY] = np.array(json.dumps([[name, list(_bool(m).shape)] for name, m in masks.items()]))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def read_masks(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of ``pack_masks``: ``{name: bool array}`` in the packed order."""
    with np.load(io.BytesIO(data)) as archive:
        shapes = json.loads(str(archive[_SHAPES_KEY]))
        return {name: np.unpackbits(archive[name], count=int(np.prod(shape))).astype(bool).reshape(shape)
                for name, shape in shapes}


def mask_iou(masks_a: Mapping[str, Any], masks_b: Mapping[str, Any]) -> tuple[dict[str, float], float]:
    """``({name: IoU}, overall)`` of the kept weights: ``|A & B| / |A | B|`` per matrix and
    pooled over every matrix (1.0 when both keep nothing). Both must name the same matrices."""
    if set(masks_a) != set(masks_b):
        raise ValueError(f"masks name different matrices: {sorted(set(masks_a) ^ set(masks_b))}")
    inter, union = {}, {}
    for name in masks_a:
        a, b = _bool(masks_a[name]), _bool(masks_b[name])
        inter[name], union[name] = int((a & b).sum()), int((a | b).sum())
    per_matrix = {name: inter[name] / union[name] if union[name] else 1.0 for name in masks_a}
    total_union = sum(union.values())
    return per_matrix, sum(inter.values()) / total_union if total_union else 1.0


def chance_iou(masks_a: Mapping[str, Any], masks_b: Mapping[str, Any]) -> float:
    """The pooled IoU that two random masks with these masks' densities per matrix give:
    ``sum n p q / sum n (p + q - p q)`` over matrices of ``n`` weights kept at ``p`` and ``q``."""
    inter = union = 0.0
    for name in masks_a:
        a, b = _bool(masks_a[name]), _bool(masks_b[name])
        p, q = a.mean(), b.mean()
        inter += a.size * p * q
        union += a.size * (p + q - p * q)
    return float(inter / union) if union else 1.0
