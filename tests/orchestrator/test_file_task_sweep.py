"""Tasks from the user's files through a real sweep (DESIGN.md decision 11).

The two examples, ``examples/run_my_csv.yaml`` (a 3-label CSV) and
``examples/run_my_pairs.yaml`` (sentence pairs from JSONL with an ``ood`` evaluation
set), as cells of one grid on a real local Ray, SQLite registry and MLflow store; then
a grid whose CSV has no label column stopped at ``headsweep submit``.
"""

from pathlib import Path

import numpy as np
import pytest
import ray
import yaml

from base.sections import read_yaml
from orchestrator import tracking
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"max_steps": 4, "batch_size": 8, "eval_every": 2, "lr": 1e-3}


def example_task(name: str) -> dict:
    """The task section of an example run config (its paths relative to the repository root)."""
    return read_yaml(ROOT / "examples" / name)["task"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI", "HEADSWEEP_CHECKPOINTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)  # the examples' data_dir is relative to the repository root
    return tmp_path


@pytest.mark.ray
def test_a_csv_task_and_a_pair_task_with_an_ood_set_run_through_a_sweep(home):
    csv, pairs = example_task("run_my_csv.yaml"), example_task("run_my_pairs.yaml")
    grid = {
        "name": "file-tasks",
        "base": {"model": "tiny-bert", "method": "finetune", "train": TRAIN, "task": csv},
        "axes": {"seed": [0, 1]},  # the CSV task's cells; the pair task's are included
        "include": [{"task": pairs, "seed": seed} for seed in (0, 1)],
        "resources": {"cpus": 1},
        "max_concurrent": 2,
        "max_failures": 0,
    }
    spec = parse_grid(grid)
    cells = expand(spec)
    assert [(c.task.train.rsplit("/", 1)[-1], c.seed) for c in cells] == [
        ("feedback_train.csv", 0), ("feedback_train.csv", 1), ("pairs_train.jsonl", 0), ("pairs_train.jsonl", 1)]
    assert all(Path(c.task.train).is_absolute() for c in cells)  # resolved here, read by the workers as is
    url = f"sqlite:///{home}/registry.db"
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep(spec.name, yaml.safe_dump(grid), cells, {"cpus": 1}, 2, 0)
    mlflow = tracking.client()
    experiment_id = tracking.ensure_experiment(mlflow, spec.name)
    parent = tracking.start_run(mlflow, experiment_id, sweep_id)
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)

    # imported here: Ray's workers import this module without tests/ on their path
    from local_ray import start_local_ray

    start_local_ray()
    try:
        assert execute_sweep(sweep_id, registry_url=url) == {"finished": 4}
    finally:
        ray.shutdown()

    results = registry.sweep_runs(sweep_id)
    assert set(results["status"]) == {"finished"} and registry.get_sweep(sweep_id)["status"] == "finished"
    is_pairs = np.array([c["task"]["train"].endswith("pairs_train.jsonl") for c in results["config"]])
    assert is_pairs.tolist() == [False, False, True, True]
    for metrics, pair in zip(results["metrics"], is_pairs, strict=True):
        assert 0 <= metrics["accuracy"] <= 1
        assert ("accuracy/ood" in metrics) == pair and (not pair or 0 <= metrics["accuracy/ood"] <= 1)
    children = [r for r in mlflow.search_runs([experiment_id]) if r.info.run_id != parent]
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    assert sum("accuracy/ood" in r.data.metrics for r in children) == 2

    from analysis.data.loading import clear_cache, load_sweep
    from analysis.questions.results import aggregate

    clear_cache()
    data = load_sweep(registry, sweep_id)
    (row,) = aggregate(data, ["task"], "accuracy/ood")  # both are the task "classification"
    assert row["task"] == "classification" and row["runs"] == 4 and row["n"] == 2  # the CSV runs have no ood set
    ood = np.array([m["accuracy/ood"] for m, pair in zip(results["metrics"], is_pairs, strict=True) if pair])
    assert row["mean"] == pytest.approx(ood.mean())
    by_file = {r["task.train"].rsplit("/", 1)[-1]: r for r in aggregate(data, ["task.train"], "accuracy/ood")}
    assert by_file["pairs_train.jsonl"]["n"] == 2 and by_file["feedback_train.csv"]["n"] == 0


def test_submit_stops_a_grid_whose_csv_has_no_label_column_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """``headsweep submit`` in this process (its exit status through a real one: test_cli_submit.py)."""
    from headsweep.cli import main

    (tmp_path / "train.csv").write_text("text,category\ngreat,pos\nawful,neg\n", encoding="utf-8")
    (tmp_path / "dev.csv").write_text("text,category\nfine,pos\n", encoding="utf-8")
    bad = {"name": "classification", "data_dir": str(tmp_path), "train": "train.csv", "dev": "dev.csv"}
    good = example_task("run_my_pairs.yaml") | {"data_dir": str(ROOT / "examples" / "data")}
    grid = {"name": "no-label", "base": {"model": "tiny-bert", "method": "finetune", "train": TRAIN, "task": bad},
            "axes": {"seed": [0, 1]}, "include": [{"task": good, "seed": 0}]}  # fmt: skip
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    home = tmp_path / "home"
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    assert main(["submit", str(tmp_path / "grid.yaml")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("headsweep: error: cell 0 (seed=0)") and (
        f"task.label: no column 'label' in {tmp_path}/train.csv (its columns: text, category)") in line, line
    assert not home.exists() or not any(home.iterdir())  # no registry, no MLflow store, no Ray head


def headerless_tsv(folder: Path, name: str, words: tuple[str, str], rows: int) -> str:
    """A TSV as GLUE's test files and AG News come: no header row, label first, then the text."""
    lines = [f"{i % 2}\t{words[i % 2]} report number {i} from the wire" for i in range(rows)]
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(folder / name)


@pytest.mark.ray
def test_two_headerless_tsv_tasks_named_by_id_compared_across_task(home, capsys):
    """Two of the user's own TSV tasks without header rows, told apart by ``task.id`` in the
    registry's labels, MLflow run names and ``headsweep agreement --across task``."""
    from headsweep.cli import main

    data = home / "data"
    data.mkdir()
    tasks = [{"name": "classification", "id": name, "columns": ["label", "text"],
              "train": headerless_tsv(data, f"{name}_train.tsv", words, 24),
              "dev": headerless_tsv(data, f"{name}_dev.tsv", words, 8)}
             for name, words in (("agnews", ("sports", "business")), ("trec", ("who", "where")))]
    grid = {"name": "two-tsv", "base": {"model": "tiny-bert", "method": "head_gates", "train": TRAIN,
                                        "task": tasks[0]},
            "axes": {"seed": [0, 1]}, "include": [{"task": tasks[1], "seed": seed} for seed in (0, 1)],
            "resources": {"cpus": 1}, "max_concurrent": 2, "max_failures": 0}
    spec = parse_grid(grid)
    cells = expand(spec)
    assert [c.labels()["task"] for c in cells] == ["agnews", "agnews", "trec", "trec"]
    url = f"sqlite:///{home}/registry.db"
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep(spec.name, yaml.safe_dump(grid), cells, {"cpus": 1}, 2, 0)
    # imported here: Ray's workers import this module without tests/ on their path
    from local_ray import start_local_ray

    start_local_ray()
    try:
        assert execute_sweep(sweep_id, registry_url=url, track=False) == {"finished": 4}
    finally:
        ray.shutdown()
    assert sorted(found["task"] for found in registry.sweep_runs(sweep_id)["labels"]) == ["agnews", "agnews", "trec", "trec"]
    capsys.readouterr()
    assert main(["agreement", sweep_id, "--across", "task", "--n-perm", "50"]) == 0
    out = capsys.readouterr().out
    assert "agnews" in out and "trec" in out and "classification" not in out
