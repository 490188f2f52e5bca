"""Recipe parity of the optimisers (issue 44 item 1): every paper recipe (examples/papers/*.yaml), each
parameter group's optimiser, learning rate, weight decay, Adam betas and eps, lr schedule and gradient
clip, against the reference code's (``Ref``: values written from the reference's code, file:line in each).

Each recipe is expanded by the grid expansion a sweep uses (``grid.expand``) with a tiny model, a few
examples and 1,000 steps (``SETS``); every run of it that trains (its cells and the stages they start
from) runs its method's own ``run`` up to its first optimiser step, where ``loop.update`` hands over the
real torch objects: the optimisers (param groups), the schedulers (their multiplier at every step) and
the parameters it clips and the norm. Nothing trains. Per group the test checks:

- the torch objects against the reference's values; a schedule step by step, our warm-up one step
  ahead of the references' (their first step runs at lr 0: ``get_linear_schedule_with_warmup``,
  BertAdam's ``warmup_linear``; ours never does, ``maths.schedules.linear_warmup_decay``);
- the groups the method declares (``optimisers(cfg)``, what ``--dry-run`` prints) against the same
  torch objects;
- where headsweep differs on purpose or cannot follow (``DIFFERENCES``), that it does differ, as written.

Run with ``-s`` to see the table (also in PARITY.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from experiments import RunContext, parse_config, run
from experiments.maths.schedules import linear_warmup_decay
from experiments.methods import METHODS
from experiments.training import optimisers as opt
from orchestrator.driving.grid import expand, load_grid

PAPERS = Path(__file__).resolve().parents[2] / "examples" / "papers"
STEPS = 1000
SETS = ["task.max_train=24", "task.max_eval=8", "task.max_length=24", f"train.max_steps={STEPS}"]
"""What each recipe runs here instead of its scale: the schedules depend only on the number of steps."""
TINY = {"wang_2022": "tiny-roberta"}
"""The tiny model standing in for each recipe's hub model (tiny-bert where not named)."""
ROLES = {"encoder": "encoder", "decoders.task": "decoder", "interventions.gates": "gates",
         "interventions.prompt": "prompt", "interventions.masks": "scores"}
"""Which declared group (experiments/training/optimisers.py ``PARAMS``) a module of the run state trains."""


# --------------------------------------------------------------------------- the references' schedules

Schedule = Callable[[int], list[float]]
"""total steps -> the reference's lr multiplier at each of OUR steps (its own at s + 1 during its warm-up)."""


def _ahead(lam: Callable[[int], float], warmup: float, total: int) -> list[float]:
    """Ours warms up one step ahead: our step s is the reference's s + 1 while it warms up."""
    return [lam(s + 1) if s < warmup else lam(s) for s in range(total)]


def hf_linear(warmup: float) -> Schedule:
    """transformers' get_linear_schedule_with_warmup (the real function), warm-up ``warmup * total`` steps."""
    def multipliers(total: int) -> list[float]:
        dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        lam = get_linear_schedule_with_warmup(dummy, warmup * total, total).lr_lambdas[0]
        return _ahead(lam, warmup * total, total)
    return multipliers


def bert_adam_linear(warmup: float) -> Schedule:
    """dark-secrets-of-BERT pytorch_pretrained_bert/optimization.py:39-44 (warmup_linear) at progress
    ``state['step'] / t_total`` (:156-159)."""
    def lam(s: int, total: int) -> float:
        x = s / total
        return x / warmup if x < warmup else max((x - 1.0) / (warmup - 1.0), 0)
    return lambda total: _ahead(functools.partial(lam, total=total), warmup * total, total)


def paul_squared(warmup: float) -> Schedule:
    """pmichel31415/pytorch-pretrained-BERT@paul: examples/classifier_training.py:13-16 (warmup_linear:
    x / w, then 1 - x), applied twice: :69-71 and :217-221 set each group's lr to lr * s(step / t_total)
    every step, and BertAdam (optimization.py:159-162, t_total given at classifier_training.py:61-66)
    multiplies it by s again."""
    def lam(s: int, total: int) -> float:
        x = s / total
        scale = x / warmup if x < warmup else 1.0 - x
        return scale * scale
    return lambda total: _ahead(functools.partial(lam, total=total), warmup * total, total)


def constant(total: int) -> list[float]:
    return [1.0] * total


def imp_rounds(rounds: int, round_fraction: float, retrain_warmup: float | None) -> Schedule:
    """llyx97/sparse-and-robust-PLM hg_transformers/trainer_imp.py:431-433: at every pruning, every
    ``t_total / 10`` steps, a new AdamW and get_linear_schedule_with_warmup(warmup_steps, t_total), the
    pruning scripts without --warmup_steps (training_args.py:78: 0); with rewinding the subnetwork then
    retrains in a new run (scripts/imp/lt/retrain: --warmup_steps, a whole train section)."""
    def multipliers(total: int) -> list[float]:
        phase = STEPS
        period = round(round_fraction * phase)
        pruning = [(phase - s % period) / phase for s in range((rounds - 1) * period)]
        last = hf_linear(retrain_warmup)(phase) if retrain_warmup is not None else [
            (phase - s) / phase for s in range(period)]
        return (pruning + last)[:total]
    return multipliers


# --------------------------------------------------------------------------- the references' groups


@dataclass(frozen=True)
class Ref:
    """One parameter group of a reference script, written from its code (``cite``)."""

    optimizer: str  # the torch class that computes its update (transformers' AdamW is torch's), or its own
    lr: float
    weight_decay: tuple[float, float]  # (matrices, biases and LayerNorm weights)
    betas: tuple[float, float]
    eps: float
    schedule: Schedule
    schedule_text: str
    clip: str  # opt.clipped(max norm, whose gradients share it), or how it clips when not one global norm
    cite: str


HE_CHOI_MODEL = dict(
    optimizer="AdamW", weight_decay=(0.0, 0.0), betas=(0.9, 0.999), eps=1e-8, schedule=hf_linear(0.1),
    schedule_text=opt.linear(0.1), clip=opt.clipped(1.0, ("encoder", "decoder", "gates")),
    cite="emorynlp/stem-cell-hypothesis: elit/components/mtl/gated/gated_mtl.py:34-35 (fit: adam_epsilon 1e-8, "
         "weight_decay 0.0, warmup_steps 0.1; pos.py and dep.py leave them), multi_task_learning.py:211, 223-260 "
         "(AdamW over the decoder at the task's lr and the encoder at encoder_lr, no_decay groups, "
         "get_linear_schedule_with_warmup(0.1 * steps, steps)), :412-413 and elit/utils/torch_util.py:166-169 "
         "(grad_norm: one norm over every trainable parameter, the gates' log_a too); pos.py:87 grad_norm=1")
HE_CHOI = {
    "encoder": Ref(lr=1e-5, **HE_CHOI_MODEL | {"cite": "pos.py:86 encoder_lr=1e-5; gated_mtl.py:196-198 (the gates "
                                                       "left out of its group); " + HE_CHOI_MODEL["cite"]}),
    "decoder": Ref(lr=1e-3, **HE_CHOI_MODEL | {"cite": "pos.py:38 and dep.py:62 (the task's lr=1e-3); "
                                                       + HE_CHOI_MODEL["cite"]}),
    "gates": Ref("Adam", 1e-3, (0.0, 0.0), (0.9, 0.999), 1e-8, constant, opt.CONSTANT, HE_CHOI_MODEL["clip"],
                 "gated_mtl.py:40 (gates_lr=0.001), :181-183 (torch.optim.Adam over the log_a, torch's betas and "
                 "eps), :185-186 (no gates_warm_up: no scheduler); the clip of multi_task_learning.py:412-413"),
}
WANG = {
    "prompt": Ref("Adam", 1e-3, (0.0, 0.0), (0.9, 0.98), 1e-6, hf_linear(0.006), opt.linear(0.006),
                  "1 (prompt + the frozen backbone's gradients)",
                  "THU-KEG/Skill-Neuron src/trainer.py:26-27 (Adam(model.optimize_parameters(), lr, eps=1e-6, "
                  "betas=(0.9, 0.98))), src/modelzoo.py:113-114 (the prompt, weight_decay 0.0), src/train.py:27 "
                  "(lr 1e-3), trainer.py:87 (get_linear_schedule_with_warmup(t_total * 0.006, t_total)), :66 and "
                  ":115 (clip_grad_norm_(self.model.parameters(), 1): the backbone is never frozen, "
                  "modelzoo.py:221, so its gradients count too)"),
}
BERT_ADAM = dict(optimizer="BertAdam", betas=(0.9, 0.999), eps=1e-6, clip="1 (each parameter tensor alone)")
KOVALEVA_CITE = ("text-machine-lab/dark-secrets-of-BERT examples/run_classifier.py:621-633 (lr 5e-5, warm-up "
                 "0.1), :790-796 (no_decay groups 0.01 / 0.0 over every parameter), :814-817 (BertAdam(lr, warmup, "
                 "t_total)); pytorch_pretrained_bert/optimization.py:67-69 (e 1e-6, max_grad_norm 1.0), :137-138 "
                 "(each tensor clipped alone), :39-44 and :156-159 (warmup_linear), :175-178 (no bias correction)")
KOVALEVA = {part: Ref(lr=5e-5, weight_decay=(0.01, 0.0), schedule=bert_adam_linear(0.1), schedule_text=opt.linear(0.1),
                      cite=KOVALEVA_CITE, **BERT_ADAM) for part in ("encoder", "decoder")}
MICHEL_CITE = ("pmichel31415/pytorch-pretrained-BERT@paul examples/run_classifier.py:282-309 (no_decay groups "
               "0.01 / 0.0 over every parameter, prepare_bert_adam(lr)), experiments/prepare_task.sh (--learning_rate "
               "2e-5); examples/classifier_training.py:13-16, 61-71, 217-221; pytorch_pretrained_bert/optimization.py:"
               "64-66 (e 1e-6, max_grad_norm 1.0), :139-140 (each tensor clipped alone), :159-162, :171-174 (no bias "
               "correction)")
MICHEL = {part: Ref(lr=2e-5, weight_decay=(0.01, 0.0), schedule=paul_squared(0.1),
                    schedule_text="(x / 0.1, then 1 - x) squared", cite=MICHEL_CITE, **BERT_ADAM)
          for part in ("encoder", "decoder")}
LIU_CITE = ("llyx97/sparse-and-robust-PLM hg_transformers/training_args.py:68-71 (lr 5e-5, weight_decay 0.0, "
            "adam_epsilon 1e-8, max_grad_norm 1.0), trainer_imp.py:312-328 and mask_trainer.py:342-356 (AdamW over "
            "no_decay groups, get_linear_schedule_with_warmup(warmup_steps, steps)), trainer_imp.py:681 and "
            "mask_trainer.py:614-618 (one global clip, mask_run_glue.py:191-193)")
LIU_FINETUNE_WARMUP = 3600 / 36_816  # scripts/full_bert/std_train/mnli.sh:3-5: 3 epochs of MNLI, --warmup_steps 3600
LIU_5_EPOCHS_WARMUP = 3600 / 61_360  # scripts/mask_train/mask_on_plm_pt/std/mnli/0.5.sh:3-7, imp/lt/retrain/std/mnli


def _liu(params: str, warmup: float | Schedule, text: str, together: Sequence[str]) -> Ref:
    schedule = hf_linear(warmup) if isinstance(warmup, float) else warmup
    return Ref("AdamW", 5e-5, (0.0, 0.0), (0.9, 0.999), 1e-8, schedule, text, opt.clipped(1.0, together), LIU_CITE)


LIU_IMP_TEXT = "rounds of 0.1 of the steps, each a decay's start, no warm-up"
LIU_FINETUNE_TEXT, LIU_5_EPOCHS_TEXT = opt.linear(round(LIU_FINETUNE_WARMUP, 3)), opt.linear(round(LIU_5_EPOCHS_WARMUP, 3))
LIU = {
    "finetune": {p: _liu(p, LIU_FINETUNE_WARMUP, LIU_FINETUNE_TEXT, ("encoder", "decoder")) for p in ("encoder", "decoder")},
    "mask_train prune_only": {"scores": _liu("scores", LIU_5_EPOCHS_WARMUP, LIU_5_EPOCHS_TEXT, ("scores",))},
    "mask_train ft_then_prune": {"scores": _liu("scores", LIU_5_EPOCHS_WARMUP, LIU_5_EPOCHS_TEXT, ("scores",))},
    "mask_train prune_then_ft": {p: _liu(p, LIU_5_EPOCHS_WARMUP, LIU_5_EPOCHS_TEXT, ("encoder", "decoder"))
                                 for p in ("encoder", "decoder")},
    "imp ft_then_prune": {p: _liu(p, imp_rounds(5, 0.1, None), LIU_IMP_TEXT, ("encoder", "decoder"))
                          for p in ("encoder", "decoder")},
    "imp prune_then_ft": {p: _liu(p, imp_rounds(5, 0.1, LIU_5_EPOCHS_WARMUP), f"{LIU_IMP_TEXT}; retraining "
                                  f"{LIU_5_EPOCHS_TEXT}", ("encoder", "decoder")) for p in ("encoder", "decoder")},
}

REFERENCES: dict[str, dict[str, dict[str, Ref]]] = {
    "he_choi_2021": {"head_gates dp": HE_CHOI},
    "wang_2022": {"skill_neurons": WANG},
    "kovaleva_2019": {"finetune": KOVALEVA},
    "michel_2019": {"finetune": MICHEL},
    "liu_2022": LIU,
}
"""Per recipe, per run that trains ("method pipeline"), per parameter group: the reference's."""

BERT_ADAM_DIFFERENCES = {
    "optimizer": "BertAdam (no bias correction) is torch's bias-corrected AdamW",
    "eps": "BertAdam's 1e-6, torch's 1e-8",
    "clip": "BertAdam clips each tensor alone; ours one global norm",
}
LIU_WARMUP = ("the warm-up is per data set in the reference (MNLI: 3,600 steps, 0.098 of the 3-epoch fine-tune, 0.059 "
              "of 5-epoch mask training and retraining; no SST-2 script); the recipe's one train section has 0.1")
DIFFERENCES: dict[tuple[str, str, str], str] = {
    ("wang_2022", "skill_neurons", "clip"): (
        "the reference's norm counts the frozen backbone's gradients (it keeps requires_grad, only the prompt "
        "steps); ours the prompt's: the backbone's weight gradients only for a norm would cost a third more a step"),
    **{("kovaleva_2019", "finetune", field): why for field, why in BERT_ADAM_DIFFERENCES.items()},
    **{("michel_2019", "finetune", field): why for field, why in BERT_ADAM_DIFFERENCES.items()},
    ("michel_2019", "finetune", "schedule"): (
        "the paul branch applies its schedule twice (lr * s^2, down to 0.81 lr after the warm-up); ours linear"),
    **{("liu_2022", who, "schedule"): LIU_WARMUP for who in LIU if who != "imp ft_then_prune"},
}
"""(recipe, run, field) where headsweep differs from the reference on purpose or cannot follow it (no key),
as the recipe's header says; the test checks that they differ. Every other field must be equal."""


# --------------------------------------------------------------------------- what a run builds


class _FirstStep(Exception):
    """Raised at a run's first optimiser step: what it built is read, nothing trains."""


@dataclass
class Built:
    """A run's optimisers as ``loop.update`` gets them at its first step, and the run state they train."""

    state: object
    total: int
    optimizers: list
    schedulers: list
    clipped: list
    grad_clip: float | None


def build(cfg, monkeypatch, weights: dict) -> Built:
    """Run ``cfg``'s method to its first optimiser step (its stages first, the same way, their untrained
    weights handed on: only the optimisers are read)."""
    for upstream in cfg.upstreams.values():
        if upstream.run_key not in weights:
            weights[upstream.run_key] = build(upstream, monkeypatch, weights).state.weights()
    module, seen = METHODS[cfg.method], {}
    real_train_steps = module.train_steps

    def train_steps(state, ctx, total, *args, **kwargs):
        seen.update(state=state, total=total)
        return real_train_steps(state, ctx, total, *args, **kwargs)

    def update(loss, optimizer, scheduler=None, params=None, grad_clip=None, scaler=None):
        as_list = lambda x: [] if x is None else list(x) if isinstance(x, Sequence) else [x]  # noqa: E731
        seen.update(optimizers=as_list(optimizer), schedulers=as_list(scheduler), clipped=params or [],
                    grad_clip=grad_clip)
        raise _FirstStep

    with monkeypatch.context() as patch:
        patch.setattr(module, "train_steps", train_steps)
        patch.setattr(module, "update", update)
        with pytest.raises(_FirstStep):
            run(cfg, RunContext(load_upstream=lambda role: weights[cfg.upstreams[role].run_key]))
    return Built(**seen)


def built_groups(built: Built, method: str) -> dict[str, dict]:
    """Per trained group (``ROLES``), its settings as the torch objects hold them; every parameter of a
    group must agree (weight decay separately for matrices and 1-D parameters)."""
    where = {id(p): (o, i) for o in built.optimizers for i, g in enumerate(o.param_groups) for p in g["params"]}
    schedules = {id(s.optimizer): s for s in built.schedulers}
    trainable = {name: p for prefix, module in built.state.modules().items()
                 for name, p in module.named_parameters(prefix=prefix) if p.requires_grad}
    clipped = {id(p) for p in built.clipped}
    role_of = {id(p): _role(name, method) for name, p in trainable.items()}
    together = {role_of[i] for i in clipped if i in role_of}
    groups: dict[str, dict] = {}
    for name, p in trainable.items():
        assert id(p) in where, f"{name} is trainable but in no optimiser"
        optimizer, index = where[id(p)]
        group, scheduler = optimizer.param_groups[index], schedules.get(id(optimizer))
        lam = scheduler.lr_lambdas[index] if scheduler else (lambda s: 1.0)
        found = {
            "optimizer": type(optimizer).__name__, "lr": group.get("initial_lr", group["lr"]),
            "betas": tuple(group["betas"]), "eps": group["eps"],
            "schedule": tuple(lam(s) for s in range(built.total)),
            "clip": opt.clipped(built.grad_clip if id(p) in clipped else None, together),
        }
        kind = "weight_decay_matrices" if p.dim() >= 2 else "weight_decay_1d"
        entry = groups.setdefault(role_of[id(p)], dict(found))
        for key, value in found.items():
            assert entry[key] == value, f"{name}: {key} {value} where the rest of its group has {entry[key]}"
        assert entry.setdefault(kind, group["weight_decay"]) == group["weight_decay"], name
    return groups


def _role(name: str, method: str) -> str:
    prefix = next(p for p in sorted(ROLES, key=len, reverse=True) if name.startswith(p + "."))
    role = ROLES[prefix]
    return "read-out" if role == "decoder" and method == "skill_neurons" else role


# --------------------------------------------------------------------------- the recipes


def recipe_runs(recipe: str) -> dict[str, object]:
    """Every run of the recipe that trains, cells and stages, one config per "method pipeline" (the
    groups are the same for each seed and task: ``test_every_run_of_a_recipe_declares_the_same_groups``)."""
    sets = [*SETS, f"model={TINY.get(recipe, 'tiny-bert')}"]
    pending, found = list(expand(load_grid(PAPERS / f"{recipe}.yaml", sets))), {}
    while pending:
        cfg = pending.pop(0)
        pending.extend(cfg.upstreams.values())
        if getattr(METHODS[cfg.method], "optimisers", None) is not None:
            pipeline = cfg.labels().get("pipeline")
            found.setdefault(cfg.method + (f" {pipeline}" if pipeline else ""), []).append(cfg)
    return found


FIELDS = ("optimizer", "lr", "weight decay", "betas", "eps", "schedule", "clip")


def _fields(ours: dict, declared: opt.Group, ref: Ref, total: int) -> dict[str, tuple[object, object, bool]]:
    """Per field: (ours, the reference's, equal). A schedule is equal when every step's multiplier is."""
    worst = max(abs(a - b) for a, b in zip(ours["schedule"], ref.schedule(total), strict=True))
    mine = {"optimizer": ours["optimizer"], "lr": ours["lr"],
            "weight decay": (ours.get("weight_decay_matrices", 0.0), ours.get("weight_decay_1d", 0.0)),
            "betas": ours["betas"], "eps": ours["eps"],
            "schedule": declared.schedule + ("" if worst < 1e-9 else f" (max |diff| {worst:.3f})"),
            "clip": ours["clip"]}
    theirs = {"optimizer": ref.optimizer, "lr": ref.lr, "weight decay": ref.weight_decay, "betas": ref.betas,
              "eps": ref.eps, "schedule": ref.schedule_text, "clip": ref.clip}
    return {field: (mine[field], theirs[field], mine[field] == theirs[field]) for field in FIELDS}


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(f"{v:g}" for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("recipe", list(REFERENCES))
def test_recipe_optimisers_are_the_references(recipe, monkeypatch):
    runs, weights, lines, mismatches = recipe_runs(recipe), {}, [], []
    assert set(runs) == set(REFERENCES[recipe]), f"{recipe}: runs that train {sorted(runs)}"
    for who, refs in REFERENCES[recipe].items():
        cfg = runs[who][0]
        built = build(cfg, monkeypatch, weights)
        ours = built_groups(built, cfg.method)
        declared = {group.params: group for group in METHODS[cfg.method].optimisers(cfg)}
        assert set(ours) == set(refs) == set(declared), f"{recipe} {who}: groups {sorted(ours)}, declared " \
                                                        f"{sorted(declared)}, reference {sorted(refs)}"
        for part, ref in refs.items():
            _check_declared(declared[part], ours[part], f"{recipe} {who} {part}")
            fields = _fields(ours[part], declared[part], ref, built.total)
            lines.append(f"{recipe} / {who} / {part}  ({ref.cite[:90]}...)")
            lines.append("  ours       " + " | ".join(_shown(mine) for mine, _, _ in fields.values()))
            lines.append("  reference  " + " | ".join(_shown(theirs) for _, theirs, _ in fields.values()))
            for field, (mine, theirs, same) in fields.items():
                why = DIFFERENCES.get((recipe, who, field))
                if why and not same:
                    lines.append(f"  differs: {field}: {why}")
                elif same == bool(why):  # equal where a difference is written down, or an unexplained difference
                    mismatches.append(f"{recipe} {who} {part} {field}: ours {_shown(mine)}, reference "
                                      f"{_shown(theirs)}" + (f" (written down as differing: {why})" if why else ""))
    print("\n" + "\n".join(lines))
    assert not mismatches, "\n".join(mismatches)


def _check_declared(declared: opt.Group, ours: dict, where: str) -> None:
    """The declared group (``--dry-run``'s row) is what the run built."""
    assert (declared.optimizer, declared.lr, declared.betas, declared.eps, declared.clip) == (
        ours["optimizer"], ours["lr"], ours["betas"], ours["eps"], ours["clip"]), where
    assert ours.get("weight_decay_matrices", declared.weight_decay) == declared.weight_decay, where
    assert ours.get("weight_decay_1d", 0.0) == (declared.weight_decay if declared.decay_1d else 0.0), where


@pytest.mark.parametrize("recipe", list(REFERENCES))
def test_every_run_of_a_recipe_declares_the_same_groups(recipe):
    """One check per "method pipeline" stands for its runs: their seeds and tasks declare the same groups."""
    for who, configs in recipe_runs(recipe).items():
        declared = {tuple(METHODS[cfg.method].optimisers(cfg)) for cfg in configs}
        assert len(declared) == 1, f"{recipe} {who}: {declared}"


@pytest.mark.parametrize(("method", "keys"), [("skill_neurons", {"prompt_optimizer": "reference", "prompt_length": 2,
                                                                  "perturb_fractions": [0.1], "prune_fraction": None}),
                                              ("head_gates", {"clip_gates": True})])
def test_the_reference_keys_train_to_the_end(method, keys, run_chain, monkeypatch):
    """The keys the recipes set, in a whole tiny run: every step's lr follows the schedule the
    first step showed (the scheduler steps), and the clip takes the groups it names."""
    module, seen = METHODS[method], []
    real_update = module.update

    def update(loss, optimizer, scheduler=None, params=None, grad_clip=None, scaler=None):
        first = optimizer[0] if isinstance(optimizer, Sequence) else optimizer
        seen.append((first.param_groups[0]["lr"], first.param_groups[0].get("initial_lr"), len(params or []),
                     grad_clip))
        return real_update(loss, optimizer, scheduler, params, grad_clip, scaler)

    monkeypatch.setattr(module, "update", update)
    raw = {"model": "tiny-bert", "method": method, "task": {"name": "synthetic-cls", "num_train": 32, "num_eval": 16,
           "max_length": 16}, "train": {"max_steps": 10, "batch_size": 8, "eval_every": 10}, method: keys}
    cfg = parse_config(raw)
    result, _ = run_chain(cfg)
    assert result.steps == 10 and len(seen) == 10
    declared = {group.params: group for group in module.optimisers(cfg)}
    first = declared["prompt" if method == "skill_neurons" else "encoder"]
    warmup = 0.006 if method == "skill_neurons" else cfg.train.warmup_ratio
    assert [lr for lr, _, _, _ in seen] == pytest.approx([first.lr * linear_warmup_decay(s, 10, warmup)
                                                          for s in range(10)])
    assert {clip for _, _, _, clip in seen} == {1.0}
    if method == "head_gates":  # encoder, decoder and the gates' one tensor
        state_params = {n for n, _ in _tiny_params(cfg)}
        assert {count for _, _, count, _ in seen} == {len(state_params) + 1}


def _tiny_params(cfg):
    from experiments.models import load_backbone
    from experiments.tasks import TASKS
    from experiments.training.state import build_decoder

    encoder, _ = load_backbone(cfg.model, 0)
    decoder = build_decoder(TASKS[cfg.task.name], encoder.config.hidden_size, 2, 0)
    return [*encoder.named_parameters(prefix="encoder"), *decoder.named_parameters(prefix="decoder")]
