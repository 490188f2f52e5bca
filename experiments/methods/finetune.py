"""Plain fine-tuning, every head open: the baseline every pruning method is compared with.

AdamW on encoder and decoder with linear warm-up and decay; evaluates every
``train.eval_every`` steps. Its gates are all ones (nothing pruned), so it
sits in the same tables and figures as the pruning methods.
"""

from __future__ import annotations

import numpy as np
import torch

from experiments.models import head_layout, load_backbone
from experiments.result import RunResult
from experiments.seeding import derive_seed
from experiments.tasks import TASKS
from experiments.training import (
    RunContext,
    adamw,
    batch_indices,
    build_decoder,
    evaluate,
    forward_logits,
    linear_warmup_decay,
    num_steps,
    rng_state,
    set_rng_state,
    take,
    task_loss,
)

VERSION = "1"
PIPELINES = ("none",)


def run(cfg, ctx: RunContext) -> RunResult:
    seed, tc = cfg.seed, cfg.train
    task = TASKS[cfg.task.name]
    encoder, tokenizer = load_backbone(cfg.model, derive_seed(seed, "model_init"))
    data = task.load(cfg.task, tokenizer)
    num_layers, num_heads, _ = head_layout(encoder)
    decoder = build_decoder(task, encoder.config.hidden_size, data.num_labels, seed)
    encoder.to(ctx.device), decoder.to(ctx.device)

    total = num_steps(len(data.train), tc.batch_size, tc.epochs, tc.max_steps)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = adamw([(list(encoder.parameters()), tc.lr), (list(decoder.parameters()), tc.decoder_lr)], tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, total, tc.warmup_ratio))

    torch.manual_seed(derive_seed(seed, "dropout"))
    step, eval_steps = 0, []
    saved = ctx.checkpointer.load() if ctx.checkpointer else None
    if saved is not None:
        step, eval_steps = saved["step"], saved["eval_steps"]
        encoder.load_state_dict(saved["encoder"]), decoder.load_state_dict(saved["decoder"])
        optimizer.load_state_dict(saved["optimizer"]), scheduler.load_state_dict(saved["scheduler"])
        set_rng_state(saved["rng"])

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
                ctx.checkpointer.save({
                    "step": step, "encoder": encoder.state_dict(), "decoder": decoder.state_dict(),
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "eval_steps": eval_steps, "rng": rng_state(),
                })
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
