"""Which ``train.*`` keys and keys of its own section each method reads, and the one line for one it does not.

A key that no code of the run reads would still enter the run key (every key set does) and change
nothing else: ``train.grad_clip`` on ``probes``, which trains nothing, would be a second run of
the same probes under another key. So each method module declares ``READS``, the ``train.*`` keys
its own code may read (built from the groups below), and, where a run of it reads less than that
or less than its whole section (a pipeline, a verbalizer), ``unread(section, train)``: the keys
this run does not read, each with why. Validation (``experiments.harness.config.check_run_keys``)
refuses any of them set away from its default, unless a stage of the run inherits it and reads
it (the ``finetune`` stage of ``head_ablation`` reads ``train.lr``). ``model`` is read by every
method. tests/experiments/test_method_reads.py checks each declaration against what the method's
code consults on a real run (issue 43).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from base.sections import TrainConfig

FINE_TUNING = tuple(TrainConfig.model_fields)
"""Every ``train.*`` key: a method that trains the model (its optimiser, schedule, clipping, steps)."""
FORWARDS = ("precision", "pooler")
"""A method that only runs the model forwards (and backwards, for gradients) on its own data."""
BATCHED_FORWARDS = (*FORWARDS, "batch_size")
"""The same in batches of ``train.batch_size``."""


def reads(module: ModuleType) -> tuple[str, ...]:
    """The ``train.*`` keys a method's code may read (``READS``; every key for a method outside
    this package that declares none)."""
    return tuple(getattr(module, "READS", FINE_TUNING))


def unread(module: ModuleType, section, train) -> dict[str, str]:
    """``{key: why}``, the keys a run of ``section`` and ``train`` does not read although the method
    may: its own keys as written (``sp_finetune_steps``) and ``train.*`` keys (``train.lr``)."""
    found = getattr(module, "unread", None)
    return dict(found(section, train)) if found is not None else {}


def readers(key: str, methods: Mapping[str, ModuleType]) -> list[str]:
    """The methods whose ``READS`` has ``train.<key>``, in ``methods`` order."""
    return [name for name, module in methods.items() if key in reads(module)]


def unread_line(key: str, method: str, methods: Mapping[str, ModuleType], why: str | None = None) -> str:
    """``train.grad_clip: the probes method does not read train.grad_clip (it trains nothing); the
    methods head_gates, finetune, ... read it``: the key, the method that ignores it (and why, where
    it reads it in other runs), and which methods read it."""
    line = f"train.{key}: the {method} method does not read train.{key}"
    if why:
        line += f" {why}"
    found = readers(key, methods)
    if not found or found == [method]:
        return line
    who = f"the {found[0]} method reads it" if len(found) == 1 else f"the methods {', '.join(found)} read it"
    return f"{line}; {who}"
