"""Weight-mask training: a sparse subnetwork of frozen weights (Liu et al. 2022, PAPERS.md).

Every matrix of every layer (Q, K, V, attention output, FFN in and out), the pooler and the
classifier get real-valued scores ``S``, one per weight; the forward uses ``W * 1[S > tau]``
with a straight-through gradient to ``S`` (experiments/interventions/masks.py: parametrisations, no model
file edited). As in the reference scripts (``--mask_classifier true --train_classifier false``)
the classifier is masked and never trained, and it reads the pooler output
``tanh(W_p h_[CLS] + b_p)``, as BERT's ``BertForSequenceClassification`` does (``pooler``:
BERT/RoBERTa and sentence classification; ``masks.read_pooler``). Scores start from the
weights' magnitudes at the initial sparsity and train with AdamW at ``lr`` (reference 5e-5),
linear warm-up (``train.warmup_ratio``) and decay to 0, gradients clipped to ``train.grad_clip``;
every ``reset_every`` steps, and at the last step, each matrix's threshold is reset to its k-th
score for the scheduled sparsity (kept when the k-th score is the largest: the reference's
guard), so each matrix ends at ``sparsity``. The schedule is constant, or cubic (Zhu & Gupta)
from ``initial_sparsity`` to ``sparsity`` over the first ``schedule_end`` of the steps
(reference: all of them, the last epoch); the reported model is the last one, always at the
final sparsity (the reference code kept its best checkpoint, saved at the initial sparsity).

Pipelines (DESIGN.md "pipeline"):
- ``prune_only`` (c): masks on the frozen pretrained weights and a new, random classifier that
  is masked too: no weight is ever updated (``train_classifier: true`` trains it unmasked).
- ``ft_then_prune`` (a): masks on the frozen weights of a fine-tuned model (an ``init_from``
  finetune stage), its classifier masked and frozen too. Our finetune's decoder reads [CLS],
  not the pooler, so here the pooler is neither read nor masked (the reference fine-tunes
  through the pooler and masks it).
- ``prune_then_ft`` (b): the mask of a ``prune_only`` run with the same keys (an
  ``init_from`` stage, whose encoder is still the pretrained one) is fixed on the encoder and
  pooler, and the subnetwork is fine-tuned from the pretrained values with an unmasked
  classifier (AdamW, warm-up and decay; the reference's retraining: ``--mask_classifier false``).

``loss`` is any objective of experiments/components/debias.py (its bias model and teacher are stages).

Reports the evaluation metrics (per evaluation set), ``sparsity`` (realised, over every
masked weight), and maps of the fraction of weights kept: ``heads.mask_density`` (L, H),
``neurons.mask_density`` (L, I) and ``weights.mask_density`` (L, 6: ``masks.ROLES``). The
mask itself is the run's ``masks.npz`` artifact (bit-packed, ~1/32 of the weights); with trained
scores (prune_only, ft_then_prune) the mask it started from is ``initial_masks.npz``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.debias import LOSSES, check_loss, loss_stages, objective
from experiments.interventions.masks import (
    MaskScores,
    attach_masks,
    decoder_linears,
    maskable_weights,
    masked_result,
    read_pooler,
    uses_pooler,
)
from experiments.maths.schedules import cubic_sparsity, linear_warmup_decay
from experiments.training import optimisers as opt
from experiments.training.context import RunContext
from experiments.training.loop import forward_logits, num_steps, train_steps, update
from experiments.training.reads import FINE_TUNING
from experiments.training.state import adam, fine_tuning, set_up, upstream_weights

VERSION = "4"  # 4: gradual schedules start from soft magnitude scores (|W|, threshold the k-th |W|), as the
# reference's gradual scripts; the initial mask stored beside the final one (initial_masks.npz)
# 3: the reference protocol: classifier masked and frozen, pooler read and masked, score lr 5e-5
# with warm-up, decay and clipping, the cubic schedule ending at the last step, the threshold guard
PIPELINES = ("prune_only", "ft_then_prune", "prune_then_ft")
SHORT_NAMES = ("sparsity", "pipeline", "loss")
READS = FINE_TUNING
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): every train key; prune_only and
ft_then_prune train masks at mask_train.lr, not the model (``unread``)."""
OUTPUTS = outputs.Outputs(maps=outputs.MASK_DENSITIES, metrics=(*outputs.EVALUATION, outputs.SPARSITY))
"""What its runs report (base.outputs)."""
REFERENCE: dict[str, Any] = {}
"""Every default is the reference scripts' protocol (scripts/mask_train/*: --mask_classifier true
--train_classifier false, lr 5e-5 with warm-up, magnitude init, --final_sparsity_epoch = epochs)."""


class Config(Section):
    """mask_train's own keys: ``mask_train: {sparsity: 0.7, pipeline: ft_then_prune}``."""

    pipeline: str = Field(
        PIPELINES[0], description="prune_only: masks on frozen pretrained weights; ft_then_prune: on a "
        "fine-tuned model's (init_from stage); prune_then_ft: fine-tune the subnetwork of a prune_only mask.",
    )
    sparsity: float = Field(0.5, ge=0, lt=1, description="Fraction of each matrix's weights removed at the end.")
    initial_sparsity: float | None = Field(
        None, ge=0, lt=1, description="Cubic schedule from this sparsity to `sparsity`; None = constant sparsity.")
    schedule_end: float = Field(
        1.0, gt=0, le=1, description="Fraction of the steps after which the cubic schedule holds `sparsity` "
        "(reference: 1, the final sparsity at the last epoch: --final_sparsity_epoch = --num_train_epochs).")
    init: Literal["auto", "magnitude", "magnitude_soft"] = Field(
        "auto", description="How the scores start: magnitude_soft = S |W| and each matrix's threshold its k-th |W| "
        "at the initial sparsity (the reference's gradual scripts: --controlled_init magnitude_soft, maskers.py:182-187), "
        "so a rising sparsity ranks weights by magnitude; magnitude = S 2*tau on the weights the magnitude mask keeps, "
        "0 else, threshold tau (its constant-sparsity scripts: --controlled_init magnitude); auto = magnitude_soft "
        "with a gradual schedule (initial_sparsity set), magnitude otherwise.")
    reset_every: int = Field(1000, gt=0, description="Steps between resets of each matrix's threshold to its k-th "
                             "score (reference: every logging step, 1,000).")
    lr: float = Field(5e-5, gt=0, le=10, description="AdamW learning rate of the mask scores, with linear warm-up "
                      "(train.warmup_ratio) and decay to 0 and gradients clipped to train.grad_clip (reference: 5e-5, "
                      "3,600 warm-up steps of ~61,000, clip 1.0). Scores start 0.01 from the threshold and Adam moves "
                      "each by ~lr a step, so at 5e-5 no weight flips before ~200 steps: short runs need more (3e-4; "
                      "at 1e-3 prune_only on SST-2 learned, then collapsed to one class in 2 of 3 seeds).")
    train_classifier: bool = Field(
        False, description="prune_only, ft_then_prune: train the classifier (train.decoder_lr) instead of masking it; "
        "the reference scripts mask it and never train it (--mask_classifier true --train_classifier false).")
    pooler: bool = Field(
        True, description="prune_only, prune_then_ft: the classifier reads the pooler output tanh(W_p h_[CLS] + b_p), "
        "masked like every matrix, as the reference's BertForSequenceClassification (BERT/RoBERTa, sentence tasks); "
        "false: it reads [CLS] (our finetune's decoder, so ft_then_prune never reads the pooler).")
    loss: str = Field("ce", description="Training objective: " + "; ".join(f"{k}: {v}" for k, v in LOSSES.items()) + ".")

    @model_validator(mode="after")
    def _schedule_rises(self) -> Config:
        if self.initial_sparsity is not None and self.initial_sparsity > self.sparsity:
            raise ValueError(f"the schedule's final sparsity ({self.sparsity}) is below its initial "
                             f"sparsity ({self.initial_sparsity}): sparsity only grows")
        return self


def stages(section: Config) -> dict[str, dict]:
    """ft_then_prune starts from a fine-tune; prune_then_ft from the prune_only run of the same
    keys (its mask); a debiasing loss from a bias model (and a teacher): experiments/components/debias.py."""
    upstreams = loss_stages(section.loss)
    if section.pipeline == "ft_then_prune":
        upstreams["init_from"] = {"method": "finetune"}
    elif section.pipeline == "prune_then_ft":
        keys = section.model_dump(by_alias=True, mode="json", exclude_defaults=True)
        upstreams["init_from"] = {"method": "mask_train", "mask_train": keys | {"pipeline": "prune_only"}}
    return upstreams


def optimisers(cfg) -> list[opt.Group]:
    """Its parameter groups (experiments/training/optimisers.py): prune_then_ft fine-tunes the subnetwork (the
    fine-tuning AdamW); the others train the mask scores at ``lr`` (and with ``train_classifier`` the decoder),
    linear warm-up and decay, clipped together."""
    tc, own = cfg.train, cfg.section
    if own.pipeline == "prune_then_ft":
        return opt.fine_tuning(tc)
    trained = ("scores", "decoder") if own.train_classifier else ("scores",)
    schedule, clip = opt.linear(tc.warmup_ratio), opt.clipped(tc.grad_clip, trained)
    groups = [opt.Group("scores", "AdamW", own.lr, 0.0, schedule, clip)]
    if own.train_classifier:
        groups.append(opt.Group("decoder", "AdamW", tc.head_lr, tc.weight_decay, schedule, clip, decay_1d=True))
    return groups


def check(cfg) -> None:
    check_loss(cfg, cfg.section.loss)


def scheduled_sparsity(step: int, total: int, own: Config) -> float:
    """The target sparsity after ``step`` of ``total`` steps: constant ``sparsity``, or cubic from
    ``initial_sparsity`` at step 0 to ``sparsity`` at ``schedule_end * total``."""
    start = own.sparsity if own.initial_sparsity is None else own.initial_sparsity
    return cubic_sparsity(step, start, own.sparsity, 0, round(own.schedule_end * total))


def score_init(own: Config) -> str:
    """The scores' initialisation (``MaskScores(init=...)``): ``init``, with ``auto`` resolved."""
    if own.init != "auto":
        return own.init
    return "magnitude" if own.initial_sparsity is None else "magnitude_soft"


def masked_linears(encoder, decoder, own: Config, pooled: bool) -> dict[str, torch.nn.Linear]:
    """The matrices this run masks: every layer's six, the pooler when the classifier reads it,
    and the classifier's unless it trains (prune_then_ft: masks from its upstream, which had them)."""
    mask_decoder = own.pipeline != "prune_then_ft" and not own.train_classifier
    return maskable_weights(encoder, decoder if mask_decoder else None, pooler=pooled)


def unread(section: Config, train) -> dict[str, str]:
    """The ``train.*`` keys of the model's optimiser, which prune_only and ft_then_prune do not read:
    their masks learn at ``mask_train.lr`` over frozen weights; ``train_classifier`` trains the
    classifier at ``train.decoder_lr`` (``train.lr`` when that is null), with ``train.weight_decay``."""
    if section.pipeline == "prune_then_ft":
        return {}
    why = f"with pipeline {section.pipeline} (its masks learn at mask_train.lr over frozen weights"
    keys = ["lr", "decoder_lr", "weight_decay"]
    if section.train_classifier:
        keys = [] if train.decoder_lr is None else ["lr"]
        why += "; train_classifier trains the classifier at train.decoder_lr"
    return {f"train.{key}": why + ")" for key in keys}


def run(cfg, ctx: RunContext) -> RunResult:
    tc, own = cfg.train, cfg.section
    state = set_up(cfg, ctx)  # with init_from: the fine-tuned model (a) or the prune_only run's (b)
    encoder, decoder = state.encoder, state.decoder
    # ft_then_prune: our finetune's decoder reads [CLS], unless train.pooler (then set_up's hook reads the pooler)
    pooled = own.pooler and (own.pipeline != "ft_then_prune" or tc.pooler) and uses_pooler(encoder, decoder)
    pooler_hook = read_pooler(encoder) if pooled and not tc.pooler else None
    linears = masked_linears(encoder, decoder, own, pooled)
    total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
    loss_fn = objective(own.loss, cfg, ctx, state)

    initial_masks = None
    if own.pipeline == "prune_then_ft":  # a fixed mask on the encoder (and pooler); the weights and classifier train
        masks = {name: mask.to(state.device) for name, mask in upstream_masks(cfg, ctx, linears, decoder, own).items()}
        handle = attach_masks(linears, masks.__getitem__)
        params = list(encoder.parameters()) + list(decoder.parameters())
        optimizer, scheduler = fine_tuning(state, total)

        def step(state, batch) -> dict[str, float]:
            ids, mask, labels = batch
            loss = loss_fn(forward_logits(encoder, decoder, ids, mask, tc.precision), labels, state.batch_index)
            return {"loss": update(loss, optimizer, scheduler, params, tc.grad_clip, state.scaler),
                    "sparsity": own.sparsity}
    else:  # trained scores over frozen weights
        encoder.requires_grad_(False)
        decoder.requires_grad_(own.train_classifier)  # default: masked, never trained (reference)
        scores = MaskScores({name: lin.weight for name, lin in linears.items()},
                            scheduled_sparsity(0, total, own), init=score_init(own)).to(state.device)
        initial_masks = scores.binary_masks()
        handle = attach_masks(linears, scores.mask)
        params = list(scores.parameters())
        groups = [{"params": params, "lr": own.lr, "weight_decay": 0.0}]
        if own.train_classifier:
            params = params + list(decoder.parameters())
            groups.append({"params": list(decoder.parameters()), "lr": tc.head_lr, "weight_decay": tc.weight_decay})
        optimizer = adam(groups, decoupled=True)
        # the reference's get_linear_schedule_with_warmup over every group (mask_trainer.py get_optimizers)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, total, tc.warmup_ratio))
        state.interventions["masks"], state.optimizers["masks"], state.schedulers["masks"] = scores, optimizer, scheduler

        def step(state, batch) -> dict[str, float]:
            ids, mask, labels = batch
            logits = forward_logits(encoder, decoder, ids, mask, tc.precision)
            loss = update(loss_fn(logits, labels, state.batch_index), optimizer, scheduler, params, tc.grad_clip,
                          state.scaler)
            done = state.step + 1
            if done % own.reset_every == 0 or done == total:
                scores.reset_thresholds(scheduled_sparsity(done, total, own))
            return {"loss": loss, "sparsity": scheduled_sparsity(done, total, own)}

        masks = None

    metrics = train_steps(state, ctx, total, step)

    masks = scores.binary_masks() if masks is None else masks
    handle.remove()
    if pooler_hook is not None:
        pooler_hook.remove()
    return masked_result(cfg, state, metrics, masks, initial_masks)


def upstream_masks(cfg, ctx, linears, decoder, own: Config) -> dict[str, torch.Tensor]:
    """The binary masks of the ``init_from`` mask_train run (its mask scores and thresholds,
    handed on as ``interventions.masks.*``), for these matrices: the upstream also masked its
    classifier, which prune_then_ft trains unmasked (the reference's ``--mask_classifier false``)."""
    prefix = "interventions.masks."
    saved = {key[len(prefix):]: value for key, value in upstream_weights(cfg, ctx, "init_from").items()
             if key.startswith(prefix)}
    if not saved:
        raise ValueError("init_from: the upstream run hands on no mask (prune_then_ft starts from a mask_train run)")
    upstream = dict(linears)
    if not own.train_classifier:  # the prune_only run masked these too, after the encoder's (maskable_weights order)
        upstream |= decoder_linears(decoder)
    scores = MaskScores({name: lin.weight.detach().cpu() for name, lin in upstream.items()}, 0.0)
    scores.load_state_dict(saved)
    return {name: mask for name, mask in scores.binary_masks().items() if name in linears}
