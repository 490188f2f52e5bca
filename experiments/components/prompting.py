"""The soft-prompted frozen encoder of skill neurons (Wang et al. 2022; ../shared/PAPERS.md), shared by
the two methods that read it: ``skill_neurons`` trains a prompt and finds its skill neurons;
``prompt_transfer`` builds two such runs again from their handed-on weights and compares them.

- ``SkillNeuronsConfig``: the keys of a skill-neurons run (the ``skill_neurons`` method's section,
  and ``prompt_transfer.skill_neurons``, the keys of its two stages);
- the prompted model: ``SoftPrompt``, ``PromptedEncoder`` (the prompt after [CLS]), ``Readout``
  (the standardised read-out: a learned linear layer or frozen word rows), and ``build``, a run's
  state with all three;
- reading it: ``find_skill_neurons`` (predictivity per subtask, experiments/maths/predictivity.py)
  and ``perturbation_check`` / ``noisy_accuracy`` (noise on the top neurons of each layer vs as
  many random ones).

The protocol, its measurements and where it differs from the reference are in
experiments/methods/skill_neurons.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import AfterValidator, Field, field_validator
from torch import nn

from base.sections import Section
from experiments.interventions.neurons import capture_ffn, perturb_neurons
from experiments.maths.predictivity import (
    by_layer,
    combined_score,
    correct_counts,
    neuron_predictivity,
    random_like,
    skill_neuron_mask,
    subtask_labels,
    subtask_sums,
)
from experiments.maths.schedules import linear_warmup_decay
from experiments.models import load_tokenizer
from experiments.training import optimisers as opt
from experiments.training.context import RunContext
from experiments.training.loop import batches, evaluate, num_steps
from experiments.training.seeding import derive_seed, generator
from experiments.training.state import RunState, adam, set_up


def _fractions(value: tuple[float, ...]) -> tuple[float, ...]:
    bad = [f for f in value if not 0 < f <= 1]
    if bad:
        raise ValueError(f"each fraction must be in (0, 1], got {bad}")
    return tuple(sorted(set(value)))


Fractions = Annotated[tuple[float, ...], AfterValidator(_fractions)]
"""Fractions of all FFN neurons, each in (0, 1], sorted, each once (perturb_fractions here and in prompt_transfer)."""


class SkillNeuronsConfig(Section):
    """The keys of a skill-neurons run (the ``skill_neurons`` method's section); it also reads ``train``
    (epochs or max_steps, batch_size, eval_every)."""

    prompt_length: int = Field(16, ge=1, le=128, description="Soft-prompt vectors inserted after [CLS] (paper: ~16).")
    lr: float | None = Field(
        None, gt=0, le=10, description="Adam learning rate of the soft prompt (no schedule); None = 1e-3 with the "
        "learned read-out, 1e-2 with a frozen verbalizer (the prompt alone has to learn then).")
    readout_lr: float = Field(1e-2, gt=0, le=10, description="Adam learning rate of the learned read-out (verbalizer learned).")
    prompt_optimizer: Literal["adam", "reference"] = Field(
        "adam", description="adam: torch's Adam (betas 0.9/0.999, eps 1e-8) at a constant lr, no clipping (ours: the "
        "setting the short grids' lrs were measured with); reference: the reference trainer's, Adam with betas "
        "(0.9, 0.98) and eps 1e-6, the lr warmed up linearly over the first 0.6 % of the steps then decayed linearly "
        "to 0, gradients clipped to a global norm of 1 (THU-KEG/Skill-Neuron src/trainer.py:27, 87, 115).")
    readout: Literal["prompt", "cls"] = Field(
        "prompt", description="Final hidden state the read-out reads: mean over the prompt positions, or [CLS].")
    verbalizer: Literal["learned", "label_words", "random_words"] = Field(
        "learned", description="learned: a trained linear read-out (lr readout_lr); label_words / "
        "random_words: frozen rows = input embeddings of one word per class (a verbalizer without an MLM head).")
    label_words: tuple[str, ...] | None = Field(
        None, description="verbalizer label_words: one word per class, in label-id order; None = the task's label names.")
    word_seed: int | None = Field(
        None, ge=0, description="verbalizer random_words: seed of the random words; None = the run's seed.")
    noise_std: float = Field(0.1, ge=0, description="Std of the Gaussian noise of the perturbation check (paper: 0.1).")
    prune_fraction: float | None = Field(
        0.02, gt=0, le=1, description="Neuron pruning (paper: 0.02): keep this fraction of the FFN neurons of each "
        "layer in the upper three quarters (reference: layers 3-11 of 12; MiniLM: 2-5), the skill neurons, fold the "
        "others' mean activation into the output bias, slice the matrices (experiments/interventions/ffn_prune.py) and report "
        "pruned_<metric>; None = no pruning.")
    prune_baseline: Literal["prompt", "tokens"] = Field(
        "prompt", description="The mean a pruned neuron is replaced by: prompt = its mean over the training set at "
        "the prompt positions, averaged over them (the reference's train_avg.mean(1)); tokens = its mean over every "
        "token of the training sentences, prompt included (a pruned neuron is gone at every position).")
    prune_fold: Literal["removed", "all"] = Field(
        "removed", description="Which means are folded into the output bias: removed = the removed neurons' (their "
        "exact replacement); all = every neuron's, the kept ones' too, as the reference prune.py does (it adds the "
        "kept neurons' means on top of their real activations).")
    recalibrate_bn: bool = Field(
        True, description="Before the pruned copy is evaluated, re-estimate the read-out's standardisation (its "
        "parameter-free BatchNorm) on the pruned backbone: the mean and unbiased variance of the read-out's input over "
        "the first 256 training examples (RECALIBRATE_EXAMPLES) (forward only, no label read, no weight trained); false = keep the "
        "unpruned model's running statistics (VERSION 2). The reference has no such statistics (it reads a masked-LM "
        "head through a verbalizer) and retrains the prompt on the pruned model (README: train.py --model_type "
        "RobertaPrunePrompt); measured on MiniLM SST-2 (PARITY.md): 0.71 pruned accuracy with it, 0.50 without.")
    perturb_fractions: Fractions = Field(
        (0.01, 0.02, 0.05, 0.1), min_length=1,
        description="Fractions f perturbed: the top max(1, int(f*I)) skill neurons of each layer (reference finfo) vs "
        "as many random neurons of each layer.")

    @field_validator("label_words")
    @classmethod
    def _words(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (len(value) < 2 or any(not w.strip() for w in value)):
            raise ValueError(f"one non-empty word per class (at least 2), got {list(value)}")
        return value


def prompt_lr(own: SkillNeuronsConfig) -> float:
    """The soft prompt's learning rate: ``lr``, else 1e-3 with the learned read-out, 1e-2 with a frozen verbalizer."""
    if own.lr is not None:
        return own.lr
    return 1e-3 if own.verbalizer == "learned" else 1e-2


REFERENCE_ADAM = {"betas": (0.9, 0.98), "eps": 1e-6}
"""``prompt_optimizer: reference``: the reference's ``Adam(..., eps=1e-6, betas=(0.9, 0.98))`` (trainer.py:27)."""
REFERENCE_WARMUP = 0.006
"""... its ``get_linear_schedule_with_warmup(num_warmup_steps=t_total*0.006)`` (trainer.py:87) ..."""
REFERENCE_CLIP = 1.0
"""... and ``clip_grad_norm_(self.model.parameters(), max_grad_norm)``, max_grad_norm 1 (trainer.py:66, 115)."""


def prompt_groups(own: SkillNeuronsConfig) -> list[opt.Group]:
    """What trains (experiments/training/optimisers.py): the prompt, and with ``verbalizer: learned`` the read-out."""
    trained = ("prompt",) if own.verbalizer != "learned" else ("prompt", "read-out")
    if own.prompt_optimizer == "reference":
        schedule, clip, adam_keys = opt.linear(REFERENCE_WARMUP), opt.clipped(REFERENCE_CLIP, trained), REFERENCE_ADAM
    else:
        schedule, clip, adam_keys = opt.CONSTANT, opt.clipped(None, ()), {"betas": opt.BETAS, "eps": opt.EPS}
    lrs = {"prompt": prompt_lr(own), "read-out": own.readout_lr}
    return [opt.Group(name, "Adam", lrs[name], 0.0, schedule, clip, **adam_keys) for name in trained]


# ------------------------------------------------------------------------------ the prompted model


class SoftPrompt(nn.Module):
    """``weight`` (n, E): the soft prompt, in the input-embedding space."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())


class PromptedEncoder(nn.Module):
    """The backbone with the prompt after the first token; a view for ``loop.evaluate`` and
    ``forward_logits`` (not part of the run state: backbone and prompt are)."""

    def __init__(self, backbone: nn.Module, prompt: SoftPrompt):
        super().__init__()
        self.backbone, self.prompt = backbone, prompt

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        embeds = self.backbone.get_input_embeddings()(input_ids)  # (B, T, E)
        batch, n = input_ids.shape[0], self.prompt.weight.shape[0]
        prompt = self.prompt.weight.unsqueeze(0).expand(batch, -1, -1)
        embeds = torch.cat([embeds[:, :1], prompt, embeds[:, 1:]], dim=1)  # (B, 1 + n + T - 1, E)
        mask = torch.cat([attention_mask[:, :1], attention_mask.new_ones(batch, n), attention_mask[:, 1:]], dim=1)
        return self.backbone(inputs_embeds=embeds, attention_mask=mask)


class Readout(nn.Module):
    """Class logits from one final hidden state: [CLS]'s or the prompt positions' mean, standardised
    per dimension (a BatchNorm without parameters: batch statistics while training, running
    averages at evaluation), then a learned linear layer or frozen word-embedding rows (a
    verbalizer without an MLM head). The standardising matters: across sentences a frozen
    MiniLM's state at the prompt varies ~0.05 per dimension around a mean of norm ~3.6, so a
    plain linear read-out at lr 1e-3 is still at chance after 64 steps (measured on SST-2)."""

    def __init__(self, position: str, prompt_length: int, hidden_size: int, num_labels: int,
                 words: torch.Tensor | None = None):
        super().__init__()
        self.position, self.prompt_length = position, prompt_length
        self.norm = nn.BatchNorm1d(hidden_size, affine=False)
        if words is None:
            self.linear = nn.Linear(hidden_size, num_labels)
        else:
            self.linear = None
            self.register_buffer("words", words.detach().clone())  # (C, E), frozen

    def state(self, hidden: torch.Tensor) -> torch.Tensor:
        """The state it standardises: hidden (B, 1 + n + T - 1, Hd) -> (B, Hd)."""
        return hidden[:, 0] if self.position == "cls" else hidden[:, 1 : 1 + self.prompt_length].mean(dim=1)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # hidden (B, 1 + n + T - 1, Hd) -> logits (B, C)
        h = self.state(hidden)
        if self.training and h.shape[0] == 1:  # one example has no batch statistics: use the running ones
            h = nn.functional.batch_norm(h, self.norm.running_mean, self.norm.running_var, training=False)
        else:
            h = self.norm(h)
        return self.linear(h) if self.linear is not None else h @ self.words.T


RECALIBRATE_EXAMPLES = 256
"""Training examples ``recalibrate`` reads (``recalibrate_bn``; PARITY.md measured with 256)."""


@torch.no_grad()
def recalibrate(readout: Readout, model: nn.Module, state: RunState, n: int = RECALIBRATE_EXAMPLES) -> None:
    """Set ``readout``'s running statistics to the mean and unbiased variance of its input state over the
    first ``n`` training examples through ``model`` (e.g. a pruned copy): what a BatchNorm with
    ``momentum=None`` records over them in one batch. Forward only, in eval mode; no label is read."""
    model.eval()
    states = []
    for ids, mask, _ in batches(state.data.train, state.cfg.train.batch_size, state.device,
                                min(n, len(state.data.train))):
        with state.autocast():
            states.append(readout.state(model(ids, mask).last_hidden_state).float())
    h = torch.cat(states)  # (n, Hd)
    norm = readout.norm
    norm.running_mean.copy_(h.mean(dim=0))
    norm.running_var.copy_(h.var(dim=0, unbiased=True) if len(h) > 1 else torch.ones_like(norm.running_var))


def _vocabulary_words(tokenizer) -> torch.Tensor:
    """Ids of whole alphabetic words of the vocabulary (no sub-word pieces, no special tokens)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for token, i in tokenizer.get_vocab().items()
           if i not in special and not token.startswith("##") and token.lstrip("\u0120\u2581").isalpha()
           and not token.startswith("[")]
    return torch.tensor(sorted(ids))


def _word_rows(cfg, state: RunState, tokenizer, words: torch.Tensor) -> tuple[torch.Tensor | None, list[str]]:
    """The frozen verbalizer rows (C, E) and their words, or (None, []) for a learned read-out."""
    own, num_labels = cfg.section, state.data.num_labels
    if own.verbalizer == "learned":
        return None, []
    if own.verbalizer == "label_words":
        chosen = list(own.label_words or state.data.label_names)
        if len(chosen) != num_labels:
            raise ValueError(f"skill_neurons.label_words: {len(chosen)} words for {num_labels} classes")
    else:
        seed = cfg.seed if own.word_seed is None else own.word_seed
        pick = torch.randperm(len(words), generator=generator(seed, "label_words"))[:num_labels]
        chosen = tokenizer.convert_ids_to_tokens(words[pick].tolist())
    table = state.encoder.get_input_embeddings().weight.detach()
    rows = []
    for word in chosen:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"skill_neurons.label_words: '{word}' has no token in the vocabulary of {cfg.model}")
        row = table[ids].mean(dim=0)
        rows.append(row / row.norm())
    return torch.stack(rows).cpu(), [str(w) for w in chosen]


def build(cfg, ctx: RunContext) -> tuple[RunState, PromptedEncoder, torch.optim.Optimizer]:
    """The run's state with the backbone frozen, the soft prompt (``interventions["prompt"]``,
    from random vocabulary words: 'prompt' stream) and the read-out (``decoders["task"]``,
    'decoder' stream), the prompted model over them, and the Adam optimiser of what trains
    (``prompt_groups``); with ``prompt_optimizer: reference`` its schedule is ``state.schedulers["prompt"]``
    over the run's steps."""
    own = cfg.section
    state = set_up(cfg, ctx)
    backbone = state.encoder.requires_grad_(False)
    tokenizer = load_tokenizer(cfg.model)
    vocab = _vocabulary_words(tokenizer)
    table = backbone.get_input_embeddings().weight.detach()
    pick = torch.randperm(len(vocab), generator=generator(cfg.seed, "prompt"))[: own.prompt_length]
    prompt = SoftPrompt(table[vocab[pick].to(table.device)]).to(ctx.device)
    words, word_names = _word_rows(cfg, state, tokenizer, vocab)
    with torch.random.fork_rng(devices=[]):  # the 'decoder' stream, as every task decoder
        torch.manual_seed(derive_seed(cfg.seed, "decoder"))
        readout = Readout(own.readout, own.prompt_length, backbone.config.hidden_size, state.data.num_labels, words)
    state.decoders["task"], state.interventions["prompt"] = readout.to(ctx.device), prompt
    state.values["label_words"] = word_names
    modules = {"prompt": prompt, "read-out": readout}
    planned = prompt_groups(own)
    optimizer = adam([{"params": list(modules[group.params].parameters()), "lr": group.lr} for group in planned],
                     betas=planned[0].betas, eps=planned[0].eps)
    state.optimizers["prompt"] = optimizer
    if own.prompt_optimizer == "reference":
        tc = cfg.train
        total = num_steps(len(state.data.train), tc.batch_size, tc.epochs, tc.max_steps)
        state.schedulers["prompt"] = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: linear_warmup_decay(s, total, REFERENCE_WARMUP))
    return state, PromptedEncoder(backbone, prompt), optimizer


def trained_parameters(state: RunState) -> list[nn.Parameter]:
    """What the prompt's optimiser steps (the prompt, and a learned read-out): ``prompt_optimizer: reference`` clips
    their gradients."""
    return [p for group in state.optimizers["prompt"].param_groups for p in group["params"]]


# ------------------------------------------------------------------------------ its skill neurons


@torch.no_grad()
def find_skill_neurons(model: PromptedEncoder, state: RunState) -> dict[str, torch.Tensor]:
    """Each binary subtask's baseline over its training examples, its correct counts on its dev
    examples, predictivity (eval mode; activations at the prompt positions only, reduced batch by
    batch). Also ``train_mean`` (P, L, I): the mean over the whole training set (pruning's baseline)."""
    n, num_labels = model.prompt.weight.shape[0], state.data.num_labels
    positions = torch.arange(1, 1 + n, device=state.device)
    batch_size = state.cfg.train.batch_size
    train, dev = state.data.train, state.data.dev
    sub_train = subtask_labels(train.labels, num_labels).to(state.device)  # (S, N_train)
    sub_dev = subtask_labels(dev.labels, num_labels).to(state.device)  # (S, N_dev)
    with capture_ffn(model.backbone, positions) as capture:
        sums, total = None, None
        for (ids, mask, _), labels in zip(batches(train, batch_size, state.device), sub_train.split(batch_size, dim=1),
                                          strict=True):
            with state.autocast():  # train.precision
                model(ids, mask)
            acts = capture.take().to(torch.float64)  # (B, P, L, I)
            part = subtask_sums(acts, labels)  # (S, P, L, I)
            sums = part if sums is None else sums + part
            total = acts.sum(dim=0) if total is None else total + acts.sum(dim=0)
        sizes = (sub_train >= 0).sum(dim=1).to(torch.float64).clamp(min=1)  # (S,)
        baselines = sums / sizes.view(-1, 1, 1, 1)  # (S, P, L, I)
        correct = None
        for (ids, mask, _), labels in zip(batches(dev, batch_size, state.device), sub_dev.split(batch_size, dim=1),
                                          strict=True):
            with state.autocast():
                model(ids, mask)
            found = correct_counts(capture.take(), baselines, labels)
            correct = found if correct is None else correct + found
    per_subtask, best_position = neuron_predictivity(correct.cpu(), (sub_dev >= 0).sum(dim=1).cpu())
    return {"per_subtask": per_subtask, "best_position": best_position, "score": combined_score(per_subtask),
            "baseline": baselines.cpu(), "train_mean": (total / len(train)).cpu()}


def noisy_accuracy(model: PromptedEncoder, state: RunState, neurons: dict[int, torch.Tensor], std: float) -> float:
    """Dev accuracy with ``N(0, std^2)`` on those neurons (one draw per sequence, at every position);
    the noise stream ('perturb_noise') starts afresh each call, so two neuron sets see the same draws."""
    noise = torch.Generator(device=state.device).manual_seed(derive_seed(state.cfg.seed, "perturb_noise"))
    with perturb_neurons(model.backbone, neurons, std, noise):
        model.eval()
        metrics = evaluate(model, state.decoder, state.data.dev, state.task, state.cfg.train.batch_size,
                           state.device, state.precision)
    return float(metrics["accuracy"])


def perturbation_check(model: PromptedEncoder, state: RunState, per_subtask: torch.Tensor,
                       fractions: tuple[float, ...], std: float) -> dict[str, list]:
    """Accuracy with noise on the skill neurons at each fraction (``skill_neuron_mask`` of
    ``per_subtask``: the top of each layer) and on as many random ones per layer."""
    inner = per_subtask.shape[-1]
    choose = generator(state.cfg.seed, "perturb_neurons")
    out: dict[str, list] = {"fractions": list(fractions), "k": [], "accuracy_top": [], "accuracy_random": [],
                            "selected": []}
    for f in fractions:
        mask = skill_neuron_mask(per_subtask, f)
        top = by_layer(mask)
        out["k"].append(int(mask.sum()))
        out["selected"].append(mask)
        out["accuracy_top"].append(noisy_accuracy(model, state, top, std))
        out["accuracy_random"].append(noisy_accuracy(model, state, random_like(top, inner, choose), std))
    return out
