"""Multi-task learning: one shared encoder, one decoder per task (He & Choi 2021).

The tasks: the run's ``task`` (the primary, first) and every entry of
``multitask.tasks``, each a task section validated like ``task``
(``multitask: {tasks: [{name: ud-pos}, {name: ud-dep}]}`` with ``task: {name: sst2,
max_train: 2000}`` trains SST-2 + POS + arcs). An entry inherits nothing from ``task``:
write its data keys (max_train, max_length, ...) where they apply. Each task once (its
name ends its metric names). So the run's task keeps what it means everywhere else: its
label in run names and the registry, its data in the run key, the task a stage
(``init_from``) inherits, the plain metric names.

Each step draws its batch from ONE task, task t with probability proportional to
``n_t ** alpha`` (``n_t`` its training examples, ``alpha`` 0.8: experiments/maths/task_sampling.py);
the schedule comes from the run's ``task_order`` stream, and each task walks through its
own seeded data order (the primary's is the single-task order of the same seed), so a
resumed run sees the same batches. The loss is that task's, through its decoder: a
decoder's weights move only on its own task's steps. ``train.epochs`` counts passes over
all tasks' examples together (``sum_t n_t / batch_size`` steps per epoch). AdamW with
linear warm-up and decay over the encoder (``train.lr``) and every decoder
(``train.decoder_lr``); the primary's decoder is initialised from the ``decoder`` stream
as in single-task runs, the others from ``decoder:<task>``.

Head gates (``pipeline``; Hard Concrete with the L0 penalty, exactly as head_gates' DP:
experiments/maths/hard_concrete.py, experiments/interventions/heads.py):

- ``none``: no gates, every head open;
- ``shared``: one gate set for every task; maps ``heads.gate`` and ``heads.log_alpha``;
- ``per_task``: one gate set per task, applied while that task's batch runs (and when it is
  evaluated); a step's penalty is that set's (the other sets see no loss that step); maps
  ``heads.gate.<task>`` and ``heads.log_alpha.<task>``, metrics ``open_heads/<task>``, and
  ``open_heads`` = heads some task keeps open (what the shared encoder still needs).

Penalty ``lambda * l0_penalty`` (mean over layers of expected open heads per layer), gates'
own Adam at ``lr`` without a schedule; ``lambda`` 0.001 is He & Choi's multi-task value
(ignored with ``pipeline: none``).

Metrics, at every evaluation: ``<metric>/<task>`` on each task's dev set (the primary too),
``<metric>/<task>.<set>`` on each task's extra evaluation sets, ``<metric>/mean`` the mean
over tasks of the metrics every task reports (``accuracy/mean``, ``loss/mean``), and the
primary's as in a single-task run under plain names (``accuracy``, ``loss``,
``accuracy/<set>``), so tables and figures that read ``accuracy`` compare the primary with
its single-task runs.

Weights handed on (stages): ``decoders.task.*`` is the primary's decoder,
``decoders.<task>.*`` each other task's, ``interventions.gates.*`` the gates (per task:
``interventions.gates.<task>.log_alpha``). A dependant on the primary's task loads the
encoder and that decoder; on another task, the encoder. A multi-task run starting from
``init_from`` takes the encoder (and the primary's decoder, same task); its other decoders
start fresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import nn

from base import outputs
from base.naming import suggest
from base.result import RunResult
from base.sections import ConfigError, Section, TaskConfig
from experiments.interventions.gates import HeadGates
from experiments.interventions.heads import attach_head_gates
from experiments.maths.hard_concrete import eval_gates, l0_penalty, open_heads, prob_open
from experiments.maths.losses import task_loss
from experiments.maths.schedules import linear_warmup_decay
from experiments.maths.task_sampling import (
    ALPHA,
    batch_positions,
    task_probabilities,
    task_schedule,
)
from experiments.models import load_tokenizer
from experiments.tasks import TASKS, TaskData
from experiments.tasks.cache import load_task
from experiments.training.context import RunContext
from experiments.training.loop import (
    batch_indices,
    evaluate,
    forward_logits,
    num_steps,
    take,
    train_steps,
    update,
)
from experiments.training.reads import FINE_TUNING
from experiments.training.seeding import derive_seed, generator
from experiments.training.state import adam, adamw, set_up

VERSION = "1"
PIPELINES = ("none", "shared", "per_task")
SHORT_NAMES = ("pipeline", "lambda")
READS = FINE_TUNING
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): every train key."""
PROGRESS = {outputs.OPEN_HEADS.name: "open heads"}  # heads some task keeps open
OUTPUTS = outputs.Outputs(
    maps=(outputs.GATE, outputs.LOG_ALPHA),  # per task (heads.gate.<task>) when pipeline is per_task
    metrics=(*outputs.EVALUATION, outputs.OPEN_HEADS, outputs.EXPECTED_OPEN_HEADS, outputs.L0_PENALTY))
"""What its runs report (base.outputs); metrics on each task as ``<metric>/<task>``."""
MEAN = "mean"
"""The suffix of the mean over tasks: ``accuracy/mean``."""


class Config(Section):
    """multitask's own keys: ``multitask: {tasks: [{name: ud-pos}], pipeline: per_task}``."""

    pipeline: str = Field(
        PIPELINES[0], description="Head gates: none; shared (one Hard Concrete set for every task); "
        "per_task (one set per task, applied while its batch runs).",
    )
    tasks: tuple[TaskConfig, ...] = Field(
        (), description="The tasks trained beside the run's task (the first), each a section like "
        "task ({name: ud-pos, max_train: 2000}); each task once.",
    )
    alpha: float = Field(
        ALPHA, ge=0, le=1, description="Task sampling: a batch comes from task t with probability "
        "proportional to n_t ** alpha (n_t its training examples; 0 uniform, 1 proportional).",
    )
    lambda_: float = Field(
        0.001, alias="lambda", ge=0, le=100,
        description="Weight of the gates' L0 penalty (mean over layers of expected open heads per layer).",
    )
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of the gates' log_alpha (no schedule).")


def labels(section: Config) -> dict[str, Any]:
    """Its labels (its short names' values), without lambda when it trains no gates (pipeline
    none): the penalty weighs nothing there, so tables, run names and the registry show none."""
    return {"pipeline": section.pipeline, "lambda": None if section.pipeline == "none" else section.lambda_}


def extra_tasks(section: Config) -> dict[str, TaskConfig]:
    """The tasks a run reads besides ``task``, by key: checked at submit, in the run key."""
    return {f"multitask.tasks.{i}": task for i, task in enumerate(section.tasks)}


def unread(section: Config, train) -> dict[str, str]:
    """Keys a run of ``section`` does not read (experiments/training/reads.py): the gates' keys without gates."""
    if section.pipeline == "none":
        return {key: "read only with pipeline shared or per_task (it is none: no gates)" for key in ("lambda", "lr")}
    return {}


def check(cfg) -> None:
    """At least one task beside the run's; known names; each task once; no evaluation set of the
    primary named like a task (its metrics would collide with ``<metric>/<task>``)."""
    if not cfg.section.tasks:
        raise ConfigError("multitask.tasks: list the tasks trained beside the run's task, e.g. "
                          "[{name: ud-pos}] (the run's task is the first)")
    seen = {cfg.task.name: "task.name"}
    for key, task in extra_tasks(cfg.section).items():
        if task.name not in TASKS:
            raise ConfigError(f"{key}.name: unknown task '{task.name}'{suggest(task.name, TASKS)}")
        if task.name in seen:
            raise ConfigError(f"{key}.name: task '{task.name}' is already in this run ({seen[task.name]}): "
                              f"each task once, its metrics are named <metric>/{task.name}")
        seen[task.name] = f"{key}.name"
    for name, _ in cfg.task.eval_sets:
        if name in seen or name == MEAN:
            raise ConfigError(f"task.eval_sets.{name}: a multitask run names its metrics <metric>/<task> and "
                              f"<metric>/{MEAN}: rename this evaluation set")


@dataclass
class _Task:
    """One task of the run: its name (in metrics, maps and decoders), module, data and decoder."""

    name: str
    module: ModuleType
    data: TaskData
    decoder: nn.Module
    order_seed: int  # seed of its own data order (batch_indices)


def _decoder(module: ModuleType, hidden_size: int, num_labels: int, seed: int, name: str) -> nn.Module:
    """A further task's decoder, from the run's ``decoder:<task>`` stream (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, f"decoder:{name}"))
        return module.build_decoder(hidden_size, num_labels)


def run(cfg, ctx: RunContext) -> RunResult:
    tc, own = cfg.train, cfg.section
    state = set_up(cfg, ctx)  # the primary: data, decoders["task"] (and init_from weights)
    encoder = state.encoder
    tasks = _tasks(cfg, ctx, state)

    total, schedule, position = _task_order(cfg, tasks)
    model_params = list(encoder.parameters()) + [p for t in tasks for p in t.decoder.parameters()]
    optimizer, scheduler = _model_optimizer(cfg, state, tasks, total)

    active = [0]  # whose batch (or evaluation) runs: its task's gates gate the encoder
    gate_sets, handle = _gates(cfg, ctx, state, tasks, active)
    gate_optimizer = state.optimizers.get("gates")
    maps_of = _gate_map_names(own.pipeline, [t.name for t in tasks])  # {gate map name: its task index}
    state.values["trajectory"] = {name: [] for name in maps_of}

    def batch(state):
        task = tasks[int(schedule[state.step])]
        state.batch_index = batch_indices(int(position[state.step]), len(task.data.train), tc.batch_size,
                                          task.order_seed)  # indices into that task's train split
        return take(task.data.train, state.batch_index, state.device)

    # The loop body; train_steps does the evaluations, checkpoints and progress.
    def step(state, batch) -> dict[str, float]:
        t = active[0] = int(schedule[state.step])
        ids, mask, labels = batch
        loss = task_loss(forward_logits(encoder, tasks[t].decoder, ids, mask, tc.precision), labels)
        if not gate_sets:  # gradients set to None first: the other tasks' decoders are left alone
            value = update(loss, optimizer, scheduler, model_params, tc.grad_clip, state.scaler)
            return {"loss": value, "open_heads": state.num_layers * state.num_heads}
        penalty = l0_penalty(gate_sets[t].log_alpha)
        update(loss + own.lambda_ * penalty, [optimizer, gate_optimizer], scheduler, model_params, tc.grad_clip,
               state.scaler)
        with torch.no_grad():
            expected = prob_open(gate_sets[t].log_alpha).sum().item()
        return {"loss": loss.item(), "l0_penalty": penalty.item(), "expected_open_heads": expected,
                "open_heads": _open_union(gate_sets)}

    def evaluate_tasks(state) -> dict[str, float]:
        with state.evaluating():  # test-time gates
            metrics = _evaluate(state, tasks, active)
            for name, index in maps_of.items():
                state.values["trajectory"][name].append(_test_gates(gate_sets[index]))
            if own.pipeline == "per_task":
                metrics |= {f"open_heads/{t.name}": float(open_heads(eval_gates(g.log_alpha)).sum())
                            for t, g in zip(tasks, gate_sets, strict=True)}
        return metrics

    metrics = train_steps(state, ctx, total, step, evaluate_tasks, batch)
    if handle is not None:
        handle.remove()
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        maps=_gate_maps(maps_of, tasks, gate_sets),
        trajectories={name: np.stack(values) for name, values in state.values["trajectory"].items()},
        eval_steps=np.asarray(state.values["eval_steps"]),
        steps=state.step,
    )


def _task_order(cfg, tasks: list[_Task]) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The run's steps, which task each step draws from (``n_t ** alpha``, seeded) and which of that
    task's batches it is."""
    tc = cfg.train
    sizes = [len(t.data.train) for t in tasks]
    total = num_steps(sum(sizes), tc.batch_size, tc.epochs, tc.max_steps)
    schedule = task_schedule(task_probabilities(sizes, cfg.section.alpha), total, generator(cfg.seed, "task_order"))
    return total, schedule, batch_positions(schedule, len(tasks))


def _model_optimizer(cfg, state, tasks: list[_Task], total: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the encoder (``train.lr``) and every task's decoder (``train.head_lr``), with linear
    warm-up and decay (``state.optimizers["model"]``)."""
    tc = cfg.train
    optimizer = adamw([(list(state.encoder.parameters()), tc.lr),
                       ([p for t in tasks for p in t.decoder.parameters()], tc.head_lr)], tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, total, tc.warmup_ratio))
    state.optimizers["model"], state.schedulers["model"] = optimizer, scheduler
    return optimizer, scheduler


def _tasks(cfg, ctx: RunContext, state) -> list[_Task]:
    """The run's tasks: the primary (``set_up``'s data and decoder) and each of ``multitask.tasks``, whose
    decoder joins ``state.decoders`` under its name."""
    tasks = [_Task(cfg.task.name, state.task, state.data, state.decoder, cfg.seed)]
    tokenizer = load_tokenizer(cfg.model)
    for entry in cfg.section.tasks:
        module = TASKS[entry.name]
        data = load_task(entry, tokenizer)
        decoder = _decoder(module, state.encoder.config.hidden_size, data.num_labels, cfg.seed, entry.name).to(ctx.device)
        state.decoders[entry.name] = decoder
        tasks.append(_Task(entry.name, module, data, decoder, derive_seed(cfg.seed, f"data_order:{entry.name}")))
    return tasks


def _gates(cfg, ctx: RunContext, state, tasks: list[_Task], active: list[int]) -> tuple[list[HeadGates], Any]:
    """The pipeline's head gates (none; one set shared by the tasks; one set per task) and the handle
    that gates the encoder with the set of task ``active[0]``; the gates train with their own Adam at
    ``lr``, no schedule (``state.optimizers["gates"]``)."""
    own = cfg.section
    if own.pipeline == "none":
        return [], None
    noise = generator(cfg.seed, "gates")  # initialises every set, then draws their noise
    if own.pipeline == "shared":
        shared = HeadGates(state.num_layers, state.num_heads, noise)
        gates: nn.Module = shared
        gate_sets = [shared] * len(tasks)
    else:
        gates = nn.ModuleDict({t.name: HeadGates(state.num_layers, state.num_heads, noise) for t in tasks})
        gate_sets = [gates[t.name] for t in tasks]
    gates.to(ctx.device)
    handle = attach_head_gates(state.encoder, lambda: gate_sets[active[0]]())
    state.interventions["gates"], state.generators["gate_noise"] = gates, noise
    state.optimizers["gates"] = adam(gates.parameters(), lr=own.lr)
    return gate_sets, handle


def _gate_maps(maps_of: dict[str, int], tasks: list[_Task], gate_sets: list[HeadGates]) -> dict:
    """Each gate map (its test-time gates) with its companion log_alpha, named by whose set it is."""
    maps = {}
    for name, index in maps_of.items():
        part = outputs.GATE.part(name) or None  # None: the shared set, else its task
        whose = f" on {tasks[index].name} batches" if part else " of every task"
        log_alpha = gate_sets[index].log_alpha.detach().cpu().numpy()
        maps |= [outputs.GATE(_test_gates(gate_sets[index]), f"test-time gate{whose}, 0 = removed", part),
                 outputs.LOG_ALPHA(log_alpha, f"log_alpha{whose}, larger = more open", part)]
    return maps


def _gate_map_names(pipeline: str, names: list[str]) -> dict[str, int]:
    """The gate maps of a pipeline, each with the index of the task whose set it shows."""
    if pipeline == "shared":
        return {outputs.GATE.name: 0}
    if pipeline == "per_task":
        return {outputs.GATE.named(name): i for i, name in enumerate(names)}
    return {}


def _test_gates(gates: HeadGates) -> np.ndarray:
    return eval_gates(gates.log_alpha.detach()).cpu().numpy().astype(np.float32)


def _open_union(gate_sets: list[HeadGates]) -> int:
    """Heads open (test-time gate > 1e-3) in at least one set."""
    with torch.no_grad():
        return int(torch.stack([open_heads(eval_gates(g.log_alpha)) for g in gate_sets]).any(dim=0).sum())


def _evaluate(state, tasks: list[_Task], active: list[int]) -> dict[str, float]:
    """Every task on its dev set and evaluation sets, each with its own decoder (and gates, via
    ``active``): ``<metric>/<task>``, ``<metric>/<task>.<set>``, ``<metric>/mean``, and the
    primary under plain names (``accuracy``, ``accuracy/<set>``). Modes are the caller's."""
    batch_size, device, precision = state.cfg.train.batch_size, state.device, state.precision
    metrics: dict[str, float] = {}
    dev: dict[str, dict[str, float]] = {}
    for index, task in enumerate(tasks):
        active[0] = index
        dev[task.name] = scores = evaluate(state.encoder, task.decoder, task.data.dev, task.module, batch_size, device,
                                           precision)
        metrics |= {f"{metric}/{task.name}": value for metric, value in scores.items()}
        if index == 0:
            metrics |= scores
        for set_name, split in task.data.eval_sets.items():
            extra = evaluate(state.encoder, task.decoder, split, task.module, batch_size, device, precision)
            metrics |= {f"{metric}/{task.name}.{set_name}": value for metric, value in extra.items()}
            if index == 0:
                metrics |= {f"{metric}/{set_name}": value for metric, value in extra.items()}
    common = set.intersection(*(set(scores) for scores in dev.values()))
    metrics |= {f"{metric}/{MEAN}": float(np.mean([dev[t.name][metric] for t in tasks])) for metric in sorted(common)}
    return metrics
