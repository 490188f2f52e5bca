"""analysis.statistics against its reference implementations, side by side; one JSON line per figure.

    .venv/bin/python tests/benchmarks/bench_stats.py        (BENCH_SCALE=0.1 for a quick run)

Each statistic is timed beside the implementation a user would reach for instead, doing the same
work (the same inputs, the same output, the same dtype) in the same process on the same threads,
repetitions interleaved (``_bench.side_by_side``), medians compared, and checked equal to it (the
script fails otherwise). The targets (``_bench.TARGETS``) are speed-ups over the reference:

- ``pearson_matrix``: ``pearson.pearson_matrix`` vs ``numpy.corrcoef``, the run x run matrix of
  10,000 float32 maps of 144 heads, float32 both (``corrcoef(dtype=float32)``).
- ``spearman_between``: ``spearman.spearman_between`` vs ``scipy.stats.spearmanr(axis=1)``, the
  n x n matrix of the same 1,000 runs (ours: the group with itself), float64 both.
- ``stem_cell_fit``: ``stem_cell.stem_cell`` over cells of 3 runs vs statsmodels
  ``OLS(...).fit().rsquared_adj`` per response run (the paper fits with statsmodels), float64 both.
- ``rbo_pairs``: ``rbo.rbo_maps`` vs the published ``ranked_overlap.rbo`` (PyPI ``ranked-overlap``:
  Webber et al.'s RBO_ext, eq. 32) per pair of rankings, on maps without ties (where the two agree).
  PyPI's ``rbo`` (changyaochen), the better known one, pins ``numpy<2`` in both releases (0.1.2,
  0.1.3), which the project's ``numpy>=2`` excludes.

Informational (no peer): the permutation nulls, ``agreement`` across seed of 2,004 runs x 1,000
permutations (what the service answers up to ``app.MAX_RUN_PERMS``), a bootstrap interval.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import ranked_overlap
import scipy.stats
import statsmodels.api as sm
from _bench import emit, finish, scaled, side_by_side

from analysis.data.sweep import SweepData, from_runs
from analysis.questions.agreement import across_runs
from analysis.statistics import intervals, pearson, rbo, spearman, stem_cell
from analysis.statistics import nulls as permutations
from analysis.views.service.app import MAX_RUN_PERMS

P = 144  # 6 layers x 12 heads (MiniLM)
REPS = 5


def _time(fn: Callable[[], object], repeats: int = 3) -> tuple[float, float]:
    """(best of ``repeats`` warm calls, the first cold call)."""
    times = []
    for _ in range(1 + repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
    return min(times[1:]), times[0]


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
            "status": ["finished"] * n, "metrics": [{}] * n,
            "labels": [{"task": c["task"]["name"], "model": "tiny-bert", "method": "head_gates", "pipeline": "dp",
                        "seed": c["seed"], "lambda": c["head_gates"]["lambda"]} for c in configs],
            "config": configs, "maps": [], "updated_at": None, "run_maps": [("heads.gate",)] * n}
    return replace(from_runs(runs, None), _overrides=MappingProxyType(
        {"heads.gate": (np.asarray(gates, np.float32), np.ones(n, bool))}))


def _emit(figure: str, seconds: float, **extra) -> None:
    emit("stats", figure, seconds=seconds, **extra)


def _versus(figure: str, ours: Callable[[], object], reference: Callable[[], object], reps: int = REPS,
            **extra) -> None:
    """Time ours beside the reference, interleaved, and emit the speed-up of the medians."""
    times = side_by_side({"ours": ours, "reference": reference}, reps)
    ours_s, reference_s = statistics.median(times["ours"]), statistics.median(times["reference"])
    emit("stats", figure, measured="speedup", speedup=reference_s / ours_s,
         ours_s=ours_s, reference_s=reference_s, reps=reps, **extra)


def _ols_r(runs: np.ndarray) -> np.ndarray:
    """statsmodels' multiple correlation of each run on the others: sqrt(max(R2_adj, 0))."""
    out = []
    for i in range(len(runs)):
        design = sm.add_constant(np.delete(runs, i, axis=0).T)
        out.append(np.sqrt(max(sm.OLS(runs[i], design).fit().rsquared_adj, 0.0)))
    return np.array(out)


def published_rbo(maps_a: np.ndarray, maps_b: np.ndarray) -> list[float]:
    """``ranked_overlap.rbo`` of each pair of maps, units ranked by value, largest first."""
    return [ranked_overlap.rbo(np.argsort(-a).tolist(), np.argsort(-b).tolist(), p=rbo.PERSISTENCE)
            for a, b in zip(maps_a, maps_b, strict=True)]


def references(rng: np.random.Generator) -> None:
    """The figures with a reference implementation: equal values, then the speed-up."""
    x = _gates(rng, scaled(10_000, 200))
    diff = float(np.abs(pearson.pearson_matrix(x) - np.corrcoef(x, dtype=np.float32)).max())
    assert diff < 1e-5, f"pearson_matrix differs from numpy.corrcoef by {diff:.3g}"
    _versus("pearson_matrix", lambda: pearson.pearson_matrix(x), lambda: np.corrcoef(x, dtype=np.float32),
            reps=3, runs=len(x), heads=P, max_abs_diff=diff, dtype="float32 both")

    a = _gates(rng, scaled(1_000, 50))
    diff = float(np.nanmax(np.abs(spearman.spearman_between(a, a, dtype=np.float64)
                                  - scipy.stats.spearmanr(a, axis=1).statistic)))
    assert diff < 1e-6, f"spearman_between differs from scipy.stats.spearmanr by {diff:.3g}"
    _versus("spearman_between", lambda: spearman.spearman_between(a, a, dtype=np.float64),
            lambda: scipy.stats.spearmanr(a, axis=1), runs=len(a), heads=P, max_abs_diff=diff, dtype="float64 both",
            note="the n x n matrix of the same n runs, both: ours the group with itself, scipy the group")

    triples = rng.normal(size=(scaled(300, 10), 3, P)) + rng.normal(size=(1, 1, P))  # related runs
    runs, cells = triples.reshape(-1, P), [np.arange(i, i + 3) for i in range(0, 3 * len(triples), 3)]

    def by_statsmodels() -> float:
        return float(np.mean([_ols_r(t).mean() for t in triples]))

    diff = abs(stem_cell.stem_cell(runs, cells) - by_statsmodels())
    assert diff < 1e-9, f"stem_cell differs from statsmodels OLS by {diff:.3g}"
    _versus("stem_cell_fit", lambda: stem_cell.stem_cell(runs, cells), by_statsmodels,
            cells=len(triples), max_abs_diff=diff, dtype="float64 both",
            note="mean over cells of each triple's sqrt(R2_adj), each run the response once: statsmodels "
                 "fits 3 OLS per cell, ours one batched Pearson")

    maps_a, maps_b = rng.random((scaled(1_000, 20), P)), rng.random((scaled(1_000, 20), P))  # no ties
    diff = float(np.abs(rbo.rbo_maps(maps_a, maps_b) - published_rbo(maps_a, maps_b)).max())
    assert diff < 1e-9, f"rbo_maps differs from ranked_overlap.rbo by {diff:.3g}"
    _versus("rbo_pairs", lambda: rbo.rbo_maps(maps_a, maps_b), lambda: published_rbo(maps_a, maps_b),
            pairs=len(maps_a), max_abs_diff=diff, dtype="float64 both",
            peer=f"ranked_overlap.rbo {ranked_overlap.__version__} (PyPI ranked-overlap)")


def informational(rng: np.random.Generator) -> None:
    """What the nulls and the service's agreement cost: no reference implementation to set beside."""
    z = (rng.random((3, 6, 12)) < 0.5).astype(np.float64)
    for name, fn in (
        ("stem_cell", stem_cell.stem_cell),
        ("mean_pairwise_pearson", lambda z: _mean_pairwise(pearson.pearson_rows, z)),
        ("mean_pairwise_rbo", lambda z: _mean_pairwise(rbo.rbo_maps, z)),
    ):
        warm, cold = _time(
            lambda fn=fn: permutations.permutation_null(fn, z, 1000, np.random.default_rng(1)), repeats=2
        )
        _emit(f"permutation_null_1000x3x144_{name}", warm, cold_seconds=cold, note="informational: no peer")

    cells_n = scaled(1_000, 10)
    x = (rng.random((3 * cells_n, 6, 12)) < 0.5).astype(np.float64)
    cells = [np.arange(i, i + 3) for i in range(0, 3 * cells_n, 3)]
    warm, cold = _time(lambda: permutations.both_nulls(lambda z: stem_cell.stem_cell(z, cells), x, 100,
                                                np.random.default_rng(3)), repeats=2)
    _emit(f"stem_cell_both_nulls_100perm_{cells_n}cells_x3x144", warm, cold_seconds=cold,
          per_permutation_ms=1000 * warm / 200, note="informational: what a whole sweep's stem cell nulls cost")

    for model, (layers, heads) in (("tiny_bert_2x4", (2, 4)), ("minilm_6x12", (6, 12))):
        data = _sweep(rng, scaled(668, 10), 3, layers, heads)
        warm, cold = _time(lambda data=data: across_runs.agreement(data, "seed", n_perm=1000, map_name="heads.gate"), repeats=2)
        _emit(f"agreement_seed_{len(data)}runs_x1000perm_{model}", warm, cold_seconds=cold,
              runs_x_perms=len(data) * 1000, answered_by_service=len(data) * 1000 <= MAX_RUN_PERMS,
              note="informational: both nulls, every statistic; no peer computes this question")

    values = rng.random(1_000)
    warm, cold = _time(lambda: intervals.aggregate(values, np.random.default_rng(2), n_boot=1000))
    _emit("aggregate_bootstrap_1000x1000", warm, cold_seconds=cold, note="informational: a bootstrap CI")


def main() -> None:
    rng = np.random.default_rng(0)
    references(rng)
    informational(rng)
    finish()


if __name__ == "__main__":
    main()
