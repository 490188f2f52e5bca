"""Gradient importance of each head, and the iterative pruning curve (Michel et al. 2019).

Looks at a fine-tuned model: the ``init_from`` stage, by default a ``finetune`` run of the same
model, task, seed and training settings (``finetune_steps`` steps if set), shared with head_gates'
SP and the other analyses that start from it; a config's own ``init_from`` wins. Nothing is trained.

Importance (the paper's section 4.1; reference: ``examples/classifier_eval.py:187-254`` of the ``paul`` branch
of pmichel31415/pytorch-pretrained-BERT). Each head's output at each token is multiplied by its
own gate ``xi = 1`` (``heads.attach_token_gates``; a pruned head's is 0). On the first
``examples`` training examples (default: all of them, as the reference's
``--compute_head_importance_on_subset 1.0``), in batches of ``train.batch_size``, with the model
in eval mode (no dropout):

    I_h = sum over batches b, examples and tokens of |dL_b / dxi_{h,t}|  /  (real tokens)

with ``L_b`` the batch's mean task loss (the reference backprops ``CrossEntropyLoss()``, a batch
mean; its ``.sum()`` is of a scalar) and ``dL_b/dxi_{h,t} = dL_b/dctx_{h,t} . ctx_{h,t}`` (the
reference's ``einsum("bhli,bhli->bhl", grad_ctx, ctx).abs().sum(-1).sum(0)``): the absolute
value is taken per example and per token, so gradients of opposite sign never cancel. The last
layer of a sequence classifier is divided by the examples instead of the tokens (its decoder
reads [CLS] only; the reference's ``head_importance[-1] /= subset_size``). With
``normalize_layers`` (default, as in the paper and the README's ``--normalize_pruning_by_layer``)
each layer's row is then divided by its L2 norm. Map ``heads.importance``: the unpruned model's
``I``.

Pruning curve (reference: ``experiments/BERT/heads_pruning.sh`` of are-16-heads-really-better-
than-1, ``--prune_percent `seq 5 5 100```; ``run_classifier.py:369-522``). Starting from all
heads, each step removes ``step`` (default 5 %) of ALL heads, ``floor(pct * N / 100)`` in all,
the still-kept ones with the lowest importance, by setting their gates to 0 (no retraining), and
evaluates on the dev set, until every head is removed. The ranking is the unpruned model's
(the reference's default: importance is computed at its first step only, unless
``--exact_pruning``); with ``recompute`` importance is computed again on the pruned model before
each step (the pruned heads gated at 0 there, importance 0), a greedy ranking that follows the
pruning.

Reports:

- metrics: the unpruned model's dev metrics (``accuracy``, ``loss``, ``accuracy/<set>``), and the
  curve as ``<metric>_pruned_<pct>`` for pct = 0, 5, ..., 100 (every ``step``), the percent of
  heads targeted (``floor(pct * N / 100)`` heads removed; ``<metric>_pruned_0`` is the unpruned
  metric). Losses are left out of the curve.
- tracker: at step = pct, ``<metric>_pruned`` and ``heads_pruned`` (MLflow draws the curve);
- maps: ``heads.importance``, and ``heads.pruned_at``: the fraction of heads targeted at the step
  that removed the head (larger = kept longer; the iterative ranking, which with ``recompute``
  can differ from the first importance's order).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, field_validator

from base import collapse, outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.finetuning import finetune_stage
from experiments.interventions.heads import attach_head_gates, attach_token_gates
from experiments.maths.head_importance import (
    abs_token_sum,
    least_important,
    normalize_per_layer,
    per_token,
    pruning_counts,
)
from experiments.maths.losses import task_loss
from experiments.training.context import RunContext
from experiments.training.loop import batches, evaluate_all, forward_logits
from experiments.training.reads import BATCHED_FORWARDS
from experiments.training.state import RunState, set_up

VERSION = "2"  # 2: |dL/dxi| per example and token (was: of the batch mean); 5 % steps, ranking fixed,
# floor counts, all training examples by default (the reference's protocol)
PIPELINES = ("none",)
SHORT_NAMES = ()
READS = BATCHED_FORWARDS
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): forwards and backwards in batches
of train.batch_size; its finetune stage reads the rest."""
PROGRESS = {outputs.OPEN_HEADS.name: "open heads"}  # heads left after each pruning step
OUTPUTS = outputs.Outputs(maps=(outputs.IMPORTANCE, outputs.PRUNED_AT),
                          metrics=(*outputs.EVALUATION, outputs.PRUNING_CURVE))
"""What its runs report (base.outputs)."""
REFERENCE: dict[str, Any] = {}  # every default is the reference script's (heads_pruning.sh --normalize_pruning_by_layer)


class Config(Section):
    """head_importance's own keys: ``head_importance: {examples: 500, step: 0.05}``."""

    examples: int | None = Field(None, gt=0, description="Training examples (the first ones) whose loss gradients "
                                 "make the importance; null = all (the reference: --compute_head_importance_on_subset 1.0).")
    step: float = Field(0.05, ge=0.01, le=0.5, description="Fraction of all heads removed at each pruning step "
                        "(whole percents: 0.05, 0.1, ...; the reference script: 0.05, --prune_percent `seq 5 5 100`).")
    recompute: bool = Field(False, description="Recompute importance on the pruned model before each step (greedy); "
                            "false = rank once, on the unpruned model (the reference's default: no --exact_pruning).")
    normalize_layers: bool = Field(True, description="Divide each layer's importance by its L2 norm (Michel et al.; "
                                   "the reference's --normalize_pruning_by_layer, as its README runs it).")
    finetune_steps: int | None = Field(None, gt=0, description="Training steps of the fine-tune it starts from "
                                       "(None = the same train settings).")

    @field_validator("step")
    @classmethod
    def _whole_percent(cls, value: float) -> float:
        if abs(value * 100 - round(value * 100)) > 1e-9:
            raise ValueError(f"{value} is not a whole percent (0.05, 0.1, ...): the curve's metrics are named by percent")
        return value


def stages(section: Config) -> dict[str, dict]:
    """A fine-tuned model to score: a ``finetune`` run of the same model, task, seed and training
    settings (shared with head_gates' SP and the other analyses that start from it)."""
    return finetune_stage(section.finetune_steps)


def run(cfg, ctx: RunContext) -> RunResult:
    own = cfg.section
    state = set_up(cfg, ctx)  # the fine-tuned model (init_from)
    state.train(False)  # no dropout: importance and metrics are the model's, not a noise sample's
    for module in state.modules().values():
        module.requires_grad_(False)  # only the gates need gradients
    num_layers, num_heads = state.num_layers, state.num_heads
    counts = pruning_counts(num_layers * num_heads, own.step)

    keep = torch.ones(num_layers, num_heads, dtype=torch.bool)
    pruned_at = torch.zeros(num_layers, num_heads)
    importance = first = head_importance(state, keep, own.examples, own.normalize_layers)
    metrics: dict[str, float] = {}
    for t, count in enumerate(counts):
        pct = min(100, round(100 * t * own.step))
        if t > 0:  # remove the next heads, least important first
            if own.recompute and t > 1:
                importance = head_importance(state, keep, own.examples, own.normalize_layers)
            removed = least_important(importance, keep, count - int((~keep).sum()))
            keep &= ~removed
            pruned_at[removed] = pct / 100
        scores = _evaluate_with(state, keep)
        curve = {name: value for name, value in scores.items()
                 if name.split("/")[0] not in ("loss", collapse.TOP_CLASS_SHARE, collapse.LOSS_VS_UNIFORM)}
        ctx.tracker.log_metrics({_pruned(name): v for name, v in curve.items()} | {"heads_pruned": float(count)}, pct)
        metrics |= {_pruned(name, pct): value for name, value in curve.items()}
        if t == 0:
            metrics |= scores  # the unpruned model's dev metrics, under their plain names
        ctx.progress(t, len(counts) - 1, {outputs.OPEN_HEADS.name: float(keep.sum())})

    n = _examples(state, own.examples)
    norm = "L2-normalised per layer" if own.normalize_layers else "per token"
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        maps=dict([
            outputs.IMPORTANCE(first.numpy(), f"Michel importance E|dL/dxi| (per example and token) on {n} "
                                              f"train examples, {norm} (larger = more important)"),
            outputs.PRUNED_AT(pruned_at.numpy(), "fraction of heads pruned when it was removed "
                                                 f"({'recomputed' if own.recompute else 'fixed'} ranking; larger = kept longer)"),
        ]),
    )


def token_gradients(encoder, decoder, ids, mask, labels, xi: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """``dL/dxi`` (L, B, T, H) per example, token and head of the batch's mean task loss, head h
    of layer l gated by ``xi[l, h]`` at every token (``heads.attach_token_gates``); the forward in
    ``precision`` (``train.precision``), the gates and their gradient float32. A gate that does not
    reach the loss (a layer with no head left) gets gradient 0."""
    with attach_token_gates(encoder, xi) as handle:
        loss = task_loss(forward_logits(encoder, decoder, ids, mask, precision), labels)
        grads = torch.autograd.grad(loss, handle.gates, allow_unused=True)
    return torch.stack([torch.zeros_like(g) if d is None else d for g, d in zip(handle.gates, grads, strict=True)])


def head_importance(state: RunState, keep: torch.Tensor, examples: int | None, normalize: bool) -> torch.Tensor:
    """Michel's ``I`` (L, H) on the first ``examples`` training examples (None: all), kept heads at
    ``xi = 1``, pruned ones at 0 (and given importance 0); per layer L2-normalised when ``normalize``."""
    split, batch_size = state.data.train, state.cfg.train.batch_size
    n = _examples(state, examples)
    xi = keep.to(state.device, torch.float32)
    total, tokens = torch.zeros_like(xi), 0
    sequence_level = split.labels.dim() == 1  # its decoder reads [CLS]: the last layer reaches the loss there only
    for ids, mask, labels in batches(split, batch_size, state.device, n):
        grads = token_gradients(state.encoder, state.decoder, ids, mask, labels, xi, state.precision)  # (L, B, T, H)
        total += torch.stack([abs_token_sum(layer, mask) for layer in grads])
        tokens += int(mask.sum())
    importance = per_token(total, tokens, n, last_layer_per_example=sequence_level).cpu() * keep
    return normalize_per_layer(importance) if normalize else importance


def _examples(state: RunState, examples: int | None) -> int:
    """How many training examples make the importance: ``examples`` (None: all), at most the split."""
    return len(state.data.train) if examples is None else min(examples, len(state.data.train))


def _evaluate_with(state: RunState, keep: torch.Tensor) -> dict[str, float]:
    """Dev metrics (and every evaluation set's) with the heads not in ``keep`` gated to 0."""
    gates = keep.to(state.device, torch.float32)
    with attach_head_gates(state.encoder, lambda: gates):
        return evaluate_all(state)


def _pruned(name: str, pct: int | None = None) -> str:
    """``accuracy`` -> ``accuracy_pruned_<pct>`` (``outputs.PRUNING_CURVE``), ``accuracy/ood`` ->
    ``accuracy_pruned_<pct>/ood``; without ``pct``: ``accuracy_pruned``, the tracker's series over pct."""
    metric, slash, where = name.partition("/")
    return (f"{metric}_pruned" if pct is None else outputs.PRUNING_CURVE.name(metric=metric, pct=pct)) + slash + where
