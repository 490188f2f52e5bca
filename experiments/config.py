"""One run's configuration: typed, frozen, validated once at the edge.

A run config is the shared sections (``seed``, ``model``, ``task``, ``train``,
``method``) plus the method's own section, named after it
(``method: head_gates`` + ``head_gates: {lambda: 0.05}``): each method module
declares its ``Config`` (DESIGN.md decision 8); :func:`config_class` joins them.

A run is content-addressed (decision 1): ``run_key`` hashes what the run reads
(see experiments/run_keys.py), seed included; ``group_key`` is the same hash
without the seed (the unit for mean +- std).

Every mistake is a :class:`ConfigError` whose one-line message names the key
and, for a misspelt key or name, the nearest valid one. :func:`parse_config`
is the one validation path: ``headsweep run``, ``--set`` and every grid cell.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from experiments.naming import suggest


class ConfigError(ValueError):
    """A config that cannot run: one line, naming the key and a suggestion."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TaskConfig(_Frozen):
    name: str = Field("synthetic-cls", description="Task name, a key of experiments.tasks.TASKS.")
    data_dir: str | None = Field(
        None, description="Folder holding the task's files; None = $HEADSWEEP_DATA or ../shared/data."
    )
    max_train: int | None = Field(None, gt=0, description="Use at most this many training examples.")
    max_eval: int | None = Field(None, gt=0, description="Use at most this many evaluation examples.")
    max_length: int = Field(64, ge=8, le=512, description="Tokens per example after truncation.")
    data_seed: int = Field(
        0, ge=0, description="Seed of the data subset and synthetic data (not the run's seed)."
    )
    num_train: int = Field(2000, gt=0, description="Size of a generated (synthetic) training set.")
    num_eval: int = Field(500, gt=0, description="Size of a generated (synthetic) evaluation set.")
    # The file tasks (classification, tagging): experiments/tasks/classification.py and tagging.py.
    train: str | None = Field(
        None, description="File tasks: the training file (or hf folder); a relative path is resolved "
        "at validation against data_dir, else the current directory."
    )
    dev: str | None = Field(None, description="File tasks: the evaluation file; its metrics keep plain names.")
    eval_sets: tuple[tuple[str, str], ...] = Field(
        (), description="File tasks: more evaluation files by name, {ood: path}; metrics get '/<name>' (accuracy/ood)."
    )
    format: str | None = Field(
        None, description="File tasks: tsv, csv, jsonl, conllu, bio or hf; None = from each file's extension."
    )
    text: str | tuple[str, ...] | None = Field(
        None, description="classification: the text column, or two for a pair ([premise, hypothesis]); "
        "None = text. tagging, hf folders: the tokens column (None = tokens)."
    )
    label: str | None = Field(None, description="classification: the label column; None = label.")
    labels: tuple[str, ...] | None = Field(
        None, description="File tasks: the label set in id order; None = the train file's labels, sorted "
        "(numerically when all are integers)."
    )
    column: str | None = Field(
        None, description="tagging: the tag column: upos (default), xpos, deprel (CoNLL-U), or an hf column (None = tags)."
    )

    @model_validator(mode="before")
    @classmethod
    def _absolute_paths(cls, data: Any) -> Any:
        """Resolve relative train/dev/eval_sets paths once, here, against data_dir (else the current
        directory), so a Ray worker running in another folder reads the same files. Idempotent."""
        if not isinstance(data, dict):
            return data
        base = Path(data["data_dir"]).expanduser() if isinstance(data.get("data_dir"), str) else Path(".")
        absolute = lambda p: os.path.abspath(base / Path(p).expanduser()) if isinstance(p, str) else p  # noqa: E731
        out = {k: absolute(v) if k in ("train", "dev") else v for k, v in data.items()}
        if isinstance(out.get("eval_sets"), dict):
            out["eval_sets"] = {name: absolute(path) for name, path in out["eval_sets"].items()}
        return out

    @field_validator("eval_sets", mode="before")
    @classmethod
    def _eval_sets_as_pairs(cls, value: Any) -> Any:
        """{name: path} -> sorted (name, path) pairs: hashable, so configs dedup by value."""
        if isinstance(value, dict):
            for name in value:
                if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                    raise ValueError(f"eval set name {name!r} must be letters, digits, '_', '-' or '.' (it ends metric names)")
            return tuple(sorted(value.items()))
        return value

    @field_serializer("eval_sets")
    def _eval_sets_as_dict(self, value: tuple[tuple[str, str], ...]) -> dict[str, str]:
        return dict(value)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, value: Any) -> Any:
        """Labels as the data's strings: 1 -> '1', true -> 'true' (as JSON writes them)."""
        if isinstance(value, list | tuple):
            return tuple(v if isinstance(v, str) else json.dumps(v) for v in value)
        return value

    @field_validator("text")
    @classmethod
    def _one_or_two_columns(cls, value: Any) -> Any:
        if isinstance(value, tuple):
            if len(value) not in (1, 2):
                raise ValueError(f"one text column or two (a pair), got {list(value)}")
            return value[0] if len(value) == 1 else value
        return value


class TrainConfig(_Frozen):
    epochs: float = Field(1.0, gt=0, le=100, description="Passes over the training set.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many steps (overrides epochs).")
    batch_size: int = Field(32, gt=0, le=4096, description="Examples per optimiser step.")
    lr: float = Field(5e-5, gt=0, le=1, description="Encoder learning rate (AdamW, linear warm-up/decay).")
    decoder_lr: float = Field(1e-3, gt=0, le=1, description="Task decoder learning rate.")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay of encoder and decoder.")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Fraction of steps with linear warm-up.")
    eval_every: int = Field(50, gt=0, description="Evaluate (and log gates) every this many steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Forward-pass precision (experiments/precision.py): fp32; bf16 = autocast to "
        "bfloat16 (CPU or CUDA); fp16 = autocast to float16 with a grad scaler (CUDA only: use bf16 on CPU). "
        "Weights, optimiser states, gates and losses stay float32.",
    )


class Section(_Frozen):
    """Base of a method's own section: frozen, unknown keys rejected, ``lambda`` for ``lambda_``.

    A method module declares ``class Config(Section)`` with a default and a
    description per key; a run config holds it under the method's name
    (``method: head_gates`` + ``head_gates: {lambda: 0.05}``, DESIGN.md decision 8).
    """


CONFIG_VERSION = "1"
"""Version of the shared sections' defaults (seed, model, task, train). A run key leaves out
keys at their default, so changing a default's value changes what those runs mean: bump this
(or the method's VERSION for a key of its section); tests/experiments/config_defaults.json checks."""

DEFAULT_METHOD = "head_gates"

STAGE_ROLES = {
    "init_from": "start from that run's final weights (encoder and task decoder)",
    "teacher": "learn from that run's predictions (e.g. confidence regularisation)",
    "bias_model": "weigh examples by that run's predictions of the label (debiasing losses)",
    "source": "carry that run's outputs over to this run's task (prompt_transfer: another task's prompt)",
}
"""Upstream runs a run may start from or use (DESIGN.md decision 10). Each is a partial run
config: the dependant's ``seed``, ``model``, ``task`` and ``train`` with the keys it sets on
top (``init_from: {method: finetune}`` = fine-tune the same model on the same task with the
same seed and training settings). Grid expansion turns them into a DAG."""


class RunConfig(_Frozen):
    """The shared part of every run config; :func:`config_class` adds the method's own section.

    Build one with :func:`parse_config` (or ``config_class(method).model_validate``):
    a bare ``RunConfig`` has no method section. Keys are computed once per instance.
    """

    seed: int = Field(0, ge=0, description="The run's seed; every random stream derives from it.")
    model: str = Field("minilm-l6", description="Model name (experiments.models), random:<name>, hub id or path.")
    method: str = Field(DEFAULT_METHOD, description="Method name, a key of experiments.methods.METHODS.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="The task and its data.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation every method shares.")
    init_from: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["init_from"] + ".")
    teacher: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["teacher"] + ".")
    bias_model: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["bias_model"] + ".")
    source: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["source"] + ".")

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
        """The run's searchable labels: task, model, method, pipeline, seed, sparsity, lambda.

        The one place that says where each label lives in the config: MLflow tags, registry
        columns and run names all read it (None where the method has no such key).
        """
        section = self.section
        pipeline = section_value(section, "pipeline")
        return {
            "task": self.task.name,
            "model": self.model,
            "method": self.method,
            "pipeline": pipeline,
            "seed": self.seed,
            "sparsity": section_value(section, "sparsity"),
            # no gates trained (multitask's pipeline none): its lambda weighs nothing, so no label
            "lambda": None if pipeline == "none" else section_value(section, "lambda"),
        }

    def run_name(self, sep: str = "-") -> str:
        """``synthetic-tag-head_gates-dp-seed0``: task, method, pipeline (if it has one), seed."""
        labels = self.labels()
        parts = (labels["task"], labels["method"], labels["pipeline"], f"seed{labels['seed']}")
        return sep.join(str(part) for part in parts if part is not None)

    def to_dict(self) -> dict[str, Any]:
        """The canonical nested dict (aliases as users write them, every default filled; a stage
        only when the run has it)."""
        unset = {role for role in STAGE_ROLES if getattr(self, role) is None}
        return self.model_dump(by_alias=True, mode="json", exclude=unset)

    @property
    def run_key(self) -> str:
        """16 hex: the hash of what this run reads (experiments.run_keys), seed included."""
        return self._keys[0]

    @property
    def group_key(self) -> str:
        """The run key without the seed: runs that differ only by seed (mean +- std)."""
        return self._keys[1]

    @cached_property
    def _keys(self) -> tuple[str, str]:
        from experiments.run_keys import run_and_group_key

        return run_and_group_key(self)

    @cached_property
    def _key_material(self) -> dict[str, Any]:
        from experiments.run_keys import key_material

        return key_material(self)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> RunConfig:
        """A copy without the cached keys (they would be stale after ``update``)."""
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("_keys", "_key_material", "upstreams", "_seeded"):
            copy.__dict__.pop(cached, None)
        return copy

    def with_seed(self, seed: int) -> RunConfig:
        """This config with another (already validated) seed, keyed without validating or
        flattening it again: the grid's fast path for cells that differ only by seed.

        Equal to validating the changed config (tests/experiments/test_config.py): the seed
        enters a run key only as itself and through the upstreams, which follow the seed
        unless their stage sets one (see :func:`resolve_stage`)."""
        from experiments.run_keys import reseeded_keys

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


def _rebuild(raw: dict[str, Any]) -> RunConfig:
    return config_class(raw["method"]).model_validate(raw)


def section_value(section: BaseModel, key: str, default: Any = None) -> Any:
    """The value of ``key`` as users write it (``lambda``, not ``lambda_``), or ``default``."""
    name = _attribute(type(section), key)
    return default if name is None else getattr(section, name)


@lru_cache(maxsize=1024)
def _attribute(cls: type[BaseModel], key: str) -> str | None:
    """The attribute of the field written ``key`` (its name or its alias), or None."""
    return next((name for name, field in cls.model_fields.items() if key in (name, field.alias)), None)


_CLASSES: dict[tuple[str, type[BaseModel]], type[RunConfig]] = {}


def config_class(method: str) -> type[RunConfig]:
    """RunConfig plus the method's section as a field named after it (``head_gates: {...}``).

    One class per method (made on first use, after checking the method module's contract),
    so pydantic validates shared keys and the section in one call, and an error's location
    is the dotted key the user wrote (``head_gates.lambda``).
    """
    from experiments.methods import METHODS, check_method

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


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"train.lr": 5e-05, ...} (the MLflow params of a run)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def set_dotted(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Return a copy of nested ``config`` with ``key`` ("train.lr") set to ``value``."""
    out = json.loads(json.dumps(config))
    node = out
    *parents, last = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{key}': '{part}' is a value, not a section")
        node = child
    node[last] = value
    return out


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """YAML text -> Python values, the one way configs, grids and ``--set`` values are read."""
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file, or raise ConfigError naming the file (and the line for bad YAML)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        return parse_yaml(file.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(err, 'problem', None) or err})") from None


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set key=value`` strings; values are read as YAML (1e-4, true, [1, 2]).

    A key is dotted (``train.lr``, ``head_gates.lr``), ``task`` for ``task.name``, or a short
    name of the run's method (``lambda`` -> ``head_gates.lambda``), the method being the one
    the overrides leave (``--set method=finetune`` counts). Unknown keys fail in parse_config.
    """
    from experiments.config_keys import resolve

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


def upgrade_legacy(raw: dict[str, Any]) -> dict[str, Any]:
    """A config in the shape registries of revision 0001 stored (a ``gates`` section, top-level
    ``pipeline`` and ``sparsity``) in today's shape: head_gates' keys move into its section,
    and methods without them (finetune) drop them. A config already in today's shape is returned as is.
    """
    out = {k: v for k, v in raw.items() if k not in ("gates", "pipeline", "sparsity")}
    if out.get("method", DEFAULT_METHOD) == "head_gates":
        moved = dict(raw.get("gates") or {})
        moved |= {k: raw[k] for k in ("pipeline", "sparsity") if raw.get(k) is not None}
        if moved:
            out["head_gates"] = moved | dict(raw.get("head_gates") or {})
    return out


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
    shared = {"seed": cfg.seed, "model": cfg.model, "task": cfg.task.model_dump(by_alias=True, mode="json"),
              "train": cfg.train.model_dump(by_alias=True, mode="json")}
    try:
        return _parse_stage(json.dumps(_deep_merge(shared, partial), sort_keys=True), check_files)
    except ConfigError as err:
        raise ConfigError(f"{role}.{err}" if not str(err).startswith(role) else str(err)) from None


@lru_cache(maxsize=4096)
def _parse_stage(text: str, check_files: bool) -> RunConfig:
    """An upstream config from its canonical JSON, parsed once: the 24 cells of a grid that start
    from one fine-tune share one (frozen) config object and its cached run key."""
    return parse_config(json.loads(text), check_files=check_files)


def _with_default_stages(cfg: RunConfig) -> RunConfig:
    """Fill the stages the method asks for by default (``stages(section)`` in its module), e.g.
    head_gates' sp pipeline starts from a fine-tuned model; stages the config sets win."""
    from experiments.methods import METHODS

    defaults = getattr(METHODS[cfg.method], "stages", None)
    wanted = {role: partial for role, partial in (defaults(cfg.section) if defaults else {}).items()
              if getattr(cfg, role) is None}
    return cfg.model_copy(update=wanted) if wanted else cfg


def parse_config(raw: dict[str, Any], *, check_files: bool = True) -> RunConfig:
    """Validate a nested dict into a RunConfig, or raise a one-line ConfigError.

    The one validation path (``headsweep run``, ``--set``, every grid cell): the method
    first (it says which section is allowed), then keys and types, then names (task,
    model, pipeline), then, unless ``check_files`` is False, the task's data.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a run config must be a mapping of keys, got {type(raw).__name__}")
    method = _method_of(raw)
    try:
        cfg = config_class(method).model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, method)) from None
    check_names(cfg)
    return with_stages(cfg, check_files=check_files)


def with_stages(cfg: RunConfig, *, check_files: bool = True) -> RunConfig:
    """The last step of validation, after keys, types and names: the method's default stages
    filled in, every upstream resolved (so a typo in a stage fails at submit too) and, unless
    ``check_files`` is False, the data of the run and of its upstreams checked."""
    cfg = _with_default_stages(cfg)
    check_method_rules(cfg)
    for upstream in cfg.upstreams.values():
        if check_files:
            check_data(upstream)
    if check_files:
        check_data(cfg)
    return cfg


def check_method_rules(cfg: RunConfig) -> None:
    """What a method or a stage asks of the whole config: the method's own ``check(cfg)``;
    a ``bias_model`` stage must be a method that hands on a bias model (``BIAS_MODEL``) and
    the run's task must define bias features (the run reads p_b on its own data)."""
    from experiments.methods import METHODS
    from experiments.tasks import bias_feature_names

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
    from experiments.methods import METHODS

    method = raw.get("method", DEFAULT_METHOD)
    if not isinstance(method, str) or method not in METHODS:
        hint = suggest(str(method), METHODS) or f" (methods: {', '.join(METHODS)})"
        raise ConfigError(f"method: unknown method '{method}'{hint}")
    return method


def check_names(cfg: RunConfig) -> None:
    """Raise ConfigError for an unknown task or model, or a pipeline its method does not have."""
    from experiments.methods import METHODS
    from experiments.models import check_model_name
    from experiments.tasks import TASKS

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
    from experiments.run_keys import extra_tasks
    from experiments.tasks import TASKS

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
    from experiments.config_keys import unknown_key, wrong_section

    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return wrong_section(key, method) or unknown_key(key, method)
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{key}: {first['msg']} (got {first.get('input')!r}){more}"
