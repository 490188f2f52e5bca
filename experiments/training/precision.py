"""Numeric precision of a run's forward passes: ``train.precision`` = fp32 | bf16 | fp16.

The one place that decides how a forward pass runs (``autocast``): every method's forwards go
through it, via ``loop.forward_logits`` / ``loop.evaluate`` (``precision=``), ``RunState.autocast()``
or ``probing.sentence_maps`` (``precision=``).

- ``fp32``: plain float32, no autocast (what every run did before this key existed).
- ``bf16``: ``torch.autocast(device_type, torch.bfloat16)`` on CPU and CUDA. Matrix products run in
  bfloat16; autocast keeps reductions, softmax, norms and losses in float32 where it lists them.
- ``fp16``: ``torch.autocast("cuda", torch.float16)`` plus a ``torch.amp.GradScaler`` for the
  backward and the optimiser steps (``loop.update``). CUDA only: fp16's 5 exponent bits need loss
  scaling, and CPU runs use bf16 (``check_precision`` says so before anything runs).

Weights, optimiser states and gates stay float32 (autocast, never ``.half()``): the master
weights are what the optimiser updates and what a dependant run starts from. What the loop
hands a loss (``forward_logits``) is cast back to float32, so losses and penalties are float32;
the Hard Concrete gates are sampled outside autocast (``interventions.gates.HeadGates``). Analyses that record
attention probabilities or activations cast what they record to float32 before their maths.
``bias_only`` (a logistic regression on hand-made features, no encoder) stays float32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from base.sections import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each ``train.precision`` (experiments.harness.config.TrainConfig; fp32: no autocast)."""


def device_type(device: str | torch.device) -> str:
    """``"cuda:1"`` -> ``"cuda"``: what ``torch.autocast`` and ``GradScaler`` take."""
    return torch.device(device).type


def precision_error(precision: str, device: str | torch.device) -> str | None:
    """Why ``precision`` cannot run on ``device`` (a sentence naming the key), or None when it can."""
    if precision == "fp16" and device_type(device) != "cuda":
        return (f"train.precision: fp16 needs a CUDA GPU (float16 autocast with a grad scaler), and this run is on "
                f"{device_type(device)}; use bf16 on CPU")
    return None


def check_precision(cfg: Any, device: str | torch.device) -> None:
    """Raise ConfigError when the run, or a run it starts from (its stages), asks for a precision
    ``device`` cannot run: fp16 anywhere but on CUDA. Called where the device is known, before
    anything runs (``experiments.harness.runner.run``, ``headsweep run``, a grid whose trials get no GPU)."""
    for role, config in _with_upstreams(cfg, ""):
        error = precision_error(config.train.precision, device)
        if error is not None:
            raise ConfigError(f"{role}{error}")


def _with_upstreams(cfg: Any, prefix: str):
    """(key prefix, config) of the run and, recursively, of every stage it names: ``init_from.``."""
    yield prefix, cfg
    for role, upstream in cfg.upstreams.items():
        yield from _with_upstreams(upstream, f"{prefix}{role}.")


def autocast(precision: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The context a forward pass of ``precision`` runs in on ``device``: nothing for fp32,
    ``torch.autocast(device type, bfloat16 | float16)`` otherwise (fp16 off CUDA raises)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    error = precision_error(precision, device)
    if error is not None:
        raise ConfigError(error)
    return torch.autocast(device_type=device_type(device), dtype=DTYPES[precision])


def grad_scaler(precision: str, device: str | torch.device) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for fp16 (loss scaling against float16 underflow), else None:
    bf16 has float32's exponent range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device_type(device))
