"""The methods: one readable file each, a plain dict to find them (no decorator registry).

A method module is the whole of a method (DESIGN.md decision 8); adding one is
one file plus one line here, or one file named in ``HEADSWEEP_METHODS`` (below). It reads like a
recipe over the rooms below it (experiments/components for what several methods share, training,
interventions, maths, tasks) and never imports another method. It exposes:

- ``VERSION``: bump it when its results, or a default of its ``Config``, would change;
- ``PIPELINES``: its pipelines, the first the default (a method with more than one has
  a ``pipeline`` key in its ``Config``, defaulting to the first);
- ``Config``: its own section, a subclass of ``base.sections.Section`` with a default
  and a description per key; a run config holds it under the method's name
  (``method: head_gates`` + ``head_gates: {lambda: 0.05}``);
- ``SHORT_NAMES``: keys of its ``Config`` that grids and ``--set`` may write without the
  section (``lambda`` for ``head_gates.lambda``); with its pipeline they are its runs' labels
  (``RunConfig.labels()``: MLflow tags, the registry's label columns, the dry-run table);
- ``labels(section)`` (optional): its labels when not simply its short names' values (multitask:
  no lambda when it trains no gates);
- ``OUTPUTS`` (optional for methods outside this package, every built-in one has it): what its runs
  report, an ``base.outputs.Outputs`` of the maps and metrics declared there (names,
  meanings, companions, patterns); the method builds its maps and metric names from them, and analysis
  reads the declarations instead of typed names;
- ``PROGRESS`` (optional): ``{name of a step value: how to say it}``, what ``headsweep run``'s
  progress bar shows beside the loss (head_gates: ``{"open_heads": "open heads"}``); absent = none;
- ``run(cfg, ctx) -> RunResult``, reading its keys from ``cfg.section``;
- ``REFERENCE`` (optional): ``{key of its Config: value}``, the keys whose default is NOT the
  paper's reference code's protocol (headsweep keeps a sounder choice there), each with the value
  that restores the reference; absent = every default follows the reference code. ``headsweep
  methods`` prints them as the ``--set`` that reproduces the paper (PARITY.md);
- ``NAME`` (optional, for methods outside this package): its name in ``METHODS``;
- ``stages(section)`` (optional): the upstream runs it starts from by default (head_gates' SP);
- ``optimisers(cfg)`` (optional; the methods of the paper recipes have it): each parameter group it
  trains, as ``experiments.training.optimisers.Group`` (lr, weight decay, schedule, clip, betas, eps), from
  the config alone: what ``headsweep run/submit --dry-run`` print (tests/experiments/test_recipe_optimisers.py
  checks them against the torch objects the run builds);
- ``check(cfg)`` (optional): more validation of a whole run config, at submit (raises
  ``ConfigError`` naming the key; bias_only: the task must define bias features);
- ``BIAS_MODEL = True`` (optional): its runs hand on a bias model (experiments/components/bias.py), so
  they may fill a ``bias_model`` stage (bias_only);
- ``extra_tasks(section)`` (optional): the task sections its runs read besides ``task``, by
  dotted key (multitask: ``{"multitask.tasks.0": TaskConfig}``): their data is checked at
  submit like ``task``'s, their VERSION and data fingerprint enter the run key.

Validation, "did you mean", ``--set``, grid axes and ``headsweep methods`` read these,
so nothing else changes when a method is added.

Precision (``train.precision``, experiments/training/precision.py): a method runs its forwards through
``loop.forward_logits`` / ``loop.evaluate`` with ``precision=``, ``state.autocast()`` or
``probing.sentence_maps(precision=)``, and its optimiser steps through ``loop.update(...,
scaler=state.scaler)``; tests/experiments/test_precision.py checks every method's forwards.

Methods outside this package: name their modules in the environment variable
``HEADSWEEP_METHODS`` (comma-separated import paths, importable where headsweep runs,
e.g. through ``PYTHONPATH``)::

    HEADSWEEP_METHODS=mylab.methods.probe,my_method headsweep methods

Each is imported when this package is, checked like the built-in ones, and added to
``METHODS`` under its ``NAME`` attribute, else the last part of its dotted path
(``probe``, ``my_method``). Ray workers import this package afresh: they must see the
same variable and modules (a local Ray started by a process that has both passes them
on; on a cluster, set them on every node). A module that cannot be imported, fails the
checks or reuses a method's name is a one-line ``ConfigError`` naming the variable and
the module.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from experiments.methods import (
    attention_analysis,
    bias_only,
    finetune,
    head_ablation,
    head_gates,
    head_importance,
    imp,
    mask_train,
    multitask,
    probes,
    prompt_transfer,
    skill_neurons,
)

METHODS: dict[str, ModuleType] = {
    "head_gates": head_gates,
    "finetune": finetune,
    "bias_only": bias_only,  # not "bias_model": that is the stage role, a reserved key
    "mask_train": mask_train,
    "imp": imp,
    "multitask": multitask,
    "skill_neurons": skill_neurons,
    "prompt_transfer": prompt_transfer,
    "probes": probes,
    "attention_analysis": attention_analysis,
    "head_importance": head_importance,
    "head_ablation": head_ablation,
}

_RESERVED = ("seed", "model", "method", "task", "train", "init_from", "teacher", "bias_model", "source")
"""Top-level keys of every run config: neither a method's name nor a short name may be one."""


def check_method(name: str, module: ModuleType) -> None:
    """Raise TypeError naming what a method module lacks (a programming error, found at first use)."""
    from pydantic import BaseModel

    from base.outputs import Outputs

    def fail(what: str) -> None:
        raise TypeError(f"method '{name}' ({module.__name__}): {what}")

    if not name.isidentifier() or name in _RESERVED:
        fail(f"a method's name must be an identifier other than {', '.join(_RESERVED)}")
    for attr in ("VERSION", "PIPELINES", "Config", "run"):
        if not hasattr(module, attr):
            fail(f"has no {attr} (a method module exposes VERSION, PIPELINES, Config, SHORT_NAMES and run)")
    if not isinstance(module.VERSION, str) or not module.PIPELINES:
        fail("VERSION must be a string and PIPELINES a non-empty tuple")
    config = module.Config
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        fail("Config must be a pydantic model (subclass base.sections.Section)")
    if config.model_config.get("extra") != "forbid" or not config.model_config.get("frozen"):
        fail("Config must be frozen and forbid unknown keys (subclass base.sections.Section)")
    keys = {field.alias or key: field for key, field in config.model_fields.items()}
    for short in getattr(module, "SHORT_NAMES", ()):
        if short not in keys or short in _RESERVED:
            fail(f"short name '{short}' must be a key of its Config and not one of {', '.join(_RESERVED)}")
    if not isinstance(getattr(module, "OUTPUTS", Outputs()), Outputs):
        fail("OUTPUTS must be an base.outputs.Outputs (the maps and metrics its runs report)")
    progress = getattr(module, "PROGRESS", {})
    if not (isinstance(progress, dict) and all(isinstance(v, str) for v in (*progress, *progress.values()))):
        fail("PROGRESS must be a dict {name of a step value: how the progress bar says it}")
    reference = getattr(module, "REFERENCE", {})
    for key, value in reference.items():
        if key not in keys:
            fail(f"REFERENCE names '{key}', not a key of its Config")
        try:
            config.model_validate({key: value})
        except Exception as err:  # noqa: BLE001 (pydantic's error says which value)
            fail(f"REFERENCE value {value!r} of '{key}' is not a valid value: {err}")
        if config.model_validate({key: value}) == config():
            fail(f"REFERENCE value of '{key}' is its default: list only keys whose default differs")
    if len(module.PIPELINES) > 1 and ("pipeline" not in keys or keys["pipeline"].default != module.PIPELINES[0]):
        fail(f"with several pipelines, Config needs a key 'pipeline' defaulting to '{module.PIPELINES[0]}'")


ENV_VAR = "HEADSWEEP_METHODS"
"""Comma-separated import paths of method modules outside this package."""


def from_env(environ: dict[str, str] | None = None) -> dict[str, ModuleType]:
    """The method modules named in ``HEADSWEEP_METHODS``, by method name, imported and checked.

    Raises ``ConfigError`` (one line, naming the variable and the module) when one cannot
    be imported, fails ``check_method``, or takes a name already used.
    """
    from base.sections import ConfigError

    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    found: dict[str, ModuleType] = {}
    for path in (p.strip() for p in value.split(",")):
        if not path:
            continue

        def fail(what: str, path: str = path) -> ConfigError:
            return ConfigError(f"{ENV_VAR}: module '{path}' {' '.join(what.split())}")

        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as err:
            if err.name is not None and (path == err.name or path.startswith(err.name + ".")):
                raise fail(f"cannot be imported: no module named '{err.name}' (is its folder on PYTHONPATH?)") from err
            raise fail(f"cannot be imported: {type(err).__name__}: {err}") from err
        except Exception as err:  # its own code failed: a syntax error, a failed import inside it, ...
            raise fail(f"cannot be imported: {type(err).__name__}: {err}") from err
        name = getattr(module, "NAME", path.rsplit(".", 1)[-1])
        if not isinstance(name, str):
            raise fail(f"has NAME {name!r}, which is not a string")
        owner = METHODS.get(name) or found.get(name)
        if owner is module:  # listed twice, or a built-in one: nothing to add
            continue
        if owner is not None:
            raise fail(f"is method '{name}', a name {owner.__name__} already has (set NAME in it to another)")
        try:
            check_method(name, module)
        except TypeError as err:
            raise fail(f"is not a method module: {err}") from err
        found[name] = module
    return found


METHODS.update(from_env())
