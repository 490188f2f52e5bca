"""Prompt transferability between tasks, and the task x task perturbation (Wang et al. 2022; ../shared/PAPERS.md).

One run looks at ONE ordered pair of tasks, source -> target, through two ``skill_neurons``
runs, its stages (nothing is trained here):

- ``init_from``: the target, a skill_neurons run on this run's task: its prompt, read-out, data;
- ``source``: a skill_neurons run of the same model, seed and settings on ``source_task``.

Both prompts' runs take the skill_neurons keys written in ``prompt_transfer.skill_neurons``
(``{verbalizer: label_words}``, ...): by default the stages are ``{method: skill_neurons,
skill_neurons: <those keys>}`` and the same with the task's name replaced (the target's file keys
reset, its sizes and ``data_dir`` kept), so a grid with ``task`` and ``source_task`` as axes trains
each task's prompt once per seed, shared as target and as source (a diagonal cell's two stages are
one run, read once). Stages written in the config win (a source task from your files); ``check``
asks that both are skill_neurons runs of this run's model with ``prompt_transfer.skill_neurons``
and the same training, the target on this run's task.

With the ``learned`` read-out (skill_neurons' default) the read-out, trained with the target
prompt, does much of the task: on MiniLM, SST-2 and synthetic-cls (600 sentences, 2 epochs, one seed) either
task's prompt read by the other's read-out kept 0.97-1.0 of its accuracy. A frozen verbalizer
(``label_words``: every built-in sentence task has the words negative / positive) leaves the task
to the prompt, as the paper's MLM head does: the setting for transfer (examples/grid_skill_transfer.yaml).

Each prompt's skill neurons are found again from its handed-on weights on its own task's
data by ``prompting.find_skill_neurons`` (deterministic: the predictivity of its
``skill_neurons.npz``; a stage hands on weights, not artifacts), and selected per layer as the
reference's ``finfo`` does (``predictivity.skill_neuron_mask``). Reports:

- ``accuracy``: the target's prompt and read-out on the target's dev set, as trained (the
  baseline of the noise metrics below; the target run's own final ``accuracy``).
- ``transfer_accuracy``: zero-shot prompt transfer, the source prompt read by the target's
  read-out on the target's dev set. The read-out standardises the state it reads (a BatchNorm
  without parameters, ``prompting.Readout``) with statistics of the prompt it was trained
  with; another prompt moves that state by many of its standard deviations, and the read-out
  would give one class to every sentence. So the statistics are re-estimated, without labels,
  on the target's training sentences under the prompt being read (as
  ``torch.optim.swa_utils.update_bn`` does: a cumulative average over batches). The paper reads
  a frozen MLM head through label words, which needs no such step.
- ``own_accuracy``: the same protocol with the target's own prompt, and
  ``transfer_relative = transfer_accuracy / own_accuracy`` (the paper's relative transfer
  performance; exactly 1 when source = target).
- ``overlap_top20``: the shared fraction of the two prompts' top 20 % skill neurons (the top
  20 % of each layer; experiments/maths/transfer.py), ``overlap_top20_chance`` what chance gives
  within layers (0.2 up to rounding: both sets hold the same number in every layer).
- ``overlap_active``: Su et al. (2022)'s overlapping rate of activated neurons, the plain
  indicator the paper improves on: each prompt fed alone (``[CLS] p_1 .. p_n [SEP]``, no
  sentence), a neuron active at a prompt position when its FFN activation is above 0, the two
  prompts' (P, L, I) sets compared by cosine; ``overlap_active_chance`` its chance (within each
  layer at each position), ``active_fraction`` and ``active_fraction_source`` the sets' sizes.
- ``accuracy_noise_source_top_<f>`` / ``accuracy_noise_source_random_<f>``: the target prompt on
  its own task with Gaussian noise N(0, ``noise_std``^2) (one draw per sequence) on the SOURCE
  prompt's skill neurons, the top ``max(1, int(f * I))`` of each layer, vs on as many random
  neurons per layer, ``f`` in ``perturb_fractions``: ``prompting.perturbation_check`` with the
  source's predictivity and the
  target run's noise and random draws, so a diagonal cell with the stages' ``noise_std`` and
  fractions repeats the target run's own check, and with others perturbs each prompt's own top
  neurons at other noise levels without training it again (these two keys are this run's, not
  the stages').

``headsweep transfer SWEEP`` (analysis/questions/transfer.py) puts the pairs into task x task tables and
correlates the overlaps with transfer across pairs (paper: Spearman 0.53 for activated neurons,
0.71 for skill neurons).
"""

from __future__ import annotations

import copy

import torch
from pydantic import Field

from base import outputs
from base.naming import suggest
from base.result import RunResult
from base.sections import ConfigError, Section
from experiments.components.prompting import (
    Fractions,
    PromptedEncoder,
    SkillNeuronsConfig,
    build,
    find_skill_neurons,
    perturbation_check,
)
from experiments.interventions.neurons import capture_ffn
from experiments.maths.predictivity import skill_neuron_mask
from experiments.maths.transfer import chance_overlap, overlap
from experiments.models import RANDOM_PREFIX, load_tokenizer
from experiments.training.context import RunContext
from experiments.training.loop import batches, evaluate, forward_logits
from experiments.training.state import RunState, upstream_weights

VERSION = "2"
PIPELINES = ("none",)
SHORT_NAMES = ("source_task",)
READS = ()
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): none itself: its two skill_neurons
stages read theirs (inherited from this run's train)."""
OUTPUTS = outputs.Outputs(metrics=(
    outputs.ACCURACY, outputs.SOURCE_NOISE, outputs.TRANSFER_RELATIVE, outputs.TRANSFER_ACCURACY, outputs.OVERLAP_TOP20,
    outputs.OVERLAP_ACTIVE, outputs.Metric("own_accuracy", "the target prompt on its own task"),
    outputs.Metric("overlap_top20_chance", "overlap_top20 of random neuron sets", score=False),
    outputs.Metric("overlap_active_chance", "overlap_active of independent activations", score=False),
    outputs.Metric("active_fraction", "fraction of the target prompt's neurons active", score=False),
    outputs.Metric("active_fraction_source", "fraction of the source prompt's neurons active", score=False)))
"""What its runs report (base.outputs)."""

TOP_FRACTION = 0.2
"""The paper's top 20 % skill neurons (``overlap_top20``)."""
FILE_KEYS = ("train", "dev", "eval_sets", "format", "text", "label", "labels", "column")
"""The target's task keys that describe its files: reset in the default source stage."""


class Config(Section):
    """prompt_transfer's own keys; ``train`` (batch_size, precision) and ``task`` reach its stages."""

    source_task: str | None = Field(
        None, description="Task whose prompt is carried over to this run's task (a task name: sst2, synthetic-cls, "
        "...): the source stage is skill_neurons on that task, the target's file keys reset. None = this run's "
        "own task, or the source stage written in the config (source: {method: skill_neurons, task: {...}}, "
        "e.g. a task from your files).")
    skill_neurons: SkillNeuronsConfig = Field(
        default_factory=SkillNeuronsConfig, description="The keys of both prompts' skill_neurons runs, its stages "
        "(prompt_transfer.skill_neurons.verbalizer, ...): how the prompts train, and the stages' own checks.")
    noise_std: float = Field(0.1, ge=0, description="Std of the Gaussian noise on the source's top neurons (paper: "
                             "0.1); evaluation only: another value trains no prompt again.")
    perturb_fractions: Fractions = Field(
        (0.01, 0.02, 0.05, 0.1), min_length=1,
        description="Fractions f perturbed: the source's top max(1, int(f*I)) skill neurons of each layer vs as "
        "many random neurons of each layer.")



def stages(section: Config) -> dict[str, dict]:
    """The target's skill_neurons run with ``section.skill_neurons``, and the source's: the same on
    ``source_task``."""
    keys = section.skill_neurons.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    target: dict = {"method": "skill_neurons"} | ({"skill_neurons": keys} if keys else {})
    source = dict(target)
    if section.source_task is not None:  # a list, not {}: a mapping would merge into the target's eval_sets
        source["task"] = {"name": section.source_task} | {key: None for key in FILE_KEYS} | {"eval_sets": []}
    return {"init_from": target, "source": source}


def check(cfg) -> None:
    """A known source task; both stages skill_neurons runs of this run's model (and seed, for a
    random-init one) with ``prompt_transfer.skill_neurons`` and the same training, the target on this
    run's task, the source on ``source_task``."""
    from experiments.tasks import TASKS

    name = cfg.section.source_task
    if name is not None and name not in TASKS:
        raise ConfigError(f"prompt_transfer.source_task: unknown task '{name}'{suggest(name, TASKS)}")
    upstreams = cfg.upstreams
    for role in ("init_from", "source"):
        method = upstreams[role].method
        if method != "skill_neurons":
            raise ConfigError(f"{role}.method: prompt_transfer reads the prompt of a skill_neurons run, not {method}")
        if upstreams[role].model != cfg.model:
            raise ConfigError(f"{role}.model: the prompts must be of this run's model {cfg.model} "
                              f"(got {upstreams[role].model}): neurons are compared by index")
    target, source = upstreams["init_from"], upstreams["source"]
    if cfg.model.startswith(RANDOM_PREFIX) and source.seed != target.seed:
        raise ConfigError(f"source.seed: a random-init model ({cfg.model}) is another network for each seed, "
                          f"so the prompts must share one (init_from: {target.seed}, source: {source.seed})")
    if _differ(target.task, cfg.task, TASKS[cfg.task.name].READS):  # the keys its task reads: num_train may
        got = target.task.name if target.task.name != cfg.task.name else "it with other task keys"
        raise ConfigError(f"init_from.task: the target prompt must be trained on this run's task "
                          f"'{cfg.task.name}' (got {got}); source_task names the other task")
    if name is not None and source.task.name != name:
        raise ConfigError(f"source.task.name: the source stage is on '{source.task.name}', source_task says "
                          f"'{name}'; leave source_task out when you write the source stage")
    for role, upstream in upstreams.items():
        differ = _differ(upstream.section, cfg.section.skill_neurons)
        if differ:
            raise ConfigError(f"{role}.skill_neurons: the prompts' runs take prompt_transfer.skill_neurons, this "
                              f"stage differs in {', '.join(differ)}")
    differ = _differ(source.train, target.train)
    if differ:
        raise ConfigError(f"source.train: the two prompts must be trained alike, the stages differ in "
                          f"{', '.join('train.' + key for key in differ)}")


def _differ(a, b, keys=None) -> list[str]:
    """The keys (of ``keys``, else all) of two sections of one kind whose values differ."""
    theirs = b.model_dump(by_alias=True)
    return [key for key, value in a.model_dump(by_alias=True).items()
            if theirs[key] != value and (keys is None or key in keys)]


# ------------------------------------------------------------------------------ the run


def run(cfg, ctx: RunContext) -> RunResult:
    own = cfg.section
    target, model = prompted(cfg, ctx, "init_from")
    found, own_accuracy = find_skill_neurons(model, target), calibrated_accuracy(model, target)
    if cfg.upstreams["source"].run_key == cfg.upstreams["init_from"].run_key:  # the diagonal: one run, read once
        carried, found_source, transfer = model, found, own_accuracy
    else:
        source, source_model = prompted(cfg, ctx, "source")
        found_source = find_skill_neurons(source_model, source)  # on the source's own data
        # the source prompt on the target's backbone; eval: loop.evaluate gives a model back in its own mode,
        # and a new module's is train (the backbone's dropout would stay on)
        carried = PromptedEncoder(target.encoder, source_model.prompt).eval()
        transfer = calibrated_accuracy(carried, target)

    top = skill_neuron_mask(found["per_subtask"], TOP_FRACTION)
    top_source = skill_neuron_mask(found_source["per_subtask"], TOP_FRACTION)
    alone = load_tokenizer(cfg.model)("", return_tensors="pt")["input_ids"].to(target.device)  # [CLS] [SEP]
    active, active_source = active_neurons(model, alone, target), active_neurons(carried, alone, target)
    metrics = {
        outputs.ACCURACY.name: _accuracy(model, target.decoder, target),
        "own_accuracy": own_accuracy,
        outputs.TRANSFER_ACCURACY.name: transfer,
        outputs.TRANSFER_RELATIVE.name: transfer / own_accuracy if own_accuracy > 0 else float("nan"),
        outputs.OVERLAP_TOP20.name: overlap(top_source, top),
        "overlap_top20_chance": chance_overlap(top_source, top),
        outputs.OVERLAP_ACTIVE.name: overlap(active_source, active),
        "overlap_active_chance": chance_overlap(active_source, active),
        "active_fraction": float(active.float().mean()),
        "active_fraction_source": float(active_source.float().mean()),
    }
    perturbation = perturbation_check(model, target, found_source["per_subtask"], own.perturb_fractions,
                                      own.noise_std)
    for f, top_acc, random_acc in zip(own.perturb_fractions, perturbation["accuracy_top"],
                                      perturbation["accuracy_random"], strict=True):
        for which, value in (("top", top_acc), ("random", random_acc)):
            metrics[outputs.SOURCE_NOISE.name(metric=outputs.ACCURACY.name, which=which, fraction=f)] = value
    ctx.tracker.log_metrics(metrics, 0)
    return RunResult(run_key=cfg.run_key, group_key=cfg.group_key, metrics=metrics)


def prompted(cfg, ctx: RunContext, role: str) -> tuple[RunState, PromptedEncoder]:
    """The state of the skill_neurons run of stage ``role`` (its own config and data) with its
    handed-on weights, and its prompted model, in eval mode."""
    upstream = cfg.upstreams[role]
    state, model, _ = build(upstream, ctx)
    weights = upstream_weights(cfg, ctx, role)
    state.load_weights(weights)  # the encoder (frozen, as handed on) and the read-out
    model.prompt.load_state_dict({"weight": weights["interventions.prompt.weight"]})
    state.train(False)
    model.eval()
    return state, model


def _accuracy(model: PromptedEncoder, readout: torch.nn.Module, state: RunState) -> float:
    return float(evaluate(model, readout, state.data.dev, state.task, state.cfg.train.batch_size, state.device,
                          state.precision)["accuracy"])


@torch.no_grad()
def calibrated_accuracy(model: PromptedEncoder, state: RunState) -> float:
    """Dev accuracy of ``state``'s read-out (a copy) over ``model``'s prompt, the read-out's
    standardisation re-estimated on the training sentences under that prompt (no labels read)."""
    model.eval()
    readout = copy.deepcopy(state.decoder)
    readout.norm.reset_running_stats()
    readout.norm.momentum = None  # running statistics = the plain average over the batches
    readout.train()
    for ids, mask, _ in batches(state.data.train, state.cfg.train.batch_size, state.device):
        forward_logits(model, readout, ids, mask, state.precision)
    return _accuracy(model, readout, state)


@torch.no_grad()
def active_neurons(model: PromptedEncoder, ids: torch.Tensor, state: RunState) -> torch.Tensor:
    """``(P, L, I)`` bool: the FFN neurons the prompt activates (activation > 0) at its positions,
    the prompt fed alone: ``ids`` (1, 2) are an empty sentence, [CLS] [SEP] (Su et al. 2022)."""
    model.eval()
    n = model.prompt.weight.shape[0]
    with capture_ffn(model.backbone, torch.arange(1, 1 + n, device=state.device)) as capture, state.autocast():
        model(ids, torch.ones_like(ids))
        activations = capture.take()[0]  # (P, L, I)
    return (activations > 0).cpu()
