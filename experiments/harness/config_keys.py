"""The key space of a run config: shared keys, each method's section, short names.

A run config nests sections (``train: {lr: 1e-4}``, ``head_gates: {lambda: 0.05}``).
Grids and ``--set`` take dotted keys (``train.lr``, ``head_gates.lambda``,
``task.max_train``), ``task`` for ``task.name``, and the short names a method
declares in ``SHORT_NAMES`` (``lambda``, ``sparsity``, ``pipeline``), which
resolve through the run's own method. Everything here is read off the section
models, so a new method's keys appear in messages, grids and ``headsweep
methods`` without a change here.
"""

from __future__ import annotations

import json
from typing import Any, get_args

from pydantic import BaseModel

from base.naming import suggest
from base.sections import (
    ALIASES,
    DEFAULT_METHOD,
    STAGE_ROLES,
    SharedConfig,
    resolve_key,
    section_value,
)
from experiments.methods import METHODS

SHARED_SECTIONS = ("task", "train")


def _leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key as users write it, its pydantic field) of every leaf key of a section model."""
    leaves = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves.extend(_leaves(annotation, f"{key}."))
        else:
            leaves.append((key, field))
    return leaves


def dotted_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf key of a section model, dotted and as users write them (``lambda``, not ``lambda_``)."""
    return [key for key, _ in _leaves(model, prefix)]


def shared_keys() -> list[str]:
    """``seed``, ``model``, ``method``, ``task.*``, ``train.*``."""
    return dotted_keys(SharedConfig)


def method_keys(method: str) -> list[str]:
    """The dotted keys of a method's own section (``head_gates.lambda``, ...)."""
    return dotted_keys(METHODS[method].Config, f"{method}.")


def short_names(method: str) -> tuple[str, ...]:
    """The keys of its section a method lets grids and ``--set`` write without the section."""
    module = METHODS.get(method)
    return tuple(getattr(module, "SHORT_NAMES", ())) if module is not None else ()


def valid_keys(method: str = DEFAULT_METHOD) -> list[str]:
    """Every dotted key a run of ``method`` accepts: the shared ones, then its section's."""
    return shared_keys() + method_keys(method)


def all_keys() -> list[str]:
    """Every key a grid may name: shared, every method's section, short names, aliases."""
    keys = shared_keys() + [k for m in METHODS for k in method_keys(m)]
    shorts = [s for m in METHODS for s in short_names(m) if s not in keys]
    return keys + list(dict.fromkeys(shorts)) + list(ALIASES)


def owner(key: str) -> str | None:
    """The method whose section a dotted key addresses (``head_gates.lr`` -> head_gates), else None."""
    head = key.split(".", 1)[0]
    return head if head in METHODS else None


def applies(key: str, method: str | None) -> bool:
    """Whether a dotted key belongs in a run of ``method``: shared keys always, a method's
    section only in its own runs, a bare short name only once resolved (never here)."""
    head = owner(key)
    if head is not None:
        return head == method
    return "." in key or key in shared_keys()


def is_short_name(key: str) -> bool:
    return any(key in short_names(m) for m in METHODS)


def is_known(key: str) -> bool:
    """Whether a grid key names something (a shared key, a method's key or short name, an alias,
    or a key inside a stage: ``init_from.train.max_steps``, checked when the stage is resolved)."""
    return key in ALIASES or is_short_name(key) or key in shared_keys() or (
        owner(key) is not None and key in method_keys(owner(key))) or key.split(".", 1)[0] in STAGE_ROLES


def resolve(key: str, method: str) -> str:
    """The dotted key ``key`` stands for in a run of ``method`` (``lambda`` -> ``head_gates.lambda``).

    Aliases and the method's short names are expanded; anything else is returned unchanged
    (a dotted key, or a name validation will report).
    """
    return resolve_key(key, method, short_names(method))


def short_name(key: str, method: str) -> str:
    """The name a run of ``method`` shows for a dotted key: the short name that resolves to it
    (``head_gates.lambda`` -> ``lambda``), else the key itself (``train.lr``)."""
    return next((short for short in short_names(method) if resolve(short, method) == key), key)


def method_labels(method: str, section: BaseModel) -> dict[str, Any]:
    """A run's labels of its own method: its pipeline (None when its section has no ``pipeline``:
    one pipeline) and its short names' values, or what the method's ``labels(section)`` says."""
    module = METHODS[method]
    if hasattr(module, "labels"):
        return module.labels(section)
    return {"pipeline": section_value(section, "pipeline"),
            **{short: section_value(section, short) for short in short_names(method)}}


def owners_of(leaf: str) -> list[str]:
    """The methods whose section has a key ``leaf`` (``lambda`` -> [head_gates])."""
    return [m for m in METHODS if f"{m}.{leaf}" in method_keys(m)]


def unknown_key(key: str, method: str | None = None) -> str:
    """``unknown key 'x'`` and the nearest valid key, or the method that owns a key of that name.

    With ``method`` (a run config, ``--set``) only that run's keys are suggested; without
    (a grid, whose cells may have several methods) every key is.
    """
    sections = [*SHARED_SECTIONS, method] if method else [*SHARED_SECTIONS, *METHODS]
    choices = (valid_keys(method) + list(short_names(method)) if method else all_keys()) + sections
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in choices if k != key and "." in k and k.rsplit(".", 1)[-1] == leaf]
    elsewhere = [m for m in owners_of(leaf) if m != method]
    in_list = _list_item_keys(key)
    if in_list:  # a key of one section of a list of them (multitask.tasks.0.nmae): that section's keys
        hint = suggest(key, in_list)
    elif same_leaf:  # the right key in the wrong place: train.lambda -> head_gates.lambda
        hint = f"; did you mean '{same_leaf[0]}'?"
    elif method and elsewhere:
        hint = f"; '{leaf}' is a key of method '{elsewhere[0]}', not of '{method}'"
    else:
        hint = suggest(key, choices)
    return f"unknown key '{key}'{hint}"


def _list_item_keys(key: str) -> list[str]:
    """The keys beside ``key`` when it sits in one section of a method's list of sections
    (``multitask.tasks.0.nmae`` -> ``multitask.tasks.0.name``, ...), else []."""
    parts = key.split(".")
    module = METHODS.get(parts[0])
    if module is None or len(parts) < 4 or not parts[2].isdigit():
        return []
    field = next((f for name, f in module.Config.model_fields.items() if parts[1] in (name, f.alias)), None)
    items = [a for a in get_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)] if field else []
    return dotted_keys(items[0], ".".join(parts[:3]) + ".") if items else []


def wrong_section(key: str, method: str) -> str | None:
    """The message for another method's section in a run of ``method``, else None."""
    if key in METHODS and key != method:
        return f"section '{key}' belongs to method '{key}', this run's method is '{method}'"
    return None


def describe(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default as JSON, description) of every leaf key of a section model."""
    return [(key, json.dumps(field.get_default(call_default_factory=True)), field.description or "")
            for key, field in _leaves(model, prefix)]


def defaults(model: type[BaseModel]) -> dict[str, Any]:
    """{dotted key: default} of a section model, as JSON values (what a run key leaves out)."""
    return {key: json.loads(default) for key, default, _ in describe(model)}
