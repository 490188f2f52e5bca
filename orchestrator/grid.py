"""The grid: a YAML spec of axes over a base config, expanded into validated RunConfigs.

A grid file::

    name: stem-cells            # the sweep family (MLflow experiment name)
    base:                       # a partial run config, nested like RunConfig
      method: head_gates
      train: {max_steps: 200}
    axes:                       # dotted keys (or `task`, `lambda`); first axis varies slowest
      task: [synthetic-cls, sst2]
      lambda: [0.01, 0.1]
      seed: [0, 1, 2]
    exclude:                    # drop product cells matching every key/value of an entry
      - {task: sst2, gates.lambda: 0.1}
    include:                    # extra cells merged onto base (dotted or nested keys)
      - {task: ud-pos, seed: 0, train: {lr: 1.0e-4}}
    resources: {cpus: 1, gpus: 0.25}
    max_concurrent: 8
    max_failures: 1

:func:`load_grid` / :func:`parse_grid` check the spec's shape and keys;
:func:`expand` validates every cell like ``headsweep run`` would, so a typo in a
10,000-run grid fails at submit, naming the cell and its axis values.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from experiments.config import (
    ConfigError,
    RunConfig,
    check_data,
    flatten,
    parse_config,
    read_yaml,
    suggest,
    valid_keys,
)

SHORTHANDS = {"task": "task.name", "lambda": "gates.lambda"}
"""Axis (and include/exclude) keys that stand for a longer dotted key."""


class Resources(BaseModel):
    """What one trial asks Ray for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(1.0, gt=0, description="CPUs per trial (fractions allowed).")
    gpus: float = Field(0.0, ge=0, description="GPUs per trial (fractions allowed, e.g. 0.25).")


class GridSpec(BaseModel):
    """A validated grid file; axes, include and exclude hold canonical dotted keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_-]+$", description="Sweep family, the MLflow experiment name.")
    base: dict[str, Any] = Field(default_factory=dict, description="Partial run config under every cell.")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Dotted key -> values.")
    include: list[dict[str, Any]] = Field(default_factory=list, description="Extra cells onto base.")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Product cells to drop.")
    resources: Resources = Field(default_factory=Resources, description="Per-trial Ray resources.")
    max_concurrent: int | None = Field(None, gt=0, description="Trials at once; None = as many as fit.")
    max_failures: int = Field(1, ge=0, description="Retries of a failing trial.")

    def cell_count(self) -> int:
        """Cells of the full product (before exclude and include)."""
        count = 1
        for values in self.axes.values():
            count *= len(values)
        return count


# --------------------------------------------------------------------------- loading


def load_grid(path: str | Path) -> GridSpec:
    """Read and validate a grid file; ConfigError names the file (and the line for bad YAML)."""
    data = read_yaml(path)
    try:
        return parse_grid(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def parse_grid(data: Any) -> GridSpec:
    """Validate a grid mapping into a GridSpec with canonical dotted keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"a grid must be a mapping of keys, got {type(data).__name__}")
    try:
        spec = GridSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    base = _assign_all({}, _canonical_keys("base", spec.base))
    axes = _canonical_keys("axes", spec.axes)
    for key, values in axes.items():
        if not values:
            raise ConfigError(f"axes.{key}: empty list (an axis needs at least one value)")
    include = [_canonical_keys(f"include[{i}]", entry) for i, entry in enumerate(spec.include)]
    exclude = [_canonical_keys(f"exclude[{i}]", entry) for i, entry in enumerate(spec.exclude)]
    return spec.model_copy(update={"base": base, "axes": axes, "include": include, "exclude": exclude})


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden" and len(first["loc"]) == 1:
        return f"unknown key '{loc}'{suggest(loc, list(GridSpec.model_fields))}"
    if first["type"] == "extra_forbidden":
        key = str(first["loc"][-1])
        return f"resources: unknown key '{key}'{suggest(key, list(Resources.model_fields))}"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{loc}: {first['msg']} (got {first.get('input')!r}){more}"


def _config_keys() -> tuple[frozenset[str], list[str]]:
    keys = valid_keys()
    return frozenset(keys), keys + list(SHORTHANDS)


def _check_key(where: str, key: str) -> str:
    """The canonical dotted key for ``key``, or ConfigError with the nearest valid one."""
    key = SHORTHANDS.get(key, key)
    known, choices = _config_keys()
    if key in known:
        return key
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in choices if k.rsplit(".", 1)[-1] == leaf]  # right key, wrong section
    hint = f"; did you mean '{same_leaf[0]}'?" if same_leaf else suggest(key, choices)
    raise ConfigError(f"{where}: unknown key '{key}'{hint}")


def _canonical_keys(where: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten nested sections, expand shorthands, reject unknown and repeated keys."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for raw_key, value in flatten(dict(entry)).items():
        key = _check_key(where, raw_key)
        if key in out:
            raise ConfigError(f"{where}: '{written[key]}' and '{raw_key}' are the same key '{key}'")
        out[key], written[key] = value, raw_key
    return out


# --------------------------------------------------------------------------- expansion


def expand(spec: GridSpec) -> list[RunConfig]:
    """Every distinct cell as a validated RunConfig, in grid order (product, then includes).

    Each cell is checked like ``parse_config(cell, check_files=False)``; the
    task's data is checked once per distinct (task.name, task.data_dir).
    Cells with the same config (hence the same run_key) are kept once.
    """
    validate = _CellValidator()
    configs: dict[RunConfig, None] = {}  # frozen configs hash by value: dedup == same run_key
    data_checked: set[tuple[str, str | None]] = set()
    with gc_paused():
        for index, (prefix, values, cell) in enumerate(_cells(spec)):
            try:
                cfg = validate(cell)
                if (cfg.task.name, cfg.task.data_dir) not in data_checked:
                    check_data(cfg)
                    data_checked.add((cfg.task.name, cfg.task.data_dir))
            except ConfigError as err:
                raise ConfigError(f"cell {index} ({prefix}{_label(values)}): {err}") from None
            configs.setdefault(cfg)
    return list(configs)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small objects.

    Measured: expanding 10,000 cells takes about half the time without the
    collector's repeated passes over the growing set of live configs
    (nothing built here forms reference cycles).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _cells(spec: GridSpec) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label prefix, its dotted values, raw nested config) of every product cell not
    excluded, then of every include."""
    keys = list(spec.axes)
    excludes = _live_excludes(spec)
    for combo in itertools.product(*spec.axes.values()):
        values = dict(zip(keys, combo, strict=True))
        if any(all(_same(values[k], v) for k, v in entry.items()) for entry in excludes):
            continue
        yield "", values, _assign_all(spec.base, values)
    for i, entry in enumerate(spec.include):
        yield f"include[{i}]: ", entry, _assign_all(spec.base, entry)


def _live_excludes(spec: GridSpec) -> list[dict[str, Any]]:
    """Exclude entries reduced to their axis keys; entries the base already rules out are dropped.

    A key that is not an axis is compared with the base's value (or the
    config's default when the base leaves it unset).
    """
    fixed = {**flatten(RunConfig().to_dict()), **flatten(spec.base)}
    live = []
    for entry in spec.exclude:
        if all(_same(fixed.get(k), v) for k, v in entry.items() if k not in spec.axes):
            live.append({k: v for k, v in entry.items() if k in spec.axes})
    return live


def _same(a: Any, b: Any) -> bool:
    """Equal values, without YAML's ``true`` matching ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _label(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in values.items())


def _assign_all(base: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with each dotted key set, copying only the dicts on the way (base is shared)."""
    root = dict(base)
    copied: set[tuple[str, ...]] = set()
    for key, value in values.items():
        *parents, last = key.split(".")
        node = root
        for depth, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"'{key}': '{part}' is a value, not a section")
            path = tuple(parents[: depth + 1])
            if path not in copied:
                child = dict(child)
                node[part] = child
                copied.add(path)
            node = child
        node[last] = value
    return root


class _CellValidator:
    """``parse_config(cell, check_files=False)`` with the name checks cached.

    Valid cells take the fast path: the method's default pipeline is filled
    in before pydantic sees the cell (a ``model_copy`` afterwards costs more
    than the validation), then the names are looked up in a cache. A cell
    that fails is re-run through ``parse_config``, so its message is exactly
    the one ``headsweep run`` would print.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[Any, ...], ConfigError | None] = {}

    def __call__(self, cell: dict[str, Any]) -> RunConfig:
        try:
            cfg = RunConfig.model_validate(self._with_pipeline(cell))
            self._check_names(cfg)
        except (ValidationError, ConfigError):
            return parse_config(cell, check_files=False)
        return cfg

    @staticmethod
    def _with_pipeline(cell: dict[str, Any]) -> dict[str, Any]:
        from experiments.methods import METHODS

        method = cell.get("method", _DEFAULT_METHOD)
        if cell.get("pipeline") is not None or not isinstance(method, str) or method not in METHODS:
            return cell
        return {**cell, "pipeline": METHODS[method].PIPELINES[0]}  # the method's default

    def _check_names(self, cfg: RunConfig) -> None:
        names = (cfg.task.name, cfg.method, cfg.model, cfg.pipeline)
        if names not in self._names:
            minimal = {"task": {"name": names[0]}, "method": names[1], "model": names[2], "pipeline": names[3]}
            try:
                parse_config(minimal, check_files=False)
                self._names[names] = None
            except ConfigError as err:
                self._names[names] = err
        error = self._names[names]
        if error is not None:
            raise error


_DEFAULT_METHOD = RunConfig.model_fields["method"].default


# --------------------------------------------------------------------------- resources


def check_resources(
    resources: Resources | Mapping[str, float],
    cluster: Mapping[str, float] | Sequence[Mapping[str, float]],
) -> None:
    """Raise ConfigError when no node could ever hold one trial.

    ``cluster`` is one node's totals ``{"CPU": 16, "GPU": 1}`` or a list of
    them (one per node, e.g. from ``ray.nodes()``'s ``Resources``); a trial
    needs ``{"CPU": cpus, "GPU": gpus}`` on a single node.
    """
    if not isinstance(resources, Resources):
        resources = Resources.model_validate(dict(resources))
    nodes = [cluster] if isinstance(cluster, Mapping) else list(cluster)
    need = {"CPU": resources.cpus, "GPU": resources.gpus}
    for node in nodes:
        if all(node.get(name, 0.0) >= amount for name, amount in need.items() if amount > 0):
            return
    have = "; ".join(f"{_fmt(n.get('CPU', 0))} CPU, {_fmt(n.get('GPU', 0))} GPU" for n in nodes) or "no nodes"
    raise ConfigError(
        f"resources: a trial needs {_fmt(need['CPU'])} CPU and {_fmt(need['GPU'])} GPU on one node, "
        f"but no node has that (nodes: {have})"
    )


def _fmt(amount: float) -> str:
    return f"{amount:g}"
