"""The grid: a YAML spec of axes over a base config, expanded into validated RunConfigs.

A grid file::

    name: stem-cells            # the sweep family (MLflow experiment name)
    base:                       # a partial run config, nested like a run config
      method: head_gates
      train: {max_steps: 200}
      head_gates: {lr: 0.05}
    axes:                       # any key; first axis varies slowest
      task: [synthetic-cls, sst2]
      lambda: [0.01, 0.1]
      seed: [0, 1, 2]
    exclude:                    # drop product cells matching every key/value of an entry
      - {task: sst2, lambda: 0.1}
    include:                    # extra cells merged onto base (dotted or nested keys);
      - {task: ud-pos, seed: 0, train: {lr: 1.0e-4}}
      - {task: sst2, seed: [0, 1, 2]}   # a list: one cell per value (a product within the entry)
    description: what the sweep asks   # the sweep's MLflow parent run: its description
    tags: {paper: stem-cells}          # ... and its tags
    resources: {cpus: 1, gpus: 0.25}
    max_concurrent: 8
    max_failures: 1

Keys (in base, axes, include and exclude) are the dotted keys of a run config
(``seed``, ``train.lr``, ``task.max_train``, ``head_gates.lr``), ``task`` for
``task.name``, and the short names a method declares (``lambda``,
``sparsity``, ``pipeline`` of head_gates), which resolve through each cell's
own method.

Several methods in one grid: a method's keys (its section, its short names)
apply to the cells of that method only. With ``method: [head_gates,
finetune]`` and ``lambda: [0.01, 0.1]``, the head_gates cells vary lambda and
the finetune cells do not: their cells that become equal are one run. A key
that applies to no cell at all is an error, and so is an include that sets a
key its own method does not have.

:func:`load_grid` / :func:`parse_grid` check the spec's shape and keys;
:func:`expand` validates every cell with ``parse_config`` (the path ``headsweep
run`` takes), so a typo in a 10,000-run grid fails at submit, naming the cell
and its axis values.
"""

from __future__ import annotations

import collections.abc
import itertools
import json
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from base.naming import suggest
from base.sections import (
    DEFAULT_METHOD,
    ConfigError,
    TaskConfig,
    flatten,
    parse_yaml,
    read_yaml,
)
from experiments.harness import config_keys as keys
from experiments.harness.config import (
    RunConfig,
    UnreadKey,
    check_data,
    check_names,
    config_class,
    parse_config,
    with_stages,
)
from experiments.harness.run_keys import fingerprints_memoised
from experiments.tasks import TASKS
from experiments.tasks.reads import unread_line
from orchestrator.registry.db import gc_paused


class Resources(BaseModel):
    """What one trial asks Ray for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(1.0, gt=0, description="CPUs per trial (fractions allowed).")
    gpus: float = Field(0.0, ge=0, description="GPUs per trial (fractions allowed, e.g. 0.25).")


RESERVED_TAGS = ("sweep", "grid")
"""Tags headsweep sets on a sweep's MLflow parent run itself (``tracking.parent_tags``); ``mlflow.*`` too."""


class GridSpec(BaseModel):
    """A validated grid file; base, axes, include and exclude hold flat grid keys
    (dotted keys, ``task.name`` for ``task``, and short names as written)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_-]+$", description="Sweep family, the MLflow experiment name.")
    base: dict[str, Any] = Field(default_factory=dict, description="Partial run config under every cell.")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Key -> values.")
    include: list[dict[str, Any]] = Field(default_factory=list, description="Extra cells onto base.")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Product cells to drop.")
    resources: Resources = Field(default_factory=Resources, description="Per-trial Ray resources.")
    max_concurrent: int | None = Field(None, gt=0, description="Trials at once; None = as many as fit.")
    max_failures: int = Field(1, ge=0, description="Retries of a failing trial.")
    description: str = Field("", description="What the sweep asks: its MLflow parent run's description.")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags of its MLflow parent run.")

    def cell_count(self) -> int:
        """Cells of the full product (before exclude and include)."""
        count = 1
        for values in self.axes.values():
            count *= len(values)
        return count


# --------------------------------------------------------------------------- loading


def load_grid(path: str | Path, sets: Sequence[str] = ()) -> GridSpec:
    """Read and validate a grid file, with ``--set`` overrides (:func:`with_sets`); ConfigError
    names the file (and the line for bad YAML)."""
    data = read_yaml(path)
    try:
        return with_sets(parse_grid(data), sets)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def grid_text(path: str | Path, sets: Sequence[str] = ()) -> str:
    """The grid a sweep records: the file's text, or with ``--set`` the grid they make (YAML that
    expands to the same runs), headed by the command line's overrides."""
    text = Path(path).read_text()
    if not sets:
        return text
    spec = load_grid(path, sets).model_dump(exclude_defaults=False)
    header = f"# {Path(path).name} with " + " ".join(f"--set {item}" for item in sets) + "\n"
    return header + yaml.safe_dump(spec, sort_keys=False)


def with_sets(spec: GridSpec, sets: Sequence[str]) -> GridSpec:
    """``spec`` with ``--set key=value`` overrides, Hydra's multirun habit: ``key=v1,v2`` (values
    read as YAML, split at commas outside brackets) makes ``key`` an axis of those values, in place
    of the axis or base value it had; ``key=v`` sets ``key`` in base (and drops its axis). Keys are
    a grid's keys (dotted, ``task``, a method's short names); an unknown one fails as in a grid."""
    base, axes = dict(spec.base), dict(spec.axes)
    for item in sets:
        raw_key, sep, raw = item.partition("=")
        if not sep or not raw_key.strip():
            raise ConfigError(f"--set expects key=value or key=v1,v2, got '{item}'")
        values = [parse_yaml(part) for part in _top_level_split(raw)]
        (key, _), = _grid_keys("--set", {raw_key.strip(): values}).items()
        base.pop(key, None)
        axes.pop(key, None)
        if len(values) == 1:
            base[key] = values[0]
        else:
            axes[key] = values
    return spec.model_copy(update={"base": base, "axes": axes})


def _top_level_split(text: str) -> list[str]:
    """``"0.1,0.2"`` -> ``["0.1", "0.2"]``; ``"[1, 2],[3]"`` -> ``["[1, 2]", "[3]"]``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def parse_grid(data: Any) -> GridSpec:
    """Validate a grid mapping into a GridSpec with flat, known keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"a grid must be a mapping of keys, got {type(data).__name__}")
    try:
        spec = GridSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    for tag in spec.tags:
        if tag in RESERVED_TAGS or tag.startswith("mlflow."):
            raise ConfigError(f"tags.{tag}: headsweep sets this tag itself; name yours otherwise "
                              f"(reserved: {', '.join(RESERVED_TAGS)}, mlflow.*)")
    base = _grid_keys("base", spec.base)
    axes = _grid_keys("axes", spec.axes)
    for key, values in axes.items():
        if not values:
            raise ConfigError(f"axes.{key}: empty list (an axis needs at least one value)")
    include = [cell for i, entry in enumerate(spec.include)
               for cell in _include_cells(i, _grid_keys(f"include[{i}]", entry))]
    exclude = [_grid_keys(f"exclude[{i}]", entry) for i, entry in enumerate(spec.exclude)]
    return spec.model_copy(update={"base": base, "axes": axes, "include": include, "exclude": exclude})


def _include_cells(index: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """An include entry as its cells: a list under a key that does not take one is one cell per
    value, two lists their product (``{seed: [0, 1], lambda: [0.1, 0.2]}``: four cells)."""
    method = entry.get("method", DEFAULT_METHOD)
    listed = [key for key, value in entry.items() if isinstance(value, list) and not _takes_list(key, method)]
    for key in listed:
        if not entry[key]:
            raise ConfigError(f"include[{index}].{key}: empty list (a list in an include is one cell per value)")
    cells = []
    for combo in itertools.product(*(entry[key] for key in listed)):
        cells.append({**entry, **dict(zip(listed, combo, strict=True))})
    return cells


def _takes_list(key: str, method: Any) -> bool:
    """Whether the grid key ``key`` (dotted or a short name) of a run of ``method`` takes a list
    itself (a method list in an include asks the default method's keys)."""
    method = method if isinstance(method, str) else DEFAULT_METHOD
    try:
        model: Any = config_class(method)
        full = keys.resolve(key, method)
    except (KeyError, ConfigError):
        return False
    annotation: Any = None
    for part in full.split("."):
        fields = getattr(model, "model_fields", {})
        field = next((f for name, f in fields.items() if part in (name, f.alias)), None)
        if field is None:
            return False
        annotation = model = field.annotation
    kinds = {typing.get_origin(a) or a for a in (annotation, *typing.get_args(annotation))}
    return bool(kinds & {list, tuple, Sequence, collections.abc.Sequence})


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden" and len(first["loc"]) == 1:
        return f"unknown key '{loc}'{suggest(loc, GridSpec.model_fields)}"
    if first["type"] == "extra_forbidden":
        key = str(first["loc"][-1])
        return f"resources: unknown key '{key}'{suggest(key, Resources.model_fields)}"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{loc}: {first['msg']} (got {first.get('input')!r}){more}"


def _flat(entry: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections -> dotted keys; a dict under a key that takes one stays whole (task.eval_sets)."""
    out: dict[str, Any] = {}
    for key, value in entry.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and (path in keys.ALIASES or not keys.is_known(path)):
            out.update(_flat(value, f"{path}."))
        else:
            out[path] = value
    return out


def _grid_keys(where: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten nested sections, expand ``task``, reject unknown and repeated keys."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for raw_key, value in _flat(entry).items():
        key = keys.ALIASES.get(raw_key, raw_key)
        if not keys.is_known(key):
            raise ConfigError(f"{where}: {keys.unknown_key(key)}")
        if key in out:
            raise ConfigError(f"{where}: '{written[key]}' and '{raw_key}' are the same key '{key}'")
        out[key], written[key] = value, raw_key
    return out


# --------------------------------------------------------------------------- expansion


def expand(spec: GridSpec) -> list[RunConfig]:
    """Every distinct cell as a validated RunConfig, in grid order (product, then includes).

    Each cell is checked like ``parse_config(cell, check_files=False)``; the
    task's data is checked once per distinct task section. Cells with the same
    run key are kept once (keys are computed here, each task's data hashed once).
    """
    validate, resolver = _CellValidator(), _Resolver()
    configs: dict[str, RunConfig] = {}
    data_checked: set[Any] = set()
    applied: set[tuple[str, str]] = set()  # (base | axes, key) of grid keys some cell used
    methods: set[str] = set()
    index = 0
    from experiments.training.precision import check_precision

    on_cpu = spec.resources.gpus == 0  # trials without a GPU run on CPU (orchestrator/driving/trial.py)
    with gc_paused(), fingerprints_memoised():
        for prefix, values, is_include in _candidates(spec):
            try:
                flat, method, used = resolver.cell(spec.base, values, strict=is_include)
                if not is_include and resolver.excluded(flat, method, spec.exclude):
                    applied.update(used)
                    continue
                cfg, used = _without_unread(validate, flat, used, resolver, method)
                applied.update(used)
                if on_cpu:
                    try:
                        check_precision(cfg, "cpu")
                    except ConfigError as err:
                        raise ConfigError(f"{err} (resources.gpus is 0: the trials run on CPU)") from None
                if cfg.task not in data_checked:
                    check_data(cfg)
                    data_checked.add(cfg.task)
                configs.setdefault(cfg.run_key, cfg)
            except ConfigError as err:
                raise ConfigError(f"cell {index} ({prefix}{_label(values)}): {err}") from None
            methods.add(cfg.method)
            index += 1
    _check_applied(spec, applied, methods, resolver.unread)
    return list(configs.values())


def _without_unread(validate: Callable[[dict[str, Any]], RunConfig], flat: dict[str, Any], used: list,
                    resolver: _Resolver, method: Any) -> tuple[RunConfig, list]:
    """The cell validated, less the base and axes keys its run does not read, as a method's
    keys leave the cells of other methods: a grid over sst2 and synthetic-cls may set
    ``task.num_train`` for the cells that read it, one over finetune and probes ``train.lr`` for the
    finetune cells, one over dp and sp ``sp_finetune_steps`` for the sp cells. Each left out is
    noted in ``resolver.unread`` as (base | axes, grid key, task or None, the line); a key an
    include writes itself stays, and its cell is refused as ``headsweep run`` refuses it."""
    while True:
        try:
            return validate(flat), used
        except UnreadKey as err:
            written = [(where, key) for where, key in used if resolver.key(key, method)[0] == err.key]
            if err.key not in flat or not written or any(where == "include" for where, _ in written):
                raise
            resolver.unread.update((where, key, err.task, str(err)) for where, key in written)
            flat = {k: v for k, v in flat.items() if k != err.key}
            used = [entry for entry in used if entry not in written]


def _candidates(spec: GridSpec) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(label prefix, grid values, is an include) of every product cell, then every include."""
    names = list(spec.axes)
    for combo in itertools.product(*spec.axes.values()):
        yield "", dict(zip(names, combo, strict=True)), False
    for i, entry in enumerate(spec.include):
        yield f"include[{i}]: ", entry, True


class _Resolver:
    """Grid keys -> a cell's dotted keys, through the cell's method (memoised per key and method)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, Any], tuple[str, bool]] = {}
        self._defaults: dict[Any, dict[str, Any]] = {}
        self.unread: set[tuple[str, str, str | None, str]] = set()  # (base | axes, grid key, task, line) a cell did not read

    def key(self, key: str, method: Any) -> tuple[str, bool]:
        """(dotted key, whether it applies to a run of ``method``)."""
        memo = (key, method if isinstance(method, str) else None)
        if memo not in self._keys:
            full = keys.resolve(key, memo[1]) if memo[1] else keys.ALIASES.get(key, key)
            self._keys[memo] = (full, keys.applies(full, memo[1]))
        return self._keys[memo]

    def cell(self, base: dict[str, Any], values: dict[str, Any], strict: bool) -> tuple[dict[str, Any], Any, list]:
        """(flat dotted config, its method, the (base | axes, key) that applied) of one cell.

        Keys of another method are left out of the cell (see the module docstring),
        except in an include (``strict``), where they are an error.
        """
        method = values.get("method", base.get("method", DEFAULT_METHOD))
        flat: dict[str, Any] = {}
        used = []
        layers: dict[str, dict[str, str]] = {}
        for where, layer in (("base", base), ("include" if strict else "axes", values)):
            written = layers[where] = {}
            for key, value in layer.items():
                full, applies = self.key(key, method)
                if not applies:
                    if where == "include":
                        raise ConfigError(_not_applicable(key, full, method))
                    continue
                if full in written:
                    raise ConfigError(f"'{written[full]}' and '{key}' are the same key '{full}'")
                written[full], flat[full] = key, value
                used.append((where, key))
        self._base_id_of_its_task(flat, used, layers, base)
        return flat, method, used

    def _base_id_of_its_task(self, flat: dict[str, Any], used: list, layers: dict[str, dict[str, str]],
                             base: dict[str, Any]) -> None:
        """A base ``task.id`` names the base's task: a cell that runs another task (an axis or an
        include sets ``task.name``) and sets no id of its own does not carry it, so its runs are not
        labelled with another task's id (issue 43). Noted in ``unread`` for the cells it left."""
        own, cell = layers["base"], next(layer for where, layer in layers.items() if where != "base")
        if "task.id" not in own or "task.id" in cell or "task.name" not in cell:
            return
        named = base.get(own["task.name"], "synthetic-cls") if "task.name" in own else "synthetic-cls"
        if flat.get("task.name") == named:
            return
        key = own["task.id"]
        line = (f"task.id: the base's task.id names its task {named}, and a cell of task {flat.get('task.name')} "
                f"does not take it (set task.id beside the task.name that changes it)")
        del flat["task.id"]
        used.remove(("base", key))
        self.unread.add(("base", key, None, line))

    def excluded(self, flat: dict[str, Any], method: Any, exclude: list[dict[str, Any]]) -> bool:
        """Whether an exclude entry matches: each of its keys equals the cell's value (or the
        default when the cell leaves it unset); an entry with a key the method lacks never does."""
        for entry in exclude:
            for key, value in entry.items():
                full, applies = self.key(key, method)
                if not applies or not _same(flat.get(full, self.default(full, method)), value):
                    break
            else:
                return True
        return False

    def default(self, full: str, method: Any) -> Any:
        memo = method if isinstance(method, str) else None
        if memo not in self._defaults:
            try:
                self._defaults[memo] = flatten(config_class(memo).model_validate({}).to_dict())
            except (KeyError, ConfigError, ValidationError):
                self._defaults[memo] = {}
        return self._defaults[memo].get(full)


def _not_applicable(key: str, full: str, method: Any) -> str:
    owners = [keys.owner(full)] if keys.owner(full) else keys.owners_of(full)
    return f"'{key}' is not a key of method '{method}' (it is a key of {', '.join(o for o in owners if o)})"


def _check_applied(spec: GridSpec, applied: set[tuple[str, str]], methods: set[str],
                   unread: set[tuple[str, str, str | None, str]] = frozenset()) -> None:
    """Raise when a base or axes key applied to no cell (a key of a method no cell runs, or a key
    no cell's run reads: the line ``headsweep run`` gives for one of them)."""
    order = list(TaskConfig.model_fields)  # task keys in the order headsweep run reports them
    for where, entries in (("axes", spec.axes), ("base", spec.base)):
        for key in sorted(entries, key=lambda k: order.index(k[5:]) if k.startswith("task.") and k[5:] in order else -1):
            tasks = sorted({task for w, k, task, _ in unread if (w, k) == (where, key) and task is not None})
            lines = sorted(line for w, k, task, line in unread if (w, k) == (where, key) and task is None)
            if (where, key) not in applied and lines and not tasks:  # a train key's line names it
                line = lines[0].split(": ", 1)[1] if lines[0].startswith("train.") else lines[0]
                raise ConfigError(f"{where}: '{key}' applies to no cell: {line}")
            if (where, key) not in applied and tasks:
                written = "task.name" in spec.base or "task.name" in spec.axes
                line = unread_line(key.split(".", 1)[1], tasks[0], TASKS, name_written=written)
                raise ConfigError(f"{where}: '{key}' applies to no cell: {line.split(': ', 1)[1]}"
                                  + (f" (this grid's tasks: {', '.join(tasks)})" if len(tasks) > 1 else ""))
            if (where, key) not in applied:
                owner = keys.owner(key)
                owners = [owner] if owner else keys.owners_of(key)
                raise ConfigError(
                    f"{where}: '{key}' applies to no cell: it is a key of {', '.join(owners)}, "
                    f"and this grid's cells run {', '.join(sorted(methods)) or 'nothing'}"
                )


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"train.lr": 1e-4} -> {"train": {"lr": 1e-4}}."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root


def _same(a: Any, b: Any) -> bool:
    """Equal values, without YAML's ``true`` matching ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _label(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in values.items())


class _CellValidator:
    """``parse_config(cell, check_files=False)`` of a flat cell, done once per cell up to its seed.

    Valid cells take the fast path: one pydantic validation with the method's
    config class, then the names (task, model, pipeline) looked up in a cache. A
    cell equal to an earlier one but for a seed that already validated is that
    config ``with_seed`` (no validation, one hash). A cell that fails is re-run
    through ``parse_config``, so its message is exactly the one ``headsweep run``
    would print.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[Any, ...], ConfigError | None] = {}
        self._by_rest: dict[str, RunConfig] = {}  # the cell without its seed -> its first config
        self._seeds: set[int] = set()  # seeds some valid cell had

    def __call__(self, flat: dict[str, Any]) -> RunConfig:
        seed = flat.get("seed")
        seeded = type(seed) is int  # not bool, not absent
        rest = json.dumps({k: v for k, v in flat.items() if k != "seed"}, sort_keys=True, default=repr)
        if seeded and seed in self._seeds and rest in self._by_rest:
            return self._by_rest[rest].with_seed(seed)
        cfg = self._validate(_nest(flat))
        if seeded:
            self._seeds.add(seed)
            self._by_rest.setdefault(rest, cfg)
        return cfg

    def _validate(self, cell: dict[str, Any]) -> RunConfig:
        try:
            cfg = config_class(cell.get("method", DEFAULT_METHOD)).model_validate(cell)
            self._check_names(cfg)
            return with_stages(cfg, check_files=False)
        except (KeyError, TypeError, ValidationError, ConfigError):
            return parse_config(cell, check_files=False)

    def _check_names(self, cfg: RunConfig) -> None:
        names = (cfg.task.name, cfg.model, cfg.method, cfg.labels()["pipeline"])
        if names not in self._names:
            try:
                check_names(cfg)
                self._names[names] = None
            except ConfigError as err:
                self._names[names] = err
        error = self._names[names]
        if error is not None:
            raise error


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
