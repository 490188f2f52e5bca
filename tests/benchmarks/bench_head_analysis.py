"""Cost of head ablation (Kovaleva et al. 2019) and gradient importance (Michel et al. 2019) on MiniLM.

    .venv/bin/python tests/benchmarks/bench_head_analysis.py [--threads N]

The real MiniLM (``minilm-l6``, 6 layers x 12 heads) with a fresh SST-2 decoder, on 160 SST-2
examples (task ``sst2``, ``max_train``/``max_eval`` 160, ``max_length`` 64), batch 32: sized so one
run measures everything it reports in about three minutes on one thread (the method's default of
500 examples took ~25 minutes for the ablation alone under load). Timing does not depend on how well
the model was fine-tuned, so no fine-tune is run first. Every figure is measured in this run, none
extrapolated; one JSON line each (``_bench.emit``: target, met, load):

1. ``ablation``: ``head_ablation.ablation_deltas``, what the method runs: the full model, then
   each of the 72 heads and each of the 6 layers disabled alone (uniform attention), each
   evaluated on the 160 dev examples (79 evaluations). Informational.
2. ``importance``: ``head_importance.head_importance``, one importance pass (forward + backward
   to the head gates) over the 160 training examples. Informational.
3. ``finetune_epoch``: forward + backward + AdamW step over the same 160 training examples in
   batches of 32 (5 steps), ``finetune``'s loop body: one fine-tuning epoch of that data.
   Informational.
4. ``importance_over_backward``: the importance pass vs its peer, the bare pass it is built on:
   forward + backward of the task loss over the same 160 examples with the weights frozen (the
   gradient reaching every layer from the embeddings on, no weight gradients), 3 interleaved
   repetitions each, medians. Michel et al.'s point is that scoring every head costs one backward
   pass: a target on the ratio (``_bench.TARGETS``: what the gates' hooks and the per-token sums may add).
5. ``importance_over_epoch``, ``ablation_over_epoch``: by CPU time, against the fine-tuning epoch.
   Informational (the importance pass skips the weight gradients and the step, so it is cheaper by
   construction; the ablation grows with the dev set).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from _bench import emit, finish, side_by_side  # noqa: E402

from experiments import RunContext, parse_config  # noqa: E402
from experiments.maths.losses import task_loss  # noqa: E402
from experiments.methods.head_ablation import ablation_deltas  # noqa: E402
from experiments.methods.head_importance import head_importance  # noqa: E402
from experiments.training.loop import batches, forward_logits, take, update  # noqa: E402
from experiments.training.state import fine_tuning, set_up  # noqa: E402

EXAMPLES, TOKENS, BATCH = 160, 64, 32
CONFIG = {
    "model": "minilm-l6",
    "method": "finetune",
    "task": {"name": "sst2", "max_train": EXAMPLES, "max_eval": EXAMPLES, "max_length": TOKENS},
    "train": {"batch_size": BATCH},
}


def _seconds(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``fn()``; on 1 thread CPU time is what a shared, loaded machine
    distorts least (wall time stretches with the load)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2)


def ablation(state, common: dict) -> float:
    """Time the one-at-a-time ablation (informational); return its CPU seconds."""
    wall, cpu = _seconds(lambda: ablation_deltas(state, state.data.dev))
    evaluations = state.num_layers * state.num_heads + state.num_layers + 1
    emit("head_analysis", "ablation", seconds=wall, cpu_seconds=cpu, evaluations=evaluations,
         per_evaluation_cpu_s=round(cpu / evaluations, 3),
         note=f"informational: {evaluations} evaluations of {EXAMPLES} dev examples, measured whole", **common)
    return cpu


def bare_backward(state) -> None:
    """Forward + backward of the task loss over the first EXAMPLES training examples, the weights
    frozen: the gradient flows from the loss back to the embeddings' output, as the importance's
    does to the gates, with nothing else computed."""
    hook = state.encoder.embeddings.register_forward_hook(lambda _m, _i, out: out.detach().requires_grad_())
    try:
        for ids, mask, labels in batches(state.data.train, BATCH, "cpu", EXAMPLES):
            task_loss(forward_logits(state.encoder, state.decoder, ids, mask), labels).backward()
    finally:
        hook.remove()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-ablation", action="store_true", help="skip the ablation (minutes)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = parse_config(CONFIG)
    state = set_up(cfg, RunContext())
    num_layers, num_heads = state.num_layers, state.num_heads
    common = {"model": cfg.model, "task": "sst2", "examples": EXAMPLES, "max_length": TOKENS, "batch": BATCH,
              "threads": torch.get_num_threads()}

    state.train(False)
    ablation_cpu = None if args.no_ablation else ablation(state, common)

    keep = torch.ones(num_layers, num_heads, dtype=torch.bool)
    for module in state.modules().values():
        module.requires_grad_(False)  # as head_importance's run: only the gates need gradients
    importance, importance_cpu = _seconds(lambda: head_importance(state, keep, EXAMPLES, normalize=True))
    times = side_by_side({"importance": lambda: head_importance(state, keep, EXAMPLES, normalize=True),
                          "backward": lambda: bare_backward(state)}, reps=3, warmup=0)
    importance_s, backward_s = (statistics.median(times[name]) for name in ("importance", "backward"))
    emit("head_analysis", "importance_over_backward", measured="ratio",
         ratio=importance_s / backward_s, importance_s=importance_s, backward_s=backward_s, reps=3,
         note="wall time, interleaved; the peer: forward + backward of the loss, weights frozen", **common)
    for module in state.modules().values():
        module.requires_grad_(True)
    emit("head_analysis", "importance", seconds=importance, cpu_seconds=importance_cpu,
         note=f"informational: one pass over {EXAMPLES} training examples", **common)

    state.train(True)
    train = state.data.train
    optimizer, scheduler = fine_tuning(state, total=len(range(0, len(train), BATCH)))
    params = list(state.encoder.parameters()) + list(state.decoder.parameters())

    def epoch() -> None:
        for start in range(0, len(train), BATCH):
            ids, mask, labels = take(train, torch.arange(start, min(start + BATCH, len(train))), "cpu")
            update(task_loss(forward_logits(state.encoder, state.decoder, ids, mask), labels),
                   optimizer, scheduler, params, cfg.train.grad_clip)

    finetune, finetune_cpu = _seconds(epoch)
    emit("head_analysis", "finetune_epoch", seconds=finetune, cpu_seconds=finetune_cpu,
         steps=len(range(0, len(train), BATCH)), note="informational: the unit the ratios divide by", **common)
    emit("head_analysis", "importance_over_epoch", ratio=round(importance_cpu / finetune_cpu, 3),
         note="informational: CPU time, the same training examples; cheaper by construction", **common)
    if ablation_cpu is not None:
        emit("head_analysis", "ablation_over_epoch", ratio=round(ablation_cpu / finetune_cpu, 2),
             note="informational: CPU time; grows with the dev set", **common)
    finish()


if __name__ == "__main__":
    main()
