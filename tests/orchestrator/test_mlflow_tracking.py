"""MlflowTracker against real MLflow stores (SQLite file and PostgreSQL), with a parent run active."""

import re

import mlflow
import numpy as np
import pytest

from base.result import RunResult, UnitMap
from base.sections import flatten
from experiments.harness.config import parse_config
from experiments.harness.runner import log_maps
from orchestrator import tracking


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mlflow.db'}"
    return request.getfixturevalue("fresh_pg_database")


LABELS = {"task": "synthetic-cls", "model": "tiny-bert", "method": "head_gates", "pipeline": "dp", "seed": 3}


def _result() -> RunResult:
    gates = np.random.default_rng(0).random((2, 4)).astype(np.float32)
    return RunResult(
        run_key="k", group_key="g", metrics={},
        maps={"heads.gate": UnitMap(gates, "heads", "gate"), "heads.log_alpha": UnitMap(gates - 0.5, "heads", "la"),
              "neurons.predictivity": UnitMap(np.ones((2, 16)), "neurons", "probe accuracy")},
        trajectories={"heads.gate": np.stack([gates, gates])}, eval_steps=np.array([3, 6]), steps=6,
    )


def test_round_trip_with_a_parent_run_active(store, tmp_path):
    client = tracking.client(store)
    experiment_id = tracking.ensure_experiment(client, "hs-test")
    assert tracking.ensure_experiment(client, "hs-test") == experiment_id
    # the MLflow UI opens it on its training runs, also an experiment someone else made untagged
    assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    other = client.create_experiment("made-elsewhere")
    assert tracking.ensure_experiment(client, "made-elsewhere") == other
    assert client.get_experiment(other).tags["mlflow.experimentKind"] == "custom_model_development"
    parent = tracking.start_run(client, experiment_id, "sweep")
    cfg = parse_config({"seed": 3})
    mlflow.set_tracking_uri(store)
    with mlflow.start_run(experiment_id=experiment_id):  # an active fluent run must not capture our logs
        child = tracking.start_run(client, experiment_id, "child", tags={"sweep": "s1"}, parent_run_id=parent)
        tracker = tracking.MlflowTracker(client, child)
        tracker.log_params(flatten(cfg.to_dict()))
        tracker.log_params(flatten(cfg.to_dict()))  # a resumed attempt logs them again
        tracker.set_tags({"run_key": cfg.run_key, "seed": "3"})
        tracker.log_metrics({"accuracy": 0.5, "open_heads": 10}, step=3)
        tracker.log_metrics({"accuracy": 0.75, "open_heads": 8}, step=6)
        log_maps(tracker, _result(), LABELS)
        tracker.finish("FINISHED")
        active = mlflow.active_run().info.run_id

    run = client.get_run(child)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["run_key"] == cfg.run_key
    assert run.data.params == {k: str(v) for k, v in flatten(cfg.to_dict()).items()} and run.data.params["seed"] == "3"
    assert [(m.step, m.value) for m in client.get_metric_history(child, "accuracy")] == [(3, 0.5), (6, 0.75)]
    assert run.data.metrics["open_heads"] == 8
    # one maps.npz with every map, a heat map per heads.* map (none for the neuron map, nor for the
    # gate map's own log_alpha: the gate map draws it)
    assert {a.path for a in client.list_artifacts(child)} == {"maps.npz", "heads.gate.png"}
    local = client.download_artifacts(child, "maps.npz", str(tmp_path))
    with np.load(local) as npz:
        np.testing.assert_array_equal(npz["heads.gate"], _result().maps["heads.gate"].values)
        assert npz["neurons.predictivity"].shape == (2, 16) and npz["trajectory/heads.gate"].shape == (2, 2, 4)
    assert client.get_run(active).data.params == {}  # nothing leaked into the fluent run
    assert client.get_run(parent).info.status == "RUNNING"


def test_child_names_carry_every_axis_that_varies():
    """Two lambdas of a pipeline, three losses of finetune on another task: no two runs share a
    name; the task shows because it varies, the seed comes last."""
    from experiments.harness.config import parse_config
    from orchestrator import tracking

    configs = [parse_config({"seed": s, "head_gates": {"lambda": lam, "pipeline": p}}, check_files=False)
               for s in (0, 1) for lam in (0.05, 0.2) for p in ("dp", "sp")]
    configs += [parse_config({"method": "finetune", "seed": 0, "finetune": {"loss": loss},
                              "task": {"name": "synthetic-shortcut"}}, check_files=False)
                for loss in ("ce", "poe")]
    keys = tracking.name_keys([c.to_dict() for c in configs])
    assert keys == ["finetune.loss", "head_gates.lambda", "task.name"]
    names = [tracking.run_name(c, keys) for c in configs]
    assert len(set(names)) == len(names)
    assert names[0] == "synthetic-cls-head_gates-dp-lambda=0.05-seed0"
    assert names[-1] == "synthetic-shortcut-finetune-loss=poe-seed0"


def test_child_names_leave_out_what_the_sweep_shares_and_name_the_cell():
    """One task and model: the name starts with what differs (MLflow's run-name column shows ~20
    characters); without the seed it names the cell, the same for every seed of it."""
    from experiments.harness.config import parse_config
    from orchestrator import tracking

    configs = [parse_config({"seed": s, "model": "tiny-bert", "head_gates": {"lambda": lam, "lr": lr}}, check_files=False)
               for s in (0, 1, 2) for lam in (0.05, 0.2) for lr in (0.1, 0.3)]
    keys = tracking.name_keys([c.to_dict() for c in configs])
    assert keys == ["head_gates.lambda", "head_gates.lr"]
    assert tracking.run_name(configs[0], keys) == "head_gates-dp-lambda=0.05-head_gates.lr=0.1-seed0"
    cells = {tracking.run_name(c, keys, seed=False) for c in configs}
    assert len(cells) == 4 and "head_gates-dp-lambda=0.2-head_gates.lr=0.3" in cells
    assert all(tracking.run_name(c, keys, seed=False) == tracking.run_name(c.with_seed(9), keys, seed=False)
               for c in configs)


def test_sweep_note_links_every_axis_value_as_a_search_that_finds_the_runs(tmp_path):
    """The parent run's description links MLflow searches: each one, run through MlflowClient on a
    real store holding the children as a sweep logs them, finds exactly the runs it names."""
    from urllib.parse import parse_qs, urlsplit

    from experiments.harness.config import parse_config
    from orchestrator import tracking

    configs = [parse_config({"seed": s, "model": "tiny-bert", "head_gates": {"lambda": lam, "pipeline": p}},
                            check_files=False)
               for s in (0, 1, 2) for lam in (0.05, 0.2) for p in ("dp", "sp")]
    client = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = tracking.ensure_experiment(client, "note")
    parent = tracking.start_run(client, experiment_id, "sw-1", tags={"sweep": "sw-1"})
    keys = tracking.name_keys([c.to_dict() for c in configs])
    for cfg in configs:
        child = tracking.start_run(client, experiment_id, tracking.run_name(cfg, keys), parent_run_id=parent,
                                   tags={"sweep": "sw-1", "cell": tracking.run_name(cfg, keys, seed=False)})
        tracking.MlflowTracker(client, child).log_params(flatten(cfg.to_dict()))
    note = tracking.sweep_note(experiment_id, "sw-1", len(configs), configs, keys)
    links = {text: parse_qs(urlsplit(url).fragment.split("?", 1)[1])["searchFilter"][0]
             for text, url in re.findall(r"\[([^]]+)\]\((#/experiments/[^)]+)\)", note)}
    found = {text: len(client.search_runs([experiment_id], search)) for text, search in links.items()}
    assert found == {"every run of the sweep": 13, "0": 4, "1": 4, "2": 4, "dp": 6, "sp": 6, "0.05": 6, "0.2": 6,
                     "`tags.cell = 'head_gates-dp-lambda=0.05'`": 3}, note
    assert note.startswith("**12 runs**") and f"#/experiments/{experiment_id}/runs?" in note


def test_a_grids_description_and_tags_reach_the_sweeps_parent_run(tmp_path, monkeypatch):
    """``submit``'s MLflow part (``sweeps.track_sweep``) on a real registry and MLflow store: the
    grid's tags on the parent run beside headsweep's own, its description first in the run's note."""
    from orchestrator import settings
    from orchestrator.driving.grid import expand, parse_grid
    from orchestrator.driving.sweeps import track_sweep
    from orchestrator.registry import Registry

    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    spec = parse_grid({"name": "described", "base": {"model": "tiny-bert"}, "axes": {"seed": [0, 1]},
                       "description": "Do seeds keep the same heads at lambda 0.1?",
                       "tags": {"paper": "stem-cells", "owner": "ana"}})
    configs = expand(spec)
    registry = Registry(settings.registry_url())
    sweep_id, counts = registry.create_sweep(spec.name, "", configs, {"cpus": 1}, None, 1)
    parent = track_sweep(registry, sweep_id, spec, "grid.yaml", configs, counts["total"])
    run = tracking.client().get_run(parent)
    assert {k: v for k, v in run.data.tags.items() if not k.startswith(("mlflow.", "headsweep."))} == {
        "paper": "stem-cells", "owner": "ana", "sweep": sweep_id, "grid": "grid.yaml"}
    assert run.data.tags[tracking.NOTE_TAG].startswith("Do seeds keep the same heads at lambda 0.1?\n\n**2 runs**")
    assert registry.get_sweep(sweep_id)["mlflow_parent_run_id"] == parent and run.data.params["runs"] == "2"


def test_sweep_note_takes_an_axis_whose_values_are_lists():
    """A key with a list value that varies (``task.text: [premise, hypothesis]`` in one cell, one
    column in another) is linked by the string MLflow logs it as; it once failed the whole submit
    with ``unhashable type: 'list'``."""
    from experiments.harness.config import parse_config
    from orchestrator import tracking

    configs = [parse_config({"seed": 0, "model": "tiny-bert", "task": {"name": "classification", "train": "a.tsv",
                                                                          "text": text}}, check_files=False)
               for text in (["premise", "hypothesis"], "sentence")]
    keys = tracking.name_keys([c.to_dict() for c in configs])
    note = tracking.sweep_note("1", "sw-1", 2, configs, keys)
    assert keys == ["task.text"] and "[['premise', 'hypothesis']](" in note and "[sentence](" in note
