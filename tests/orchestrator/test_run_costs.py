"""What each run of a real sweep costs beside its training (issue 19): ``cost.<part>_s`` in the registry
and in MLflow, measured inside the trial, on a real local Ray, SQLite registry and MLflow store; the
runs of the grid share one tokenised copy of their data."""

import pytest
import ray
import yaml

from base.costs import PARTS
from orchestrator import settings, tracking
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

pytestmark = pytest.mark.ray

GRID = {
    "name": "costs",
    "base": {
        "model": "tiny-bert", "method": "head_gates",
        "task": {"name": "synthetic-cls", "num_train": 48, "num_eval": 16, "max_length": 24},
        "train": {"max_steps": 4, "batch_size": 8, "eval_every": 4},
        "head_gates": {"lambda": 0.1, "lr": 0.1, "pipeline": "dp"},
    },
    "axes": {"seed": [0, 1, 2, 3, 4]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
    "max_failures": 0,
}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """This test's home, seen by its Ray workers too (as a sweep's job passes it to them)."""
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    # imported here: Ray's workers import this module without tests/ on their path
    from local_ray import start_local_ray

    start_local_ray(runtime_env={"env_vars": {"HEADSWEEP_HOME": str(tmp_path)}})
    yield tmp_path
    ray.shutdown()


def test_every_run_records_what_it_cost_by_part(home):
    spec = parse_grid(GRID)
    registry = Registry(settings.registry_url())
    sweep_id, _ = registry.create_sweep(spec.name, yaml.safe_dump(GRID), expand(spec), spec.resources.model_dump(),
                                        spec.max_concurrent, spec.max_failures)
    mlflow = tracking.client()
    experiment_id = tracking.ensure_experiment(mlflow, spec.name)
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id,
                       mlflow_parent_run_id=tracking.start_run(mlflow, experiment_id, sweep_id))
    assert execute_sweep(sweep_id, registry_url=settings.registry_url()) == {"finished": 5}

    names = {f"cost.{part}_s" for part in PARTS} | {"cost.total_s", "cost.first_in_worker"}
    metrics = registry.sweep_runs(sweep_id)["metrics"]
    for m in metrics:
        assert names <= set(m), names - set(m)
        assert all(m[f"cost.{part}_s"] > 0 for part in PARTS)
        parts = sum(m[f"cost.{part}_s"] for part in PARTS)
        unclaimed = m["cost.total_s"] - parts  # the first run's imports of the runner; little else
        assert 0 <= unclaimed < (m["cost.total_s"] if m["cost.first_in_worker"] else 0.2 * m["cost.total_s"])
    firsts = sum(m["cost.first_in_worker"] for m in metrics)
    assert 1 <= firsts <= 2  # one per worker process; the two workers are reused for the other runs

    runs = mlflow.search_runs([experiment_id], "tags.method = 'head_gates'")
    assert len(runs) == 5
    for run in runs:
        assert names <= set(run.data.metrics)
        registered = next(m for m, key in zip(metrics, registry.sweep_runs(sweep_id)["run_key"], strict=True)
                          if key == run.data.tags["run_key"])
        assert run.data.metrics["cost.total_s"] == pytest.approx(registered["cost.total_s"])

    (entry,) = (home / "cache" / "tasks").iterdir()  # the five runs tokenised their data once
    assert entry.suffix == ".pt"
    registry.close()
