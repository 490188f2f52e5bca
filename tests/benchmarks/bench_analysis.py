"""Timings of analysis (loading, queries, the HTTP service) at sweep scale; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_analysis.py [--requests-per-client 25]

A temporary SQLite registry is filled by bulk SQL (through the registry's
own engine and tables) with one sweep of 10,000 finished runs, each with a
stored config and a 6 x 12 ``heads.gate`` map: 2 tasks x 2 pipelines x 5
sparsities x 10 lambdas x 50 seeds; for the neuron figure every run also gets
a 6 x 1536 ``neurons.predictivity`` map (random floats: ~370 MB).

- ``load_10000_cold`` / ``load_10000_cached``: ``load_sweep`` with an empty
  cache and its ``heads.gate`` map (two queries: runs + configs, then the map),
  then again (one version check query)
- ``load_10000_neurons``: ``load_sweep`` with an empty cache and its
  ``neurons.predictivity`` map (6 x 1536 per run); ``--pg URL`` repeats the
  loading figures on PostgreSQL
- ``spearman_neurons_1000_vs_1000``: ``OVERLAP`` of two groups of
  1,000 runs on the neuron map (every pairwise rho, the mean-map rho with a
  1,000-permutation null, top-20 % overlap); best of 2 after a first call
- ``pearson_agreement_10000``: ``across_runs.agreement(across="run")``, the run x run
  Pearson matrix (float32) and its mean, without nulls or the stem cell
  statistic; best of 2 after a first call ("cold_seconds")
- ``stem_cell_10000_once``: the stem cell statistic once (10,000 fits), for scale
- ``spearman_5000_vs_5000``: ``OVERLAP`` of the two tasks (5,000
  runs each): every pairwise rho, the mean-vector rho with a 1,000-permutation
  null, and top-20 % overlap; best of 2 after a first call ("cold_seconds")
- ``aggregate_10000``: ``results.aggregate`` by task and pipeline (uncached)
- ``http_aggregate_*``: the same aggregate through HTTP on Ray Serve (127.0.0.1):
  the first request (loads the sweep and answers), then 20 concurrent clients
  (threads with httpx, a bounded number of requests each) once it is cached

"seconds" is one measured run unless said otherwise. Every line carries its target, whether it was
met and the 1-minute load average (``_bench.emit``): the machine is shared, read timings next to it.
The script exits 1 when a target was missed. Not a pytest test.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import below, emit, finish  # noqa: E402
from pg_schema import pg_schema  # noqa: E402

from analysis.data.loading import clear_cache, load_sweep  # noqa: E402
from analysis.questions import results  # noqa: E402
from analysis.questions.agreement import across_runs, compare  # noqa: E402
from analysis.views import answers  # noqa: E402
from orchestrator.registry import Registry, Run, RunMap, Sweep, SweepRun  # noqa: E402
from orchestrator.registry.schema import pack_map  # noqa: E402

LAYERS, HEADS, NEURONS = 6, 12, 1536
TASKS, PIPELINES = ("synthetic-cls", "synthetic-tag"), ("dp", "sp")
SPARSITIES, LAMBDAS, SEEDS = (0.1, 0.3, 0.5, 0.7, 0.9), tuple(np.geomspace(1e-3, 1.0, 10)), range(50)
CLIENTS = 20


def _emit(figure: str, seconds: float, target, **extra: object) -> None:
    emit("analysis", figure, target=target, measured="seconds" if target else None, seconds=seconds, **extra)


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _config(task: str, pipeline: str, sparsity: float, lam: float, seed: int) -> dict:
    """A stored config shaped like a real one (about 35 keys once flattened)."""
    return {
        "seed": seed, "model": "minilm-l6", "method": "head_gates",
        "task": {"name": task, "data_dir": None, "max_train": None, "max_eval": None, "max_length": 64,
                 "data_seed": 0, "num_train": 2000, "num_eval": 500, "train": None, "dev": None, "eval_sets": {},
                 "format": None, "text": None, "label": None, "labels": None, "column": None},
        "train": {"epochs": 1.0, "max_steps": None, "batch_size": 32, "lr": 5e-05, "decoder_lr": 0.001,
                  "weight_decay": 0.01, "warmup_ratio": 0.1, "eval_every": 50, "grad_clip": 1.0},
        "head_gates": {"pipeline": pipeline, "lambda": lam, "lr": 0.001, "sparsity": sparsity,
                       "sp_finetune_steps": None},
    }


def fill(registry: Registry, rng: np.random.Generator, neurons: bool = False) -> str:
    """One sweep of 10,000 finished runs with configs and maps, inserted in bulk; returns its id."""
    cells = [(t, p, s, lam, seed) for t in TASKS for p in PIPELINES for s in SPARSITIES
             for lam in LAMBDAS for seed in SEEDS]
    profiles = {t: rng.random((LAYERS, HEADS)) for t in TASKS}
    now = datetime.now()
    sweep_id = f"sw-bench-{uuid.uuid4().hex[:6]}"
    runs, maps = [], []
    for i, (task, pipeline, sparsity, lam, seed) in enumerate(cells):
        gates = np.clip(profiles[task] + rng.normal(0, 0.3, (LAYERS, HEADS)), 0, 1).astype(np.float32)
        accuracy = 0.7 + 0.1 * (task == TASKS[1]) - 0.2 * sparsity + rng.normal(0, 0.01)
        key = f"{sweep_id[-6:]}{i:010x}"  # distinct across the sweeps of one registry
        runs.append({
            "run_key": key, "group_key": f"{i // len(SEEDS):016x}", "config": _config(task, pipeline, sparsity, float(lam), seed),
            "task": task, "model": "minilm-l6", "method": "head_gates", "pipeline": pipeline, "seed": seed,
            "sparsity": sparsity, "lambda": float(lam), "status": "finished", "attempts": 1,
            "created_at": now, "updated_at": now, "finished_at": now,
            "metrics": {"accuracy": accuracy, "loss": 1 - accuracy, "open_heads": float((gates > 0.5).sum())},
        })
        maps.append({"run_key": key, "name": "heads.gate", "kind": "heads", **pack_map(gates)})
        if neurons:
            maps.append({"run_key": key, "name": "neurons.predictivity", "kind": "neurons",
                         **pack_map(rng.random((LAYERS, NEURONS), dtype=np.float32))})
    with registry._engine.begin() as connection:  # bulk SQL on the registry's own engine
        connection.execute(Sweep.__table__.insert(), [{
            "id": sweep_id, "name": "bench", "grid": "name: bench\n", "created_at": now, "updated_at": now,
            "resources": {"cpus": 1.0}, "max_concurrent": None, "max_failures": 1,
            "cancel_requested": False, "status": "finished"}])
        connection.execute(Run.__table__.insert(), runs)
        connection.execute(SweepRun.__table__.insert(),
                           [{"sweep_id": sweep_id, "run_key": r["run_key"], "position": i} for i, r in enumerate(runs)])
        for start in range(0, len(maps), 1000):
            connection.execute(RunMap.__table__.insert(), maps[start:start + 1000])
    return sweep_id


def bench_loading(registry: Registry, sweep_id: str, neuron_sweep_id: str | None, backend: str) -> None:
    """The loading figures: runs + configs + heads.gate cold, cached, and a sweep's neuron map cold."""
    extra = {} if backend == "sqlite" else {"backend": backend}
    clear_cache()

    def load_gates():
        loaded = load_sweep(registry, sweep_id)
        return loaded, loaded.gates

    (data, gates), seconds = _timed(load_gates)
    assert gates.shape == (10_000, LAYERS, HEADS) and data.has_gates.all()
    assert len(data.config) >= 30 and data.config["head_gates.lambda"].dtype == np.float64
    _emit("load_10000_cold", seconds, below(2, "s"), runs=len(data), config_keys=len(data.config),
          map="heads.gate (6, 12)", **extra)
    again, seconds = _timed(lambda: load_sweep(registry, sweep_id))
    assert again is data
    _emit("load_10000_cached", seconds, None, ms=seconds * 1000, note="informational: one version check",
          **extra)
    if neuron_sweep_id is None:
        return
    clear_cache()

    def load_neurons():
        loaded = load_sweep(registry, neuron_sweep_id)
        return loaded, loaded.map("neurons.predictivity")

    (data, (values, has)), seconds = _timed(load_neurons)
    assert values.shape == (10_000, LAYERS, NEURONS) and has.all()
    _emit("load_10000_neurons", seconds, below(5, "s"), map="neurons.predictivity (6, 1536)",
          megabytes=round(values.nbytes / 2**20), **extra)
    if backend == "sqlite":  # the same numbers whatever the backend: once
        # two groups of 1,000 runs (one task's dp runs of 20 seeds each), the neuron map
        a = {"task": [TASKS[0]], "pipeline": ["dp"], "seed": [str(s) for s in range(20)]}
        b = {**a, "task": [TASKS[1]]}
        times = []
        for _ in range(3):  # the first call also first-touches its rank arrays
            rho, seconds = _timed(lambda: answers.overlap_json(compare.overlap(
                data, a, b, map_name="neurons.predictivity", k_frac=0.2, n_perm=1000)))
            times.append(seconds)
        assert (rho["n_a"], rho["n_b"]) == (1_000, 1_000)
        _emit("spearman_neurons_1000_vs_1000", min(times[1:]), below(1, "s"), cold_seconds=times[0],
              map="neurons.predictivity (6, 1536)", n_perm=1000, spearman=rho["spearman"])
    clear_cache()


def loading(url: str, backend: str) -> str:
    """Fill a registry at ``url`` (a gate sweep and a neuron sweep) and time loading them;
    returns the gate sweep's id."""
    rng = np.random.default_rng(0)
    with Registry(url) as registry:
        sweep_id, seconds = _timed(lambda: fill(registry, rng))
        neuron_sweep_id, neuron_seconds = _timed(lambda: fill(registry, rng, neurons=True))
        _emit("fill_10000", seconds, None, neurons_seconds=neuron_seconds, note="informational: the bulk insert that fills the registry",
              **({} if backend == "sqlite" else {"backend": backend}))
        bench_loading(registry, sweep_id, neuron_sweep_id, backend)
    return sweep_id


def bench_queries(registry: Registry, sweep_id: str) -> None:
    data = load_sweep(registry, sweep_id)
    times = []
    for _ in range(3):  # the first call also pays for first-touching its 400 MB matrix
        result, seconds = _timed(lambda: across_runs.agreement(data, "run", n_perm=0, asked=()))
        assert result.matrix.shape == (10_000, 10_000)
        times.append(seconds)
        del result
    _emit("pearson_agreement_10000", min(times[1:]), below(1, "s"), cold_seconds=times[0], dtype="float32")

    # not a target: what the stem cell statistic costs at this size (50 seeds per cell)
    result, seconds = _timed(lambda: across_runs.agreement(data, "task", n_perm=0))
    _emit("stem_cell_10000_once", seconds, None, cells=result.n_cells, stem_cell=result.stem_cell.observed,
          note="informational: 200 cells x 50 seeds, no null; the service refuses nulls above 200,000 fits")

    a, b = {"task": [TASKS[0]]}, {"task": [TASKS[1]]}
    times = []
    for _ in range(3):  # the first call also first-touches the 100 MB pairwise matrix
        rho, seconds = _timed(lambda: answers.overlap_json(compare.overlap(data, a, b, k_frac=0.2, n_perm=1000)))
        assert (rho["n_a"], rho["n_b"]) == (5_000, 5_000)
        times.append(seconds)
    _emit("spearman_5000_vs_5000", min(times[1:]), below(1, "s"), cold_seconds=times[0], spearman=rho["spearman"],
          n_perm=1000, mean_pairwise=rho["mean_pairwise"], jaccard=rho["jaccard"])

    rows, seconds = _timed(lambda: results.aggregate(data, ["task", "pipeline"], "accuracy"))
    _emit("aggregate_10000", seconds, None, groups=len(rows), note="informational: uncached, for scale")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_http(url: str, sweep_id: str, requests_per_client: int) -> None:
    import httpx
    import ray
    from ray import serve

    from analysis.views.service.serve import serve_app

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        base = serve_app(url, "127.0.0.1", _free_port())
        path = f"/sweeps/{sweep_id}/aggregate?group_by=task,pipeline&metric=accuracy"
        with httpx.Client(base_url=base, timeout=60) as client:
            response, seconds = _timed(lambda: client.get(path))
            assert response.status_code == 200, response.text
            _emit("http_aggregate_first", seconds, None, note="informational: loads the sweep and computes the answer")

        latencies: list[float] = []
        lock = threading.Lock()

        def client_thread() -> None:
            mine = []
            with httpx.Client(base_url=base, timeout=60) as client:
                for _ in range(requests_per_client):
                    start = time.perf_counter()
                    response = client.get(path)
                    mine.append(time.perf_counter() - start)
                    assert response.status_code == 200
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=client_thread) for _ in range(CLIENTS)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        ms = np.array(latencies) * 1000
        p50, p99 = np.percentile(ms, [50, 99])
        emit("analysis", "http_aggregate_20_clients", target=below(200, "ms (p99)"), measured="p99_ms",
             clients=CLIENTS, requests=len(ms), p50_ms=float(p50), p99_ms=float(p99), max_ms=float(ms.max()),
             requests_per_s=len(ms) / wall)
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-client", type=int, default=25)
    parser.add_argument("--no-http", action="store_true", help="skip the Ray Serve part")
    parser.add_argument("--only-loading", action="store_true", help="the loading figures only")
    parser.add_argument("--pg", metavar="URL", help="also the loading figures on PostgreSQL (a fresh schema in URL)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'registry.db'}"
        sweep_id = loading(url, "sqlite")
        if args.pg:
            with pg_schema(args.pg) as pg_url:
                loading(pg_url, "postgresql")
        if not args.only_loading:
            with Registry(url) as registry:
                bench_queries(registry, sweep_id)
            if not args.no_http:
                bench_http(url, sweep_id, args.requests_per_client)
    finish()


if __name__ == "__main__":
    main()
