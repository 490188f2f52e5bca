"""The plain shapes a run config is made of, below the methods: the shared sections, a method's
``Section`` base, ``ConfigError``, the stage roles, and dotted keys and YAML.

A method module imports its ``Section`` and ``ConfigError`` from here; the keyed ``RunConfig``,
parsing, stages and checks (``experiments.harness.config``) sit above the methods and read them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)


class ConfigError(ValueError):
    """A config that cannot run: one line, naming the key and a suggestion."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TaskConfig(_Frozen):
    name: str = Field("synthetic-cls", description="Task name, a key of experiments.tasks.TASKS.")
    id: str | None = Field(
        None, description="The task's name in tables, figures, MLflow and --across task (agnews, trec: two "
        "file tasks of one grid told apart); None = task.name. Part of the run key, like every key set."
    )
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
    columns: tuple[str, ...] | None = Field(
        None, description="File tasks, tsv/csv without a header row (GLUE's test files, AG News): the columns' "
        "names in order, e.g. [label, text]; None = the first row names them."
    )
    hf: str | None = Field(
        None, description="File tasks: a Hugging Face dataset by name (glue) or a dataset folder "
        "datasets.load_dataset reads; task.train, task.dev and eval_sets are then split names "
        "(train, validation). Cached by datasets; loads offline only from its cache."
    )
    hf_config: str | None = Field(None, description="The configuration of the task.hf dataset (sst2 of glue).")

    @model_validator(mode="before")
    @classmethod
    def _absolute_paths(cls, data: Any) -> Any:
        """Resolve relative train/dev/eval_sets paths once, here, against data_dir (else the current
        directory), so a Ray worker running in another folder reads the same files. Idempotent."""
        if not isinstance(data, dict):
            return data
        base = Path(data["data_dir"]).expanduser() if isinstance(data.get("data_dir"), str) else Path(".")
        if isinstance(data.get("hf"), str):  # train/dev/eval_sets are split names; hf a name or a local folder
            local = base / Path(data["hf"]).expanduser()
            return data | {"hf": os.path.abspath(local)} if local.is_dir() else data
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

    @field_validator("id")
    @classmethod
    def _simple_id(cls, value: Any) -> Any:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError(f"a task id is letters, digits, '_', '-' or '.' (it names runs and files), got {value!r}")
        return value

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, value: Any) -> Any:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError(f"name each column once, got {list(value)}")
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
    decoder_lr: float | None = Field(
        1e-3, gt=0, le=1, description="Task decoder learning rate; null = train.lr, one learning rate for every "
        "parameter, as the papers' reference scripts (run_classifier.py, trainer_imp.py).")
    weight_decay: float = Field(
        0.01, ge=0, le=1, description="AdamW weight decay of encoder and decoder matrices; biases and LayerNorm "
        "weights get none (BERT's no_decay: run_classifier.py, trainer_imp.py).")
    pooler: bool = Field(
        False, description="A sentence classifier reads the encoder's pooler tanh(W_p h_[CLS] + b_p), trained with "
        "the encoder, as BERT's BertForSequenceClassification (Michel et al.'s run_classifier.py); false: it reads "
        "[CLS]. Needs a model with a pooler (BERT, RoBERTa; MiniLM's checkpoint has BERT's pretrained one); a "
        "model without one (DistilBERT, DeBERTa) is refused, and one whose checkpoint lacks its weights starts "
        "from transformers' random pooler (transformers warns).")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Fraction of steps with linear warm-up.")
    eval_every: int = Field(50, gt=0, description="Evaluate (and log gates) every this many steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Forward-pass precision (experiments/training/precision.py): fp32; bf16 = autocast to "
        "bfloat16 (CPU or CUDA); fp16 = autocast to float16 with a grad scaler (CUDA only: use bf16 on CPU). "
        "Weights, optimiser states, gates and losses stay float32.",
    )


    @property
    def head_lr(self) -> float:
        """The task decoder's learning rate: ``decoder_lr``, or ``lr`` when that is null."""
        return self.lr if self.decoder_lr is None else self.decoder_lr


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


class SharedConfig(_Frozen):
    """The sections every run config shares (seed, model, method, task, train, stages): the plain
    shape, below the methods. ``experiments.harness.config.RunConfig`` adds the keys, the stages and
    the method's own section."""


    seed: int = Field(0, ge=0, description="The run's seed; every random stream derives from it.")
    model: str = Field("minilm-l6", description="Model name (experiments.models), random:<name>, hub id or path.")
    method: str = Field(DEFAULT_METHOD, description="Method name, a key of experiments.methods.METHODS.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="The task and its data.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation every method shares.")
    init_from: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["init_from"] + ".")
    teacher: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["teacher"] + ".")
    bias_model: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["bias_model"] + ".")
    source: dict[str, Any] | None = Field(None, description="Upstream run: " + STAGE_ROLES["source"] + ".")


ALIASES = {"task": "task.name"}
"""Keys a grid, ``--set`` or an analysis axis may write for a longer one, whatever the method."""


def resolve_key(key: str, method: str, names: Collection[str]) -> str:
    """The dotted key ``key`` stands for in a run of ``method``: an alias expanded (``task`` ->
    ``task.name``); one of ``names``, the keys of the method's section written without it, as that
    key (``lambda`` -> ``head_gates.lambda``); anything else unchanged.

    The one short-name resolver: grids and ``--set`` pass the method's ``SHORT_NAMES``
    (``config_keys.resolve``), run names invert it, analysis passes the keys its stored section
    has (it reads no method module)."""
    if key in ALIASES:
        return ALIASES[key]
    if key in names:
        return f"{method}.{key}"
    return key


def section_value(section: BaseModel, key: str, default: Any = None) -> Any:
    """The value of ``key`` as users write it (``lambda``, not ``lambda_``), or ``default``."""
    name = _attribute(type(section), key)
    return default if name is None else getattr(section, name)


@lru_cache(maxsize=1024)
def _attribute(cls: type[BaseModel], key: str) -> str | None:
    """The attribute of the field written ``key`` (its name or its alias), or None."""
    return next((name for name, field in cls.model_fields.items() if key in (name, field.alias)), None)


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


