"""What a method's code reads of a run config, recorded on a real tiny run (issue 43).

:func:`consulted` runs a config's stages for real (``run_chain``'s way, weights handed on in
memory), then the method's ``stages(section)`` and ``run(cfg, ctx)`` on a recording proxy of the
config: every ``train.*`` key, ``model`` and key of the method's own section its code consults is
noted (a property of the section, ``train.head_lr``, counts as the keys it reads). Validation
(``check``) is left out: a key read only to refuse a value changes no run.
"""

from __future__ import annotations

import copy
from typing import Any

from base.sections import TrainConfig

MODEL = "tiny-bert"
TINY_TASK = {"name": "synthetic-cls", "num_train": 32, "num_eval": 16, "max_length": 16}
TINY_TRAIN = {"max_steps": 2, "batch_size": 8, "eval_every": 2}

CASES: dict[str, dict[str, Any]] = {
    "head_gates": {},
    "finetune": {},
    "bias_only": {"task": {**TINY_TASK, "name": "synthetic-shortcut"}, "bias_only": {"steps": 4},
                  "train": {"eval_every": 2}},  # the only train key it reads
    "mask_train": {},
    "imp": {},
    "multitask": {"multitask": {"tasks": [{**TINY_TASK, "name": "synthetic-tag"}]}},
    "skill_neurons": {"skill_neurons": {"prompt_length": 2, "perturb_fractions": [0.1]}},
    "prompt_transfer": {"prompt_transfer": {"source_task": "synthetic-shortcut", "perturb_fractions": [0.1],
                                            "skill_neurons": {"prompt_length": 2, "perturb_fractions": [0.1]}}},
    "probes": {"probes": {"fit_sentences": 12, "score_sentences": 6, "max_length": 24, "top_labels": 1},
               "train": {}},  # it trains nothing
    "attention_analysis": {"attention_analysis": {"sentences": 6, "max_length": 24, "relations": ["nsubj"],
                                                  "eval_examples": 8}},
    "head_importance": {"head_importance": {"examples": 8}},
    "head_ablation": {"head_ablation": {"examples": 8}},
}
"""A tiny valid run of each method (on ``MODEL``, ``TINY_TASK``, ``TINY_TRAIN`` unless it says)."""


def tiny(method: str, pipeline: str | None = None, **extra: Any) -> dict[str, Any]:
    """The raw tiny config of ``method`` (its ``pipeline`` when given), ``extra`` sections merged on top."""
    raw = {"model": MODEL, "method": method, "task": dict(TINY_TASK), "train": dict(TINY_TRAIN)}
    raw |= copy.deepcopy(CASES.get(method, {}))
    if pipeline is not None:
        raw[method] = {**raw.get(method, {}), "pipeline": pipeline}
    for section, keys in extra.items():
        raw[section] = {**raw.get(section, {}), **keys} if isinstance(keys, dict) else keys
    return raw


class Recording:
    """A section that notes each of its keys the code consults (``prefix.key``, as users write it)."""

    def __init__(self, section, prefix: str, seen: set[str]):
        object.__setattr__(self, "_section", section)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        cls = type(self._section)
        attribute = getattr(cls, name, None)
        if isinstance(attribute, property):  # train.head_lr: the keys the property reads
            return attribute.fget(self)
        field = cls.model_fields.get(name)
        if field is not None:
            self._seen.add(f"{self._prefix}.{field.alias or name}")
        return getattr(self._section, name)

    def model_dump(self, *args, **kwargs):  # every key, as mask_train's labels read them
        self._seen.update(f"{self._prefix}.{field.alias or name}" for name, field in type(self._section).model_fields.items())
        return self._section.model_dump(*args, **kwargs)

    def __hash__(self):
        return hash(self._section)

    def __eq__(self, other):
        return self._section == getattr(other, "_section", other)


class RecordingRun:
    """A run config whose ``train``, ``model`` and method section note what the code consults."""

    def __init__(self, cfg, seen: set[str]):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "seen", seen)
        object.__setattr__(self, "train", Recording(cfg.train, "train", seen))
        section = Recording(cfg.section, cfg.method, seen)
        object.__setattr__(self, "section", section)
        object.__setattr__(self, cfg.method, section)

    @property
    def model(self) -> str:
        self.seen.add("model")
        return self._cfg.model

    def __getattr__(self, name):
        return getattr(self._cfg, name)

    def __hash__(self):
        return hash(self._cfg)

    def __eq__(self, other):
        return self._cfg == getattr(other, "_cfg", other)


def consulted(cfg) -> set[str]:
    """The keys (``train.lr``, ``model``, ``head_gates.lambda``) that a real run of ``cfg`` reads:
    its method's ``stages`` and ``run`` on a recording proxy of ``cfg``, after its stages (no Ray, no
    tracker), each recorded the same way; a ``train.*`` key a stage reads counts for ``cfg`` where
    the stage inherits it (its own section does not set it)."""
    import torch

    from experiments import RunContext
    from experiments.methods import METHODS
    from experiments.training.tracking import MemoryTracker
    from orchestrator.registry.stages import with_upstreams

    torch.set_num_threads(1)
    chain, _ = with_upstreams([cfg])
    store: dict[str, dict] = {}
    seen: dict[str, set[str]] = {}
    for key, step in chain.items():
        module, recording = METHODS[step.method], RecordingRun(step, seen.setdefault(key, set()))
        if hasattr(module, "stages"):
            module.stages(recording.section)
        ctx = RunContext(tracker=MemoryTracker(), load_upstream=lambda role, step=step: store[step.upstreams[role].run_key],
                         save_weights=lambda weights, key=key: store.__setitem__(key, weights))
        module.run(recording, ctx)
    return _with_stages(cfg, seen)


def _with_stages(cfg, seen: dict[str, set[str]]) -> set[str]:
    read = set(seen[cfg.run_key])
    for role, upstream in cfg.upstreams.items():
        own = (getattr(cfg, role) or {}).get("train") or {}
        read |= {key for key in _with_stages(upstream, seen) if key.startswith("train.") and key[6:] not in own}
    return read


TRAIN_KEYS = tuple(TrainConfig.model_fields)


def parse_without_unread_train(raw: dict):
    """``parse_config(raw)``, less the shared train keys its method does not read (refused, issue 43):
    for tests that give every method one train section."""
    from experiments.harness.config import UnreadKey, parse_config

    while True:
        try:
            return parse_config(raw)
        except UnreadKey as err:
            if not err.key.startswith("train.") or err.key[6:] not in raw["train"]:
                raise
            del raw["train"][err.key[6:]]
