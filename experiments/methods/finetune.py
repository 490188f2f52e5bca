"""Plain fine-tuning, every head open: the baseline every pruning method is compared with.

AdamW on encoder and decoder with linear warm-up and decay; evaluates every
``train.eval_every`` steps. It learns no gates, so it reports no maps; its
``open_heads`` is every head. ``loss`` picks the objective: cross-entropy, or a
debiasing loss with a bias model (and, for ``conf_reg``, a teacher) as stages
(experiments/components/debias.py).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.debias import LOSSES, check_loss, loss_stages, objective
from experiments.training import optimisers as opt
from experiments.training.context import RunContext
from experiments.training.loop import forward_logits, num_steps, train_steps, update
from experiments.training.reads import FINE_TUNING
from experiments.training.state import fine_tuning, set_up

VERSION = "1"
PIPELINES = ("none",)
SHORT_NAMES = ("loss",)
READS = FINE_TUNING
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): every train key."""
OUTPUTS = outputs.Outputs(metrics=(*outputs.EVALUATION, outputs.OPEN_HEADS))
"""What its runs report (base.outputs)."""


class Config(Section):
    """finetune's own keys; it also reads ``train`` (lr, decoder_lr, epochs, ...)."""

    loss: str = Field("ce", description="Training objective: " + "; ".join(f"{k}: {v}" for k, v in LOSSES.items()) + ".")


def stages(section: Config) -> dict[str, dict]:
    """A debiasing loss starts from a bias model (and conf_reg a teacher): experiments/components/debias.py."""
    return loss_stages(section.loss)


def optimisers(cfg) -> list[opt.Group]:
    """Its parameter groups (experiments/training/optimisers.py): the fine-tuning AdamW."""
    return opt.fine_tuning(cfg.train)


def check(cfg) -> None:
    check_loss(cfg, cfg.section.loss)


def run(cfg, ctx: RunContext) -> RunResult:
    tc = cfg.train
    state = set_up(cfg, ctx)
    encoder, decoder = state.encoder, state.decoder

    total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer, scheduler = fine_tuning(state, total)
    all_heads = state.num_layers * state.num_heads

    # The loop body; train_steps does the batches, evaluations, checkpoints and progress.
    loss_fn = objective(cfg.section.loss, cfg, ctx, state)

    def step(state, batch) -> dict[str, float]:
        ids, mask, labels = batch
        loss = loss_fn(forward_logits(encoder, decoder, ids, mask, tc.precision), labels, state.batch_index)
        return {"loss": update(loss, optimizer, scheduler, params, tc.grad_clip, state.scaler), "open_heads": all_heads}

    metrics = train_steps(state, ctx, total, step)

    return RunResult(  # no maps: plain fine-tuning learns no gates (reporting all-ones would claim it did)
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        eval_steps=np.asarray(state.values["eval_steps"]),
        steps=state.step,
    )
