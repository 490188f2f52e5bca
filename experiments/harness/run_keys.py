"""Run keys that survive growth: hash what a run reads, nothing else (DESIGN.md decision 1).

``run_key`` = hash of the method's name, the seed, and every other key of the
shared sections and of the run's own method section that is not at its default
(as flat dotted keys), plus the versions that say what the defaults and the code
mean, plus the task's data fingerprint. So:

- adding a key with a default (to any section) or adding a method keeps every
  existing key: the registry still finds the runs it already has;
- another method's section never enters a run's key (``finetune`` does not hash
  ``head_gates.lambda``);
- changing a default's value changes what an omitted key means: it needs a
  VERSION bump (``CONFIG_VERSION`` for the shared sections, the method's
  ``VERSION`` for its section), which tests/experiments/test_config.py enforces
  against tests/experiments/config_defaults.json;
- a changed data file is a different run (the task's ``fingerprint``), and the same files
  moved to another folder are the same run (paths are left out when there is a fingerprint);
- a method that reads more tasks than ``task`` (``extra_tasks``: multitask) adds each one's
  name, VERSION and fingerprint (its paths stay in the method's section, so there they count).

``group_key`` is the same hash without the seed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from base.sections import (
    CONFIG_VERSION,
    STAGE_ROLES,
    SharedConfig,
    TaskConfig,
    flatten,
)
from experiments.methods import METHODS
from experiments.tasks import TASKS


def run_and_group_key(cfg: SharedConfig) -> tuple[str, str]:
    """(run_key, group_key), 16 hex each.

    A run with stages hashes its upstreams' keys, not how the stage was written: the run key
    holds each upstream's run key, the group key each upstream's group key (so the seeds of a
    cell, each starting from its own seed's fine-tune, still share a group)."""
    material = cfg._key_material  # cached on the config; never changed here
    upstreams = cfg.upstreams
    group = {**material, "config": {k: v for k, v in material["config"].items() if k != "seed"}}
    if upstreams:
        group["stages"] = {role: up.group_key for role, up in upstreams.items()}
    return _run_key(material, cfg.seed, upstreams), _hash(group)


def reseeded_keys(cfg: SharedConfig, seed: int, upstreams: dict[str, SharedConfig]) -> tuple[str, str]:
    """The keys of ``cfg`` with ``seed`` (and those ``upstreams``), from ``cfg``'s key material:
    only the run key is hashed again, the group key is the same."""
    return _run_key(cfg._key_material, seed, upstreams), cfg.group_key


def _run_key(material: dict[str, Any], seed: int, upstreams: dict[str, SharedConfig]) -> str:
    keyed = {**material, "config": {**material["config"], "seed": seed}}
    if upstreams:
        keyed["stages"] = {role: up.run_key for role, up in upstreams.items()}
    return _hash(keyed)


def key_material(cfg: SharedConfig) -> dict[str, Any]:
    """What a run key hashes: what the run reads, and nothing else (see the module docstring)."""
    defaults = _defaults(type(cfg))
    config = {k: v for k, v in flatten(cfg.to_dict()).items()
              if (k not in defaults or defaults[k] != v) and k.split(".", 1)[0] not in STAGE_ROLES}
    material: dict[str, Any] = {
        "method": cfg.method,
        "config": config | {"seed": cfg.seed},  # the seed always: a run key is never its group's key
        "versions": {"config": CONFIG_VERSION, "task": TASKS[cfg.task.name].VERSION,
                     "method": METHODS[cfg.method].VERSION},
    }
    extra = extra_tasks(cfg)
    if extra:  # a method that reads more tasks (multitask): their code and data version its runs too
        material["tasks"] = {key: {"name": task.name, "version": TASKS[task.name].VERSION,
                                   "data": task_fingerprint(task)} for key, task in extra.items()}
    data = task_fingerprint(cfg.task)
    if data is not None:
        material["data"] = data
        # the content hash (file roles included) stands for the files: where they sit does not
        # change the run, so the same data under another folder or on another machine keeps its keys
        material["config"] = {k: v for k, v in material["config"].items() if not _is_path_key(k)}
    return material


def extra_tasks(cfg: SharedConfig) -> dict[str, TaskConfig]:
    """The task sections a run reads besides ``task``, by dotted key (``multitask.tasks.0``): its
    method's ``extra_tasks(section)``, or none."""

    extra = getattr(METHODS[cfg.method], "extra_tasks", None)
    return extra(cfg.section) if extra is not None else {}


_PATH_KEYS = ("task.data_dir", "task.train", "task.dev", "task.eval_sets")


def _is_path_key(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in _PATH_KEYS)


@lru_cache(maxsize=64)
def _defaults(cls: type) -> dict[str, Any]:
    """{dotted key: default} of a run config class, as ``to_dict`` writes them (JSON values)."""
    return flatten(cls.model_validate({}).to_dict())


def _hash(material: dict[str, Any]) -> str:
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_fingerprints: dict[Any, str | None] | None = None


@contextmanager
def fingerprints_memoised() -> Iterator[None]:
    """Hash each distinct task's data once while many configs are keyed (a grid of 10,000
    cells reads its files once, not per cell); outside it every key reads the files anew."""
    global _fingerprints
    outer = _fingerprints
    _fingerprints = {} if outer is None else outer
    try:
        yield
    finally:
        _fingerprints = outer


def task_fingerprint(task: TaskConfig) -> str | None:
    """The task's data content hash, or None for a task without files (or without ``fingerprint``)."""

    fingerprint = getattr(TASKS[task.name], "fingerprint", None)
    if fingerprint is None:
        return None
    if _fingerprints is None:
        return fingerprint(task)
    if task not in _fingerprints:
        _fingerprints[task] = fingerprint(task)
    return _fingerprints[task]
