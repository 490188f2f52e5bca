"""A run's tracking as headsweep logs it vs the same through ``mlflow`` directly; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_tracking.py [--reps 20]      (BENCH_SCALE shrinks --reps)

One process, one MLflow tracking store (SQLite in a temporary folder, artifacts beside it), the
same run logged three ways, repetitions interleaved (``_bench.side_by_side``), medians compared:

- ``headsweep``: ``tracking.start_run`` + ``MlflowTracker`` (what a trial does: params and tags in
  batches, one ``log_batch`` per evaluation step, two artifacts, ``finish``), through headsweep's
  retrying client;
- ``mlflow``: the same through MLflow's fluent API (``start_run``, ``log_params``, ``set_tags``,
  ``log_metrics`` per step, ``log_artifact``, ``end_run``): MLflow's own cost, the floor;
- ``mlflow_async``: the fluent API with ``synchronous=False`` (MLflow's asynchronous logging,
  flushed by ``end_run``): the option, for scale.

The run: 35 params, 8 tags, 10 evaluation steps of 5 metrics, a 6 x 12 map's ``maps.npz`` and a
30 KB PNG. Target (``_bench.TARGETS``): on headsweep / mlflow (what our layer adds over MLflow's own cost). Each
logged run is read back and checked complete (the script fails otherwise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
from _bench import emit, finish, scaled, side_by_side

PARAMS = {f"section{i // 7}.key{i}": f"value-{i}" for i in range(35)}
TAGS = {"task": "sst2", "model": "minilm-l6", "method": "head_gates", "pipeline": "dp", "seed": "0",
        "run_key": "0123456789abcdef", "version": "1", "commit": "abc1234"}
STEPS = 10
METRICS = ("accuracy", "loss", "open_heads", "l0", "lr")


def _metrics(step: int) -> dict[str, float]:
    return {name: float(step) / (i + 1) for i, name in enumerate(METRICS)}


def _artifacts(folder: Path) -> list[Path]:
    """``maps.npz`` (a 6 x 12 map) and a 30 KB PNG-sized file, as a run's artifacts."""
    rng = np.random.default_rng(0)
    maps = folder / "maps.npz"
    np.savez_compressed(maps, **{"heads.gate": rng.random((6, 12), dtype=np.float32)})
    png = folder / "heads.gate.png"
    png.write_bytes(rng.bytes(30_000))
    return [maps, png]


def ours(experiment_id: str, artifacts: list[Path]) -> str:
    from orchestrator import tracking

    client = tracking.client()
    run_id = tracking.start_run(client, experiment_id, "bench", tags={"sweep": "sw-bench"})
    tracker = tracking.MlflowTracker(client, run_id)
    tracker.log_params(PARAMS)
    tracker.set_tags(TAGS)
    for step in range(STEPS):
        tracker.log_metrics(_metrics(step), step)
    for path in artifacts:
        tracker.log_artifact(path.name, path.read_bytes())
    tracker.finish("FINISHED")
    return run_id


def direct(experiment_id: str, artifacts: list[Path], synchronous: bool = True) -> str:
    import mlflow

    with mlflow.start_run(experiment_id=experiment_id, run_name="bench", tags={"sweep": "sw-bench"}) as run:
        mlflow.log_params(PARAMS, synchronous=synchronous)
        mlflow.set_tags(TAGS, synchronous=synchronous)
        for step in range(STEPS):
            mlflow.log_metrics(_metrics(step), step=step, synchronous=synchronous)
        for path in artifacts:
            mlflow.log_artifact(str(path))
    return run.info.run_id


def check(run_id: str) -> None:
    """The run holds everything logged: params, tags, every step of every metric, the artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.get_run(run_id)
    assert PARAMS.items() <= run.data.params.items(), f"{run_id}: params missing"
    assert TAGS.items() <= run.data.tags.items(), f"{run_id}: tags missing"
    assert run.info.status == "FINISHED", run.info.status
    for name in METRICS:
        assert len(client.get_metric_history(run_id, name)) == STEPS, f"{run_id}: {name} lacks steps"
    assert {a.path for a in client.list_artifacts(run_id)} == {"maps.npz", "heads.gate.png"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=scaled(20, 3))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = os.environ["HEADSWEEP_TRACKING_URI"] = uri
        import mlflow

        from orchestrator import tracking

        mlflow.set_tracking_uri(uri)
        experiment_id = mlflow.create_experiment("bench", artifact_location=(Path(tmp) / "artifacts").as_uri())
        assert tracking.client().get_experiment(experiment_id).name == "bench"  # the same store
        artifacts = _artifacts(Path(tmp))
        ids: dict[str, list[str]] = {"headsweep": [], "mlflow": [], "mlflow_async": []}
        ways = {"headsweep": lambda: ours(experiment_id, artifacts),
                "mlflow": lambda: direct(experiment_id, artifacts),
                "mlflow_async": lambda: direct(experiment_id, artifacts, synchronous=False)}
        times = side_by_side({name: lambda name=name: ids[name].append(ways[name]()) for name in ways}, args.reps)
        for run_ids in ids.values():
            check(run_ids[-1])
        median = {name: statistics.median(seconds) for name, seconds in times.items()}
        emit("tracking", "run_logging", measured="ratio",
             ratio=median["headsweep"] / median["mlflow"], async_ratio=median["headsweep"] / median["mlflow_async"],
             **{f"{name}_ms": 1000 * value for name, value in median.items()}, reps=args.reps,
             params=len(PARAMS), tags=len(TAGS), steps=STEPS, metrics=len(METRICS), artifacts=len(artifacts),
             note="one run's tracking on one SQLite store: ours / MLflow's fluent API (the floor); async_ratio: "
                  "ours / MLflow's asynchronous logging")
    finish()


if __name__ == "__main__":
    main()
