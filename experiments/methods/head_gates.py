"""Hard Concrete head gates with an L0 penalty (Voita et al. 2019; He & Choi 2021).

One gate per attention head, ``z = HardConcrete(log_alpha)``, multiplies the
head's output; the loss is ``task loss + lambda * l0_penalty(log_alpha)``
(penalty = mean over layers of the expected number of open heads per layer,
as both reference codes do). Gates have their own Adam (lr 1e-3, no
schedule); the encoder and decoder use AdamW with linear warm-up and decay.

Pipelines (He & Choi 2021):
- ``dp`` (dynamic pruning): gates train from the first step together with
  encoder and decoder.
- ``sp`` (static pruning): first fine-tune without gates for
  ``gates.sp_finetune_steps`` steps, then freeze the task decoder and train
  encoder + gates.

With ``sparsity`` set, the final model keeps exactly the top (1 - sparsity)
of heads by log_alpha as a fixed 0/1 mask and is evaluated with it (Voita's
"fixed number of heads" comparison); ``accuracy_gated`` keeps the score with
the test-time gates.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from experiments.gates import HeadGates, eval_gates, l0_penalty, open_heads, prob_open
from experiments.heads import attach_head_gates
from experiments.result import RunResult
from experiments.seeding import derive_seed, generator
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
PIPELINES = ("dp", "sp")


def run(cfg, ctx: RunContext) -> RunResult:
    seed, tc = cfg.seed, cfg.train
    setup = set_up(cfg, ctx.device)
    task, data, encoder, decoder = setup.task, setup.data, setup.encoder, setup.decoder
    num_layers, num_heads = setup.num_layers, setup.num_heads
    gates = HeadGates(num_layers, num_heads, generator(seed, "gates")).to(ctx.device)

    gated_steps = num_steps(len(data.train), tc.batch_size, tc.epochs, tc.max_steps)
    ft_steps = 0 if cfg.pipeline == "dp" else (cfg.gates.sp_finetune_steps or gated_steps)
    total = ft_steps + gated_steps

    ones = torch.ones(num_layers, num_heads, device=ctx.device)
    gating = {"on": ft_steps == 0}  # SP fine-tunes with every head open, then gates
    handle = attach_head_gates(encoder, lambda: gates() if gating["on"] else ones)

    model_params = list(encoder.parameters())
    optimizer = adamw([(model_params, tc.lr), (list(decoder.parameters()), tc.decoder_lr)], tc.weight_decay)
    gate_optimizer = torch.optim.Adam(gates.parameters(), lr=cfg.gates.lr)

    def lr_scale(step: int) -> float:  # one warm-up/decay per phase
        if step < ft_steps:
            return linear_warmup_decay(step, ft_steps, tc.warmup_ratio)
        return linear_warmup_decay(step - ft_steps, gated_steps, tc.warmup_ratio)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_scale)

    torch.manual_seed(derive_seed(seed, "dropout"))
    step, trajectory, eval_steps = 0, [], []
    stateful = {
        "encoder": encoder, "decoder": decoder, "gates": gates, "gate_noise": gates.generator,
        "optimizer": optimizer, "gate_optimizer": gate_optimizer, "scheduler": scheduler,
    }
    saved = ctx.checkpointer.load() if ctx.checkpointer else None
    if saved is not None:
        step, values = restore(saved, **stateful)
        trajectory, eval_steps = values["trajectory"], values["eval_steps"]

    encoder.train(), decoder.train(), gates.train()
    metrics: dict[str, float] = {}
    while step < total:
        gating["on"] = step >= ft_steps
        if gating["on"]:
            decoder.requires_grad_(cfg.pipeline == "dp")  # SP: decoder frozen while gating
        ids, mask, labels = take(data.train, batch_indices(step, len(data.train), tc.batch_size, seed), ctx.device)
        loss = task_loss(forward_logits(encoder, decoder, ids, mask), labels)
        penalty = l0_penalty(gates.log_alpha)
        total_loss = loss + cfg.gates.lambda_ * penalty if gating["on"] else loss
        optimizer.zero_grad(set_to_none=True), gate_optimizer.zero_grad(set_to_none=True)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(model_params + list(decoder.parameters()), tc.grad_clip)
        optimizer.step(), scheduler.step()
        if gating["on"]:
            gate_optimizer.step()
        step += 1

        with torch.no_grad():
            n_open = int(open_heads(eval_gates(gates.log_alpha)).sum()) if gating["on"] else num_layers * num_heads
        if step % tc.eval_every == 0 or step == total:
            gates.eval()
            metrics = evaluate(encoder, decoder, data.dev, task, tc.batch_size, ctx.device)
            gates.train()
            effective = eval_gates(gates.log_alpha).detach() if gating["on"] else ones
            metrics |= {
                "train_loss": loss.item(),
                "l0_penalty": penalty.item(),
                "expected_open_heads": prob_open(gates.log_alpha).sum().item(),
                "open_heads": float(n_open),
            }
            ctx.tracker.log_metrics(metrics, step)
            trajectory.append(effective.cpu().numpy().astype(np.float32))
            eval_steps.append(step)
            if ctx.checkpointer:
                values = {"trajectory": trajectory, "eval_steps": eval_steps}
                ctx.checkpointer.save(snapshot(step, values, **stateful))
        ctx.progress(step, total, {"loss": loss.item(), "open_heads": n_open})

    log_alpha = gates.log_alpha.detach()
    final_gates = eval_gates(log_alpha)
    final = dict(metrics)
    if cfg.sparsity is not None:
        keep = _top_heads(log_alpha, cfg.sparsity)
        handle.remove()
        handle = attach_head_gates(encoder, lambda: keep)
        final[f"{task.METRIC}_gated"] = final[task.METRIC]
        final |= evaluate(encoder, decoder, data.dev, task, tc.batch_size, ctx.device)
        final["open_heads"] = float(keep.sum())
        final_gates = keep
    handle.remove()
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=final,
        gates=final_gates.cpu().numpy().astype(np.float32),
        scores=log_alpha.cpu().numpy().astype(np.float32),
        trajectory=np.stack(trajectory),
        eval_steps=np.asarray(eval_steps),
        steps=step,
    )


def _top_heads(log_alpha: torch.Tensor, sparsity: float) -> torch.Tensor:
    """0/1 mask (L, H) keeping the ceil((1 - sparsity) * L * H) heads with the largest log_alpha."""
    flat = log_alpha.flatten()
    k = math.ceil((1 - sparsity) * flat.numel())
    mask = torch.zeros_like(flat)
    mask[torch.topk(flat, k).indices] = 1.0
    return mask.view_as(log_alpha)
