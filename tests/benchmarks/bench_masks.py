"""Cost of weight-mask training and size of stored masks on the real MiniLM.

    .venv/bin/python tests/benchmarks/bench_masks.py

Prints one JSON line per figure. A and B are measured side by side in one
process on one thread (``THREADS``), repetitions interleaved (A, B, A, B, ...), and the median
of the paired ratios a_i / b_i taken with its 95 % interval (``paired``), so machine noise hits
both alike.

1. ``mask_train_step``: forward + backward + optimizer step (cross-entropy of
   a linear decoder over [CLS]) with every maskable matrix (Q, K, V, attention
   output, FFN in and out of each layer, pooler, decoder) masked by
   straight-through scores, weights frozen, AdamW on the scores only; vs a
   dense fine-tuning step (AdamW on encoder and decoder) on the same batch: interleaved pairs until
   the median paired ratio is resolved to 2.5 % (``bench_heads.paired``). Target (``_bench.TARGETS``, as
   for every figure here): on the upper end of its 95 % interval.
2. ``mask_storage``: ``pack_masks`` of the trained run's masks (50 % sparsity), a 70 % magnitude
   mask and random masks at 50 % and 90 %, each unpacked and checked equal, against the entropy
   bound of the mask: ``H(s)`` bits per weight for a fraction ``s`` pruned (1 bit at 50 %, 0.47 at
   90 %), what no lossless format beats for independent bits. Target: on the worst of them over
   its bound (bit-packing alone is 1 bit per weight, 2.1x the bound at 90 %; a byte per weight
   8x). Beside it, packed bytes / the fp32 weights covered (1/32 by construction), for scale.

Every line carries its target, whether it was met and the load (``_bench.emit``); the script
exits 1 when a target was missed.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_heads  # noqa: E402  (its batch, timing and interleaving, so the two read alike)
import torch  # noqa: E402
from _bench import emit, finish  # noqa: E402
from torch import nn  # noqa: E402

from base.mask_format import pack_masks  # noqa: E402
from experiments.interventions.masks import (  # noqa: E402
    MaskScores,
    attach_masks,
    magnitude_mask,
    maskable_weights,
    realised_sparsity,
    unpack_masks,
)
from experiments.models import load_backbone  # noqa: E402

BATCH, TOKENS, NUM_LABELS, THREADS = bench_heads.BATCH, bench_heads.TOKENS, bench_heads.NUM_LABELS, bench_heads.THREADS
_batch, paired = bench_heads._batch, bench_heads.paired
SPARSITY = 0.5


def _step(encoder, decoder, optimizer, batch, labels):
    def step():
        optimizer.zero_grad(set_to_none=True)
        cls = encoder(**batch).last_hidden_state[:, 0]  # (B, hidden)
        nn.functional.cross_entropy(decoder(cls), labels).backward()
        optimizer.step()

    return step


def bench_mask_train_step(model, batch) -> tuple[dict, MaskScores]:
    labels = torch.randint(0, NUM_LABELS, (BATCH,), generator=torch.Generator().manual_seed(1))
    hidden = model.config.hidden_size

    dense = copy.deepcopy(model).train()
    dense_decoder = nn.Linear(hidden, NUM_LABELS)
    dense_opt = torch.optim.AdamW([*dense.parameters(), *dense_decoder.parameters()], lr=2e-5)

    masked = copy.deepcopy(model).train().requires_grad_(False)
    masked_decoder = nn.Linear(hidden, NUM_LABELS).requires_grad_(False)
    linears = maskable_weights(masked, masked_decoder)
    scores = MaskScores({name: lin.weight for name, lin in linears.items()}, SPARSITY)
    handle = attach_masks(linears, scores.mask)
    scores_opt = torch.optim.AdamW(scores.parameters(), lr=1e-2)

    figure = paired("mask_train", _step(masked, masked_decoder, scores_opt, batch, labels),
                    "dense", _step(dense, dense_decoder, dense_opt, batch, labels))
    handle.remove()
    figure.update(matrices=len(linears), scores=sum(s.numel() for s in scores.scores),
                  dense_params=sum(p.numel() for p in dense.parameters()) + hidden * NUM_LABELS + NUM_LABELS,
                  batch=[BATCH, TOKENS])
    return figure, scores


def _entropy_bits(s: float) -> float:
    """Bits per weight of a mask with a fraction ``s`` pruned, the bits independent: H(s)."""
    return -(s * math.log2(s) + (1 - s) * math.log2(1 - s)) if 0 < s < 1 else 0.0


def _storage(masks: dict[str, torch.Tensor]) -> dict:
    start = time.perf_counter()
    packed = pack_masks(masks)
    pack_ms = (time.perf_counter() - start) * 1000.0
    start = time.perf_counter()
    back = unpack_masks(packed)
    unpack_ms = (time.perf_counter() - start) * 1000.0
    assert all(torch.equal(back[name], mask) for name, mask in masks.items())
    weights = sum(mask.numel() for mask in masks.values())
    fp32_bytes = 4 * weights
    sparsity = realised_sparsity(masks)[1]
    return {
        "packed_bytes": len(packed),
        "fp32_bytes": fp32_bytes,
        "entropy_ratio": round(8 * len(packed) / (weights * _entropy_bits(sparsity)), 4),
        "fp32_ratio": round(len(packed) / fp32_bytes, 5),
        "one_in": round(fp32_bytes / len(packed), 1),
        "sparsity": round(sparsity, 4),
        "pack_ms": round(pack_ms, 1),
        "unpack_ms": round(unpack_ms, 1),
    }


def bench_mask_storage(model, scores: MaskScores) -> dict:
    trained = {name: mask.cpu() for name, mask in scores.binary_masks().items()}
    linears = maskable_weights(model)
    generator = torch.Generator().manual_seed(4)
    masks = {
        "trained_run": _storage(trained),
        "magnitude_0.7": _storage({n: magnitude_mask(lin.weight, 0.7) for n, lin in linears.items()}),
        **{f"random_{s}": _storage({n: torch.rand(lin.weight.shape, generator=generator) >= s
                                    for n, lin in linears.items()}) for s in (0.5, 0.9)},
    }
    return {"worst_entropy_ratio": max(m["entropy_ratio"] for m in masks.values()), **masks}


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model, _ = load_backbone("minilm-l6", 0)
    batch = _batch(torch.Generator().manual_seed(0))
    figure, scores = bench_mask_train_step(model, batch)
    emit("masks", "mask_train_step", measured="upper_ratio", **figure)
    emit("masks", "mask_storage", measured="worst_entropy_ratio",
         note="packed bits per weight / H(sparsity); fp32_ratio: packed bytes / fp32 bytes covered",
         **bench_mask_storage(model, scores))
    finish()


if __name__ == "__main__":
    main()
