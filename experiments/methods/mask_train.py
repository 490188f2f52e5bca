"""Weight-mask training: a sparse subnetwork of frozen weights (Liu et al. 2022, PAPERS.md).

Every matrix of every layer (Q, K, V, attention output, FFN in and out; not the pooler,
which the task decoders do not read) gets real-valued scores ``S``, one per weight; the forward uses ``W * 1[S > tau]`` with a
straight-through gradient to ``S`` (experiments/masks.py: parametrisations, no model file
edited). Scores start from the weights' magnitudes at the initial sparsity; every
``reset_every`` steps, and at the last step, each matrix's threshold is reset to its k-th
score for the scheduled sparsity, so each matrix ends at exactly ``sparsity``. The
schedule is constant, or cubic (Zhu & Gupta) from ``initial_sparsity`` to ``sparsity`` over
the first ``schedule_end`` of the steps; the reported model is the last one, always at the
final sparsity (the reference code kept its best checkpoint from the initial sparsity).

Pipelines (DESIGN.md "pipeline"):
- ``prune_only`` (c): masks on the frozen pretrained weights; the new task decoder trains
  with them (``train.decoder_lr``); it is not masked.
- ``ft_then_prune`` (a): masks on the frozen weights of a fine-tuned model (an ``init_from``
  finetune stage), whose decoder stays frozen too.
- ``prune_then_ft`` (b): the mask of a ``prune_only`` run with the same keys (an
  ``init_from`` stage, whose encoder is still the pretrained one) is fixed, and the
  subnetwork is fine-tuned from the pretrained values (AdamW, warm-up and decay).

``loss`` is any objective of experiments/debias.py (its bias model and teacher are stages).

Reports the evaluation metrics (per evaluation set), ``sparsity`` (realised, over every
masked weight), and maps of the fraction of weights kept: ``heads.mask_density`` (L, H),
``neurons.mask_density`` (L, I) and ``weights.mask_density`` (L, 6: ``masks.ROLES``). The
mask itself is the run's ``masks.npz`` artifact (bit-packed, ~1/32 of the weights).
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from experiments.config import Section
from experiments.context import RunContext
from experiments.debias import LOSSES, check_loss, loss_stages, objective
from experiments.loop import forward_logits, num_steps, train_steps, update
from experiments.masks import (
    MaskScores,
    attach_masks,
    maskable_weights,
    masked_result,
)
from experiments.maths.schedules import cubic_sparsity
from experiments.result import RunResult
from experiments.state import fine_tuning, set_up, upstream_weights

VERSION = "2"  # 2: the scores' learning rate defaults to 1e-4 (1e-2 flipped half the mask in the first step)
PIPELINES = ("prune_only", "ft_then_prune", "prune_then_ft")
SHORT_NAMES = ("sparsity", "pipeline", "loss")


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
        0.7, gt=0, le=1, description="Fraction of the steps after which the cubic schedule holds `sparsity`.")
    reset_every: int = Field(1000, gt=0, description="Steps between resets of each matrix's threshold to its k-th score.")
    lr: float = Field(1e-4, gt=0, le=10, description="Adam learning rate of the mask scores (no schedule). Scores start "
                      "0.01 from the threshold and Adam moves each by ~lr a step: 1e-2 flips about half the mask at "
                      "the first step (measured: a fine-tuned MiniLM falls to chance in 5 steps).")
    loss: str = Field("ce", description="Training objective: " + "; ".join(f"{k}: {v}" for k, v in LOSSES.items()) + ".")

    @model_validator(mode="after")
    def _schedule_rises(self) -> Config:
        if self.initial_sparsity is not None and self.initial_sparsity > self.sparsity:
            raise ValueError(f"the schedule's final sparsity ({self.sparsity}) is below its initial "
                             f"sparsity ({self.initial_sparsity}): sparsity only grows")
        return self


def stages(section: Config) -> dict[str, dict]:
    """ft_then_prune starts from a fine-tune; prune_then_ft from the prune_only run of the same
    keys (its mask); a debiasing loss from a bias model (and a teacher): experiments/debias.py."""
    upstreams = loss_stages(section.loss)
    if section.pipeline == "ft_then_prune":
        upstreams["init_from"] = {"method": "finetune"}
    elif section.pipeline == "prune_then_ft":
        keys = section.model_dump(by_alias=True, mode="json", exclude_defaults=True)
        upstreams["init_from"] = {"method": "mask_train", "mask_train": keys | {"pipeline": "prune_only"}}
    return upstreams


def check(cfg) -> None:
    check_loss(cfg, cfg.section.loss)


def run(cfg, ctx: RunContext) -> RunResult:
    tc, hp = cfg.train, cfg.section
    state = set_up(cfg, ctx)  # with init_from: the fine-tuned model (a) or the prune_only run's (b)
    encoder, decoder = state.encoder, state.decoder
    linears = maskable_weights(encoder, pooler=False)  # our decoders read [CLS], not the pooler
    total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
    loss_fn = objective(hp.loss, cfg, ctx, state)

    if hp.pipeline == "prune_then_ft":  # a fixed mask; the weights train
        masks = {name: mask.to(state.device) for name, mask in upstream_masks(cfg, ctx, linears).items()}
        handle = attach_masks(linears, masks.__getitem__)
        params = list(encoder.parameters()) + list(decoder.parameters())
        optimizer, scheduler = fine_tuning(state, total)

        def step(state, batch) -> dict[str, float]:
            ids, mask, labels = batch
            loss = loss_fn(forward_logits(encoder, decoder, ids, mask, tc.precision), labels, state.batch_index)
            return {"loss": update(loss, optimizer, scheduler, params, tc.grad_clip, state.scaler),
                    "sparsity": hp.sparsity}
    else:  # trained scores over frozen weights
        def scheduled(step: int) -> float:
            start = hp.sparsity if hp.initial_sparsity is None else hp.initial_sparsity
            return cubic_sparsity(step, start, hp.sparsity, 0, round(hp.schedule_end * total))

        encoder.requires_grad_(False)
        decoder.requires_grad_(hp.pipeline == "prune_only")  # a: the fine-tuned decoder stays
        scores = MaskScores({name: lin.weight for name, lin in linears.items()}, scheduled(0)).to(state.device)
        handle = attach_masks(linears, scores.mask)
        groups = [{"params": list(scores.parameters()), "lr": hp.lr, "weight_decay": 0.0}]
        if hp.pipeline == "prune_only":
            groups.append({"params": list(decoder.parameters()), "lr": tc.decoder_lr, "weight_decay": tc.weight_decay})
        optimizer = torch.optim.AdamW(groups)
        state.interventions["masks"], state.optimizers["masks"] = scores, optimizer

        def step(state, batch) -> dict[str, float]:
            ids, mask, labels = batch
            logits = forward_logits(encoder, decoder, ids, mask, tc.precision)
            loss = update(loss_fn(logits, labels, state.batch_index), optimizer, scaler=state.scaler)
            done = state.step + 1
            if done % hp.reset_every == 0 or done == total:
                scores.reset_thresholds(scheduled(done))
            return {"loss": loss, "sparsity": scheduled(done)}

        masks = None

    metrics = train_steps(state, ctx, total, step)

    masks = scores.binary_masks() if masks is None else masks
    handle.remove()
    return masked_result(cfg, state, metrics, masks)


def upstream_masks(cfg, ctx, linears) -> dict[str, torch.Tensor]:
    """The binary masks of the ``init_from`` mask_train run (its mask scores and thresholds,
    handed on as ``interventions.masks.*``), for these matrices."""
    prefix = "interventions.masks."
    saved = {key[len(prefix):]: value for key, value in upstream_weights(cfg, ctx, "init_from").items()
             if key.startswith(prefix)}
    if not saved:
        raise ValueError("init_from: the upstream run hands on no mask (prune_then_ft starts from a mask_train run)")
    scores = MaskScores({name: lin.weight.detach().cpu() for name, lin in linears.items()}, 0.0)
    scores.load_state_dict(saved)
    return scores.binary_masks()
