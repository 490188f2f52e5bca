"""What a run pays besides its training (issue 19), measured beside what it would cost without us.

Prints one JSON line per figure (``_bench.emit``: target, met, load; exits 1 on a miss):
- ``minilm_warm_setup``: MiniLM and SST-2 (20,000 train phrases, 1,000 dev, max_length 64) loaded
  as a run's ``set_up`` loads them (``load_backbone`` + ``load_task``: the ``cost.model_s`` and
  ``cost.data_s`` of the run), in one process with its own ``HEADSWEEP_HOME``: the first run
  (model read, data tokenised and cached) then ``--repeats`` warm ones, interleaved with its peer,
  what a plain script pays (``from_pretrained`` of model and tokenizer + the task's own load):
  warm / plain.
- ``sweep_vs_loop``: K (``--runs``) tiny-bert head_gates runs (a generated task, a few steps each)
  through a real sweep (local Ray, 2 concurrent 1-CPU trials, SQLite registry, MLflow on, figures)
  vs the same K trainings (``experiments.run`` of the same configs, no tracking) in plain Python
  loops at the sweep's concurrency and a trial's threads: 2 loop processes at once, one torch thread
  each, every other config to each (:func:`plain_loops`), timed before each sweep and after the
  last (interleaved with them; each sweep on a Ray of its own, so that the loops run without Ray's
  daemons, as a plain script does). The wall-time ratio (the lesser of the two K sweeps over the least loop), and the gap (sweep - loop)
  split into that sweep's runs' own ``cost.<part>_s`` summed over runs and divided by the
  concurrency: MLflow (``mlflow``), figures, the registry (``claim`` + ``finish``), and the rest (Ray
  and Tune: worker start-up, scheduling, the driver) as fractions of it. At K = 20 runs of ~0.2 s it
  is mostly the sweep's fixed start (two trial workers importing torch, Tune's set-up) over a few
  seconds of training: a number about K as much as about the code; the next figure cancels the start.
- ``per_run_vs_loop``: a run's own cost through the sweep against the loops', the sweep's fixed start
  cancelled: sweeps of K, 4K and K again (other seeds each), (sweep of 4K - the lesser K sweep) /
  (loops of 4K - loops of K, each the least of four); unresolved (inf, a miss) when the two least
  of the K sweeps, of the K loops or of the 4K loops are more than 1.5x apart, which says the load
  changed under the measurement, or when either difference is not positive (each is checked on its
  own: two negative differences make a positive ratio).

Targets: ``_bench.TARGETS``.

    .venv/bin/python tests/benchmarks/bench_run_cost.py [--repeats 3] [--runs 20] [--max-train 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import statistics
import tempfile
import time

from _bench import emit, finish, scaled, start_ray

TINY_GRID = {
    "name": "bench-run-cost",
    "base": {
        "model": "tiny-bert", "method": "head_gates",
        "task": {"name": "synthetic-cls", "num_train": 256, "num_eval": 64, "max_length": 32},
        "train": {"max_steps": 8, "batch_size": 16, "eval_every": 8},
        "head_gates": {"pipeline": "dp", "lambda": 0.1, "lr": 0.1},
    },
    "resources": {"cpus": 1},
    "max_concurrent": 2,
    "max_failures": 0,
}


def minilm_setup(args) -> None:
    from base.costs import Costs, active
    from base.sections import TaskConfig
    from experiments.models import load_backbone
    from experiments.tasks.cache import load_task

    cfg = TaskConfig(name="sst2", max_train=args.max_train, max_eval=1000, max_length=64)

    def cached() -> dict[str, float]:
        costs = Costs()
        with active(costs):
            _, tokenizer = load_backbone("minilm-l6", 0)
            load_task(cfg, tokenizer)
        return {"model": costs.seconds["model"], "data": costs.seconds["data"]}

    first = cached()
    warm, before = [], []
    for _ in range(args.repeats):
        warm.append(cached())
        before.append(uncached(cfg))
    total = [w["model"] + w["data"] for w in warm]
    emit("run_cost", "minilm_warm_setup", measured="ratio",
         ratio=statistics.median(total) / statistics.median(before), warm_s=statistics.median(total), warm_model_s=statistics.median(w["model"] for w in warm),
         warm_data_s=statistics.median(w["data"] for w in warm), first_s=first["model"] + first["data"],
         first_model_s=first["model"], first_data_s=first["data"],
         uncached_s=statistics.median(before), repeats=args.repeats, train_phrases=args.max_train,
         note="one process, its own HEADSWEEP_HOME (cold cache); uncached = from_pretrained + the task's "
              "own load, what each run paid before (interleaved with the warm ones)")


def uncached(cfg) -> float:
    """Seconds of a run's model and data set-up without the caches: what it was before them."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from experiments.models import MODELS
    from experiments.tasks import TASKS

    started = time.perf_counter()
    path = MODELS["minilm-l6"].path()
    AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    TASKS[cfg.name].load(cfg, AutoTokenizer.from_pretrained(path))
    return time.perf_counter() - started


def _loop_worker(conn, threads: int) -> None:
    """One plain loop, a trial worker's twin: ``threads`` torch threads; it trains each list of
    configs it receives one after the other (``experiments.run``, no tracking) and sends back the
    seconds, until it receives None."""
    import torch

    from experiments import RunContext, run

    torch.set_num_threads(threads)
    while (configs := conn.recv()) is not None:
        started = time.perf_counter()
        for cfg in configs:
            run(cfg, RunContext())
        conn.send(time.perf_counter() - started)


@contextlib.contextmanager
def plain_loops(processes: int, threads: int):
    """The sweep's peer: ``processes`` plain loops at once (the sweep's concurrent trials), each a
    process of ``threads`` torch threads (a trial's). Yields ``timed(configs)``: the wall seconds of
    ``configs`` trained by the loops, every ``processes``-th config to each."""
    context = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    for _ in range(processes):
        ours, theirs = context.Pipe()
        workers.append(context.Process(target=_loop_worker, args=(theirs, threads), daemon=True))
        workers[-1].start()
        pipes.append(ours)

    def timed(configs) -> float:
        started = time.perf_counter()
        for i, pipe in enumerate(pipes):
            pipe.send(configs[i::processes])
        for pipe in pipes:
            pipe.recv()
        return time.perf_counter() - started

    try:
        yield timed
    finally:
        for pipe in pipes:
            pipe.send(None)
        for worker in workers:
            worker.join(60)


def per_run_ratio(sweeps_k: list[float], sweep_4k: float, loops_k: list[float], loops_4k: list[float]) -> float:
    """What 3K more runs add through the sweep over what they add in the loops, the sweep's fixed
    start cancelled: (sweep of 4K - the least K sweep) / (the least loop of 4K - the least loop of
    K): the least of each (noise only adds). inf (unresolved: a miss, not a ratio of two machines)
    when the two least of a kind are more than 1.5x apart (the load changed under them) or when
    either difference is not positive, each checked on its own sign (two negative differences would
    make a positive ratio)."""
    steady = all(least[1] <= 1.5 * least[0] for least in map(sorted, (sweeps_k, loops_k, loops_4k)))
    sweep_more, loop_more = sweep_4k - min(sweeps_k), min(loops_4k) - min(loops_k)
    return sweep_more / loop_more if steady and sweep_more > 0 and loop_more > 0 else math.inf


def sweep_vs_loop(args) -> None:
    import ray
    import yaml

    from base.costs import PARTS
    from orchestrator import settings, tracking
    from orchestrator.driving.driver import execute_sweep
    from orchestrator.driving.grid import expand, parse_grid
    from orchestrator.registry import Registry

    def cells(seeds) -> tuple[dict, object, list]:
        """The grid of ``seeds``, its parsed spec and its expanded configs (each parsed and expanded once)."""
        grid = TINY_GRID | {"axes": {"seed": list(seeds)}}
        spec = parse_grid(grid)
        return grid, spec, expand(spec)

    def sweep(grid, spec, configs) -> tuple[float, str]:
        """Wall seconds of a real sweep of ``configs`` (registered, tracked, executed on Ray) and its id."""
        sweep_id, _ = registry.create_sweep(f"{spec.name}-{len(configs)}", yaml.safe_dump(grid), configs,
                                            spec.resources.model_dump(), spec.max_concurrent, spec.max_failures, force=True)
        experiment_id = tracking.ensure_experiment(mlflow, spec.name)
        registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id,
                           mlflow_parent_run_id=tracking.start_run(mlflow, experiment_id, sweep_id))
        started = time.perf_counter()
        counts = execute_sweep(sweep_id, registry_url=settings.registry_url())
        assert counts == {"finished": len(configs)}, counts
        return time.perf_counter() - started, sweep_id

    first, four, again = (cells(range(args.runs)), cells(range(args.runs, 5 * args.runs)),  # other seeds each:
                          cells(range(5 * args.runs, 6 * args.runs)))  # other runs, the same work
    spec, configs, more = first[1], first[2], four[2]
    concurrency, threads = spec.max_concurrent, max(1, int(spec.resources.cpus))  # as trial.py sets a trial's
    registry = Registry(settings.registry_url())
    mlflow = tracking.client()
    timed, swept = [], []
    with plain_loops(concurrency, threads) as loop:
        loop(configs[:concurrency])  # the imports and each loop's first model build, which the sweep's workers pay too
        # the loops of K and 4K before each sweep and after the last, interleaved, so that a change of load hits
        # both alike; sweeps of K, 4K, then K again (each of other seeds): a warm-up that favours later sweeps
        # hits both sizes. Each sweep on a Ray of its own, started and stopped around it (not timed): the loops
        # run without Ray's daemons, as a plain script does, and every sweep pays the same fixed start.
        for cell in (first, four, again):
            timed.append((loop(configs), loop(more)))
            start_ray(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                      runtime_env={"env_vars": {"HEADSWEEP_HOME": os.environ["HEADSWEEP_HOME"]}})
            try:
                swept.append(sweep(*cell))
            finally:
                ray.shutdown()
        timed.append((loop(configs), loop(more)))
    (first_s, first_id), (sweep_4k_s, _), (again_s, again_id) = swept
    loops, loops_4k = (list(kind) for kind in zip(*timed, strict=True))
    (sweep_s, sweep_id), loop_s = min((first_s, first_id), (again_s, again_id)), min(loops)  # noise only adds
    metrics = registry.sweep_runs(sweep_id)["metrics"]
    summed = {part: sum(m[f"cost.{part}_s"] for m in metrics) / concurrency for part in PARTS}
    gap = sweep_s - loop_s
    parts = {"mlflow": summed["mlflow"], "figures": summed["figures"], "registry": summed["claim"] + summed["finish"]}
    parts["ray_and_rest"] = gap - sum(parts.values())
    warm = [m for m in metrics if not m["cost.first_in_worker"]]
    emit("run_cost", "sweep_vs_loop", measured="ratio", ratio=sweep_s / loop_s,
         sweep_s=sweep_s, sweeps_s=[first_s, again_s], loop_s=loop_s, loops_s=loops, gap_s=gap, runs=args.runs,
         loop_processes=concurrency, loop_threads=threads,
         **{f"{part}_of_gap": value / gap for part, value in parts.items()},
         warm_total_s=statistics.median(m["cost.total_s"] for m in warm) if warm else None,
         note="the lesser K sweep over the lesser loop: at K tiny runs mostly the sweep's fixed start over K "
              "trainings; the loop: 2 processes at once, one torch thread each, as the sweep's 2 one-CPU trials; "
              "the parts: that sweep's runs' cost.<part>_s summed and divided by the concurrency (2), as fractions "
              "of the gap; ray_and_rest is what is left (worker start-up, Tune, the driver)")
    per_run = per_run_ratio([first_s, again_s], sweep_4k_s, loops, loops_4k)
    emit("run_cost", "per_run_vs_loop", measured="ratio", ratio=per_run,
         sweep_4k_s=sweep_4k_s, loop_4k_s=min(loops_4k), sweeps_s=[first_s, again_s], loops_s=loops,
         loops_4k_s=loops_4k, sweep_more_s=sweep_4k_s - sweep_s, loop_more_s=min(loops_4k) - loop_s, runs=args.runs,
         sweep_start_s=sweep_s - per_run * loop_s if math.isfinite(per_run) else None,
         note="what 3K more runs add: (sweep of 4K - sweep of K, the lesser of one before and one after) / "
              "(loops of 4K - loops of K, the least of four, interleaved with the sweeps), other seeds each, the loops as in sweep_vs_loop; "
              "inf (a miss) when the two least of a kind are more than 1.5x apart (the load changed under them) or either difference "
              "is not positive; the sweep's fixed start (workers importing torch, Tune's set-up) cancels; "
              "sweep_start_s is that start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=scaled(20, 4))
    parser.add_argument("--max-train", type=int, default=scaled(20000, 500))
    args = parser.parse_args()
    os.environ["HEADSWEEP_HOME"] = tempfile.mkdtemp(prefix="bench-run-cost-")
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        os.environ.pop(name, None)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    minilm_setup(args)
    sweep_vs_loop(args)
    finish()


if __name__ == "__main__":
    main()
