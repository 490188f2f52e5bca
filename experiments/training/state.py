"""The state of one run: what a method builds, trains, checkpoints and hands on.

:class:`RunState` is plain data: the backbone, the decoders, the data, the
interventions (modules a method puts on the model, such as head gates), the
optimisers, schedulers and random generators, the step, and plain values (a gate
trajectory, the evaluation steps). Two views of it leave the run:

- ``state_dict()``: a checkpoint, everything a resumed run needs to continue
  bit-identically (including the global torch RNG that drives dropout);
- ``weights()``: the encoder's, decoders' and interventions' weights, what a dependant run
  (stages: ``init_from``) starts from.

:func:`set_up` builds the state every method starts from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from experiments.models import head_layout, load_backbone
from experiments.tasks.cache import load_task
from experiments.training.precision import autocast, grad_scaler
from experiments.training.seeding import derive_seed


@dataclass
class RunState:
    """One run's moving parts. Dicts are keyed by role: ``decoders["task"]``, ``interventions["gates"]``."""

    cfg: Any  # RunConfig
    task: Any  # the task module (experiments.tasks)
    data: Any  # TaskData
    encoder: nn.Module
    decoders: dict[str, nn.Module] = field(default_factory=dict)
    interventions: dict[str, nn.Module] = field(default_factory=dict)
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    schedulers: dict[str, Any] = field(default_factory=dict)  # torch.optim.lr_scheduler.*
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    step: int = 0
    """Optimiser steps taken so far."""
    batch_index: torch.Tensor | None = None
    """Example indices (into ``data.train``) of the step's batch, set by ``train_steps``."""
    values: dict[str, Any] = field(default_factory=lambda: {"eval_steps": []})
    """Plain values that belong in a checkpoint: ``eval_steps``, a gate ``trajectory``, ..."""
    device: str = "cpu"
    precision: str = "fp32"
    """``train.precision`` of the run: how its forwards run (``autocast()``, experiments/training/precision.py)."""
    scaler: torch.amp.GradScaler | None = None
    """fp16's gradient scaler (``loop.update(..., scaler=state.scaler)``); None in fp32 and bf16."""

    def autocast(self):
        """The context every forward pass of this run runs in (``train.precision`` on its device):
        for methods that call the model themselves rather than through ``loop.forward_logits``."""
        return autocast(self.precision, self.device)

    @property
    def decoder(self) -> nn.Module:
        """The task decoder, ``decoders["task"]``."""
        return self.decoders["task"]

    @property
    def num_layers(self) -> int:
        return head_layout(self.encoder)[0]

    @property
    def num_heads(self) -> int:
        return head_layout(self.encoder)[1]

    def modules(self) -> dict[str, nn.Module]:
        """Every trained module by a unique name: ``encoder``, ``decoders.<role>``, ``interventions.<role>``."""
        named = {"encoder": self.encoder}
        named |= {f"decoders.{name}": module for name, module in self.decoders.items()}
        named |= {f"interventions.{name}": module for name, module in self.interventions.items()}
        return named

    def train(self, mode: bool = True) -> None:
        """Training (or eval) mode for the encoder, every decoder and every intervention."""
        for module in self.modules().values():
            module.train(mode)

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Every module in eval mode for the block (test-time gates, no dropout), then each back in
        the mode it had, also on an error."""
        modes = {name: module.training for name, module in self.modules().items()}
        self.train(False)
        try:
            yield
        finally:
            for name, module in self.modules().items():
                module.train(modes[name])

    # ----------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint: everything a resumed run needs to continue bit-identically.

        Module, optimiser and scheduler states are their own ``state_dict()``s and share
        storage with the live tensors (a checkpointer writes them before the next step);
        ``values`` is a deep copy. Holds the global CPU RNG (dropout) and, on CUDA, that
        device's RNG too; under fp16, the grad scaler's scale and growth tracker.
        """
        state: dict[str, Any] = {
            "step": self.step,
            "values": copy.deepcopy(self.values),
            "rng": torch.get_rng_state(),
            "encoder": self.encoder.state_dict(),
            "decoders": {name: module.state_dict() for name, module in self.decoders.items()},
            "interventions": {name: module.state_dict() for name, module in self.interventions.items()},
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "schedulers": {name: sched.state_dict() for name, sched in self.schedulers.items()},
            "generators": {name: gen.get_state() for name, gen in self.generators.items()},
        }
        if torch.device(self.device).type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the same objects must exist under the same names."""
        self.encoder.load_state_dict(saved["encoder"])
        for group in ("decoders", "interventions", "optimizers", "schedulers"):
            objects = getattr(self, group)
            if set(saved[group]) != set(objects):
                raise KeyError(f"checkpoint has {group} {sorted(saved[group])}, this run has {sorted(objects)}")
            for name, obj in objects.items():
                obj.load_state_dict(saved[group][name])
        if set(saved["generators"]) != set(self.generators):
            raise KeyError(f"checkpoint has generators {sorted(saved['generators'])}, this run has {sorted(self.generators)}")
        for name, gen in self.generators.items():
            gen.set_state(saved["generators"][name])
        self.step = saved["step"]
        self.values = copy.deepcopy(saved["values"])
        torch.set_rng_state(saved["rng"])
        if "cuda_rng" in saved and torch.device(self.device).type == "cuda":
            torch.cuda.set_rng_state(saved["cuda_rng"], self.device)
        if self.scaler is not None and "scaler" in saved:
            self.scaler.load_state_dict(saved["scaler"])

    # ----------------------------------------------------------------- stages

    def weights(self) -> dict[str, torch.Tensor]:
        """What a dependant run (stages) starts from, as one flat state dict of CPU copies:
        ``encoder.<param>``, ``decoders.<role>.<param>`` and ``interventions.<role>.<param>``
        (gates, mask scores: a ``prune_then_ft`` run reads its upstream's masks there).
        A weight under a parametrisation (a mask) is handed on as the plain weight it wraps,
        under its plain name. Optimisers are not part of it."""
        named = {"encoder": self.encoder}
        named |= {f"decoders.{name}": module for name, module in self.decoders.items()}
        named |= {f"interventions.{name}": module for name, module in self.interventions.items()}
        return {
            f"{prefix}.{key.replace('.parametrizations.weight.original', '.weight')}": tensor.detach().to("cpu", copy=True)
            for prefix, module in named.items()
            for key, tensor in module.state_dict().items()
        }

    def load_weights(self, weights: dict[str, torch.Tensor], decoders: bool = True) -> None:
        """Start from :meth:`weights` of another run: the encoder, and (``decoders=True``) every
        decoder of this run, which must all be in ``weights``; a missing or extra key is an error.
        ``decoders=False`` loads the encoder only (a dependant with a new decoder)."""
        targets = {"encoder": self.encoder}
        if decoders:
            targets |= {f"decoders.{name}": module for name, module in self.decoders.items()}
        for prefix, module in targets.items():
            part = {key[len(prefix) + 1 :]: value for key, value in weights.items() if key.startswith(prefix + ".")}
            if not part:
                raise KeyError(f"weights have no '{prefix}.*' entries (they hold {sorted({k.split('.')[0] for k in weights})})")
            module.load_state_dict(part)


def build_decoder(task, hidden_size: int, num_labels: int, seed: int) -> nn.Module:
    """The task's decoder, initialised from the run's 'decoder' stream (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "decoder"))
        return task.build_decoder(hidden_size, num_labels)


def adam(params, decoupled: bool = False, **options) -> torch.optim.Adam | torch.optim.AdamW:
    """torch's Adam (AdamW with ``decoupled``: weight decay outside the gradient) over ``params``
    (tensors or param groups), fused: one kernel updates every tensor, where the default on the CPU
    loops over them in small ops. The same update to float rounding; it halves a tiny run's
    training on the CPU (issue 19). Every method's optimiser is made here."""
    return (torch.optim.AdamW if decoupled else torch.optim.Adam)(params, fused=True, **options)


def decay_groups(groups: list[tuple[list[nn.Parameter], float]], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's param groups of (params, lr) groups: matrices decay by ``weight_decay``, biases and
    LayerNorm weights (1-D) by none: BERT's ``no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight']``
    of the references (run_classifier.py, trainer_imp.py), by shape so that every architecture gets it."""
    param_groups = []
    for params, lr in groups:
        param_groups += [
            {"params": [p for p in params if p.dim() >= 2], "lr": lr, "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "lr": lr, "weight_decay": 0.0},
        ]
    return param_groups


def adamw(groups: list[tuple[list[nn.Parameter], float]], weight_decay: float) -> torch.optim.AdamW:
    """AdamW over (params, lr) groups; biases and LayerNorm weights (1-D) get no decay (``decay_groups``)."""
    return adam(decay_groups(groups, weight_decay), decoupled=True)


def fine_tuning_groups(encoder: nn.Module, decoder: nn.Module, tc) -> list[dict[str, Any]]:
    """The fine-tuning optimiser's param groups: the encoder (its pooler included) at ``train.lr``, the
    task decoder at ``train.decoder_lr`` (null: ``train.lr``, one lr for every parameter, as the papers'
    scripts), each split by ``decay_groups``."""
    return decay_groups([(list(encoder.parameters()), tc.lr), (list(decoder.parameters()), tc.head_lr)],
                        tc.weight_decay)


def fine_tuning(state: RunState, total: int, schedule: Callable[[int], float] | None = None):
    """The model's optimiser every fine-tuning method shares, registered as ``state.optimizers``
    / ``state.schedulers["model"]``: AdamW over ``fine_tuning_groups``, the lr multiplied by
    ``schedule(step)``: by default linear warm-up and decay over ``total`` steps (IMP passes its
    rounds' schedule). Returns (optimizer, scheduler)."""
    from experiments.maths.schedules import linear_warmup_decay

    tc = state.cfg.train
    optimizer = adam(fine_tuning_groups(state.encoder, state.decoder, tc), decoupled=True)
    if schedule is None:
        def schedule(s: int) -> float:
            return linear_warmup_decay(s, total, tc.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    state.optimizers["model"], state.schedulers["model"] = optimizer, scheduler
    return optimizer, scheduler


def set_up(cfg, ctx) -> RunState:
    """What every method starts from: the task's data, the backbone (seeded 'model_init' stream)
    and a fresh task decoder ('decoder' stream), on ``ctx.device``, in float32 whatever
    ``train.precision`` (which sets ``precision`` and, for fp16, the ``scaler``); the global RNG
    (dropout) seeded from the 'dropout' stream. Optimisers, schedulers and interventions are the
    method's to add."""
    from experiments.tasks import TASKS

    task = TASKS[cfg.task.name]
    encoder, tokenizer = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    data = load_task(cfg.task, tokenizer)  # tokenised once per grid (experiments/tasks/cache.py)
    decoder = build_decoder(task, encoder.config.hidden_size, data.num_labels, cfg.seed)
    precision = cfg.train.precision
    state = RunState(cfg=cfg, task=task, data=data, encoder=encoder, decoders={"task": decoder}, device=ctx.device,
                     precision=precision, scaler=grad_scaler(precision, ctx.device))
    if cfg.train.pooler:
        read_pooler_for_good(encoder, decoder, cfg.model)
    if getattr(cfg, "init_from", None) is not None:
        state.load_weights(upstream_weights(cfg, ctx, "init_from"),
                           decoders=cfg.upstreams["init_from"].task == cfg.task)  # another task: its own decoder
    encoder.to(ctx.device), decoder.to(ctx.device)
    torch.manual_seed(derive_seed(cfg.seed, "dropout"))
    return state


def read_pooler_for_good(encoder: nn.Module, decoder: nn.Module, model: str) -> None:
    """``train.pooler``: the [CLS] classifier reads the encoder's pooler for the whole run
    (``masks.read_pooler``, a forward hook; the pooler's weights are the encoder's and train with it)."""
    from base.sections import ConfigError
    from experiments.interventions.masks import read_pooler, uses_pooler

    if not uses_pooler(encoder, decoder):
        what = "has no pooler" if getattr(encoder, "pooler", None) is None else "is read by a token-level decoder"
        raise ConfigError(f"train.pooler: {model} {what}; set train.pooler=false (the classifier reads [CLS])")
    read_pooler(encoder)


def upstream_weights(cfg, ctx, role: str) -> dict:
    """The final weights of the run's upstream ``role`` (a stage), from the orchestrator."""
    if ctx.load_upstream is None:
        up = cfg.upstreams[role]
        raise RuntimeError(f"this run starts from another run ({role}: {up.method}, run key {up.run_key}); "
                           "run it with `headsweep run` or in a sweep, which run that one first")
    return ctx.load_upstream(role)
