"""Skill neurons (Wang et al. 2022; ../shared/PAPERS.md): prompt tuning, neuron predictivity, perturbation.

1. Prompt tuning. ``prompt_length`` trainable vectors are inserted into the input
   embeddings right after the first token: ``[CLS] p_1 .. p_n w_1 .. w_m [SEP]``. After
   [CLS], not before it, so [CLS] keeps position 0 as in pretraining (and the ``cls``
   read-out reads what it always reads); the prompt is at positions ``1 .. n``. The
   backbone is frozen: ``requires_grad`` off, and in eval mode also while the prompt trains
   (no dropout: its weights do not train, and dropout noise on hidden states of norm ~3.6
   drowns the ~0.05 per dimension by which sentences differ at the prompt; measured on
   SST-2, 64 steps: 0.79 dev accuracy without dropout, 0.75 with). The prompt starts as the
   embeddings of random vocabulary words (the ``prompt`` stream).
2. The read-out. The paper reads a masked-LM head at a <mask> token through a verbalizer
   (one label word per class). The shipped MiniLM is a sentence encoder without an MLM
   head, so ours is an adaptation, a linear map from one final hidden state to the class
   logits. ``readout``: the mean of the prompt positions' final hidden states (``prompt``)
   or [CLS]'s (``cls``), standardised per dimension (a BatchNorm without parameters; see
   ``prompting.Readout``, experiments/components/prompting.py). ``verbalizer``:
   - ``learned``: a linear layer trained with the prompt (lr ``readout_lr``);
   - ``label_words``: FROZEN rows = the input embeddings of one word per class
     (``label_words``, default: the task's label names; a word of several pieces is the
     mean of their embeddings), scaled to unit norm; logit_c = z . e(word_c) / |e(word_c)|
     with ``z`` the standardised state (so the logit scale is the same for a random-init
     table, |e| ~ 0.4 in MiniLM's shape, as for a pretrained one). A verbalizer without
     the MLM head's transform: everything the task needs has to be in the prompt, as in
     the paper. Needs embeddings as wide as the hidden states (not ELECTRA's);
   - ``random_words``: the same with random vocabulary words (drawn from ``word_seed``,
     default the run's seed): the paper's random-label-word check. Runs that differ only
     in ``word_seed`` give the rankings whose Spearman the paper reports (0.87).
   Prompt and read-out train with Adam (no weight decay, no schedule, no clipping). The prompt's
   ``lr`` defaults by verbalizer (MiniLM, SST-2, 1000 examples, 64 steps of 32): with the learned
   read-out 1e-3 reached 0.79 dev accuracy and 1e-2 0.61 (unstable); with random words,
   the prompt alone learning, 1e-2 reached 0.72 and 3e-3 0.67. ``prompt_optimizer: reference``
   trains them as the reference's src/trainer.py (``REFERENCE``): Adam with betas (0.9, 0.98) and
   eps 1e-6 (:27), linear warm-up over 0.6 % of the steps and decay to 0 (:87), gradients clipped
   to norm 1 (:115). The reference's clip norm counts the whole model's gradients, the backbone's
   too (its backbone keeps ``requires_grad``; only the prompt steps); ours counts what trains.
3. Predictivity (experiments/maths/predictivity.py, the reference's ``probe_avg``,
   ``probe_acc`` and ``finfo``): FFN activations after the non-linearity at the prompt
   positions, the baseline their mean over the training set; ``Pred = max(Acc, 1 - Acc)`` on
   dev, max over positions. A multi-class task is split into the binary subtasks of the
   reference's ``helper/binarize.py`` (3 classes: 0 vs 2 and 1 vs rest; 4 classes: 1 vs 3 and
   2 vs rest), each on class-balanced subsets of train and dev with its own baseline. The
   reference trains one prompt per subtask (on ``<task>-pn`` / ``<task>-neu``); ours reads the
   one prompt trained on the whole task at each subtask's subsets. Map ``neurons.predictivity``
   (L, I): the best subtask's predictivity.
4. Perturbation (the reference's ``mask.py``): the skill neurons at fraction ``f`` are the top
   ``max(1, int(f * I))`` of EACH layer (``finfo``; multi-class: half from the first subtask,
   filled up from the second); Gaussian noise ``N(0, noise_std^2)`` on them, ONE draw per
   sequence added at every position (experiments/interventions/neurons.py, the reference's
   ``randn([B, 3072]) * 0.1``), against as many random neurons per layer (drawn uniformly from
   the layer, so by chance some may be skill neurons), ``f`` in ``perturb_fractions``; the same
   noise stream for both. Metrics ``accuracy_noise_top_<f>`` and ``accuracy_noise_random_<f>``
   (``f`` as written by ``{:g}``: ``accuracy_noise_top_0.01``), next to the unperturbed
   ``accuracy``; the curve is the run's ``perturbation.png``, and ``predictivity_by_layer.png``
   draws each layer's best, 99th-percentile and median neuron.
5. Pruning (``prune_fraction``, the reference's ``prune.py``; experiments/interventions/ffn_prune.py): a sliced
   copy keeping the skill neurons at ``prune_fraction`` in the upper three quarters of the
   layers (reference: 3-11 of 12; MiniLM's 6: 2-5, ``ffn_prune.pruned_layers``), each removed
   neuron replaced by its mean activation folded into the output bias: the mean at the prompt
   positions over the training set (``prune_baseline: prompt``, the reference's) or over every
   token; the removed neurons' means only (``prune_fold: removed``, ours) or every neuron's
   (``all``, the reference's, which counts the kept ones' means on top of their activations).
   The read-out's standardisation (a BatchNorm) holds the unpruned model's running statistics;
   ``recalibrate_bn`` (default) re-estimates them on the pruned backbone over 256 training
   examples before ``pruned_<metric>`` is measured (forward only, no label, no weight trained):
   on MiniLM SST-2 the stale statistics shift every sentence the same way and the pruned copy
   predicts one class (0.50 dev accuracy; 0.71 recalibrated, 0.79 unpruned; PARITY.md). The
   reference reads a masked-LM head (no such statistics) and retrains the prompt on the pruned
   model. VERSION 3: ``recalibrate_bn`` (false: VERSION 2's pruned metrics).

Where a default is ours, ``REFERENCE`` says which value restores the reference protocol.
Not adapted: the reference's 16 prompt positions are a <mask> token (read by the MLM head)
and 15 trained vectors before the sentence; ours are 16 trained vectors after [CLS].

Also reported: ``predictivity_top1`` (the best neuron's), ``predictivity_mean`` (over all
neurons) and the artifact ``skill_neurons.npz``: ``per_subtask`` (S, L, I) predictivity,
``best_position`` (S, L, I) its prompt position (0-based within the prompt), ``baseline``
(S, P, L, I) each subtask's training means, ``selected`` (F, L, I) the skill neurons at each
perturbation fraction, and the perturbation table (``fractions``, ``k``, ``accuracy_top``,
``accuracy_random``, ``accuracy``). The trained prompt is handed on as
``interventions.prompt.weight``, the read-out as ``decoders.task.*``.

Sentence-level classification tasks only: a tagging task has no sentence label for a
neuron at the prompt to predict (``check`` says so).
"""

from __future__ import annotations

import copy
import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from base import outputs
from base.result import RunResult
from base.sections import ConfigError
from experiments.components.prompting import (
    REFERENCE_CLIP,
    PromptedEncoder,
    SkillNeuronsConfig,
    build,
    find_skill_neurons,
    perturbation_check,
    prompt_groups,
    recalibrate,
    trained_parameters,
)
from experiments.interventions.ffn_prune import mean_ffn_activations, pruned_layers, pruned_metrics
from experiments.maths.losses import task_loss
from experiments.maths.predictivity import by_layer, skill_neuron_mask
from experiments.models import MODELS, RANDOM_PREFIX
from experiments.training.context import RunContext
from experiments.training.loop import (
    batches,
    evaluate,
    evaluate_all,
    forward_logits,
    num_steps,
    train_steps,
    update,
)
from experiments.training.state import RunState

VERSION = "3"
PIPELINES = ("none",)
SHORT_NAMES = ("prompt_length", "verbalizer", "readout")
READS = ("epochs", "max_steps", "batch_size", "pooler", "eval_every", "precision")
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): the prompt and read-out train at
skill_neurons.lr / readout_lr, with no weight decay, and no clipping or warm-up but with
``skill_neurons.prompt_optimizer: reference`` (its own clip and schedule, not train's)."""
OUTPUTS = outputs.Outputs(
    maps=(outputs.PREDICTIVITY,),
    metrics=(*outputs.EVALUATION, outputs.NOISE, outputs.PRUNED, outputs.PRUNED_KEPT_FRACTION,
             outputs.Metric("predictivity_mean", "mean predictivity of the FFN neurons"),
             outputs.Metric("predictivity_top1", "predictivity of the best FFN neuron")))
"""What its runs report (base.outputs)."""

Config = SkillNeuronsConfig
"""Its section is a shared component (experiments/components/prompting.py): prompt_transfer's
stages take the same keys."""

REFERENCE: dict[str, Any] = {"prune_fold": "all", "prompt_optimizer": "reference"}
"""The keys whose default is ours, and the value that restores the reference protocol."""


def optimisers(cfg) -> list:
    """Its parameter groups (experiments/training/optimisers.py): the prompt (and a learned read-out)."""
    return prompt_groups(cfg.section)


def unread(section: Config, train) -> dict[str, str]:
    """Keys a run of ``section`` does not read (experiments/training/reads.py): those of another verbalizer."""
    own = {"label_words": "label_words", "word_seed": "random_words"}
    return {key: f"read only with verbalizer {verbalizer} (it is {section.verbalizer})"
            for key, verbalizer in own.items() if section.verbalizer != verbalizer}


def check(cfg) -> None:
    """A classification task; the prompt fits
    the model's positions; a frozen verbalizer needs embeddings as wide as the hidden states."""
    from experiments.tasks import TASKS

    own, task = cfg.section, TASKS[cfg.task.name]
    if task.KIND != "classification":
        raise ConfigError(f"task.name: skill_neurons needs a sentence classification task, and '{cfg.task.name}' "
                          f"is {task.KIND} (a neuron at the soft prompt predicts one label per sentence)")
    names = getattr(task, "LABEL_NAMES", None) or cfg.task.labels
    if own.label_words is not None and names is not None and len(own.label_words) != len(names):
        raise ConfigError(f"skill_neurons.label_words: {len(own.label_words)} words for the {len(names)} "
                          f"classes of task '{cfg.task.name}' ({', '.join(names)})")
    sizes = _model_sizes(cfg.model)
    if sizes is None:  # a hub model not on this machine: run time says
        return
    embedding, hidden, positions = sizes
    if cfg.task.max_length + own.prompt_length > positions:
        raise ConfigError(f"skill_neurons.prompt_length: {own.prompt_length} prompt vectors + task.max_length "
                          f"{cfg.task.max_length} exceed the {positions} positions of model {cfg.model}")
    if own.verbalizer != "learned" and embedding != hidden:
        raise ConfigError(f"skill_neurons.verbalizer: {own.verbalizer} scores hidden states ({hidden}) against word "
                          f"embeddings ({embedding}), which differ in model {cfg.model}; use verbalizer learned")


@lru_cache(maxsize=16)
def _model_sizes(name: str) -> tuple[int, int, int] | None:
    """(embedding size, hidden size, usable positions) from the model's config (the tiny models'
    dict, else the ``config.json`` of its folder; no transformers import), or None when it cannot
    be read here. RoBERTa's positions start after its padding id."""
    base = name.removeprefix(RANDOM_PREFIX)
    spec = MODELS.get(base)
    if spec is not None and spec.config is not None:
        config = dict(spec.config)
    else:
        path = Path(spec.path() if spec is not None else base) / "config.json"
        if not path.is_file():
            return None
        config = json.loads(path.read_text())
    hidden, positions = config.get("hidden_size"), config.get("max_position_embeddings")
    if not isinstance(hidden, int) or not isinstance(positions, int):
        return None
    if config.get("model_type") == "roberta":
        positions -= (config.get("pad_token_id") or 0) + 1
    return config.get("embedding_size") or hidden, hidden, positions


# ------------------------------------------------------------------------------ the run


def run(cfg, ctx: RunContext) -> RunResult:
    tc, own = cfg.train, cfg.section
    state, model, optimizer = build(cfg, ctx)
    readout = state.decoder
    reference = own.prompt_optimizer == "reference"  # its schedule (build) and clip
    scheduler, clip = state.schedulers.get("prompt"), REFERENCE_CLIP if reference else None
    trained = trained_parameters(state)

    def step(state: RunState, batch) -> dict[str, float]:
        ids, mask, labels = batch
        state.encoder.eval()  # frozen: no dropout while the prompt trains (module docstring)
        logits = forward_logits(model, readout, ids, mask, state.precision)
        return {"loss": update(task_loss(logits, labels), optimizer, scheduler, trained, clip, state.scaler)}

    total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
    metrics = train_steps(state, ctx, total, step, eval_fn=lambda state: evaluate_all(state, model))

    state.train(False)
    found = find_skill_neurons(model, state)
    perturbation = perturbation_check(model, state, found["per_subtask"], own.perturb_fractions, own.noise_std)
    score = found["score"]
    extra = {"predictivity_top1": float(score.max()), "predictivity_mean": float(score.mean())}
    for f, top, rand in zip(own.perturb_fractions, perturbation["accuracy_top"], perturbation["accuracy_random"],
                            strict=True):
        for which, value in (("top", top), ("random", rand)):
            extra[outputs.NOISE.name(metric=outputs.ACCURACY.name, which=which, fraction=f)] = value
    if own.prune_fraction is not None:  # the paper's pruning of a copy: what is kept, and what it costs
        extra |= _pruned(model, state, found, own)
    ctx.tracker.log_metrics(extra, state.step)
    metrics |= extra

    title = f"{cfg.task.name} / {cfg.model} / seed {cfg.seed}"
    artifacts = {
        "skill_neurons.npz": _npz(found, perturbation, metrics.get("accuracy", float("nan")),
                                  state.values["label_words"]),
        "perturbation.png": _perturbation_png(perturbation, metrics.get("accuracy", float("nan")), own.noise_std,
                                              state.num_layers * score.shape[1], title),
        "predictivity_by_layer.png": _by_layer_png(score.numpy(), title),
    }
    meaning = ("max over prompt positions of max(Acc, 1 - Acc), Acc = dev accuracy of 1[activation > train mean] "
               "as the label" + (" (max over the binary subtasks on class-balanced subsets)"
                                 if state.data.num_labels > 2 else ""))
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics=metrics,
        maps=dict([outputs.PREDICTIVITY(score.numpy(), meaning)]),
        eval_steps=np.asarray(state.values["eval_steps"]),
        steps=state.step,
        artifacts=artifacts,
    )


def _pruned(model: PromptedEncoder, state: RunState, found: dict, own: SkillNeuronsConfig) -> dict[str, float]:
    """Dev metrics of a sliced copy of the backbone keeping the skill neurons at ``prune_fraction`` in
    the upper three quarters of the layers, the removed ones' mean activation (``prune_baseline``)
    folded into the output bias (``prune_fold``)."""
    batch_size = state.cfg.train.batch_size
    if own.prune_baseline == "prompt":  # the reference's train_avg (L, P, I).mean(axis=1)
        mean = found["train_mean"].mean(dim=0)  # (P, L, I) -> (L, I)
        baseline = {layer: mean[layer].float() for layer in range(len(mean))}
    else:
        with state.autocast():
            baseline = mean_ffn_activations(model.backbone, batches(state.data.train, batch_size, state.device),
                                            forward=lambda batch: model(batch[0], batch[1]))
        baseline = {layer: values.float() for layer, values in baseline.items()}
    chosen = by_layer(skill_neuron_mask(found["per_subtask"], own.prune_fraction))
    keep = {layer: chosen[layer] for layer in pruned_layers(state.num_layers)}

    def pruned_evaluate(backbone) -> dict[str, float]:
        pruned, readout = PromptedEncoder(backbone, model.prompt), state.decoder
        if own.recalibrate_bn:  # the read-out's statistics of the pruned backbone, on a copy (the run's stays)
            readout = copy.deepcopy(readout)
            recalibrate(readout, pruned, state)
        return evaluate(pruned, readout, state.data.dev, state.task, batch_size, state.device,
                        state.cfg.train.precision)

    return pruned_metrics(model.backbone, pruned_evaluate, keep, baseline, own.prune_fold)


def _npz(found: dict, perturbation: dict, accuracy: float, words: list[str]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        per_subtask=found["per_subtask"].numpy().astype(np.float32),
        best_position=found["best_position"].numpy().astype(np.int16),
        baseline=found["baseline"].numpy().astype(np.float32),
        selected=torch.stack(perturbation["selected"]).numpy(),
        fractions=np.asarray(perturbation["fractions"], dtype=np.float64),
        k=np.asarray(perturbation["k"], dtype=np.int64),
        accuracy_top=np.asarray(perturbation["accuracy_top"], dtype=np.float64),
        accuracy_random=np.asarray(perturbation["accuracy_random"], dtype=np.float64),
        accuracy=np.float64(accuracy),
        label_words=np.asarray(words, dtype=str),
    )
    return buf.getvalue()


def _perturbation_png(perturbation: dict, accuracy: float, std: float, num_neurons: int, title: str) -> bytes:
    # matplotlib only when drawing: importing the methods (every config check) stays light
    from matplotlib.figure import Figure

    from base.png import figure_png

    x = 100 * np.asarray(perturbation["fractions"])
    fig = Figure(figsize=(5.5, 3.8), dpi=100)
    ax = fig.subplots()
    ax.plot(x, perturbation["accuracy_top"], "o-", color="tab:red", label="noise on each layer's top skill neurons")
    ax.plot(x, perturbation["accuracy_random"], "s-", color="tab:blue", label="noise on as many random neurons")
    ax.axhline(accuracy, color="grey", linestyle="--", label="no noise")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_xlabel(f"% of each layer's FFN neurons ({num_neurons} in all)")
    ax.set_ylabel("dev accuracy")
    ax.set_title(f"{title}\nperturbation check: Gaussian noise per sequence, std {std:g}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def _by_layer_png(score: np.ndarray, title: str) -> bytes:
    """Per layer: the best neuron's predictivity, the 99th percentile and the median."""
    from matplotlib.figure import Figure

    from base.png import figure_png

    layers = np.arange(1, score.shape[0] + 1)
    fig = Figure(figsize=(5.5, 3.8), dpi=100)
    ax = fig.subplots()
    ax.plot(layers, score.max(axis=1), "o-", color="tab:red", label="best neuron")
    ax.plot(layers, np.percentile(score, 99, axis=1), "s-", color="tab:orange", label="99th percentile")
    ax.plot(layers, np.median(score, axis=1), "^-", color="tab:blue", label="median")
    ax.axhline(0.5, color="grey", linestyle=":", label="chance (0.5)")
    ax.set_xticks(layers)
    ax.set_ylim(0.48, 1.0)  # the whole range of predictivity: runs' figures compare by eye
    ax.set_xlabel("layer")
    ax.set_ylabel("neuron predictivity on dev")
    ax.set_title(f"{title}\nskill-neuron predictivity per layer ({score.shape[1]} FFN neurons each)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)
