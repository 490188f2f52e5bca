"""Plain fine-tuning, every head open: the baseline every pruning method is compared with.

AdamW on encoder and decoder with linear warm-up and decay; evaluates every
``train.eval_every`` steps. Its gates are all ones (nothing pruned), so it
sits in the same tables and figures as the pruning methods.
"""

from __future__ import annotations

import numpy as np
import torch

from experiments.result import RunResult
from experiments.seeding import derive_seed
from experiments.training import (
    RunContext,
    adamw,
    batch_indices,
    evaluate,
    forward_logits,
    linear_warmup_decay,
    num_steps,
    restore,
    set_up,
    snapshot,
    take,
    task_loss,
)

VERSION = "1"
PIPELINES = ("none",)


def run(cfg, ctx: RunContext) -> RunResult:
    seed, tc = cfg.seed, cfg.train
    setup = set_up(cfg, ctx.device)
    task, data, encoder, decoder = setup.task, setup.data, setup.encoder, setup.decoder
    num_layers, num_heads = setup.num_layers, setup.num_heads

    total = num_steps(len(data.train), tc.batch_size, tc.epochs, tc.max_steps)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = adamw([(list(encoder.parameters()), tc.lr), (list(decoder.parameters()), tc.decoder_lr)], tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, total, tc.warmup_ratio))

    torch.manual_seed(derive_seed(seed, "dropout"))
    step, eval_steps = 0, []
    stateful = {"encoder": encoder, "decoder": decoder, "optimizer": optimizer, "scheduler": scheduler}
    saved = ctx.checkpointer.load() if ctx.checkpointer else None
    if saved is not None:
        step, values = restore(saved, **stateful)
        eval_steps = values["eval_steps"]

    encoder.train(), decoder.train()
    metrics: dict[str, float] = {}
    while step < total:
        ids, mask, labels = take(data.train, batch_indices(step, len(data.train), tc.batch_size, seed), ctx.device)
        loss = task_loss(forward_logits(encoder, decoder, ids, mask), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        optimizer.step(), scheduler.step()
        step += 1
        if step % tc.eval_every == 0 or step == total:
            metrics = evaluate(encoder, decoder, data.dev, task, tc.batch_size, ctx.device)
            metrics |= {"train_loss": loss.item(), "open_heads": float(num_layers * num_heads)}
            ctx.tracker.log_metrics(metrics, step)
            eval_steps.append(step)
            if ctx.checkpointer:
                ctx.checkpointer.save(snapshot(step, {"eval_steps": eval_steps}, **stateful))
        ctx.progress(step, total, {"loss": loss.item(), "open_heads": num_layers * num_heads})

    ones = np.ones((num_layers, num_heads), dtype=np.float32)
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        gates=ones,
        scores=None,
        trajectory=np.broadcast_to(ones, (len(eval_steps), num_layers, num_heads)).copy(),
        eval_steps=np.asarray(eval_steps),
        steps=step,
    )
