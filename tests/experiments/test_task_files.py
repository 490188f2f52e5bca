"""Tasks from the user's own files: formats, label sets, paths, content hashes and bad-data errors."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from base.sections import ConfigError, TaskConfig, read_yaml
from experiments import RunContext, run
from experiments.harness.config import parse_config
from experiments.tasks import TASKS, classification, sources, tagging
from experiments.tasks.parts import IGNORE_INDEX
from experiments.training.tracking import MemoryTracker

ROOT = Path(__file__).resolve().parents[2]

ROW = "\t".join


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path.name


def csv_task(tmp_path, **task):
    """Files of a 3-label CSV task in tmp_path; returns the raw task section."""
    write(tmp_path / "train.csv", "sentence,label\n" + "".join(
        f'"{word} item, number {i}",{label}\n'
        for i in range(4) for word, label in (("great", "pos"), ("awful", "neg"), ("plain", "neu"))
    ))  # fmt: skip
    write(tmp_path / "dev.csv", 'sentence,label\n"fine, really",pos\nbad,neg\nok,neu\n')
    return {"name": "classification", "data_dir": str(tmp_path), "train": "train.csv",
            "dev": "dev.csv", "text": "sentence"} | task  # fmt: skip


def pair_task(tmp_path, **task):
    """Files of a sentence-pair JSONL task with an `ood` evaluation set."""
    def lines(n, offset=0):
        labels = ["entailment", "neutral", "contradiction"]
        return "".join(
            json.dumps({"premise": f"a man rides bike {i}", "hypothesis": f"someone {i} moves",
                        "label": labels[(i + offset) % 3]}) + "\n"  # fmt: skip
            for i in range(n)
        )

    write(tmp_path / "train.jsonl", lines(12))
    write(tmp_path / "dev.jsonl", lines(6) + "\n")  # a trailing blank line is fine
    write(tmp_path / "ood.jsonl", lines(5, offset=1))
    return {"name": "classification", "data_dir": str(tmp_path), "train": "train.jsonl", "dev": "dev.jsonl",
            "eval_sets": {"ood": "ood.jsonl"}, "text": ["premise", "hypothesis"]} | task  # fmt: skip


def task_cfg(raw):
    return TaskConfig.model_validate(raw)


def error(raw_task) -> str:
    """The one-line ConfigError that validating a run config with this task section gives."""
    with pytest.raises(ConfigError) as info:
        parse_config({"task": raw_task})
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- classification


def test_csv_with_three_labels_loads_with_sorted_label_ids(tmp_path, minilm_tokenizer):
    cfg = task_cfg(csv_task(tmp_path, max_train=9))
    data = classification.load(cfg, minilm_tokenizer)
    assert data.label_names == ("neg", "neu", "pos") and data.num_labels == 3
    assert (len(data.train), len(data.dev)) == (9, 3) and data.eval_sets == {}
    assert data.dev.labels.tolist() == [2, 0, 1]  # pos, neg, neu
    first = minilm_tokenizer.decode(data.dev.input_ids[0], skip_special_tokens=True)
    assert first == "fine, really"  # quoted comma kept inside the text


def test_given_labels_fix_the_ids_and_yaml_numbers_match_the_file(tmp_path, minilm_tokenizer):
    data = classification.load(task_cfg(csv_task(tmp_path, labels=["pos", "neu", "neg"])), minilm_tokenizer)
    assert data.label_names == ("pos", "neu", "neg") and data.dev.labels.tolist() == [0, 2, 1]
    write(tmp_path / "n.tsv", 'text\tlabel\nsaid "hi"\t10\nb\t2\nc\t1\n')
    numeric = task_cfg({"name": "classification", "data_dir": str(tmp_path), "train": "n.tsv", "dev": "n.tsv"})
    data = classification.load(numeric, minilm_tokenizer)
    assert data.label_names == ("1", "2", "10")  # numeric order, not '1' < '10' < '2'
    assert minilm_tokenizer.decode(data.train.input_ids[0], skip_special_tokens=True) == 'said " hi "'  # TSV: no quoting
    assert task_cfg({"labels": [0, 1, True]}).labels == ("0", "1", "true")


def test_sentence_pairs_load_as_sequence_pairs_with_an_ood_set(tmp_path, minilm_tokenizer):
    data = classification.load(task_cfg(pair_task(tmp_path)), minilm_tokenizer)
    assert set(data.eval_sets) == {"ood"} and len(data.eval_sets["ood"]) == 5 and len(data.dev) == 6
    sep = minilm_tokenizer.sep_token_id
    assert (data.train.input_ids[0] == sep).sum() == 2  # [CLS] premise [SEP] hypothesis [SEP]
    assert data.label_names == ("contradiction", "entailment", "neutral")
    assert data.eval_sets["ood"].labels.tolist() == [2, 0, 1, 2, 0]


def test_relative_paths_resolve_once_against_data_dir_or_the_current_directory(tmp_path, monkeypatch):
    raw = pair_task(tmp_path)
    cfg = parse_config({"task": raw})
    assert cfg.task.train == str(tmp_path / "train.jsonl") and cfg.task.eval_sets == (("ood", str(tmp_path / "ood.jsonl")),)
    again = parse_config(cfg.to_dict())  # what a Ray worker in another folder re-validates
    assert again == cfg and again.run_key == cfg.run_key and hash(again) == hash(cfg)
    assert cfg.to_dict()["task"]["eval_sets"] == {"ood": str(tmp_path / "ood.jsonl")}
    monkeypatch.chdir(tmp_path)
    here = parse_config({"task": {**raw, "data_dir": None}})
    assert here.task.dev == str(tmp_path / "dev.jsonl")


def test_the_same_files_in_another_folder_keep_the_run_key(tmp_path):
    other = tmp_path / "copy"
    other.mkdir()
    pair_task(tmp_path)
    for name in ("train.jsonl", "dev.jsonl", "ood.jsonl"):
        (other / name).write_bytes((tmp_path / name).read_bytes())
    here = parse_config({"task": pair_task(tmp_path)})
    there = parse_config({"task": pair_task(tmp_path) | {"data_dir": str(other)}})
    assert here.task.train != there.task.train and here.run_key == there.run_key
    with open(other / "ood.jsonl", "a") as f:
        f.write(json.dumps({"premise": "x", "hypothesis": "y", "label": "neutral"}) + "\n")
    changed = parse_config({"task": pair_task(tmp_path) | {"data_dir": str(other)}})
    assert changed.run_key != here.run_key


def test_fingerprint_follows_the_content_and_roles_of_the_files(tmp_path):
    cfg = task_cfg(pair_task(tmp_path))
    first = classification.fingerprint(cfg)
    assert len(first) == 16 and classification.fingerprint(cfg) == first
    other = tmp_path / "copy"
    other.mkdir()
    for name in ("train.jsonl", "dev.jsonl", "ood.jsonl"):
        (other / name).write_bytes((tmp_path / name).read_bytes())
    assert classification.fingerprint(task_cfg(pair_task(tmp_path) | {"data_dir": str(other)})) == first
    swapped = task_cfg(pair_task(tmp_path) | {"eval_sets": {"ood": "dev.jsonl"}, "dev": "ood.jsonl"})
    assert classification.fingerprint(swapped) != first
    with open(tmp_path / "ood.jsonl", "a") as f:
        f.write(json.dumps({"premise": "x", "hypothesis": "y", "label": "neutral"}) + "\n")
    assert classification.fingerprint(cfg) != first
    assert TASKS["synthetic-cls"].fingerprint(cfg) is None and TASKS["synthetic-tag"].fingerprint(cfg) is None


def test_file_digests_are_cached_by_path_size_and_mtime(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\na,1\n")
    before = sources.file_digest(str(path))
    stat = os.stat(path)
    path.write_text("text,label\nb,1\n")  # same size ...
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... and mtime: the cached digest stands
    assert sources.file_digest(str(path)) == before
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert sources.file_digest(str(path)) != before


def test_a_thousand_checks_of_the_same_files_read_them_once(tmp_path, monkeypatch):
    reads = []
    real = classification.read_records
    monkeypatch.setattr(classification, "read_records", lambda src: reads.append(src.role) or real(src))
    cfg = task_cfg(pair_task(tmp_path))
    for _ in range(1000):
        classification.check(cfg)
    assert reads == ["train", "dev", "eval_sets.ood"]
    (tmp_path / "dev.jsonl").write_text(json.dumps({"premise": "p", "hypothesis": "h", "label": "neutral"}) + "\n")
    classification.check(cfg)  # changed content: checked again
    assert len(reads) == 6


# --------------------------------------------------------------------------- bad data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dev": "nope.csv"}, "task.dev: no such file: {tmp}/nope.csv"),
        ({"text": "sentense"}, "task.text: no column 'sentense' in {tmp}/train.csv (its columns: sentence, label); "
                               "did you mean 'sentence'?"),
        ({"label": "labl"}, "did you mean 'label'?"),
        ({"dev": "empty.csv"}, "task.dev: {tmp}/empty.csv has no examples"),
        ({"dev": "maybe.csv"}, "task.dev: label 'maybe' (line 3 of {tmp}/maybe.csv) never occurs in the train file "
                               "{tmp}/train.csv (its labels: neg, neu, pos)"),
        ({"eval_sets": {"ood": "maybe.csv"}}, "task.eval_sets.ood: label 'maybe' (line 3 of"),
        ({"dev": "latin1.csv"}, "task.dev: {tmp}/latin1.csv line 3 is not UTF-8 text (byte 0xe9)"),
        ({"format": "xlsx"}, "task.format: unknown format 'xlsx'"),
        ({"dev": "dev.txt"}, "task.dev: cannot tell the format of {tmp}/dev.txt from its extension '.txt'; "
                             "set task.format to one of tsv, csv, jsonl, hf"),
        ({"dev": "ragged.csv"}, "task.dev: {tmp}/ragged.csv line 2 has 3 fields, its header has 2"),
        ({"labels": ["pos", "neg"]}, "task.labels: label 'neu' (line 4 of {tmp}/train.csv) is not one of pos, neg"),
        ({"train": None}, "task.train: the classification task needs task.train and task.dev"),
        ({"dev": "dev.conllu"}, "is conllu, the classification task reads tsv, csv, jsonl, hf"),
    ],
)
def test_bad_data_fails_validation_with_one_line(tmp_path, change, message):
    raw = csv_task(tmp_path) | change
    write(tmp_path / "empty.csv", "sentence,label\n")
    write(tmp_path / "maybe.csv", "sentence,label\nfine,pos\nwho knows,maybe\n")
    (tmp_path / "latin1.csv").write_bytes("sentence,label\nok,pos\ncaf\xe9,neu\n".encode("latin-1"))
    write(tmp_path / "dev.txt", "sentence,label\nok,pos\n")
    write(tmp_path / "ragged.csv", "sentence,label\nok, fine,pos\n")
    write(tmp_path / "dev.conllu", ROW(["1", "x"] + ["_"] * 8) + "\n")
    got = error(raw)
    assert got.startswith("task 'classification': task.") and message.format(tmp=tmp_path) in got


def test_bad_jsonl_and_bad_eval_set_names(tmp_path):
    raw = pair_task(tmp_path)
    write(tmp_path / "broken.jsonl", '{"premise": "a", "hypothesis": "b", "label": "neutral"}\n{"premise": \n')
    assert "task.dev: " + str(tmp_path / "broken.jsonl") + " line 2 is not JSON" in error(raw | {"dev": "broken.jsonl"})
    write(tmp_path / "nolabel.jsonl", '{"premise": "a", "hypothesis": "b", "label": null}\n')
    assert "line 1 has no value in column 'label'" in error(raw | {"dev": "nolabel.jsonl"})
    write(tmp_path / "nokey.jsonl", '{"premise": "a", "hypothesis": "b", "label": "neutral"}\n{"premise": "c"}\n')
    assert "nokey.jsonl line 2 has no value in column 'hypothesis'" in error(raw | {"dev": "nokey.jsonl"})
    assert "eval set name 'o/d'" in error(raw | {"eval_sets": {"o/d": "ood.jsonl"}})


# --------------------------------------------------------------------------- tagging


def conllu(*sentences):
    """CoNLL-U text: each sentence a list of (form, upos, xpos, deprel)."""
    out = []
    for words in sentences:
        out.append("# sent")
        out += [ROW([str(i), f, f.lower(), u, x, "_", "0", d, "_", "_"]) for i, (f, u, x, d) in enumerate(words, 1)]
        out.append("")
    return "\n".join(out) + "\n"


@pytest.fixture
def ud_files(tmp_path):
    write(tmp_path / "train.conllu", conllu(
        [("Dogs", "NOUN", "NNS", "nsubj"), ("bark", "VERB", "VBP", "root"), (".", "PUNCT", ".", "punct")],
        [("I", "PRON", "PRP", "nsubj"), ("ran", "VERB", "VBD", "root")],
    ))  # fmt: skip
    write(tmp_path / "dev.conllu", conllu([("Cats", "NOUN", "NNS", "nsubj"), ("sleep", "VERB", "VBP", "root")]))
    write(tmp_path / "web.conllu", conllu([("You", "PRON", "PRP", "nsubj"), ("ran", "VERB", "VBD", "root")]))
    return {"name": "tagging", "data_dir": str(tmp_path), "train": "train.conllu", "dev": "dev.conllu",
            "eval_sets": {"web": "web.conllu"}}  # fmt: skip


@pytest.mark.parametrize(
    ("column", "labels"),
    [
        (None, ("NOUN", "PRON", "PUNCT", "VERB")),
        ("upos", ("NOUN", "PRON", "PUNCT", "VERB")),
        ("xpos", (".", "NNS", "PRP", "VBD", "VBP")),
        ("deprel", ("nsubj", "punct", "root")),
    ],
)
def test_conllu_columns_give_their_label_sets(ud_files, minilm_tokenizer, column, labels):
    data = tagging.load(task_cfg(ud_files | {"column": column}), minilm_tokenizer)
    assert data.label_names == labels and data.num_labels == len(labels)
    scored = data.dev.labels[data.dev.labels != IGNORE_INDEX]
    assert len(scored) == 2 and set(data.eval_sets) == {"web"}


def test_bio_files_load_with_their_tags(tmp_path, minilm_tokenizer):
    write(tmp_path / "train.bio", "-DOCSTART- O\n\nAnna B-PER\nSmith I-PER\nsings O\n\nin O\nParis\tB-LOC\n")
    write(tmp_path / "dev.bio", "Paris B-LOC\nsings O\n")
    cfg = task_cfg({"name": "tagging", "data_dir": str(tmp_path), "train": "train.bio", "dev": "dev.bio"})
    data = tagging.load(cfg, minilm_tokenizer)
    assert data.label_names == ("B-LOC", "B-PER", "I-PER", "O") and len(data.train) == 2
    first = data.train.labels[0][data.train.labels[0] != IGNORE_INDEX].tolist()
    assert [data.label_names[i] for i in first] == ["B-PER", "I-PER", "O"]
    assert "task.column: BIO files have one tag column" in error({**cfg.model_dump(), "column": "upos"})


def test_bad_tagging_files_fail_with_one_line(ud_files, tmp_path):
    assert "task.column: CoNLL-U has no column 'upso'" in error(ud_files | {"column": "upso"})
    assert "did you mean 'upos'?" in error(ud_files | {"column": "upso"})
    write(tmp_path / "odd.conllu", conllu([("Hi", "INTJ", "UH", "root")]))
    assert "task.dev: label 'INTJ' (line 2 of " in error(ud_files | {"dev": "odd.conllu"})
    write(tmp_path / "short.conllu", "1\tHi\tINTJ\n")
    assert "short.conllu line 1 has 3 tab-separated columns, CoNLL-U has 10" in error(ud_files | {"dev": "short.conllu"})
    write(tmp_path / "blank.conllu", "# only a comment\n")
    assert "blank.conllu has no sentences" in error(ud_files | {"dev": "blank.conllu"})
    write(tmp_path / "dev.bio", "Hi O\n")
    assert "need one format, got bio, conllu" in error(ud_files | {"dev": "dev.bio"})


def test_hf_folders_work_where_datasets_is_installed(tmp_path, minilm_tokenizer):
    datasets = pytest.importorskip("datasets")
    labels = datasets.ClassLabel(names=["neg", "pos"])
    features = datasets.Features({"text": datasets.Value("string"), "label": labels})
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["good", "bad", "fine"], "label": [1, 0, 1]}, features=features),
        "validation": datasets.Dataset.from_dict({"text": ["nice"], "label": [1]}, features=features),
    })  # fmt: skip
    splits.save_to_disk(str(tmp_path / "sst"))
    raw = {"name": "classification", "data_dir": str(tmp_path / "sst"), "train": "train", "dev": "validation"}
    data = classification.load(task_cfg(raw), minilm_tokenizer)
    assert data.label_names == ("neg", "pos") and data.train.labels.tolist() == [1, 0, 1]
    assert len(classification.fingerprint(task_cfg(raw))) == 16
    assert "holds a DatasetDict" in error(raw | {"data_dir": str(tmp_path), "train": "sst", "dev": "sst/validation"})
    tags = datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER"]))
    words = datasets.Dataset.from_dict(
        {"tokens": [["Anna", "sings"], ["Bo", "hums"]], "tags": [[1, 0], [1, 0]]},
        features=datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")), "tags": tags}),
    )
    words.save_to_disk(str(tmp_path / "ner"))
    tagged = tagging.load(task_cfg({"name": "tagging", "train": str(tmp_path / "ner"), "dev": str(tmp_path / "ner")}),
                          minilm_tokenizer)  # fmt: skip
    assert tagged.label_names == ("B-PER", "O") and len(tagged.train) == 2


def test_sst2_and_ud_pos_are_file_tasks_with_a_fingerprint(shared_data):
    sst2, ud = TaskConfig(name="sst2"), TaskConfig(name="ud-pos")
    TASKS["sst2"].check(sst2), TASKS["ud-pos"].check(ud)  # the real files pass every check
    prints = {TASKS["sst2"].fingerprint(sst2), TASKS["ud-pos"].fingerprint(ud)}
    assert len(prints) == 2 and all(len(p) == 16 for p in prints)


# --------------------------------------------------------------------------- end to end


TINY_TRAIN = {"max_steps": 4, "batch_size": 8, "eval_every": 2, "lr": 1e-3}


@pytest.mark.parametrize(
    ("example", "num_labels", "eval_sets"),
    [("examples/run_my_csv.yaml", 3, ()), ("examples/run_my_pairs.yaml", 3, ("ood",))],
)
def test_the_examples_run_end_to_end_with_a_metric_per_evaluation_set(monkeypatch, example, num_labels, eval_sets):
    torch.set_num_threads(1)
    monkeypatch.chdir(ROOT)  # the examples' paths are relative to the repository root
    cfg = parse_config(read_yaml(example) | {"model": "tiny-bert", "train": TINY_TRAIN})
    data = classification.load(cfg.task, _tokenizer())
    assert data.num_labels == num_labels and tuple(data.eval_sets) == eval_sets
    tracker = MemoryTracker()
    result = run(cfg, RunContext(tracker=tracker))
    names = {"accuracy", "loss"} | {f"{m}/{s}" for s in eval_sets for m in ("accuracy", "loss")}
    assert names <= set(result.metrics)
    assert all(0 <= result.metrics[f"accuracy{suffix}"] <= 1 for suffix in ["", *(f"/{s}" for s in eval_sets)])
    for name in names:
        assert [step for step, _ in tracker.metrics[name]] == [2, 4]


def test_a_tagging_run_reports_its_evaluation_set(ud_files):
    torch.set_num_threads(1)
    cfg = parse_config({"model": "tiny-bert", "task": ud_files | {"column": "xpos"}, "train": TINY_TRAIN})
    result = run(cfg)
    assert {"accuracy", "accuracy/web", "loss/web"} <= set(result.metrics)
    assert 0 <= result.metrics["accuracy/web"] <= 1


def _tokenizer():
    from experiments.models import load_backbone

    return load_backbone("tiny-bert", 0)[1]


def test_headsweep_run_and_submit_stop_at_bad_data_and_write_nothing(tmp_path, monkeypatch, capsys):
    raw = csv_task(tmp_path)
    write(tmp_path / "maybe.csv", "sentence,label\nfine,pos\nwho knows,maybe\n")
    config = {"model": "tiny-bert", "task": raw | {"dev": "maybe.csv"}, "train": TINY_TRAIN}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    grid = {"name": "bad-data", "base": {"model": "tiny-bert", "task": raw, "train": TINY_TRAIN},
            "axes": {"task.dev": ["dev.csv", "maybe.csv"]}}  # fmt: skip
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    # the CLI in this process: its exit status through a real one is test_cli_submit.py's and test_cli_run.py's
    from headsweep.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    for args in (["run", str(tmp_path / "run.yaml")], ["submit", str(tmp_path / "grid.yaml")]):
        assert main(args) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "task.dev: label 'maybe' (line 3 of" in lines[0], err
    assert not home.exists() or not any(home.iterdir())


def test_a_grid_over_a_file_task_keeps_its_eval_sets_and_keys_runs_by_content(tmp_path):
    from orchestrator.driving.grid import expand, parse_grid

    grid = {"name": "pairs", "base": {"model": "tiny-bert", "task": pair_task(tmp_path)},
            "axes": {"seed": [0, 1, 2], "task.max_train": [4, 8]}}  # fmt: skip
    cells = expand(parse_grid(grid))
    assert len(cells) == 6 and {c.task.eval_sets for c in cells} == {(("ood", str(tmp_path / "ood.jsonl")),)}
    assert len({c.run_key for c in cells}) == 6
    (tmp_path / "ood.jsonl").write_text(json.dumps({"premise": "p", "hypothesis": "h", "label": "neutral"}) + "\n")
    changed = expand(parse_grid(grid))
    assert {c.run_key for c in changed}.isdisjoint({c.run_key for c in cells})  # a changed file: new runs
