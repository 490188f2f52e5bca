"""Orchestration overhead per trial: trivial runs through the full path (registry + Ray Tune, MLflow off).

Prints one JSON line per figure (``_bench.emit``: target, met, load; exits 1 on a miss):
- per-trial overhead for 1,000 trivial runs, median of 3 sweeps (target <= 15 ms): the driver's
  wall time over the runs, split by the registry's timestamps into the wave's start-up (fit() to
  the first run claimed: Tune's set-up and the new worker processes' imports) and the steady
  part (first claim to last finish, per trial);
- the driver's peak memory after 1,000 trials vs after 100 (target ratio <= 1.5), each
  measured in a fresh driver process.

    .venv/bin/python tests/benchmarks/bench_orchestration.py [--runs 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import sqlalchemy as sa
from _bench import at_most, emit, finish


def trivial_run(cfg, ctx):
    from experiments.common.result import RunResult, UnitMap

    ones = np.ones((2, 4), dtype=np.float32)
    return RunResult(cfg.run_key, cfg.group_key, {"accuracy": 1.0}, {"heads.gate": UnitMap(ones, "heads", "test")}, steps=1)


def _grid(n: int) -> dict:
    return {
        "name": "bench",
        "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
        "axes": {"seed": list(range(n))},
        "resources": {"cpus": 1},
        "max_concurrent": 2,
        "max_failures": 0,
    }


def one_sweep(n: int, home: str) -> dict[str, float]:
    """Register n trivial runs and execute them; return the driver's wall seconds (``seconds``), the
    start-up (start to the first run claimed) and the steady part (first claim to last finish)."""
    from orchestrator.driving.driver import execute_sweep
    from orchestrator.driving.grid import expand, parse_grid
    from orchestrator.registry import Registry, Run
    from orchestrator.registry.db import now

    url = f"sqlite:///{home}/registry.db"
    spec = parse_grid(_grid(n))
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep("bench", "", expand(spec), {"cpus": 1}, 2, 0, force=True)
    started, started_at = time.perf_counter(), now()
    counts = execute_sweep(sweep_id, registry_url=url, track=False, run_fn=trivial_run)
    seconds = time.perf_counter() - started
    assert counts == {"finished": n}, counts
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        first, last = connection.execute(sa.select(sa.func.min(Run.started_at), sa.func.max(Run.finished_at))).one()
    engine.dispose()
    return {"seconds": seconds, "startup_s": (first - started_at).total_seconds(),
            "steady_s": (last - first).total_seconds()}


def _child(n: int) -> None:
    """A fresh driver process: run one sweep, print its peak RSS (MB)."""
    import ray

    home = tempfile.mkdtemp()
    os.environ["HEADSWEEP_HOME"] = home
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    one_sweep(n, home)
    with open("/proc/self/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    print(json.dumps({"maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_mb": rss_kb / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", type=int)
    parser.add_argument("--memory-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    if args.child:
        _child(args.child)
        return

    if not args.memory_only:
        overhead(args)
    memory_ratio(args)
    finish()


def overhead(args) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    sweeps = []
    for _ in range(1 + args.repeats):  # the first warms Ray's worker pool and the driver's imports
        home = tempfile.mkdtemp()
        os.environ["HEADSWEEP_HOME"] = home
        sweeps.append(one_sweep(args.runs if sweeps else 20, home))
    ray.shutdown()
    sweeps = sweeps[1:]

    def median(part: str) -> float:
        return statistics.median(sweep[part] for sweep in sweeps)

    emit("orchestration", "overhead_per_trial", target=at_most(15, "ms"), measured="median_ms", runs=args.runs,
         median_ms=1000 * median("seconds") / args.runs, sweeps_s=[round(sweep["seconds"], 2) for sweep in sweeps],
         startup_s=median("startup_s"), steady_ms_per_trial=1000 * median("steady_s") / args.runs,
         note="2 CPUs, 2 concurrent 1-CPU trials, reuse_actors, MLflow off; includes registry claim+finish")


def memory_ratio(args) -> None:
    memory = {}
    for n in (100, args.runs):
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=True)
        memory[n] = json.loads(out.stdout.strip().splitlines()[-1])
    emit("orchestration", "driver_memory", target=at_most(1.5), measured="ratio",
         rss_mb_100=round(memory[100]["rss_mb"], 1), **{f"rss_mb_{args.runs}": round(memory[args.runs]["rss_mb"], 1)},
         ratio=round(memory[args.runs]["rss_mb"] / memory[100]["rss_mb"], 3),
         peak_ratio=round(memory[args.runs]["maxrss_mb"] / memory[100]["maxrss_mb"], 3))


if __name__ == "__main__":
    main()
