"""One run's configuration: typed, frozen, validated once at the edge.

A run is content-addressed (DESIGN.md, decision 1): ``run_key`` hashes the
canonical config (seed included) together with the VERSION of its task and
method, so a result is reused only while the code that made it is the same;
``group_key`` is the same hash without the seed (the unit for mean +- std).

Every mistake is a :class:`ConfigError` whose one-line message names the key
and, for a misspelt key or name, the nearest valid one.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


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


class GateConfig(_Frozen):
    lambda_: float = Field(
        0.01, alias="lambda", ge=0, le=100,
        description="Weight of the L0 penalty (mean over layers of expected open heads per layer).",
    )
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate of log_alpha (no schedule).")
    sp_finetune_steps: int | None = Field(
        None, gt=0,
        description="SP only: fine-tuning steps before gating starts (None = as many as the gated phase).",
    )


class RunConfig(_Frozen):
    seed: int = Field(0, ge=0, description="The run's seed; every random stream derives from it.")
    model: str = Field("minilm-l6", description="Model name (experiments.models), random:<name>, hub id or path.")
    method: str = Field("head_gates", description="Method name, a key of experiments.methods.METHODS.")
    pipeline: str | None = Field(None, description="Pipeline of the method; None = the method's first.")
    sparsity: float | None = Field(
        None, ge=0, lt=1, description="Target fraction of heads removed (methods that take one)."
    )
    task: TaskConfig = Field(default_factory=TaskConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    gates: GateConfig = Field(default_factory=GateConfig)

    def to_dict(self) -> dict[str, Any]:
        """The canonical nested dict (aliases as users write them, every default filled)."""
        return self.model_dump(by_alias=True, mode="json")

    @property
    def run_key(self) -> str:
        return _hash(self._key_material())

    @property
    def group_key(self) -> str:
        material = self._key_material()
        material["config"].pop("seed")
        return _hash(material)

    def _key_material(self) -> dict[str, Any]:
        from experiments.methods import METHODS
        from experiments.tasks import TASKS

        return {
            "config": self.to_dict(),
            "task_version": TASKS[self.task.name].VERSION,
            "method_version": METHODS[self.method].VERSION,
        }


def _hash(material: dict[str, Any]) -> str:
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def valid_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key a config accepts, e.g. ``train.lr`` and ``gates.lambda``."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(valid_keys(annotation, f"{key}."))
        else:
            keys.append(key)
    return keys


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """'; did you mean 'x'?' for the nearest choice, or '' when nothing is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else ""


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
    """Apply ``--set key=value`` strings; values are read as YAML (1e-4, true, [1, 2])."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        config = set_dotted(config, key.strip(), parse_yaml(raw))
    return config


def parse_config(raw: dict[str, Any], *, check_files: bool = True) -> RunConfig:
    """Validate a nested dict into a RunConfig, or raise a one-line ConfigError.

    Checks keys and types, then names (model, task, method, pipeline), then,
    unless ``check_files`` is False, that the task's data files exist.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a run config must be a mapping of keys, got {type(raw).__name__}")
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    cfg = _check_names(cfg)
    if check_files:
        check_data(cfg)
    return cfg


def _check_names(cfg: RunConfig) -> RunConfig:
    from experiments.methods import METHODS
    from experiments.models import check_model_name
    from experiments.tasks import TASKS

    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name: unknown task '{cfg.task.name}'{suggest(cfg.task.name, list(TASKS))}")
    if cfg.method not in METHODS:
        raise ConfigError(f"method: unknown method '{cfg.method}'{suggest(cfg.method, list(METHODS))}")
    try:
        check_model_name(cfg.model)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from None
    method = METHODS[cfg.method]
    if cfg.pipeline is None:
        cfg = cfg.model_copy(update={"pipeline": method.PIPELINES[0]})
    if cfg.pipeline not in method.PIPELINES:
        raise ConfigError(
            f"pipeline: method '{cfg.method}' has no pipeline '{cfg.pipeline}' "
            f"(it has {', '.join(method.PIPELINES)}){suggest(cfg.pipeline, method.PIPELINES)}"
        )
    return cfg


def check_data(cfg: RunConfig) -> None:
    """Raise ConfigError naming the missing file when the task's data is not there."""
    from experiments.tasks import TASKS

    try:
        TASKS[cfg.task.name].check(cfg.task)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"task '{cfg.task.name}': {err}") from None


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = [str(part) for part in first["loc"]]
    key = ".".join(loc)
    if first["type"] == "extra_forbidden":
        keys = valid_keys()
        keys += sorted({k.rsplit(".", 1)[0] for k in keys if "." in k})  # sections: task, train, gates
        same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == loc[-1]]  # right key, wrong section
        hint = f"; did you mean '{same_leaf[0]}'?" if same_leaf else suggest(key, keys)
        return f"unknown key '{key}'{hint}"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{key}: {first['msg']} (got {first.get('input')!r}){more}"
