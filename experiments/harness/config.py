"""One run's configuration: typed, frozen, validated once at the edge.

A run config is the shared sections (``seed``, ``model``, ``task``, ``train``,
``method``) plus the method's own section, named after it
(``method: head_gates`` + ``head_gates: {lambda: 0.05}``): each method module
declares its ``Config`` (DESIGN.md decision 8); :func:`config_class` joins them.

A run is content-addressed (decision 1): ``run_key`` hashes what the run reads
(see experiments/harness/run_keys.py), seed included; ``group_key`` is the same hash
without the seed (the unit for mean +- std).

Every mistake is a :class:`ConfigError` whose one-line message names the key
and, for a misspelt key or name, the nearest valid one. :func:`parse_config`
is the one validation path: ``headsweep run``, ``--set`` and every grid cell.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from functools import cached_property, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, create_model

from base.naming import suggest
from base.sections import (
    DEFAULT_METHOD,
    STAGE_ROLES,
    ConfigError,
    Section,
    SharedConfig,
    TaskConfig,
    TrainConfig,
    parse_yaml,
    section_value,
    set_dotted,
)
from experiments.harness.config_keys import method_labels, resolve, unknown_key, wrong_section
from experiments.harness.run_keys import extra_tasks, key_material, reseeded_keys, run_and_group_key
from experiments.methods import METHODS, check_method
from experiments.models import check_model_name
from experiments.tasks import TASKS, bias_feature_names, data_label, unread_key
from experiments.tasks.reads import unread_line
from experiments.training import reads as method_reads


class RunConfig(SharedConfig):
    """The shared part of every run config; :func:`config_class` adds the method's own section.

    Build one with :func:`parse_config` (or ``config_class(method).model_validate``):
    a bare ``RunConfig`` has no method section. Keys are computed once per instance.
    """

    def __hash__(self) -> int:  # the stage sections are dicts: hash the canonical JSON instead
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    @cached_property
    def upstreams(self) -> dict[str, RunConfig]:
        """``{role: the upstream run's full config}`` for every stage this run names (``STAGE_ROLES``)."""
        return {role: resolve_stage(self, role) for role in STAGE_ROLES if getattr(self, role) is not None}

    @property
    def section(self) -> Section:
        """The method's own section (``cfg.section.lambda_`` for ``head_gates: {lambda: ...}``)."""
        return getattr(self, self.method)

    def labels(self) -> dict[str, Any]:
        """The run's searchable labels: task (its ``id``, else its name), model, method, seed, and its method's short names
        (``SHORT_NAMES``: head_gates' lambda, sparsity, pipeline; None where unset).

        The one place that says where each label lives in the config: MLflow tags, the registry's
        label columns, run names and the dry-run table all read it.
        """
        return {"task": self.task.id or self.task.name, "data": self._data, "model": self.model, "method": self.method,
                "seed": self.seed, **method_labels(self.method, self.section)}

    @cached_property
    def _data(self) -> str:
        """The ``data`` label: what the run trains on (the files and their content hash, or the
        generator and its seed), so a run on the wrong data is seen at a glance."""
        try:
            fingerprint = self._key_material.get("data")
        except (FileNotFoundError, ValueError):  # not validated against its files (yet)
            fingerprint = None
        return _data_label(self.task, fingerprint)

    def run_name(self, sep: str = "-") -> str:
        """``synthetic-tag-head_gates-dp-seed0``: task, method, pipeline (if it has one), seed."""
        labels = self.labels()
        parts = (labels["task"], labels["method"], labels.get("pipeline"), f"seed{labels['seed']}")
        return sep.join(str(part) for part in parts if part is not None)

    def to_dict(self) -> dict[str, Any]:
        """The canonical nested dict (aliases as users write them, every default filled; a stage
        only when the run has it)."""
        unset = {role for role in STAGE_ROLES if getattr(self, role) is None}
        return self.model_dump(by_alias=True, mode="json", exclude=unset)

    @property
    def run_key(self) -> str:
        """16 hex: the hash of what this run reads (experiments.harness.run_keys), seed included."""
        return self._keys[0]

    @property
    def group_key(self) -> str:
        """The run key without the seed: runs that differ only by seed (mean +- std)."""
        return self._keys[1]

    @cached_property
    def _keys(self) -> tuple[str, str]:
        return run_and_group_key(self)

    @cached_property
    def _key_material(self) -> dict[str, Any]:
        return key_material(self)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> RunConfig:
        """A copy without the cached keys (they would be stale after ``update``)."""
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("_keys", "_key_material", "upstreams", "_seeded", "_data"):
            copy.__dict__.pop(cached, None)
        return copy

    def with_seed(self, seed: int) -> RunConfig:
        """This config with another (already validated) seed, keyed without validating or
        flattening it again: the grid's fast path for cells that differ only by seed.

        Equal to validating the changed config (tests/experiments/test_config.py): the seed
        enters a run key only as itself and through the upstreams, which follow the seed
        unless their stage sets one (see :func:`resolve_stage`)."""
        seeded = self.__dict__.setdefault("_seeded", {})  # an upstream shared by many cells: once per seed
        if seed in seeded:
            return seeded[seed]
        copy = seeded[seed] = self.model_copy(update={"seed": seed})
        upstreams = {role: up if "seed" in getattr(self, role) else up.with_seed(seed)
                     for role, up in self.upstreams.items()}
        copy.__dict__["upstreams"] = upstreams
        copy.__dict__["_keys"] = reseeded_keys(self, seed, upstreams)
        return copy

    def __reduce__(self):  # the class is made per method at run time: pickle the dict instead
        return (_rebuild, (self.to_dict(),))


@lru_cache(maxsize=1024)
def _data_label(task: TaskConfig, fingerprint: str | None) -> str:
    """``data_label`` once per task section and content: the cells of a grid share a few."""
    return data_label(task, fingerprint)


def _rebuild(raw: dict[str, Any]) -> RunConfig:
    return config_class(raw["method"]).model_validate(raw)


_CLASSES: dict[tuple[str, type[BaseModel]], type[RunConfig]] = {}


def config_class(method: str) -> type[RunConfig]:
    """RunConfig plus the method's section as a field named after it (``head_gates: {...}``).

    One class per method (made on first use, after checking the method module's contract),
    so pydantic validates shared keys and the section in one call, and an error's location
    is the dotted key the user wrote (``head_gates.lambda``).
    """
    module = METHODS[method]
    cls = _CLASSES.get((method, module.Config))
    if cls is None:
        check_method(method, module)
        cls = create_model(
            f"RunConfig_{method}",
            __base__=RunConfig,
            __module__=__name__,
            method=(Literal[method], Field(method, description="Method name, a key of experiments.methods.METHODS.")),
            **{method: (module.Config, Field(default_factory=module.Config, description=f"The keys of {method}."))},
        )
        _CLASSES[(method, module.Config)] = cls
    return cls


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set key=value`` strings; values are read as YAML (1e-4, true, [1, 2]).

    A key is dotted (``train.lr``, ``head_gates.lr``), ``task`` for ``task.name``, or a short
    name of the run's method (``lambda`` -> ``head_gates.lambda``), the method being the one
    the overrides leave (``--set method=finetune`` counts). Unknown keys fail in parse_config.
    """
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got '{item}'")
        pairs.append((key.strip(), parse_yaml(raw)))
    method = next((v for k, v in reversed(pairs) if k == "method"), config.get("method", DEFAULT_METHOD))
    for key, value in pairs:
        target = key if key == "task" and isinstance(value, dict) else resolve(key, method)
        config = set_dotted(config, target, value)
    return config


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def resolve_stage(cfg: RunConfig, role: str, *, check_files: bool = False) -> RunConfig:
    """The full config of ``cfg``'s upstream ``role``: its seed, model, task and train, with the
    stage's own keys on top (a ConfigError names the role: ``init_from.finetune.lr: ...``)."""
    partial = getattr(cfg, role)
    if not isinstance(partial.get("method"), str):
        raise ConfigError(f"{role}.method: name the upstream run's method (e.g. {role}: {{method: finetune}})")
    shared = {"seed": cfg.seed, "model": cfg.model, "task": _inherited_task(cfg.task, partial.get("task")),
              "train": cfg.train.model_dump(by_alias=True, mode="json")}
    own = partial.get("train") if isinstance(partial.get("train"), dict) else {}
    inherited = tuple(key for key in TrainConfig.model_fields if key not in own)
    try:
        stage = _parse_stage(json.dumps(_deep_merge(shared, partial), sort_keys=True), check_files, inherited)
        read = train_read(stage)  # the stage inherits only the train keys it reads, as its task keys:
        unread = [key for key in inherited if key not in read and key in cfg.train.model_fields_set]
        if not unread:  # a bias_only stage is one run for every train.lr of its dependants
            return stage
        shared["train"] = {key: value for key, value in shared["train"].items() if key not in unread}
        return _parse_stage(json.dumps(_deep_merge(shared, partial), sort_keys=True), check_files, inherited)
    except ConfigError as err:
        raise ConfigError(f"{role}.{err}" if not str(err).startswith(role) else str(err)) from None


def _inherited_task(task: TaskConfig, stage_task: Any) -> dict[str, Any]:
    """The dependant's task section as a stage inherits it: the keys the stage's task reads
    (``READS``; the dependant's, unless the stage names another: ``source: {task: {name: sst2}}``).
    A dependant on sst2 whose source stage is synthetic-cls sets ``num_train`` for the source;
    its own init_from stage on sst2 does not inherit it (a key its task does not read is refused)."""
    inherited = task.model_dump(by_alias=True, mode="json")
    name = stage_task.get("name", task.name) if isinstance(stage_task, dict) else task.name
    if not isinstance(name, str) or name not in TASKS:
        return inherited
    return {key: value for key, value in inherited.items() if key in TASKS[name].READS}


@lru_cache(maxsize=4096)
def _parse_stage(text: str, check_files: bool, inherited: tuple[str, ...]) -> RunConfig:
    """An upstream config from its canonical JSON, parsed once: the 24 cells of a grid that start
    from one fine-tune share one (frozen) config object and its cached run key. ``inherited``: the
    ``train.*`` keys it carries from its dependant, which it need not read (the dependant does)."""
    return parse_config(json.loads(text), check_files=check_files, inherited=inherited)


def _with_default_stages(cfg: RunConfig) -> RunConfig:
    """Fill the stages the method asks for by default (``stages(section)`` in its module), e.g.
    head_gates' sp pipeline starts from a fine-tuned model; stages the config sets win."""
    defaults = getattr(METHODS[cfg.method], "stages", None)
    wanted = {role: partial for role, partial in (defaults(cfg.section) if defaults else {}).items()
              if getattr(cfg, role) is None}
    return cfg.model_copy(update=wanted) if wanted else cfg


def parse_config(raw: dict[str, Any], *, check_files: bool = True, inherited: Collection[str] = ()) -> RunConfig:
    """Validate a nested dict into a RunConfig, or raise a one-line ConfigError.

    The one validation path (``headsweep run``, ``--set``, every grid cell): the method
    first (it says which section is allowed), then keys and types, then names (task,
    model, pipeline), then, unless ``check_files`` is False, the task's data. ``inherited``: the
    ``train.*`` keys a stage's config carries from its dependant (not refused when it does not read
    them: :func:`check_run_keys`).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a run config must be a mapping of keys, got {type(raw).__name__}")
    method = _method_of(raw)
    try:
        cfg = config_class(method).model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, method)) from None
    check_names(cfg)
    return with_stages(cfg, check_files=check_files, inherited=inherited)


def with_stages(cfg: RunConfig, *, check_files: bool = True, inherited: Collection[str] = ()) -> RunConfig:
    """The last step of validation, after keys, types and names: the method's default stages
    filled in, every upstream resolved (so a typo in a stage fails at submit too) and, unless
    ``check_files`` is False, the data of the run and of its upstreams checked."""
    cfg = _with_default_stages(cfg)
    check_method_rules(cfg)
    check_task_keys(cfg)
    check_run_keys(cfg, inherited)
    for upstream in cfg.upstreams.values():
        if check_files:
            check_data(upstream)
    if check_files:
        check_data(cfg)
    return cfg


class UnreadKey(ConfigError):
    """A key set that the run never reads: ``key`` (dotted, as written) and, for a task key, the
    ``task`` that ignores it, so a grid can leave it out of the cells that do not read it."""

    def __init__(self, line: str, key: str, task: str | None = None):
        super().__init__(line)
        self.key, self.task = key, task


def check_task_keys(cfg: RunConfig) -> None:
    """Refuse a task key set that the run does not read: it would change the run key and nothing
    else (``task.train`` without ``task.name`` trained on synthetic-cls). A key is read when the
    run's task reads it (``READS``) or a stage on another task inherits it (prompt_transfer's
    source: the dependant's ``num_train`` sizes a synthetic source). The same for each task the
    method reads besides ``task`` (multitask's, named by their key)."""
    staged = {up.task.name for up in cfg.upstreams.values() if up.task.name != cfg.task.name}
    for prefix, task in {"task": cfg.task, **extra_tasks(cfg)}.items():
        also = set().union(*(TASKS[name].READS for name in staged)) if prefix == "task" else set()
        key = unread_key(task, also)
        if key is not None:
            line = unread_line(key, task.name, TASKS, prefix=prefix, name_written="name" in task.model_fields_set)
            raise UnreadKey(line, f"{prefix}.{key}", task.name)


def check_run_keys(cfg: RunConfig, inherited: Collection[str] = ()) -> None:
    """Refuse a key of the method's section or a ``train.*`` key set away from its default that the
    run does not read: it would change the run key and nothing else (``train.grad_clip`` on probes,
    ``head_gates.sp_finetune_steps`` on dp). The method says what it reads (``READS`` and
    ``unread(section, train)``: experiments/training/reads.py); a ``train.*`` key also counts as read
    when a stage inherits it and reads it (head_ablation's finetune stage reads ``train.lr``).
    ``inherited``: the keys a stage carries from its dependant, which reads them."""
    module = METHODS[cfg.method]
    skipped = method_reads.unread(module, cfg.section, cfg.train)
    for name, field in type(cfg.section).model_fields.items():
        key = field.alias or name
        if key in skipped and getattr(cfg.section, name) != field.get_default(call_default_factory=True):
            raise UnreadKey(f"{cfg.method}.{key}: {skipped[key]}", f"{cfg.method}.{key}")
    read = train_read(cfg)
    for key, field in TrainConfig.model_fields.items():
        if key in read or key in inherited or getattr(cfg.train, key) == field.get_default(call_default_factory=True):
            continue
        why = skipped.get(f"train.{key}", "")
        own = [role for role, up in cfg.upstreams.items() if key in train_read(up)]
        if own:  # a stage would read it, but sets its own
            why += f" (its {' and '.join(own)} stage sets its own train.{key})"
        raise UnreadKey(method_reads.unread_line(key, cfg.method, METHODS, why.strip() or None), f"train.{key}")


def train_read(cfg: RunConfig) -> set[str]:
    """The ``train.*`` keys (names) a run of ``cfg`` reads: its method's, and those each stage
    inherits (sets none of its own) and reads."""
    module = METHODS[cfg.method]
    skipped = method_reads.unread(module, cfg.section, cfg.train)
    read = {key for key in method_reads.reads(module) if f"train.{key}" not in skipped}
    for role, upstream in cfg.upstreams.items():
        partial = getattr(cfg, role)
        own = partial.get("train") if isinstance(partial.get("train"), dict) else {}
        read |= {key for key in train_read(upstream) if key not in own}
    return read


def check_method_rules(cfg: RunConfig) -> None:
    """What a method or a stage asks of the whole config: the method's own ``check(cfg)``;
    a ``bias_model`` stage must be a method that hands on a bias model (``BIAS_MODEL``) and
    the run's task must define bias features (the run reads p_b on its own data)."""

    check = getattr(METHODS[cfg.method], "check", None)
    if check is not None:
        try:
            check(cfg)
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if cfg.bias_model is not None:
        method = cfg.bias_model.get("method")
        if isinstance(method, str) and method in METHODS and not getattr(METHODS[method], "BIAS_MODEL", False):
            makers = ", ".join(name for name, module in METHODS.items() if getattr(module, "BIAS_MODEL", False))
            raise ConfigError(f"bias_model.method: method '{method}' hands on no bias model (methods that do: {makers})")
        try:
            bias_feature_names(cfg.task)
        except ValueError as err:
            raise ConfigError(f"{err}; a run with a bias_model stage reads its p_b on this task") from None


def _method_of(raw: dict[str, Any]) -> str:
    method = raw.get("method", DEFAULT_METHOD)
    if not isinstance(method, str) or method not in METHODS:
        hint = suggest(str(method), METHODS) or f" (methods: {', '.join(METHODS)})"
        raise ConfigError(f"method: unknown method '{method}'{hint}")
    return method


def check_names(cfg: RunConfig) -> None:
    """Raise ConfigError for an unknown task or model, or a pipeline its method does not have."""
    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name: unknown task '{cfg.task.name}'{suggest(cfg.task.name, TASKS)}")
    try:
        check_model_name(cfg.model)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from None
    pipelines = METHODS[cfg.method].PIPELINES
    pipeline = section_value(cfg.section, "pipeline")
    if pipeline is not None and pipeline not in pipelines:
        raise ConfigError(
            f"{cfg.method}.pipeline: method '{cfg.method}' has no pipeline '{pipeline}' "
            f"(it has {', '.join(pipelines)}){suggest(pipeline, pipelines)}"
        )


def check_data(cfg: RunConfig) -> None:
    """Raise ConfigError naming the missing file when the task's data is not there (also of the
    tasks the method reads besides ``task``, named by their key: ``multitask.tasks.1``)."""

    try:
        TASKS[cfg.task.name].check(cfg.task)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"task '{cfg.task.name}': {err}") from None
    for key, task in extra_tasks(cfg).items():
        try:
            TASKS[task.name].check(task)
        except (FileNotFoundError, ValueError) as err:
            named = f"task '{task.name}'" in str(err)
            raise ConfigError(f"{key}: {err}" if named else f"{key}: task '{task.name}': {err}") from None


def _describe(err: ValidationError, method: str) -> str:
    """The first error as one line: the dotted key, what is wrong, and a suggestion."""
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return wrong_section(key, method) or unknown_key(key, method)
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{key}: {first['msg']} (got {first.get('input')!r}){more}"
