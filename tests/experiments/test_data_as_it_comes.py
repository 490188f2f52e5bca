"""Data as researchers get it: tsv/csv files without a header row (``task.columns``) and Hugging
Face datasets by name (``task.hf``, ``task.hf_config``; split names in train/dev)."""

import pytest

from base.sections import ConfigError, TaskConfig
from experiments.harness.config import parse_config
from experiments.tasks import classification, sources, tagging


def headerless(tmp_path, name="train.tsv", rows=12):
    """A GLUE-test-like TSV: no header row, label first, then the text."""
    lines = [f"{i % 2}\t{'good' if i % 2 else 'bad'} film number {i}" for i in range(rows)]
    (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


def error(raw_task) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"task": raw_task})
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_headerless_tsv_reads_with_named_columns(tmp_path, minilm_tokenizer):
    task = {"name": "classification", "data_dir": str(tmp_path), "train": headerless(tmp_path),
            "dev": headerless(tmp_path, "dev.tsv", 4), "columns": ["label", "text"]}
    data = classification.load(TaskConfig.model_validate(task), minilm_tokenizer)
    assert (len(data.train), len(data.dev), data.label_names) == (12, 4, ("0", "1"))
    assert minilm_tokenizer.decode(data.train.input_ids[1], skip_special_tokens=True) == "good film number 1"
    assert data.train.labels.tolist()[:4] == [0, 1, 0, 1]  # the first row is an example, not a header
    # without task.columns the first example is taken as the header, and the error says what to set
    message = error(task | {"columns": None})
    assert "no column 'text'" in message and "name the columns with task.columns" in message


def test_columns_are_checked_against_each_row_and_the_format(tmp_path):
    task = {"name": "classification", "data_dir": str(tmp_path), "train": headerless(tmp_path),
            "dev": headerless(tmp_path, "dev.tsv", 4)}
    assert "line 1 has 2 fields, task.columns names 3" in error(task | {"columns": ["label", "text", "extra"]})
    assert "name each column once" in error(task | {"columns": ["text", "text"]})
    (tmp_path / "dev.jsonl").write_text('{"text": "a", "label": "0"}\n')
    assert "task.columns: names the columns of tsv/csv files" in error(task | {"columns": ["label", "text"],
                                                                           "dev": "dev.jsonl"})


def test_columns_enter_the_run_key_only_when_set(tmp_path):
    task = {"name": "classification", "data_dir": str(tmp_path), "train": headerless(tmp_path),
            "dev": headerless(tmp_path, "dev.tsv", 4), "columns": ["label", "text"]}
    other = task | {"columns": ["label", "sentence"], "text": "sentence"}
    assert parse_config({"task": task}).run_key != parse_config({"task": other}).run_key
    # the new keys at their defaults leave every existing run key as it was (tests/experiments/test_config.py pins them)
    assert parse_config({"task": {"name": "synthetic-cls"}})._key_material["config"] == {"seed": 0}
    assert parse_config({"task": task})._key_material["config"]["task.columns"] == ["label", "text"]


def local_dataset(tmp_path):
    """A dataset folder ``datasets.load_dataset`` reads by its path (CSV files named by split)."""
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    for split, n in (("train", 10), ("validation", 4)):
        rows = "".join(f"{'great' if i % 2 else 'dull'} plot {i},{i % 2}\n" for i in range(n))
        (folder / f"{split}.csv").write_text("sentence,label\n" + rows)
    return folder


def test_a_dataset_by_name_loads_its_splits(tmp_path, minilm_tokenizer, monkeypatch):
    pytest.importorskip("datasets")  # a dev dependency: installed by make test
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = local_dataset(tmp_path)
    task = {"name": "classification", "data_dir": str(tmp_path), "hf": "my_dataset", "train": "train",
            "dev": "validation", "text": "sentence"}
    cfg = parse_config({"task": task})
    assert cfg.task.hf == str(folder) and cfg.task.train == "train"  # the folder made absolute, splits kept
    data = classification.load(cfg.task, minilm_tokenizer)
    assert (len(data.train), len(data.dev), data.label_names) == (10, 4, ("0", "1"))
    fingerprint = classification.fingerprint(cfg.task)
    assert fingerprint == classification.fingerprint(cfg.task)  # stable: datasets' own content hash
    assert "task.dev: cannot load split 'test'" in error(task | {"dev": "test"})
    assert "task.columns: a dataset named by task.hf has its own columns" in error(task | {"columns": ["a", "b"]})


def test_a_dataset_by_name_offline_fails_with_what_to_do(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    message = error({"name": "classification", "hf": "nyu-mll/glue", "hf_config": "sst2", "train": "train",
                     "dev": "validation", "text": "sentence"})
    assert "task.train: cannot load split 'train' of the dataset 'nyu-mll/glue' (config 'sst2')" in message
    assert "HF_HUB_OFFLINE is set" in message


def test_tagging_reads_a_dataset_by_name(tmp_path, minilm_tokenizer, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tags"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.jsonl").write_text("".join(
            f'{{"tokens": ["the", "cat", "{i}"], "tags": ["DET", "NOUN", "NUM"]}}\n' for i in range(3)))
    task = {"name": "tagging", "hf": str(folder), "train": "train", "dev": "validation"}
    data = tagging.load(TaskConfig.model_validate(task), minilm_tokenizer)
    assert data.label_names == ("DET", "NOUN", "NUM") and len(data.train) == 3
    assert sources.Source("train", str(folder), "hub", split="train") in sources._HUB
