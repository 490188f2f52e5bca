"""Disable one head, or one whole layer, at a time, and measure the task metric (Kovaleva et al. 2019).

Looks at a fine-tuned model: the ``init_from`` stage, by default a ``finetune`` run of the same
model, task, seed and training settings (``finetune_steps`` steps if set), shared with head_gates'
SP and the other analyses that start from it; a config's own ``init_from`` wins. Nothing is trained.

A head is disabled the Kovaleva way: its attention distribution is replaced by the uniform one
over the non-padding tokens, so its output is the mean of its value vectors
(``experiments.interventions.attention.disable_heads``); a layer is disabled by disabling all its heads. On the
first ``examples`` dev examples, in eval mode, each of the ``L * H`` heads and each of the ``L``
layers is disabled alone and the task metric measured.

Reports:

- maps ``heads.ablation_delta`` (L, H) and ``layers.ablation_delta`` (L, 1): metric with the head
  (layer) disabled minus the full model's, so negative = the model needs it, positive = it is
  better off without;
- metrics: the full model's metrics on those examples (``accuracy``, ``loss``), and
  ``ablation_delta_min`` / ``ablation_delta_max`` (the most harmful / most helpful single-head
  ablation), ``layer_ablation_delta_min``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from pydantic import Field

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.finetuning import finetune_stage
from experiments.interventions.attention import disable_heads
from experiments.tasks import Split
from experiments.training.context import RunContext
from experiments.training.loop import evaluate
from experiments.training.reads import BATCHED_FORWARDS
from experiments.training.state import RunState, set_up

VERSION = "1"
PIPELINES = ("none",)
SHORT_NAMES = ()
READS = BATCHED_FORWARDS
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): forwards in batches of
train.batch_size; its finetune stage reads the rest."""
OUTPUTS = outputs.Outputs(
    maps=(outputs.HEAD_ABLATION, outputs.LAYER_ABLATION),
    metrics=(*outputs.EVALUATION, *(outputs.Metric(n, "the dev metric's change when the most needed unit is disabled")
                                    for n in ("ablation_delta_min", "ablation_delta_max", "layer_ablation_delta_min"))))
"""What its runs report (base.outputs)."""


class Config(Section):
    """head_ablation's own keys: ``head_ablation: {examples: 500}``."""

    examples: int | None = Field(500, gt=0, description="Dev examples (the first ones) each ablation is measured on (None = all).")
    finetune_steps: int | None = Field(None, gt=0, description="Training steps of the fine-tune it ablates "
                                       "(None = the same train settings).")


def stages(section: Config) -> dict[str, dict]:
    """A fine-tuned model to ablate: a ``finetune`` run of the same model, task, seed and training
    settings (shared with head_gates' SP and the other analyses that start from it)."""
    return finetune_stage(section.finetune_steps)


def run(cfg, ctx: RunContext) -> RunResult:
    state = set_up(cfg, ctx)  # the fine-tuned model (init_from)
    dev = first_examples(state.data.dev, cfg.section.examples)
    full, heads, layers = ablation_deltas(state, dev, ctx.progress)

    metric, n = state.task.METRIC, len(dev)
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=full | {"ablation_delta_min": float(heads.min()), "ablation_delta_max": float(heads.max()),
                        "layer_ablation_delta_min": float(layers.min())},
        maps=dict([
            outputs.HEAD_ABLATION(heads, f"dev {metric} with the head disabled minus full, {n} examples (negative = needed)"),
            outputs.LAYER_ABLATION(layers, f"dev {metric} with the layer disabled minus full, {n} examples "
                                           "(negative = needed)"),
        ]),
    )


def ablation_deltas(state: RunState, dev: Split, progress=None) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """(the full model's metrics on ``dev``, heads (L, H), layers (L, 1)): the task metric with each
    head, then each whole layer, disabled alone, minus the full model's. ``progress(done, total, {})``
    is called after each ablation (the run context's: it raises when the run is cancelled)."""
    metric = state.task.METRIC
    num_layers, num_heads = state.num_layers, state.num_heads
    total, done = num_layers * num_heads + num_layers, 0

    full = metrics_with(state, dev, torch.zeros(num_layers, num_heads, dtype=torch.bool))
    heads = np.zeros((num_layers, num_heads), dtype=np.float32)
    layers = np.zeros((num_layers, 1), dtype=np.float32)
    for layer in range(num_layers):
        for head in [*range(num_heads), None]:  # each head alone, then the whole layer
            disabled = torch.zeros(num_layers, num_heads, dtype=torch.bool)
            disabled[layer, slice(None) if head is None else head] = True
            delta = metrics_with(state, dev, disabled)[metric] - full[metric]
            if head is None:
                layers[layer, 0] = delta
            else:
                heads[layer, head] = delta
            done += 1
            if progress is not None:
                progress(done, total, {})
    return full, heads, layers


def metrics_with(state: RunState, dev: Split, disabled: torch.Tensor) -> dict[str, float]:
    """Metrics on ``dev`` (eval mode) with the heads where ``disabled`` (bool (L, H)) is True
    given uniform attention over the real tokens."""
    batch_size = state.cfg.train.batch_size
    with disable_heads(state.encoder, disabled):
        return evaluate(state.encoder, state.decoder, dev, state.task, batch_size, state.device, state.precision)


def first_examples(split: Split, n: int | None) -> Split:
    """The first ``n`` examples of ``split`` (all when ``n`` is None or larger)."""
    if n is None or n >= len(split):
        return split
    features = None if split.features is None else split.features[:n]
    return replace(split, input_ids=split.input_ids[:n], attention_mask=split.attention_mask[:n],
                   labels=split.labels[:n], features=features)
