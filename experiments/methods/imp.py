"""Iterative magnitude pruning (Liu et al. 2022 after Frankle & Carbin 2019; PAPERS.md).

Rounds of 10 % of the original weights: round ``k`` removes ``1 / (10 - k)`` of the weights
still kept, by magnitude within each matrix (Q, K, V, attention output, FFN in and out of
every layer, and the pooler where the classifier reads it; experiments/interventions/masks.py), so
``sparsity: 0.3`` takes three rounds. As in the reference (hg_transformers/trainer_imp.py
``train``), the first round prunes the starting weights' magnitudes at step 0; each later
round prunes the weights trained for one round: ``round_fraction`` (0.1) of the train
section's steps (``train.max_steps`` or ``train.epochs``), as the reference prunes every
``t_total / 10`` steps of one run; AdamW is rebuilt each round, without warm-up, its lr the
start of a linear decay over the train section's steps (0.1 of it: from ``train.lr`` to 0.9 of
it), as the reference rebuilds its schedule at every pruning. Pruned weights stay at zero
through the mask, a parametrisation (no model file edited).

Pipelines (DESIGN.md "pipeline"):
- ``ft_then_prune`` (a): start from a fine-tuned model (an ``init_from`` finetune stage);
  each round prunes, then trains one round from where it is (reference scripts/imp/prune_after_ft).
- ``prune_then_ft`` (b, lottery tickets with rewinding, reference scripts/imp/lt): each round
  prunes, rewinds the ENCODER to the start (the reference ``rewind()`` restores ``bert.*``
  only: the trained classifier stays) and trains one round; after the last pruning the
  subnetwork trains for the whole train section from the start, encoder and classifier, with
  warm-up and decay (the reference retrains in a new run: the pretrained model and the seed's
  initial classifier, the pooler masked, --warmup_steps 3600). The start is the pretrained
  model, or with ``rewind_steps`` an early fine-tuning checkpoint (an ``init_from`` finetune
  stage of that many steps). As in the reference's
  ``BertForSequenceClassification``, the classifier reads the pooler, which is pruned with the
  other matrices (``pooler``; BERT/RoBERTa and sentence tasks; ``masks.read_pooler``).

``loss`` is any objective of experiments/components/debias.py. Reports the evaluation metrics of the
final model, ``sparsity`` (realised), the mask's density maps (``heads.mask_density``,
``neurons.mask_density``, ``weights.mask_density``) and the mask as ``masks.npz``.
"""

from __future__ import annotations

import torch
from pydantic import Field, field_validator
from torch import nn

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.debias import LOSSES, check_loss, loss_stages, objective
from experiments.interventions.masks import (
    attach_masks,
    imp_prune,
    maskable_weights,
    masked_result,
    read_pooler,
    realised_sparsity,
    uses_pooler,
)
from experiments.maths.schedules import linear_warmup_decay, restarted_linear_decay
from experiments.training import optimisers as opt
from experiments.training.context import RunContext
from experiments.training.loop import forward_logits, num_steps, train_steps, update
from experiments.training.reads import FINE_TUNING
from experiments.training.state import fine_tuning, set_up

VERSION = "2"  # 2: the reference rounds: first prune at step 0, encoder-only rewinding, pooler read and pruned,
# rounds of a tenth of the train section, their lr as the reference rebuilds it (no warm-up, decay to 0.9)
PIPELINES = ("ft_then_prune", "prune_then_ft")
SHORT_NAMES = ("sparsity", "pipeline", "loss")
READS = FINE_TUNING
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): every train key."""
OUTPUTS = outputs.Outputs(maps=outputs.MASK_DENSITIES, metrics=(*outputs.EVALUATION, outputs.SPARSITY))
"""What its runs report (base.outputs)."""
ROUNDS = 10
"""Each round removes 10 % of the original weights (PAPERS.md)."""


class Config(Section):
    """imp's own keys: ``imp: {sparsity: 0.5, pipeline: prune_then_ft}``."""

    pipeline: str = Field(
        PIPELINES[0], description="ft_then_prune: prune a fine-tuned model (init_from stage) and keep training; "
        "prune_then_ft: prune, rewind the encoder to the start (the classifier keeps training) and train, each "
        "round; then train the subnetwork from the start.",
    )
    sparsity: float = Field(0.5, ge=0.1, le=0.9, description="Final fraction removed per matrix: 0.1, 0.2, ..., 0.9 "
                            "(one round of 10 % each).")
    pooler: bool = Field(
        True, description="prune_then_ft: the classifier reads the pooler output tanh(W_p h_[CLS] + b_p), pruned like "
        "every matrix, as the reference's BertForSequenceClassification (BERT/RoBERTa, sentence tasks); false: it "
        "reads [CLS] (our finetune's decoder, so ft_then_prune never reads the pooler).")
    round_fraction: float = Field(
        0.1, gt=0, le=1, description="Steps of a pruning round, as a fraction of the train section's (train.max_steps "
        "or train.epochs): the reference prunes every t_total / 10 steps of one run (save_steps); prune_then_ft's "
        "retraining after the last round runs the whole train section (the reference's retraining run).")
    rewind_steps: int | None = Field(
        None, gt=0, description="prune_then_ft: rewind to a fine-tune of this many steps (init_from stage) "
        "instead of the pretrained weights.")
    loss: str = Field("ce", description="Training objective: " + "; ".join(f"{k}: {v}" for k, v in LOSSES.items()) + ".")

    @field_validator("sparsity")
    @classmethod
    def _whole_rounds(cls, value: float) -> float:
        if abs(value * ROUNDS - round(value * ROUNDS)) > 1e-9:
            raise ValueError(f"{value} is not a whole number of {100 // ROUNDS} % rounds (0.1, 0.2, ..., 0.9)")
        return value


def stages(section: Config) -> dict[str, dict]:
    """ft_then_prune starts from a fine-tune; prune_then_ft with ``rewind_steps`` from an early one;
    a debiasing loss from a bias model (and a teacher): experiments/components/debias.py."""
    upstreams = loss_stages(section.loss)
    if section.pipeline == "ft_then_prune":
        upstreams["init_from"] = {"method": "finetune"}
    elif section.rewind_steps is not None:
        upstreams["init_from"] = {"method": "finetune", "train": {"max_steps": section.rewind_steps}}
    return upstreams


def check(cfg) -> None:
    check_loss(cfg, cfg.section.loss)


def unread(section: Config, train) -> dict[str, str]:
    """Keys a run of ``section`` does not read (experiments/training/reads.py)."""
    if section.pipeline != "prune_then_ft":
        return {"rewind_steps": "only prune_then_ft rewinds (ft_then_prune keeps training)"}
    return {}


class FixedMasks(nn.Module):
    """The current masks as bool buffers (so they are in every checkpoint), by matrix name."""

    def __init__(self, linears: dict[str, nn.Linear]):
        super().__init__()
        self.names = tuple(linears)
        for i, linear in enumerate(linears.values()):
            self.register_buffer(f"mask{i}", torch.ones_like(linear.weight, dtype=torch.bool))

    def __getitem__(self, name: str) -> torch.Tensor:
        return getattr(self, f"mask{self.names.index(name)}")

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {name: self[name] for name in self.names}


def optimisers(cfg) -> list[opt.Group]:
    """Its parameter groups (experiments/training/optimisers.py): the fine-tuning AdamW, its lr ``phase_lr``."""
    tc, own = cfg.train, cfg.section
    schedule = f"rounds of {own.round_fraction:g} of the steps, each a decay's start, no warm-up"
    if own.pipeline == "prune_then_ft":
        schedule += f"; retraining {opt.linear(tc.warmup_ratio)}"
    return opt.fine_tuning(tc, schedule=schedule)


def phase_lr(step: int, round_steps: int, rounds: int, total: int, retrain: bool, warmup_ratio: float) -> float:
    """LR multiplier at ``step``: each pruning round (``round_steps``) runs the start of a linear decay
    over ``total`` steps without warm-up, rebuilt at every pruning (the reference rebuilds its optimiser
    and get_linear_schedule_with_warmup(t_total) in trainer_imp.py ``pruning_and_save``: rounds of
    t_total / 10 go from lr to 0.9 lr); with ``retrain``, after the last pruning, the reference's
    retraining run: ``total`` steps of warm-up (``warmup_ratio``) and decay to 0."""
    if retrain and step >= (rounds - 1) * round_steps:
        return linear_warmup_decay(step - (rounds - 1) * round_steps, total, warmup_ratio)
    return restarted_linear_decay(step, round_steps, total)


def run(cfg, ctx: RunContext) -> RunResult:
    tc, own = cfg.train, cfg.section
    state = set_up(cfg, ctx)  # with init_from: the fine-tuned (a) or early fine-tuned (b) model
    encoder, decoder = state.encoder, state.decoder
    rewinding = own.pipeline == "prune_then_ft"
    # (a): our finetune's decoder reads [CLS], unless train.pooler (then set_up's hook reads the pooler already)
    pooled = own.pooler and (rewinding or tc.pooler) and uses_pooler(encoder, decoder)
    pooler_hook = read_pooler(encoder) if pooled and not tc.pooler else None
    linears = maskable_weights(encoder, pooler=pooled)
    rounds = round(own.sparsity * ROUNDS)
    phase = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)  # the train section's
    round_steps = max(1, round(own.round_fraction * phase))
    # a round after each pruning; rewinding retrains the last round's subnetwork for a whole phase
    total = (rounds - 1) * round_steps + (phase if rewinding else round_steps)
    start = state.weights()  # what rewinding returns to (CPU copies)
    masks = FixedMasks(linears).to(state.device)
    state.interventions["masks"] = masks
    loss_fn = objective(own.loss, cfg, ctx, state)

    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer, scheduler = fine_tuning(
        state, total, lambda s: phase_lr(s, round_steps, rounds, phase, rewinding, tc.warmup_ratio))
    handle = attach_masks(linears, masks.__getitem__)

    def prune(k: int) -> None:
        """Round k: the next 10 % by magnitude; with rewinding, the encoder back to the start (the
        reference's rewind(): bert.* only), and after the last round the classifier too."""
        nonlocal handle
        handle.remove()
        with torch.no_grad():
            pruned = imp_prune({name: lin.weight for name, lin in linears.items()}, masks.as_dict(), k)
            for name, mask in pruned.items():
                masks[name].copy_(mask)
        if rewinding and k > 0:  # round 0 prunes the start itself: nothing to rewind
            state.load_weights(start, decoders=k == rounds - 1)
        optimizer.state.clear()  # a new phase starts its optimiser afresh
        handle = attach_masks(linears, masks.__getitem__)

    def step(state, batch) -> dict[str, float]:
        if state.step % round_steps == 0 and state.step // round_steps < rounds:  # a round starts: prune first
            prune(state.step // round_steps)
        ids, mask, labels = batch
        loss = loss_fn(forward_logits(encoder, decoder, ids, mask, tc.precision), labels, state.batch_index)
        return {"loss": update(loss, optimizer, scheduler, params, tc.grad_clip, state.scaler),
                "sparsity": realised_sparsity(masks.as_dict())[1]}

    metrics = train_steps(state, ctx, total, step)

    final = {name: mask.cpu() for name, mask in masks.as_dict().items()}
    handle.remove()
    if pooler_hook is not None:
        pooler_hook.remove()
    return masked_result(cfg, state, metrics, final)
