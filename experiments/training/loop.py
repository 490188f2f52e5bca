"""The step loop every method shares: batches, evaluation, and the bookkeeping around a step.

A method writes its loop BODY, ``step_fn(state, batch) -> {name: value}``, and
hands it to :func:`train_steps`, which owns what every method did the same way:
resume from the context's checkpoint, the step counter, evaluation every
``train.eval_every`` steps and at the end, logging to the tracker, checkpoints,
progress (and so cancellation), and handing the final weights on (stages).

Batch order is a pure function of (seed, step), so a run resumed from a
checkpoint sees the same batches as one that never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from base import collapse
from experiments.maths.losses import IGNORE_INDEX, task_loss
from experiments.tasks import Split
from experiments.training.context import RunContext
from experiments.training.precision import autocast
from experiments.training.seeding import derive_seed
from experiments.training.state import RunState

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(input_ids (B, T), attention_mask (B, T), labels (B,) or (B, T)), on the run's device."""

# ------------------------------------------------------------------------------ batches


def num_steps(n_train: int, batch_size: int, epochs: float, max_steps: int | None) -> int:
    """Optimiser steps of a phase: ``max_steps`` if given, else ceil(epochs * batches per epoch)."""
    if max_steps is not None:
        return max_steps
    return max(1, math.ceil(epochs * math.ceil(n_train / batch_size)))


@lru_cache(maxsize=8)
def _epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(derive_seed(seed, f"data_order:{epoch}"))
    return torch.randperm(n, generator=gen)


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> torch.Tensor:
    """Example indices of optimiser step ``step``: a fresh permutation each epoch, seeded."""
    per_epoch = math.ceil(n / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = _epoch_order(n, seed, epoch)
    return order[index * batch_size : (index + 1) * batch_size]


def take(split: Split, idx: torch.Tensor, device: str) -> Batch:
    """(input_ids, attention_mask, labels) of those examples, trimmed to their longest sequence."""
    mask = split.attention_mask[idx]
    length = int(mask.sum(dim=1).max())
    labels = split.labels[idx]
    if labels.dim() == 2:
        labels = labels[:, :length]
    return (split.input_ids[idx, :length].to(device), mask[:, :length].to(device), labels.to(device))


def batches(split: Split, batch_size: int, device: str, n: int | None = None) -> Iterator[Batch]:
    """The first ``n`` examples of ``split`` (None: all) in order, ``batch_size`` at a time, as ``take``
    gives them: one pass for evaluation and statistics (training draws its own seeded order)."""
    n = len(split) if n is None else n
    for start in range(0, n, batch_size):
        yield take(split, torch.arange(start, min(start + batch_size, n)), device)


def forward_logits(encoder, decoder, input_ids, attention_mask, precision: str = "fp32") -> torch.Tensor:
    """Task logits (B, C) or (B, T, C): the decoder over the encoder's last hidden states.

    The forward runs under ``precision``'s autocast (``train.precision``: experiments/training/precision.py)
    on the inputs' device; bf16/fp16 logits come back as float32, so every loss on them is float32."""
    with autocast(precision, input_ids.device):
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, Hd)
        logits = decoder(hidden, attention_mask)
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits  # float64 stays


# ------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(encoder, decoder, split: Split, task, batch_size: int, device: str,
             precision: str = "fp32") -> dict[str, float]:
    """Task metrics and loss on ``split``, in eval mode, batch by batch; forwards in ``precision``
    (``train.precision``), metrics and loss on float32 logits."""
    was_training = encoder.training
    encoder.eval()
    decoder.eval()
    logits_all, labels_all, losses = [], [], []
    for ids, mask, labels in batches(split, batch_size, device):
        logits = forward_logits(encoder, decoder, ids, mask, precision)
        losses.append(task_loss(logits, labels).item() * len(ids))
        if labels.dim() == 2:  # pad back to a common length so batches concatenate
            pad = split.input_ids.shape[1] - labels.shape[1]
            logits = F.pad(logits, (0, 0, 0, pad))
            labels = F.pad(labels, (0, pad), value=IGNORE_INDEX)
        logits_all.append(logits.cpu())
        labels_all.append(labels.cpu())
    encoder.train(was_training)
    decoder.train(was_training)
    logits, labels = torch.cat(logits_all), torch.cat(labels_all)
    metrics = task.compute_metrics(logits, labels)
    metrics["loss"] = sum(losses) / len(split)
    return metrics | _prediction_spread(logits, labels, metrics["loss"])


def _prediction_spread(logits: torch.Tensor, labels: torch.Tensor, loss: float) -> dict[str, float]:
    """How one-sided the predictions are (``collapse.measure``): the most predicted class's share of
    the scored positions, and the loss over the uniform guess's ln K."""
    predicted = logits.argmax(dim=-1)[labels != IGNORE_INDEX]
    top = int(torch.bincount(predicted).max()) if predicted.numel() else 0
    return collapse.measure(top, predicted.numel(), loss, logits.shape[-1])


def evaluate_all(state: RunState, encoder: nn.Module | None = None) -> dict[str, float]:
    """The task decoder's metrics with everything in eval mode (test-time gates): dev under plain
    names (``accuracy``, ``loss``), plus ``<metric>/<set>`` for every extra evaluation set of the
    data (``accuracy/ood``, ``loss/ood``). Modes are restored afterwards. ``encoder``: what reads
    the inputs when it is a view over the state's modules rather than ``state.encoder`` itself
    (skill_neurons' backbone with its soft prompt)."""
    encoder = state.encoder if encoder is None else encoder
    batch_size, device, precision = state.cfg.train.batch_size, state.device, state.precision
    with state.evaluating():
        encoder.eval()
        metrics = evaluate(encoder, state.decoder, state.data.dev, state.task, batch_size, device, precision)
        for name, split in state.data.eval_sets.items():
            scores = evaluate(encoder, state.decoder, split, state.task, batch_size, device, precision)
            metrics |= {f"{metric}/{name}": value for metric, value in scores.items()}
    return metrics


# ------------------------------------------------------------------------------ the loop


def update(loss: torch.Tensor, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
           scheduler=None, params: list | None = None, grad_clip: float | None = None,
           scaler: torch.amp.GradScaler | None = None) -> float:
    """One optimiser step on ``loss``, the one place every method's steps happen: zero the
    gradients of ``optimizer`` (one, or several that step together: model and gates), backward,
    clip ``params`` to ``grad_clip`` (when given), step every optimiser and the ``scheduler``
    (one, a sequence, or None); returns the loss value.

    With ``scaler`` (``state.scaler``: a GradScaler under fp16, else None) the loss is scaled for
    the backward, the gradients unscaled before clipping, and a step whose gradients overflowed is
    skipped (``GradScaler.step``) while the scale adapts (``update``)."""
    optimizers = list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]
    schedulers = [] if scheduler is None else list(scheduler) if isinstance(scheduler, Sequence) else [scheduler]
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is not None:
        for opt in optimizers:
            scaler.unscale_(opt)  # clip (and step) the true gradients
    if params is not None and grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for opt in optimizers:
        opt.step() if scaler is None else scaler.step(opt)
    if scaler is not None:
        scaler.update()
    for sched in schedulers:
        sched.step()
    return loss.item()


def train_steps(
    state: RunState,
    ctx: RunContext,
    total: int,
    step_fn: Callable[[RunState, Batch], dict[str, float]],
    eval_fn: Callable[[RunState], dict[str, float]] | None = None,
    batch_fn: Callable[[RunState], Batch] | None = None,
) -> dict[str, float]:
    """Run ``step_fn`` until ``state.step == total``; return the last evaluation's metrics.

    - Resume: a checkpoint from ``ctx.checkpointer`` replaces the state (step, weights,
      optimisers, RNG, values) before the first step; otherwise the state starts as built.
    - Each step: the batch of ``state.step`` (seeded order over ``data.train``; its example
      indices in ``state.batch_index``, for losses that look examples up), then
      ``step_fn(state, batch)``, which does the forward, backward and optimiser steps and
      returns the step's values (``loss`` at least; ``open_heads`` for the progress bar).
      The loop then counts the step. ``batch_fn(state)``, when given, makes the step's batch
      instead (a multi-task run draws from one of its tasks' data; it sets ``state.batch_index``).
    - Every ``train.eval_every`` steps and at ``total``: ``eval_fn(state)`` (default
      :func:`evaluate_all`) joined by the step's values as floats (its ``loss`` as
      ``train_loss``) is logged to ``ctx.tracker`` at that step; the step goes to
      ``state.values["eval_steps"]``, the metrics to ``state.values["metrics"]``; then a
      checkpoint (``state.state_dict()``) goes to ``ctx.checkpointer``.
    - After every step, ``ctx.progress(step, total, step values)`` (raises ``RunCancelled``
      when the run should stop).
    - At the end, with ``ctx.save_weights`` set, ``state.weights()`` is handed to it once.
    """
    saved = ctx.checkpointer.load() if ctx.checkpointer else None
    if saved is not None:
        state.load_state_dict(saved)
    state.values.setdefault("eval_steps", [])
    tc, train = state.cfg.train, state.data.train
    state.train()
    while state.step < total:
        if batch_fn is None:
            state.batch_index = batch_indices(state.step, len(train), tc.batch_size, state.cfg.seed)
            batch = take(train, state.batch_index, state.device)
        else:
            batch = batch_fn(state)
        values = step_fn(state, batch)
        state.step += 1
        if state.step % tc.eval_every == 0 or state.step == total:
            metrics = (eval_fn or evaluate_all)(state)
            metrics |= {("train_loss" if name == "loss" else name): float(value) for name, value in values.items()}
            ctx.tracker.log_metrics(metrics, state.step)
            state.values["eval_steps"].append(state.step)
            state.values["metrics"] = metrics
            if ctx.checkpointer:
                ctx.checkpointer.save(state.state_dict())
        ctx.progress(state.step, total, values)
    if ctx.save_weights is not None:
        ctx.save_weights(state.weights())
    return dict(state.values.get("metrics", {}))
