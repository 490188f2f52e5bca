"""Timings of grid expansion and the registry at sweep scale; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_registry.py [--pg URL | --no-pg]

On SQLite (a temporary file) and PostgreSQL (a fresh schema, dropped after, on a private server
started for the run, the tests' own: ``pg_schema.pg_server_url``; or on ``--pg URL``'s server):

- ``expand_10000``: parse + expand + validate a 10,000-cell grid (no database)
- ``register_10000``: expand + validate + ``create_sweep`` of that grid into an empty registry
- ``resubmit_10000``: the same again (every run present: nothing inserted but the sweep's cells)
- ``register_10000_with_stages``: expand + validate + ``create_sweep`` of the same grid with every
  cell starting from a fine-tune (``init_from: {method: finetune}``): 10,000 cells + 200 shared
  upstream runs and 10,000 edges, into an empty registry
- ``results_10000``: the read model over 10,000 finished runs with a 6 x 12 ``heads.gate`` map:
  ``sweep_runs`` (one query: columns, metrics, configs) + ``sweep_map`` (one query)

And the peers, side by side on the same backend (``register_vs_peers``): registering N runs
(default 10,000; ``BENCH_SCALE`` shrinks it) vs Optuna's RDB storage creating N trials of one study
(``create_new_trial``, as ``study.ask`` does) and MLflow's SQLAlchemy store creating N runs
(``MlflowClient.create_run``), each in a fresh database of its own, repetitions in turn. The
target (``_bench.TARGETS``, one per backend): ours that many times faster than the faster peer (the
peers write a run per transaction; ours validates and keys every cell, then writes in batches).

"seconds" is one measured run after a warm-up of the imports (torch comes in with the task and
method tables): information beside the load, no target (absolute times move with the machine).
Every line carries the 1-minute load average (``_bench.emit``); the script exits 1 when a ratio
missed its target or a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import emit, finish, scaled  # noqa: E402
from pg_schema import pg_schema, pg_server_url  # noqa: E402

from orchestrator.driving.grid import expand, parse_grid  # noqa: E402
from orchestrator.registry import Registry, Run, RunMap  # noqa: E402
from orchestrator.registry.schema import pack_map  # noqa: E402

LAYERS, HEADS = 6, 12
GRID = {
    "name": "bench",
    "base": {"train": {"max_steps": 100}},
    "axes": {
        "seed": list(range(25)),
        "task": ["synthetic-cls", "synthetic-tag"],
        "lambda": [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
        "train.lr": [1e-5, 2e-5, 5e-5, 1e-4],
        "sparsity": [0.1, 0.3, 0.5, 0.7, 0.9],
    },
}


def _emit(figure: str, backend: str | None, seconds: float, **extra: object) -> None:
    """An absolute time: information beside the load (the ratios are ``register_vs_peers``)."""
    where = {"backend": backend} if backend else {}
    emit("registry", figure, seconds=seconds, **where, **extra,
         note="informational: an absolute time; the peers are in register_vs_peers")


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


STAGED = GRID | {"base": GRID["base"] | {"init_from": {"method": "finetune"}}}


def _submit(registry: Registry, grid: dict = GRID) -> tuple[str, dict[str, int]]:
    configs = expand(parse_grid(grid))
    return registry.create_sweep("bench", json.dumps(grid), configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)


def _finish_all(url: str, sweep_id: str, rng: np.random.Generator) -> None:
    """Every run of the sweep -> finished with a random gate map, in bulk (not timed)."""
    engine = sa.create_engine(url)
    table = Run.__table__
    with engine.begin() as connection:
        keys = connection.execute(sa.text("SELECT run_key FROM hs_sweep_runs WHERE sweep_id = :s"),
                                  {"s": sweep_id}).scalars().all()
        connection.execute(
            table.update().where(table.c.run_key == sa.bindparam("key")).values(
                status="finished", metrics={"accuracy": 0.9, "open_heads": 40}),
            [{"key": key} for key in keys],
        )
        gates = rng.random((len(keys), LAYERS, HEADS), dtype=np.float32)
        connection.execute(RunMap.__table__.insert(), [
            {"run_key": key, "name": "heads.gate", "kind": "heads", **pack_map(gate)}
            for key, gate in zip(keys, gates, strict=True)])
    engine.dispose()


def bench_backend(backend: str, url: str) -> None:
    registry, opened = _timed(lambda: Registry(url))
    _emit("open_and_migrate", backend, opened)
    (sweep_id, counts), seconds = _timed(lambda: _submit(registry))
    assert counts["new"] == 10_000, counts
    _emit("register_10000", backend, seconds, new=counts["new"])
    (_, counts), seconds = _timed(lambda: _submit(registry))
    assert counts["new"] == 0 and counts["total"] == 10_000, counts
    _emit("resubmit_10000", backend, seconds, new=counts["new"])
    _finish_all(url, sweep_id, np.random.default_rng(0))
    (runs, gate), seconds = _timed(lambda: (registry.sweep_runs(sweep_id), registry.sweep_map(sweep_id, "heads.gate")))
    assert gate.values.shape == (10_000, LAYERS, HEADS) and gate.has.all() and len(runs["config"]) == 10_000
    _emit("results_10000", backend, seconds, map_shape=list(gate.values.shape))
    registry.close()


def _ours(url: str, n: int) -> float:
    grid = {"name": "bench", "base": {"train": {"max_steps": 100}}, "axes": {"seed": list(range(n))}}
    registry = Registry(url)
    (_, counts), seconds = _timed(lambda: _submit(registry, grid))
    registry.close()
    assert counts["new"] == n, counts
    return seconds


def _optuna(url: str, n: int) -> float:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "bench")
    _, seconds = _timed(lambda: [storage.create_new_trial(study_id) for _ in range(n)])
    assert len(storage.get_all_trials(study_id, deepcopy=False)) == n
    storage.remove_session()
    storage.engine.dispose()
    return seconds


def _mlflow(url: str, n: int) -> float:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiment = client.create_experiment("bench")
    _, seconds = _timed(lambda: [client.create_run(experiment) for _ in range(n)])
    assert len(client.search_runs([experiment], max_results=n)) == n
    return seconds


PEERS = {"headsweep": _ours, "optuna": _optuna, "mlflow": _mlflow}


def register_vs_peers(backend: str, fresh, n: int, reps: int) -> None:
    """N runs registered by us, N trials by Optuna, N runs by MLflow, each into a fresh database
    (``fresh()`` gives its URL; set-up not timed), in turn ``reps`` times; medians compared."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    seconds = {name: [] for name in PEERS}
    for _ in range(reps):
        for name, register in PEERS.items():
            with fresh() as url:
                seconds[name].append(register(url, n))
    median = {name: float(np.median(values)) for name, values in seconds.items()}
    emit("registry", "register_vs_peers", measured="speedup", backend=backend,
         speedup=min(median["optuna"], median["mlflow"]) / median["headsweep"],
         optuna_ratio=median["optuna"] / median["headsweep"], mlflow_ratio=median["mlflow"] / median["headsweep"],
         runs=n, reps=reps, **{f"{name}_s": value for name, value in median.items()},
         note="speedup: the faster peer's median time over ours, so the target holds against both")


def bench_stages(backend: str, url: str) -> None:
    registry = Registry(url)
    (sweep_id, counts), seconds = _timed(lambda: _submit(registry, STAGED))
    assert counts["new"] == 10_200, counts
    dag = registry.sweep_dag(sweep_id)
    assert dag == {"upstream": 200, "dependants": 10_000}, dag
    _emit("register_10000_with_stages", backend, seconds, new=counts["new"], **dag)
    registry.close()


@contextlib.contextmanager
def _sqlite_file(folder: str, i: int) -> Iterator[str]:
    yield f"sqlite:///{Path(folder) / f'peer{i}.db'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", metavar="URL", help="a PostgreSQL server to use (schemas are created in it); "
                                                    "default: a private one started for the run")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--peer-runs", type=int, default=scaled(10_000, 100), help="N of register_vs_peers")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of register_vs_peers")
    args = parser.parse_args()

    expand(parse_grid({"name": "warm", "axes": {"seed": [0]}}))  # imports torch via the task table
    configs, seconds = _timed(lambda: expand(parse_grid(GRID)))
    assert len(configs) == 10_000
    _emit("expand_10000", None, seconds, cells=len(configs))
    keys, seconds = _timed(lambda: [cfg.run_key for cfg in configs])
    assert len(set(keys)) == len(configs), "two cells of the grid got the same run key"
    emit("registry", "run_keys_10000", seconds=seconds, distinct=len(set(keys)),
         note="informational: the keys' part of expand_10000 (keyed there already, so cached here)")

    with tempfile.TemporaryDirectory() as tmp:
        bench_backend("sqlite", f"sqlite:///{Path(tmp) / 'registry.db'}")
        bench_stages("sqlite", f"sqlite:///{Path(tmp) / 'staged.db'}")
        files = iter(range(1_000))
        register_vs_peers("sqlite", lambda: _sqlite_file(tmp, next(files)), args.peer_runs, args.reps)
    if not args.no_pg:
        with pg_server_url(args.pg) as server:
            register_vs_peers("postgresql", lambda: pg_schema(server), args.peer_runs, args.reps)
            with pg_schema(server) as url:
                bench_backend("postgresql", url)
            with pg_schema(server) as url:
                bench_stages("postgresql", url)
    finish()


if __name__ == "__main__":
    main()
