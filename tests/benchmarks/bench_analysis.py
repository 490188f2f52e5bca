"""Timings of analysis (loading, queries, the HTTP service) at sweep scale; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_analysis.py [--requests-per-client 25] [--pg URL | --no-pg]

A temporary SQLite registry is filled by bulk SQL (through the registry's
own engine and tables) with one sweep of 10,000 finished runs, each with a
stored config and a 6 x 12 ``heads.gate`` map: 2 tasks x 2 pipelines x 5
sparsities x 10 lambdas x 50 seeds; for the neuron figure every run also gets
a 6 x 1536 ``neurons.predictivity`` map (random floats: ~370 MB).

- ``load_10000_cold`` / ``load_10000_cached``: ``load_sweep`` with an empty
  cache and its ``heads.gate`` map (two queries: runs + configs, then the map),
  then again (one version check query)
- ``load_10000_neurons``: ``load_sweep`` with an empty cache and its
  ``neurons.predictivity`` map (6 x 1536 per run); then the loading figures again on PostgreSQL
  (a fresh schema on a private server started for the run, the tests' own:
  ``pg_schema.pg_server_url``; on ``--pg URL``'s server if given; ``--no-pg`` skips them)
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
- ``http_aggregate_serve_vs_uvicorn``: the same aggregate through HTTP (127.0.0.1) from Ray Serve
  (``serve_app``: proxy + 1 replica) and from the same FastAPI app under uvicorn alone (its own
  process): the first request each (loads the sweep), then 20 concurrent client threads in bursts
  alternating between the two once cached. Target (``_bench.TARGETS``): on Serve's p99 over
  uvicorn's. A failed request (a status other than 200, an exception) keeps its latency and fails
  the script.

"seconds" is one measured run unless said otherwise: information beside the 1-minute load average
(``_bench.emit``), no target (no peer is measured beside them). The script exits 1 when the HTTP
ratio missed its target or a check failed. ``BENCH_SCALE`` shrinks the sweeps (50 seeds per cell at
full size). Not a pytest test.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
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

from _bench import emit, finish, scaled, start_ray  # noqa: E402
from pg_schema import pg_schema, pg_server_url  # noqa: E402

from analysis.data.loading import clear_cache, load_sweep  # noqa: E402
from analysis.questions import results  # noqa: E402
from analysis.questions.agreement import across_runs, compare  # noqa: E402
from analysis.views import answers  # noqa: E402
from experiments import parse_config  # noqa: E402
from orchestrator.registry import Registry, Run, RunMap, Sweep, SweepRun  # noqa: E402
from orchestrator.registry.schema import pack_map  # noqa: E402

LAYERS, HEADS, NEURONS = 6, 12, 1536
TASKS, PIPELINES = ("synthetic-cls", "synthetic-tag"), ("dp", "sp")
SPARSITIES, LAMBDAS, SEEDS = (0.1, 0.3, 0.5, 0.7, 0.9), tuple(np.geomspace(1e-3, 1.0, 10)), range(scaled(50, 2))
RUNS = len(TASKS) * len(PIPELINES) * len(SPARSITIES) * len(LAMBDAS) * len(SEEDS)  # 10,000 at full size
CLIENTS = 20


def _emit(figure: str, seconds: float, **extra: object) -> None:
    """An absolute time: information beside the load, no target (no peer measured beside it)."""
    extra.setdefault("note", "informational: no peer measured beside it")
    emit("analysis", figure, seconds=seconds, **extra)


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
        config = _config(task, pipeline, sparsity, float(lam), seed)
        labels = {"task": task, "data": f"{task}(data_seed=0)", "model": "minilm-l6", "method": "head_gates", "seed": seed, "pipeline": pipeline,
                  "lambda": float(lam), "sparsity": sparsity}
        if i == 0:  # the labels as the registry stores them (RunConfig.labels(), one column)
            assert labels == parse_config(config).labels(), parse_config(config).labels()
        runs.append({
            "run_key": key, "group_key": f"{i // len(SEEDS):016x}", "config": config, "labels": labels,
            "status": "finished", "attempts": 1,
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
    assert gates.shape == (RUNS, LAYERS, HEADS) and data.has_gates.all()
    assert len(data.config) >= 30 and data.config["head_gates.lambda"].dtype == np.float64
    _emit("load_10000_cold", seconds, runs=len(data), config_keys=len(data.config),
          map="heads.gate (6, 12)", **extra)
    again, seconds = _timed(lambda: load_sweep(registry, sweep_id))
    assert again is data
    _emit("load_10000_cached", seconds, ms=seconds * 1000, note="informational: one version check",
          **extra)
    if neuron_sweep_id is None:
        return
    clear_cache()

    def load_neurons():
        loaded = load_sweep(registry, neuron_sweep_id)
        return loaded, loaded.map("neurons.predictivity")

    (data, (values, has)), seconds = _timed(load_neurons)
    assert values.shape == (RUNS, LAYERS, NEURONS) and has.all()
    _emit("load_10000_neurons", seconds, map="neurons.predictivity (6, 1536)",
          megabytes=round(values.nbytes / 2**20), **extra)
    if backend == "sqlite":  # the same numbers whatever the backend: once
        # two groups of 1,000 runs (one task's dp runs of 20 seeds each), the neuron map
        a = {"task": [TASKS[0]], "pipeline": ["dp"], "seed": [str(s) for s in SEEDS[:20]]}
        b = {**a, "task": [TASKS[1]]}
        times = []
        for _ in range(3):  # the first call also first-touches its rank arrays
            rho, seconds = _timed(lambda: answers.spearman_json(compare.spearman(
                data, a, b, map_name="neurons.predictivity", k_frac=0.2, n_perm=1000)))
            times.append(seconds)
        assert rho["n_a"] == rho["n_b"] == len(SPARSITIES) * len(LAMBDAS) * len(SEEDS[:20])
        _emit("spearman_neurons_1000_vs_1000", min(times[1:]), cold_seconds=times[0],
              map="neurons.predictivity (6, 1536)", n_perm=1000, spearman=rho["spearman"])
    clear_cache()


def loading(url: str, backend: str) -> str:
    """Fill a registry at ``url`` (a gate sweep and a neuron sweep) and time loading them;
    returns the gate sweep's id."""
    rng = np.random.default_rng(0)
    with Registry(url) as registry:
        sweep_id, seconds = _timed(lambda: fill(registry, rng))
        neuron_sweep_id, neuron_seconds = _timed(lambda: fill(registry, rng, neurons=True))
        _emit("fill_10000", seconds, neurons_seconds=neuron_seconds, note="informational: the bulk insert that fills the registry",
              **({} if backend == "sqlite" else {"backend": backend}))
        bench_loading(registry, sweep_id, neuron_sweep_id, backend)
    return sweep_id


def bench_queries(registry: Registry, sweep_id: str) -> None:
    data = load_sweep(registry, sweep_id)
    times = []
    for _ in range(3):  # the first call also pays for first-touching its 400 MB matrix
        result, seconds = _timed(lambda: across_runs.agreement(data, "run", n_perm=0, asked=()))
        assert result.matrix.shape == (RUNS, RUNS)
        times.append(seconds)
        del result
    _emit("pearson_agreement_10000", min(times[1:]), cold_seconds=times[0], dtype="float32")

    # not a target: what the stem cell statistic costs at this size (50 seeds per cell)
    result, seconds = _timed(lambda: across_runs.agreement(data, "task", n_perm=0))
    _emit("stem_cell_10000_once", seconds, cells=result.n_cells, stem_cell=result.stem_cell.observed,
          note="informational: 200 cells x 50 seeds, no null; the service refuses nulls above 200,000 fits")

    a, b = {"task": [TASKS[0]]}, {"task": [TASKS[1]]}
    times = []
    for _ in range(3):  # the first call also first-touches the 100 MB pairwise matrix
        rho, seconds = _timed(lambda: answers.spearman_json(compare.spearman(data, a, b, k_frac=0.2, n_perm=1000)))
        assert (rho["n_a"], rho["n_b"]) == (RUNS // 2, RUNS // 2)
        times.append(seconds)
    _emit("spearman_5000_vs_5000", min(times[1:]), cold_seconds=times[0], spearman=rho["spearman"],
          n_perm=1000, mean_pairwise=rho["mean_pairwise"], jaccard=rho["jaccard"])

    rows, seconds = _timed(lambda: results.aggregate(data, ["task", "pipeline"], "accuracy"))
    _emit("aggregate_10000", seconds, groups=len(rows), note="informational: uncached, for scale")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


UVICORN = """
import sys, uvicorn
from analysis.views.service.app import build_app
uvicorn.run(build_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""


def _uvicorn(url: str) -> tuple[subprocess.Popen, str]:
    """The same FastAPI app (``app.build_app``) under uvicorn alone, in its own process as Serve's
    replica is; returns the process and its base URL once it answers."""
    import httpx

    port = _free_port()
    process = subprocess.Popen([sys.executable, "-c", UVICORN, url, str(port)],
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/sweeps", timeout=5)
            return process, base
        except httpx.TransportError:
            assert process.poll() is None, f"uvicorn exited {process.returncode}"
            time.sleep(0.2)
    process.kill()
    raise AssertionError("uvicorn did not answer within 120 s")


def burst(base: str, path: str, clients: int, requests_per_client: int) -> tuple[list[float], list[str]]:
    """``clients`` threads each sending ``requests_per_client`` GETs; returns every request's seconds
    (failed ones too) and what went wrong in each failed one (a status, an exception)."""
    import httpx

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client_thread() -> None:
        mine, wrong = [], []
        with httpx.Client(base_url=base, timeout=60) as client:
            for _ in range(requests_per_client):
                start = time.perf_counter()
                try:
                    status = client.get(path).status_code
                    if status != 200:
                        wrong.append(f"HTTP {status}")
                except Exception as error:  # noqa: BLE001 - counted, and the script fails on it
                    wrong.append(f"{type(error).__name__}: {error}")
                mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)
            failures.extend(wrong)

    threads = [threading.Thread(target=client_thread) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures


def bench_http(url: str, sweep_id: str, requests_per_client: int, rounds: int = 4) -> None:
    """Ray Serve vs uvicorn alone, the same app and clients: ``rounds`` bursts each, alternating."""
    import httpx
    import ray
    from ray import serve

    from analysis.views.service.serve import serve_app

    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, "60")  # as serve_app sets for a Ray it starts: Serve's 5 s is short under load
    start_ray(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    server, alone = _uvicorn(url)
    try:
        bases = {"serve": serve_app(url, "127.0.0.1", _free_port()), "uvicorn": alone}
        path = f"/sweeps/{sweep_id}/aggregate?group_by=task,pipeline&metric=accuracy"
        for name, base in bases.items():
            response, seconds = _timed(lambda base=base: httpx.get(base + path, timeout=120))
            assert response.status_code == 200, response.text
            _emit(f"http_aggregate_first_{name}", seconds, note="informational: loads the sweep and answers")
        latencies = {name: [] for name in bases}
        failures = {name: [] for name in bases}
        per_round = max(1, requests_per_client // rounds)
        for _ in range(rounds):
            for name, base in bases.items():
                times, wrong = burst(base, path, CLIENTS, per_round)
                latencies[name] += times
                failures[name] += wrong
        ms = {name: np.array(times) * 1000 for name, times in latencies.items()}
        p50 = {name: float(np.percentile(v, 50)) for name, v in ms.items()}
        p99 = {name: float(np.percentile(v, 99)) for name, v in ms.items()}
        emit("analysis", "http_aggregate_serve_vs_uvicorn", measured="p99_ratio",
             p99_ratio=p99["serve"] / p99["uvicorn"], p50_ratio=p50["serve"] / p50["uvicorn"],
             serve_p50_ms=p50["serve"], serve_p99_ms=p99["serve"], uvicorn_p50_ms=p50["uvicorn"],
             uvicorn_p99_ms=p99["uvicorn"], clients=CLIENTS, requests_each=len(ms["serve"]), rounds=rounds,
             failed={name: len(wrong) for name, wrong in failures.items()},
             note="cached /aggregate, the same FastAPI app: Ray Serve (proxy + 1 replica) vs uvicorn alone "
                  "(1 process), bursts alternating; failed requests count in the latencies and fail the script")
        for name, wrong in failures.items():
            assert not wrong, f"{len(wrong)} of {len(ms[name])} requests to {name} failed, first: {wrong[0]}"
    finally:
        server.terminate()
        server.wait(30)
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-client", type=int, default=25)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP part (Ray Serve vs uvicorn)")
    parser.add_argument("--only-http", action="store_true", help="the HTTP part only (after filling the registry)")
    parser.add_argument("--only-loading", action="store_true", help="the loading figures only")
    parser.add_argument("--pg", metavar="URL", help="the PostgreSQL server of the loading figures' second run (a "
                                                    "fresh schema in it); default: a private one started for it")
    parser.add_argument("--no-pg", action="store_true", help="the loading figures on SQLite only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'registry.db'}"
        if args.only_http:
            with Registry(url) as registry:
                sweep_id = fill(registry, np.random.default_rng(0))
            bench_http(url, sweep_id, args.requests_per_client)
            finish()
            return
        sweep_id = loading(url, "sqlite")
        if not args.no_pg:
            with pg_server_url(args.pg) as server, pg_schema(server) as pg_url:
                loading(pg_url, "postgresql")
        if not args.only_loading:
            with Registry(url) as registry:
                bench_queries(registry, sweep_id)
            if not args.no_http:
                bench_http(url, sweep_id, args.requests_per_client)
    finish()


if __name__ == "__main__":
    main()
