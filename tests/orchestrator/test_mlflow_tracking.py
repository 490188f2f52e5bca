"""MlflowTracker against real MLflow stores (SQLite file and PostgreSQL), with a parent run active."""

import mlflow
import numpy as np
import pytest

from experiments.core.config import parse_config
from experiments.core.result import RunResult, UnitMap
from experiments.core.runner import log_maps
from experiments.core.sections import flatten
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
    # one maps.npz with every map, a heat map per heads.* map (none for the neuron map)
    assert {a.path for a in client.list_artifacts(child)} == {"maps.npz", "heads.gate.png", "heads.log_alpha.png"}
    local = client.download_artifacts(child, "maps.npz", str(tmp_path))
    with np.load(local) as npz:
        np.testing.assert_array_equal(npz["heads.gate"], _result().maps["heads.gate"].values)
        assert npz["neurons.predictivity"].shape == (2, 16) and npz["trajectory/heads.gate"].shape == (2, 2, 4)
    assert client.get_run(active).data.params == {}  # nothing leaked into the fluent run
    assert client.get_run(parent).info.status == "RUNNING"


def test_child_names_carry_every_axis_that_varies():
    """Two lambdas of a pipeline, three losses of finetune: no two runs share a name."""
    from experiments.core.config import parse_config
    from orchestrator import tracking

    configs = [parse_config({"seed": s, "head_gates": {"lambda": lam, "pipeline": p}}, check_files=False)
               for s in (0, 1) for lam in (0.05, 0.2) for p in ("dp", "sp")]
    configs += [parse_config({"method": "finetune", "seed": 0, "finetune": {"loss": loss},
                              "task": {"name": "synthetic-shortcut"}}, check_files=False)
                for loss in ("ce", "poe")]
    keys = tracking.name_keys([c.to_dict() for c in configs])
    assert keys == ["finetune.loss", "head_gates.lambda"]
    names = [tracking.run_name(c, keys) for c in configs]
    assert len(set(names)) == len(names)
    assert names[0] == "synthetic-cls-head_gates-dp-seed0-lambda=0.05"
    assert names[-1] == "synthetic-shortcut-finetune-seed0-loss=poe"
