"""A bias-only model: logistic regression on the task's hand-crafted bias features.

The bias model of the debiasing losses (PAPERS.md, Liu et al. 2022: product of experts,
reweighting, confidence regularisation): it sees only the shallow features the task defines
(``bias_features``: the planted marker of ``synthetic-shortcut``, word overlap and the
hypothesis' words of a ``classification`` pair task), so whatever it gets right, it gets
right by the shortcut. Full-batch Adam on mean cross-entropy + ``l2`` * |W|^2 over the
standardised training features, from a small seeded initialisation ('decoder' stream).

Reports ``accuracy`` and ``loss`` on dev and ``<metric>/<set>`` on each extra evaluation set
(the shortcut's rate in and out of distribution), ``train_accuracy``, ``train_loss``, every
``train.eval_every`` steps and at the end; no maps (it has no model units). The encoder is
never loaded: only the model's tokenizer, which the task's loader needs. Its weights go on
(``ctx.save_weights``) as ``decoders.bias.*`` (experiments/components/bias.py), what a dependant's
``bias_model: {method: bias_only}`` stage reads with ``experiments.components.bias.bias_probs``.

Named ``bias_only``, not ``bias_model``: ``bias_model`` is the stage role (a top-level key of
every run config). Runs of a task that defines no bias features fail at validation.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from base import outputs
from base.result import RunResult
from base.sections import ConfigError, Section
from experiments.components.bias import BiasModel
from experiments.maths.losses import task_loss
from experiments.models import load_tokenizer
from experiments.tasks import TASKS, bias_feature_names
from experiments.tasks.cache import load_task
from experiments.training.context import RunContext
from experiments.training.seeding import derive_seed
from experiments.training.state import adam

VERSION = "1"
PIPELINES = ("none",)
SHORT_NAMES = ()
READS = ("eval_every",)
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): a logistic regression on the bias
features, at bias_only.lr for bias_only.steps: only its evaluations' period."""
OUTPUTS = outputs.Outputs(metrics=outputs.EVALUATION)
"""What its runs report (base.outputs): the evaluation's metrics, no map."""
BIAS_MODEL = True
"""Its runs may fill a ``bias_model`` stage: they hand on a bias model (experiments/components/bias.py)."""


class Config(Section):
    """bias_only: a logistic regression on the task's bias features (reads ``train.eval_every``)."""

    steps: int = Field(300, gt=0, le=100_000, description="Full-batch Adam steps over the training set.")
    lr: float = Field(0.05, gt=0, le=10, description="Adam learning rate.")
    l2: float = Field(1e-3, ge=0, description="L2 penalty on the weights (not the intercepts), added to the mean cross-entropy.")


def check(cfg) -> None:
    """At validation: the task must define bias features for this config."""
    try:
        bias_feature_names(cfg.task)
    except ValueError as err:
        raise ConfigError(f"{err}; method bias_only trains on them") from None


def run(cfg, ctx: RunContext) -> RunResult:
    own, task = cfg.section, TASKS[cfg.task.name]
    data = load_task(cfg.task, load_tokenizer(cfg.model))
    x, y = data.train.features, data.train.labels  # (N, F), (N,)
    with torch.random.fork_rng(devices=[]):  # the 'decoder' stream, global RNG untouched
        torch.manual_seed(derive_seed(cfg.seed, "decoder"))
        model = BiasModel.for_features(x, data.num_labels)
    optimizer = adam(model.parameters(), lr=own.lr)
    eval_sets = {"": data.dev} | {f"/{name}": split for name, split in data.eval_sets.items()}

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            scores = {}
            for suffix, split in eval_sets.items():
                logits = model(split.features)
                found = task.compute_metrics(logits, split.labels) | {"loss": task_loss(logits, split.labels).item()}
                scores |= {f"{name}{suffix}": value for name, value in found.items()}
            train_logits = model(x)
            scores["train_accuracy"] = task.compute_metrics(train_logits, y)["accuracy"]
        model.train()
        return scores

    eval_steps, metrics = [], {}
    for step in range(1, own.steps + 1):
        loss = task_loss(model(x), y)
        penalty = model.linear.weight.square().sum()
        optimizer.zero_grad(set_to_none=True)
        (loss + own.l2 * penalty).backward()
        optimizer.step()
        if step % cfg.train.eval_every == 0 or step == own.steps:
            metrics = evaluate() | {"train_loss": loss.item()}
            ctx.tracker.log_metrics(metrics, step)
            eval_steps.append(step)
        ctx.progress(step, own.steps, {"loss": loss.item()})

    if ctx.save_weights is not None:
        ctx.save_weights(model.weights())
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        eval_steps=np.asarray(eval_steps),
        steps=own.steps,
    )
