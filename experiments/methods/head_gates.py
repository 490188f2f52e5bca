"""Hard Concrete head gates with an L0 penalty (Voita et al. 2019; He & Choi 2021).

One gate per attention head, ``z = HardConcrete(log_alpha)``, multiplies the
head's output; the loss is ``task loss + lambda * l0_penalty(log_alpha)``
(penalty = mean over layers of the expected number of open heads per layer,
as both reference codes do). Gates have their own Adam (lr 1e-3, no
schedule); the encoder and decoder use AdamW with linear warm-up and decay,
their gradients clipped to ``train.grad_clip``. ``clip_gates`` puts the gates'
gradients in that one global norm, as He & Choi's reference clips the whole
model (emorynlp/stem-cell-hypothesis elit/components/mtl/multi_task_learning.py:412-413,
``clip_grad_norm(model, grad_norm)`` over every trainable parameter, elit/utils/torch_util.py:166-169);
by default the gates stay out of it (``REFERENCE``): they have their own optimiser, and in the
joint norm their gradient (the task's and lambda's penalty) also sets how much the encoder's
step is cut, so lambda could change the encoder's step size across the cells of a lambda grid.

Pipelines (He & Choi 2021):
- ``dp`` (dynamic pruning): gates train from the first step together with
  encoder and decoder.
- ``sp`` (static pruning): start from a fine-tuned model, freeze its task
  decoder, train encoder + gates. The fine-tuned model is a stage (``stages``):
  an ``init_from`` finetune run, trained once and shared by every SP cell of the
  same model, task, seed and training settings, instead of fine-tuning inside
  every SP run.

Its keys live in its own section (``head_gates: {lambda: 0.05, pipeline: sp}``,
see ``Config``).

With ``head_gates.sparsity`` set (Voita's "fixed number of heads" comparison),
the final model keeps the top (1 - sparsity) of heads by log_alpha and removes
the rest: it is evaluated with gates ``z * keep``, the learned test-time gate
values on the kept heads and 0 elsewhere. A hard 0/1 mask would reopen kept
heads that trained at z ~ 0 to 1, a model that was never trained; Voita
fine-tunes with the fixed mask instead, which costs a training phase per
sparsity. So at most ``k`` heads are open (fewer when some of the top k had
closed). ``accuracy`` is that model's; ``<metric>_gated`` keeps the score with
every learned gate. The run's ``heads.gate`` map stays the learned gates; the
kept set is its own map, ``heads.kept`` (0/1).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.finetuning import finetune_stage
from experiments.interventions.gates import HeadGates
from experiments.interventions.heads import attach_head_gates
from experiments.maths.hard_concrete import eval_gates, l0_penalty, open_heads, prob_open
from experiments.maths.losses import task_loss
from experiments.training import optimisers as opt
from experiments.training.context import RunContext
from experiments.training.loop import evaluate_all, forward_logits, num_steps, train_steps, update
from experiments.training.reads import FINE_TUNING
from experiments.training.seeding import generator
from experiments.training.state import adam, fine_tuning, set_up

VERSION = "2"  # 2: sparsity evaluates z * keep (learned gates stay heads.gate); SP starts from a finetune stage
PIPELINES = ("dp", "sp")
SHORT_NAMES = ("lambda", "sparsity", "pipeline")  # grid axes and --set: lambda = head_gates.lambda
READS = FINE_TUNING
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): every train key: the gates train
with the model (dp) or on the fine-tuned one (sp)."""
PROGRESS = {outputs.OPEN_HEADS.name: "open heads"}  # beside the loss on `headsweep run`'s progress bar
OUTPUTS = outputs.Outputs(
    maps=(outputs.GATE, outputs.LOG_ALPHA, outputs.KEPT),
    metrics=(*outputs.EVALUATION, outputs.OPEN_HEADS, outputs.EXPECTED_OPEN_HEADS, outputs.L0_PENALTY,
             outputs.Metric("heads_kept", "heads among the top by log_alpha (sparsity)", score=False)))
"""What its runs report (base.outputs)."""


class Config(Section):
    """head_gates' own keys: ``head_gates: {lambda: 0.05, pipeline: sp}``."""

    pipeline: str = Field(
        PIPELINES[0], description="dp: gates train with the model from the first step; "
        "sp: start from a fine-tuned model (the init_from stage), gate with its decoder frozen.",
    )
    lambda_: float = Field(
        0.01, alias="lambda", ge=0, le=100,
        description="Weight of the L0 penalty (mean over layers of expected open heads per layer).",
    )
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of log_alpha (no schedule).")
    sparsity: float | None = Field(
        None, ge=0, lt=1, description="Fraction of heads removed at the end: keep exactly the top "
        "(1 - sparsity) by log_alpha as a 0/1 mask; None = the test-time gates.",
    )
    sp_finetune_steps: int | None = Field(
        None, gt=0,
        description="sp only: training steps of the fine-tune it starts from (None = the same train settings).",
    )
    clip_gates: bool = Field(
        False, description="Clip the gates' gradients together with the model's, one global norm of train.grad_clip, "
        "as He & Choi's reference clips the whole model (multi_task_learning.py:412-413); false: the model's alone "
        "(the gates' own Adam is not clipped, and the gates do not set how much the encoder's step is cut).",
    )


REFERENCE = {"clip_gates": True}
"""The keys whose default is ours, and the value that restores the reference protocol."""


def stages(section: Config) -> dict[str, dict]:
    """The upstream runs this method starts from by default (DESIGN.md decision 10): SP starts
    from a fine-tuned model, a ``finetune`` run of the same model, task, seed and training
    settings (``sp_finetune_steps`` steps if set), shared by every SP cell that differs only in
    head_gates' keys (lambda, lr, sparsity). A config's own ``init_from`` wins."""
    return finetune_stage(section.sp_finetune_steps) if section.pipeline == "sp" else {}


def unread(section: Config, train) -> dict[str, str]:
    """Keys a run of ``section`` does not read (experiments/training/reads.py): dp starts from no stage."""
    if section.pipeline != "sp":
        return {"sp_finetune_steps": f"read only with pipeline sp (it is {section.pipeline})"}
    return {}


def optimisers(cfg) -> list[opt.Group]:
    """Its parameter groups (experiments/training/optimisers.py): the fine-tuning AdamW over the encoder and,
    in dp, the decoder (sp freezes it), and the gates' own Adam at ``lr``, constant."""
    tc, own = cfg.train, cfg.section
    trained = ("encoder", "decoder") if own.pipeline == "dp" else ("encoder",)
    together = (*trained, "gates") if own.clip_gates else trained
    model = [group for group in opt.fine_tuning(tc, together) if group.params in trained]
    gates_clip = opt.clipped(tc.grad_clip, together) if own.clip_gates else opt.clipped(None, ())
    return [*model, opt.Group("gates", "Adam", own.lr, 0.0, opt.CONSTANT, gates_clip)]


def run(cfg, ctx: RunContext) -> RunResult:
    tc, own = cfg.train, cfg.section  # own: this method's Config
    state = set_up(cfg, ctx)  # with init_from (always for SP): the upstream's encoder and decoder
    encoder, decoder = state.encoder, state.decoder
    gates = HeadGates(state.num_layers, state.num_heads, generator(cfg.seed, "gates")).to(ctx.device)
    handle = attach_head_gates(encoder, gates)  # a fresh noise sample per forward pass in training
    decoder.requires_grad_(own.pipeline == "dp")  # SP: the fine-tuned decoder stays frozen

    total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
    model_params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer, scheduler = fine_tuning(state, total)
    gate_optimizer = adam(gates.parameters(), lr=own.lr)  # no schedule
    clipped = model_params + list(gates.parameters()) if own.clip_gates else model_params
    state.interventions["gates"], state.generators["gate_noise"] = gates, gates.generator
    state.optimizers["gates"] = gate_optimizer
    state.values["trajectory"] = []  # (L, H) test-time gates at each evaluation

    # The loop body; train_steps does the batches, evaluations, checkpoints and progress.
    def step(state, batch) -> dict[str, float]:
        ids, mask, labels = batch
        loss = task_loss(forward_logits(encoder, decoder, ids, mask, tc.precision), labels)
        penalty = l0_penalty(gates.log_alpha)  # float32: outside autocast, on float32 log_alpha
        update(loss + own.lambda_ * penalty, [optimizer, gate_optimizer], scheduler, clipped, tc.grad_clip,
               state.scaler)
        with torch.no_grad():
            n_open = int(open_heads(eval_gates(gates.log_alpha)).sum())
            expected = prob_open(gates.log_alpha).sum().item()
        return {"loss": loss.item(), "l0_penalty": penalty.item(), "expected_open_heads": expected, "open_heads": n_open}

    def evaluate(state) -> dict[str, float]:
        metrics = evaluate_all(state)  # gates in eval mode: the test-time gates
        state.values["trajectory"].append(eval_gates(gates.log_alpha).detach().cpu().numpy().astype(np.float32))
        return metrics

    metrics = train_steps(state, ctx, total, step, evaluate)

    # Report: the learned gates as maps; with sparsity, the fixed-count model's metrics.
    log_alpha = gates.log_alpha.detach()
    learned = eval_gates(log_alpha)  # (L, H) test-time gates
    final = dict(metrics)
    maps = dict([outputs.GATE(learned.cpu().numpy()), outputs.LOG_ALPHA(log_alpha.cpu().numpy())])
    handle.remove()
    if own.sparsity is not None:
        fixed, kept = _fixed_count(state, log_alpha, learned, metrics, own.sparsity)
        final |= fixed
        maps |= [kept]
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=final,
        maps=maps,
        trajectories={outputs.GATE.name: np.stack(state.values["trajectory"])},  # (E, L, H)
        eval_steps=np.asarray(state.values["eval_steps"]),
        steps=state.step,
    )


def _fixed_count(state, log_alpha: torch.Tensor, learned: torch.Tensor, metrics: dict[str, float],
                 sparsity: float) -> tuple[dict[str, float], tuple]:
    """The fixed-count model of ``sparsity``: the top heads by log_alpha at their learned test-time
    gates, 0 elsewhere, evaluated. Its metrics (the gated model's task metric and loss kept as
    ``<name>_gated``) and its ``heads.kept`` map."""
    keep = _top_heads(log_alpha, sparsity)
    pruned = learned * keep  # the learned gate values on the kept heads, 0 elsewhere
    handle = attach_head_gates(state.encoder, lambda: pruned)
    fixed = {f"{name}_gated": value for name, value in metrics.items() if name in (state.task.METRIC, "loss")}
    fixed |= evaluate_all(state)
    fixed |= {"open_heads": float(open_heads(pruned).sum()), "heads_kept": float(keep.sum())}
    handle.remove()
    return fixed, outputs.KEPT(keep.cpu().numpy(), f"1 = among the top {int(keep.sum())} heads by log_alpha "
                                                   f"(sparsity {sparsity})")


def _top_heads(log_alpha: torch.Tensor, sparsity: float) -> torch.Tensor:
    """0/1 mask (L, H) keeping the ceil((1 - sparsity) * L * H) heads with the largest log_alpha."""
    flat = log_alpha.flatten()
    k = math.ceil((1 - sparsity) * flat.numel())
    mask = torch.zeros_like(flat)
    mask[torch.topk(flat, k).indices] = 1.0
    return mask.view_as(log_alpha)
