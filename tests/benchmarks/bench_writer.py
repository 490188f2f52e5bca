"""The sweep's one writer's cost per run: register, claim and finish 1,000 tiny runs through the
writer (a Ray actor, orchestrator/driving/writer.py) against the same writes made directly by the
trials' processes, on one host, side by side in one run; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_writer.py

Both arms do the same work on the same SQLite registry (a temporary file on local disk, WAL), with
the same concurrency: a sweep of N runs is registered (``create_sweep``, from this process in both:
submit registers), then two Ray tasks (a trial each, one CPU each, as two one-CPU trials run on 2
cores) claim and finish N/2 runs each, every finish with a 6 x 12 head map. ``direct``: each task
opens its own :class:`Writer` on the file (the one-host path, unchanged). ``writer``: each task
calls the sweep's writer over Ray (:class:`Remote`), which alone opens the file (the several-hosts
path). The arms alternate (direct, writer, direct, writer, ...), each in a fresh registry; the figure
is the median of the per-pair ratios, with its 95 % bootstrap interval.

Target (``_bench.TARGETS``): on the writer's seconds per run over the direct ones, near what was
measured (2.45x [2.40, 2.55] alone on 2 cores, 2026-12-02: 5.1 against 2.1 ms a run, a Ray actor
call of ~1.5 ms per state change against a SQLite transaction), so a regression of 30 % fails. A run of
MiniLM takes seconds to minutes: the 3 ms a run the writer adds is the information.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import emit, finish, ratio_interval, scaled, start_ray  # noqa: E402

from orchestrator.driving import writer  # noqa: E402
from orchestrator.driving.grid import expand, parse_grid  # noqa: E402
from orchestrator.registry import Registry  # noqa: E402

BENCH = "writer"
TASKS = 2


@ray.remote(num_cpus=1)
def _claim_and_finish(keys: list[str], registry_url: str, through: str | None) -> float:
    """One trial's worth of state changes: claim then finish each run; seconds taken."""
    from base.result import UnitMap
    from orchestrator.driving.writer import Remote, Writer

    states = Remote(through) if through else Writer(registry_url, None)
    gate = {"heads.gate": UnitMap(np.ones((6, 12), dtype=np.float32), "heads", "bench")}
    start = time.perf_counter()
    for key in keys:
        worker = f"bench-{key[:8]}"
        assert states.claim(key, worker, 60.0) is not None
        assert states.finish(key, {"accuracy": 1.0}, worker, gate, None)
    return time.perf_counter() - start


def _one_arm(runs: int, through_writer: bool) -> dict[str, float]:
    """Seconds to register ``runs`` runs and to claim + finish them all from two tasks."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/registry.db"
        grid = {"name": "bench", "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
                "axes": {"seed": list(range(runs))}}
        configs = expand(parse_grid(grid))
        start = time.perf_counter()
        registry = Registry(url)
        sweep_id, _ = registry.create_sweep("bench", "", configs, {"cpus": 1}, None, 0)
        registered = time.perf_counter() - start
        keys = list(registry.sweep_runs(sweep_id)["run_key"])
        remote = writer.start(sweep_id, url, None) if through_writer else None
        try:
            start = time.perf_counter()
            chunks = [keys[i::TASKS] for i in range(TASKS)]
            ray.get([_claim_and_finish.remote(chunk, url, remote.name if remote else None) for chunk in chunks])
            ran = time.perf_counter() - start
        finally:
            if remote is not None:
                remote.stop()
        counts = registry.sweep_counts(sweep_id)
        registry.close()
    assert counts == {"finished": runs}, counts
    return {"register_s": registered, "claim_finish_s": ran, "total_s": registered + ran}


def main() -> int:
    runs, pairs = scaled(1000, least=20), 5
    start_ray(address="local", num_cpus=TASKS, include_dashboard=False, log_to_driver=False)
    _one_arm(min(runs, 50), True)  # warm-up: the workers' imports, the writer's
    direct, through = [], []
    for _ in range(pairs):
        direct.append(_one_arm(runs, False))
        through.append(_one_arm(runs, True))
    ray.shutdown()
    ratio, low, high = ratio_interval([t["total_s"] for t in through], [d["total_s"] for d in direct])
    per_run = {name: 1000 * float(np.median([arm["total_s"] for arm in arms])) / runs
               for name, arms in (("writer", through), ("direct", direct))}
    emit(BENCH, "writer_vs_direct_per_run", measured="ratio", ratio=ratio,
         interval=[low, high], runs=runs, pairs=pairs, tasks=TASKS, writer_ms_per_run=per_run["writer"],
         direct_ms_per_run=per_run["direct"],
         claim_finish_ms_per_run={"writer": 1000 * float(np.median([t["claim_finish_s"] for t in through])) / runs,
                                  "direct": 1000 * float(np.median([d["claim_finish_s"] for d in direct])) / runs},
         register_ms_per_run={"writer": 1000 * float(np.median([t["register_s"] for t in through])) / runs,
                              "direct": 1000 * float(np.median([d["register_s"] for d in direct])) / runs})
    return finish()


if __name__ == "__main__":
    sys.exit(main())
