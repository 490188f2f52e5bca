"""Timings of analysis.statistics and analysis.statistics.nulls at sweep scale; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_stats.py

"seconds" is the best of the repeats after a first call; "cold_seconds" is
that first call, which also pays for the first touch of the ~400 MB result
(on this VM first-touch page faults cost more than the matmul itself).

``agreement_seed_2004runs_x1000perm_*``: ``across_runs.agreement(across="seed", n_perm=1000)`` on a
synthetic sweep of 668 cells x 3 seeds (2,004 runs) of tiny-bert's 2 x 4 and MiniLM's 6 x 12 head
maps: the question the HTTP service answers up to ``app.MAX_RUN_PERMS`` runs x permutations.
Every line carries its target, whether it was met and the 1-minute load
average (``_bench.emit``); ours must equal scipy's Spearman to 1e-6, or the
script fails. Not a pytest test: it allocates ~1 GB and takes tens of seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import scipy.stats
from _bench import at_most, below, emit, finish

from analysis.data.sweep import SweepData, from_runs
from analysis.questions.agreement import across_runs
from analysis.statistics import intervals, pearson, rbo, spearman, stem_cell
from analysis.statistics import nulls as permutations
from analysis.views.service.app import MAX_RUN_PERMS

P = 144  # 6 layers x 12 heads (MiniLM)
SCIPY_LIMIT_S = 30.0
SCIPY_TOLERANCE = 1e-6  # both in float64: equal but for rounding


def _time(fn: Callable[[], object], repeats: int = 3) -> tuple[float, float]:
    """(best of ``repeats`` warm calls, the first cold call)."""
    times = []
    for _ in range(1 + repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
    return min(times[1:]), times[0]


def _emit(figure: str, seconds: float, target, **extra) -> None:
    emit("stats", figure, target=target, measured="seconds" if target else None, seconds=seconds, **extra)


def _gates(rng: np.random.Generator, n: int) -> np.ndarray:
    """Hard-Concrete-like gates: mostly exactly 0 or 1 (many ties), some in between."""
    return np.clip(rng.normal(0.5, 0.6, size=(n, P)), 0.0, 1.0).astype(np.float32)


def _mean_pairwise(pairs: Callable[[np.ndarray, np.ndarray], np.ndarray], z: np.ndarray) -> float:
    """Mean of a pairwise statistic over the distinct pairs of runs ``z``."""
    i, j = np.triu_indices(len(z), k=1)
    flat = z.reshape(len(z), -1)
    return float(pairs(flat[i], flat[j]).mean())


def _sweep(rng: np.random.Generator, n_cells: int, seeds: int, layers: int, heads: int) -> SweepData:
    """``n_cells`` cells (4 tasks x lambdas) x ``seeds`` finished head_gates runs with ``heads.gate``
    maps: each task has a profile, each cell its own around it, each run its own around the cell's
    (gates in [0, 1], some at 0 or 1)."""
    tasks = ("sst2", "mnli", "qnli", "cola")
    profile = {task: rng.normal(0.0, 1.5, (layers, heads)) for task in tasks}
    configs, gates = [], []
    for c in range(n_cells):
        task, lam = tasks[c % len(tasks)], 0.001 * (1 + c // len(tasks))
        cell = profile[task] + rng.normal(0.0, 1.0, (layers, heads))
        for seed in range(seeds):
            configs.append({"method": "head_gates", "seed": seed, "task": {"name": task},
                            "head_gates": {"lambda": lam, "pipeline": "dp"}})
            log_alpha = cell + rng.normal(0.0, 1.0, (layers, heads))
            gates.append(np.clip(1.2 / (1.0 + np.exp(-log_alpha)) - 0.1, 0.0, 1.0))
    n = len(configs)
    runs = {"sweep_id": "sw-bench", "run_key": [f"{i:016x}" for i in range(n)],
            "group_key": [json.dumps({k: v for k, v in c.items() if k != "seed"}, sort_keys=True) for c in configs],
            "status": ["finished"] * n, "task": [c["task"]["name"] for c in configs], "model": ["tiny-bert"] * n,
            "method": ["head_gates"] * n, "pipeline": ["dp"] * n, "seed": [c["seed"] for c in configs],
            "sparsity": [np.nan] * n, "lambda": [c["head_gates"]["lambda"] for c in configs], "metrics": [{}] * n,
            "config": configs, "maps": [], "updated_at": None, "run_maps": [("heads.gate",)] * n}
    return replace(from_runs(runs, None), _overrides=MappingProxyType(
        {"heads.gate": (np.asarray(gates, np.float32), np.ones(n, bool))}))


def main() -> None:
    rng = np.random.default_rng(0)

    x = _gates(rng, 10_000)
    warm, cold = _time(lambda: pearson.pearson_matrix(x))
    _emit("pearson_10000x144", warm, below(1, "s"), cold_seconds=cold, dtype="float32")
    warm, cold = _time(lambda: pearson.pearson_matrix(x, dtype=np.float64), repeats=2)
    _emit("pearson_10000x144_float64", warm, below(1, "s"), cold_seconds=cold)

    a, b = _gates(rng, 5_000), _gates(rng, 5_000)
    ours, cold = _time(lambda: spearman.spearman_between(a, b))
    _emit("spearman_between_5000x5000", ours, below(1, "s"), cold_seconds=cold, dtype="float32")
    warm, cold = _time(lambda: spearman.spearman_rows(a.mean(axis=0)[None], b.mean(axis=0)[None]))
    _emit("spearman_groups_5000_vs_5000", warm, below(1, "s"), cold_seconds=cold)

    # scipy computes the full (Na + Nb)^2 matrix; time it small first and only run the
    # full size if the quadratic extrapolation stays under the limit.
    probe = 1_000
    start = time.perf_counter()
    full_probe = scipy.stats.spearmanr(a[:probe], b[:probe], axis=1).statistic
    probe_s = time.perf_counter() - start
    ours_probe = spearman.spearman_between(a[:probe], b[:probe], dtype=np.float64)
    max_diff = float(np.nanmax(np.abs(ours_probe - full_probe[:probe, probe:])))
    assert max_diff < SCIPY_TOLERANCE, f"ours differs from scipy.stats.spearmanr by {max_diff:.3g}"
    predicted = probe_s * (len(a) / probe) ** 2
    if predicted < SCIPY_LIMIT_S:
        start = time.perf_counter()
        scipy.stats.spearmanr(a, b, axis=1)
        scipy_s = time.perf_counter() - start
        _emit(
            "scipy_spearmanr_5000_vs_5000",
            scipy_s,
            None,
            ratio_vs_ours=scipy_s / ours,
            max_abs_diff_at_1000=max_diff,
            note="informational: scipy's time, for scale (its values are checked equal to ours)",
        )
    else:
        ours_probe_s, _ = _time(lambda: spearman.spearman_between(a[:probe], b[:probe]))
        _emit(
            "scipy_spearmanr_1000_vs_1000",
            probe_s,
            None,
            note=f"informational: scipy's time, for scale (its values are checked equal to ours); full 5000 "
            f"vs 5000 predicted {predicted:.0f} s > {SCIPY_LIMIT_S:.0f} s: measured on 2,000 runs (1,000 per group)",
            ratio_vs_ours=probe_s / ours_probe_s,
            max_abs_diff=max_diff,
        )

    z = (rng.random((3, 6, 12)) < 0.5).astype(np.float64)
    for name, fn in (
        ("stem_cell", stem_cell.stem_cell),
        ("mean_pairwise_pearson", lambda z: _mean_pairwise(pearson.pearson_rows, z)),
        ("mean_pairwise_rbo", lambda z: _mean_pairwise(rbo.rbo_maps, z)),
    ):
        warm, cold = _time(
            lambda fn=fn: permutations.permutation_null(fn, z, 1000, np.random.default_rng(1)), repeats=2
        )
        _emit(f"permutation_null_1000x3x144_{name}", warm, below(1, "s"), cold_seconds=cold)

    # the stem cell null of a whole sweep: 1,000 cells x 3 seeds, every cell in one batched Pearson
    x = (rng.random((3_000, 6, 12)) < 0.5).astype(np.float64)
    cells = [np.arange(i, i + 3) for i in range(0, 3_000, 3)]
    warm, cold = _time(lambda: permutations.both_nulls(lambda z: stem_cell.stem_cell(z, cells), x, 100,
                                                np.random.default_rng(3)), repeats=2)
    _emit("stem_cell_both_nulls_100perm_1000cells_x3x144", warm, None, cold_seconds=cold,
          per_permutation_ms=1000 * warm / 200, note="informational: what a whole sweep's stem cell nulls cost")

    # what the service answers: agreement across seed of 2,004 runs with both nulls at 1,000 permutations
    for model, (layers, heads) in (("tiny_bert_2x4", (2, 4)), ("minilm_6x12", (6, 12))):
        data = _sweep(rng, 668, 3, layers, heads)
        warm, cold = _time(lambda data=data: across_runs.agreement(data, "seed", n_perm=1000), repeats=2)
        _emit(f"agreement_seed_2004runs_x1000perm_{model}", warm, at_most(5, "s"), cold_seconds=cold,
              runs_x_perms=len(data) * 1000, answered_by_service=len(data) * 1000 <= MAX_RUN_PERMS)

    values = rng.random(1_000)
    warm, cold = _time(lambda: intervals.aggregate(values, np.random.default_rng(2), n_boot=1000))
    _emit("aggregate_bootstrap_1000x1000", warm, None, cold_seconds=cold,
          note="informational: a bootstrap CI of 1,000 values")
    finish()


if __name__ == "__main__":
    main()
