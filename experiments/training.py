"""Small pieces every method's loop uses: batches, schedules, loss, evaluation, context.

No training framework: each method writes its own loop (STYLE.md) and calls
these. Schedules are functions of the step; batch order is a pure function of
(seed, step), so a run resumed from a checkpoint sees the same batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from experiments.seeding import derive_seed
from experiments.tasks import Split
from experiments.tracking import MemoryTracker, Tracker


class RunCancelled(Exception):
    """Raised inside a run when its context says stop (a cancelled sweep)."""


class Checkpointer(Protocol):
    def save(self, state: dict[str, Any]) -> None: ...

    def load(self) -> dict[str, Any] | None: ...


@dataclass
class RunContext:
    """What the caller lends a run: where to log, progress, checkpoints, cancellation."""

    tracker: Tracker = field(default_factory=MemoryTracker)
    on_progress: Callable[[int, int, Mapping[str, float]], None] | None = None
    checkpointer: Checkpointer | None = None
    should_stop: Callable[[], bool] = lambda: False
    device: str = "cpu"

    def progress(self, step: int, total: int, metrics: Mapping[str, float]) -> None:
        if self.should_stop():
            raise RunCancelled(f"stopped at step {step} of {total}")
        if self.on_progress is not None:
            self.on_progress(step, total, metrics)


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


def take(split: Split, idx: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) of those examples, trimmed to their longest sequence."""
    mask = split.attention_mask[idx]
    length = int(mask.sum(dim=1).max())
    labels = split.labels[idx]
    if labels.dim() == 2:
        labels = labels[:, :length]
    return (split.input_ids[idx, :length].to(device), mask[:, :length].to(device), labels.to(device))


def linear_warmup_decay(step: int, total: int, warmup_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup_ratio * total`` steps, then linear decay to 0."""
    warmup = int(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over (B, C) or (B, T, C) logits; label -100 is not scored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def forward_logits(encoder, decoder, input_ids, attention_mask) -> torch.Tensor:
    hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, Hd)
    return decoder(hidden, attention_mask)


@torch.no_grad()
def evaluate(encoder, decoder, split: Split, task, batch_size: int, device: str) -> dict[str, float]:
    """Task metrics and loss on ``split``, in eval mode (test-time gates), batch by batch."""
    was_training = encoder.training
    encoder.eval()
    decoder.eval()
    logits_all, labels_all, losses = [], [], []
    for start in range(0, len(split), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(split)))
        ids, mask, labels = take(split, idx, device)
        logits = forward_logits(encoder, decoder, ids, mask)
        losses.append(task_loss(logits, labels).item() * len(idx))
        if labels.dim() == 2:  # pad back to a common length so batches concatenate
            pad = split.input_ids.shape[1] - labels.shape[1]
            logits = F.pad(logits, (0, 0, 0, pad))
            labels = F.pad(labels, (0, pad), value=-100)
        logits_all.append(logits.cpu())
        labels_all.append(labels.cpu())
    encoder.train(was_training)
    decoder.train(was_training)
    metrics = task.compute_metrics(torch.cat(logits_all), torch.cat(labels_all))
    metrics["loss"] = sum(losses) / len(split)
    return metrics


def build_decoder(task, hidden_size: int, num_labels: int, seed: int) -> torch.nn.Module:
    """The task's decoder, initialised from the run's 'decoder' stream (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "decoder"))
        return task.build_decoder(hidden_size, num_labels)


def adamw(groups: list[tuple[list[torch.nn.Parameter], float]], weight_decay: float) -> torch.optim.AdamW:
    """AdamW over (params, lr) groups; biases and LayerNorm weights (1-D) get no decay."""
    param_groups = []
    for params, lr in groups:
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        param_groups += [
            {"params": decay, "lr": lr, "weight_decay": weight_decay},
            {"params": no_decay, "lr": lr, "weight_decay": 0.0},
        ]
    return torch.optim.AdamW(param_groups)


@dataclass
class Setup:
    """What every method starts from: the task, its data, the encoder and a fresh task decoder."""

    task: Any
    data: Any  # TaskData
    encoder: torch.nn.Module
    decoder: torch.nn.Module
    num_layers: int
    num_heads: int


def set_up(cfg, device: str) -> Setup:
    """Load the backbone (seeded 'model_init' stream) and the task data; build the decoder; move to device."""
    from experiments.models import head_layout, load_backbone
    from experiments.tasks import TASKS

    task = TASKS[cfg.task.name]
    encoder, tokenizer = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    data = task.load(cfg.task, tokenizer)
    num_layers, num_heads, _ = head_layout(encoder)
    decoder = build_decoder(task, encoder.config.hidden_size, data.num_labels, cfg.seed)
    encoder.to(device), decoder.to(device)
    return Setup(task, data, encoder, decoder, num_layers, num_heads)


def snapshot(step: int, values: Mapping[str, Any], **stateful: Any) -> dict[str, Any]:
    """A checkpoint: step, plain ``values``, the state of each module/optimiser/generator, and the
    global torch RNG (dropout), so a resumed run is bit-identical."""
    state = {"step": step, "values": dict(values), "rng": torch.get_rng_state()}
    for name, obj in stateful.items():
        state[name] = obj.get_state() if isinstance(obj, torch.Generator) else obj.state_dict()
    return state


def restore(saved: Mapping[str, Any], **stateful: Any) -> tuple[int, dict[str, Any]]:
    """Load a :func:`snapshot` into the given objects; return (step, values)."""
    for name, obj in stateful.items():
        if isinstance(obj, torch.Generator):
            obj.set_state(saved[name])
        else:
            obj.load_state_dict(saved[name])
    torch.set_rng_state(saved["rng"])
    return saved["step"], dict(saved["values"])
