"""A key nothing reads is refused (issue 43): each task's ``READS`` against what its code consults.

The property: for every task and every ``task.*`` key, a key the task declares is consulted by its
code when set (``check``, ``fingerprint``, ``load`` on a recording proxy of the real config), and a
key it does not declare is refused by ``parse_config`` with one line naming the key and the task.
A key accepted and never read would change the run key and nothing else.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from base.sections import ConfigError, TaskConfig
from experiments.harness.config import parse_config
from experiments.methods import METHODS
from experiments.models import load_tokenizer
from experiments.tasks import TASKS, synthetic_cls

RUN_READS = ("name", "id")
"""Read by the run, not the task's code: the name picks the module, the id labels the runs."""


def _files(tmp_path) -> dict[str, dict]:
    """A valid base section per task over tiny real files, and the headerless variant for ``columns``."""
    conllu = "".join(f"{i}\t{w}\t{w}\t{t}\t_\t_\t0\troot\t_\t_\n" for i, (w, t) in enumerate(
        [("dogs", "NOUN"), ("run", "VERB")], start=1)) + "\n"
    for name, text in {"train.csv": "text,label\ngood film,pos\nbad film,neg\nfine,pos\n",
                       "dev.csv": "text,label\ngreat,pos\nawful,neg\n",
                       "bare.csv": "good film,pos\nbad film,neg\n",
                       "train.conllu": conllu * 3, "dev.conllu": conllu,
                       "sst2/train.tsv": "sentence\tlabel\ngood\t1\nbad\t0\n", "sst2/dev.tsv": "sentence\tlabel\nok\t1\n",
                       "ud_ewt/en_ewt-ud-dev.conllu": conllu * 3, "ud_ewt/en_ewt-ud-test.conllu": conllu}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    shared = {"data_dir": str(tmp_path)}
    return {"classification": {"train": str(tmp_path / "train.csv"), "dev": str(tmp_path / "dev.csv")},
            "tagging": {"train": str(tmp_path / "train.conllu"), "dev": str(tmp_path / "dev.conllu")},
            "sst2": shared, "ud-pos": shared, "ud-dep": shared}


def _sample(name: str, key: str, tmp_path) -> dict:
    """A value of ``key`` away from its default that task ``name`` can take."""
    tagging = TASKS[name].KIND == "tagging"
    return {"max_train": {"max_train": 2}, "max_eval": {"max_eval": 1}, "max_length": {"max_length": 16},
            "data_seed": {"data_seed": 3}, "num_train": {"num_train": 4}, "num_eval": {"num_eval": 4},
            "data_dir": {"data_dir": str(tmp_path), "train": "train.conllu" if tagging else "train.csv"},
            "train": {"train": str(tmp_path / ("train.conllu" if tagging else "train.csv"))},
            "dev": {"dev": str(tmp_path / ("dev.conllu" if tagging else "dev.csv"))},
            "eval_sets": {"eval_sets": {"ood": str(tmp_path / ("dev.conllu" if tagging else "dev.csv"))}},
            "format": {"format": "conllu" if tagging else "csv"}, "text": {"text": "text"}, "label": {"label": "label"},
            "labels": {"labels": ["NOUN", "VERB"] if tagging else ["neg", "pos"]}, "column": {"column": "upos"},
            "columns": {"columns": ["text", "label"], "train": str(tmp_path / "bare.csv"), "dev": str(tmp_path / "bare.csv")},
            "hf": {"hf": "nobody/nothing"}, "hf_config": {"hf": "nobody/nothing", "hf_config": "small"}}[key]


class _Recording:
    """A task config that records which of its keys the task's code consults."""

    def __init__(self, cfg: TaskConfig):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "seen", set())

    def __getattr__(self, name):
        self.seen.add(name)
        return getattr(self._cfg, name)

    def __hash__(self):
        return hash(self._cfg)

    def __eq__(self, other):
        return self._cfg == getattr(other, "_cfg", other)


def consulted(name: str, raw: dict, tokenizer) -> set[str]:
    """The keys task ``name``'s check, fingerprint and load consult on the config ``raw`` (each step
    run to its end or its first error: an hf dataset that is not there still consults hf_config)."""
    cfg = _Recording(TaskConfig.model_validate({"name": name, **raw}))
    module = TASKS[name]
    for step in (module.check, module.fingerprint, lambda c: module.load(c, tokenizer)):
        try:
            step(cfg)
        except Exception:  # noqa: BLE001, S112 (what was consulted before the error is what counts)
            continue
    return cfg.seen


def declared_but_unread(name: str, module, tmp_path, tokenizer) -> list[str]:
    """The keys task ``name`` declares (``module.READS``) that its code does not consult when set."""
    base = _files(tmp_path).get(name, {})
    return [key for key in module.READS if key not in RUN_READS
            and key not in consulted(name, base | _sample(name, key, tmp_path), tokenizer)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("minilm-l6")


@pytest.mark.parametrize("name", list(TASKS))
def test_every_key_a_task_accepts_is_read_and_every_other_is_refused(name, tmp_path, tokenizer):
    module = TASKS[name]
    assert set(module.READS) <= set(TaskConfig.model_fields), "READS names a key TaskConfig does not have"
    assert declared_but_unread(name, module, tmp_path, tokenizer) == []
    base = _files(tmp_path).get(name, {})
    for key in sorted(set(TaskConfig.model_fields) - set(module.READS)):
        sample = _sample(name, key, tmp_path)  # columns comes with its headerless train file: either is named
        named = "|".join(k for k in sample if k not in module.READS)
        with pytest.raises(ConfigError, match=rf"^task\.({named}): the {name} task (reads no files|reads its own "
                                              rf"files|does not read task\.({named})).*; .* reads? it \(set task.name: "):
            parse_config({"task": {"name": name, **base, **sample}}, check_files=False)
    assert parse_config({"task": {"name": name, **base}}, check_files=False).task.name == name


def test_the_property_catches_a_task_that_accepts_a_key_it_does_not_read(monkeypatch, tmp_path, tokenizer):
    """The broken variant: synthetic-cls made to accept task.train, which its generator never reads."""
    monkeypatch.setattr(synthetic_cls, "READS", (*synthetic_cls.READS, "train"))
    assert declared_but_unread("synthetic-cls", synthetic_cls, tmp_path, tokenizer) == ["train"]


def test_the_issue_s_example_is_refused_with_one_line_and_never_falls_back():
    example = {"task": {"id": "mytask", "columns": ["text", "label"], "train": "does/not/exist/train.tsv",
                        "dev": "does/not/exist/dev.tsv"}}
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert str(err.value) == ("task.train: the synthetic-cls task reads no files (task.name is unset, and synthetic-cls "
                              "is its default); the file tasks read it (set task.name: classification or tagging)")
    with pytest.raises(ConfigError, match=r"no such file: .*does/not/exist/train.tsv \(a relative path is resolved "
                                          r"against task.data_dir, else the current directory\)$"):
        parse_config({"task": example["task"] | {"name": "classification"}})


@pytest.mark.parametrize(("task", "key", "value", "line"), [
    ("sst2", "columns", ["text", "label"], "task.columns: the sst2 task reads its own files (under task.data_dir); "
                                           "the classification task reads it (set task.name: classification)"),
    ("sst2", "text", "sentence", "task.text: the sst2 task reads its own files (under task.data_dir); the file tasks"),
    ("synthetic-cue", "labels", ["a", "b"], "task.labels: the synthetic-cue task reads no files; the file tasks read it"),
    ("synthetic-cls", "data_dir", "/data", "task.data_dir: the synthetic-cls task does not read task.data_dir; the tasks "
                                           "sst2, ud-pos, ud-dep, classification, tagging read it"),
    ("sst2", "num_train", 100, "task.num_train: the sst2 task does not read task.num_train; the tasks synthetic-cls, "),
])
def test_a_built_in_task_refuses_the_keys_of_other_tasks(task, key, value, line):
    with pytest.raises(ConfigError) as err:
        parse_config({"task": {"name": task, key: value}}, check_files=False)
    assert str(err.value).startswith(line)


def test_a_multitask_task_is_held_to_the_same_rule():
    raw = {"method": "multitask", "multitask": {"tasks": [{"name": "synthetic-tag", "train": "x.tsv"}]}}
    with pytest.raises(ConfigError, match=r"^multitask.tasks.0.train: the synthetic-tag task reads no files"):
        parse_config(raw, check_files=False)


def _sources(module, seen: set[str]) -> str:
    """The text of a method module and of every experiments module it imports, once each."""
    if module.__name__ in seen:
        return ""
    seen.add(module.__name__)
    text = inspect.getsource(module)
    for name in re.findall(r"^from (experiments\.[\w.]+) import", text, re.M):
        text += _sources(importlib.import_module(name), seen)
    return text


@pytest.mark.parametrize("method", list(METHODS))
def test_every_key_of_a_method_s_section_is_read_by_its_code(method):
    """Static, weaker than the tasks' check: each key of the section is named (``.attr`` or the key as
    a string) by the method's module or a module it imports, so no key is declared and left alone."""
    module = METHODS[method]
    text = _sources(module, set())
    unread = [field.alias or name for name, field in module.Config.model_fields.items()
              if not re.search(rf"\.{name}\b|[\"']{field.alias or name}[\"']", text)]
    assert unread == [], f"{method} declares keys its code never names: {unread}"


def test_the_cli_refuses_the_example_at_run_and_at_submit(tmp_path):
    """The real commands, `headsweep run` and `headsweep submit --dry-run`, on the issue's example."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    task = "{id: mytask, columns: [text, label], train: does/not/exist/train.tsv, dev: does/not/exist/dev.tsv}"
    (tmp_path / "run.yaml").write_text(f"task: {task}\n")
    (tmp_path / "grid.yaml").write_text(f"name: mine\nbase:\n  task: {task}\naxes:\n  seed: [0, 1]\n")
    line = ("the synthetic-cls task reads no files (task.name is unset, and synthetic-cls is its default); "
            "the file tasks read it (set task.name: classification or tagging)")
    cli = str(Path(sys.executable).parent / "headsweep")
    env = os.environ | {"HEADSWEEP_HOME": str(tmp_path / "home")}
    for args, expected in ((["run", "run.yaml"], f"headsweep: error: task.train: {line}"),
                           (["submit", "grid.yaml", "--dry-run"],
                            f"headsweep: error: base: 'task.train' applies to no cell: {line}")):
        done = subprocess.run([cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == expected, done.stderr
