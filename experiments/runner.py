"""``run(cfg, ctx) -> RunResult``: what ONE run does, whoever calls it (CLI, Ray trial, test)."""

from __future__ import annotations

import functools
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from experiments.config import RunConfig, flatten
from experiments.methods import METHODS
from experiments.plots import gate_map_png
from experiments.result import RunResult
from experiments.seeding import sub_seeds
from experiments.tasks import TASKS
from experiments.training import RunContext


def run(cfg: RunConfig, ctx: RunContext | None = None) -> RunResult:
    """Run the config's method; log tags, params, metrics and the gate artifacts to ``ctx.tracker``."""
    ctx = ctx or RunContext()
    ctx.tracker.set_tags(run_tags(cfg))
    ctx.tracker.log_params(flatten(cfg.to_dict()) | {f"seeds.{k}": v for k, v in sub_seeds(cfg.seed).items()})
    started = time.perf_counter()
    result = METHODS[cfg.method].run(cfg, ctx)
    result = replace(result, seconds=time.perf_counter() - started)
    ctx.tracker.log_metrics({"run_seconds": result.seconds}, result.steps)
    ctx.tracker.log_artifact("gates.npz", result.gates_npz())
    title = f"{cfg.method}/{cfg.pipeline} {cfg.task.name} {cfg.model} seed {cfg.seed}"
    ctx.tracker.log_artifact("gate_map.png", gate_map_png(result.gates, title))
    return result


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """The searchable labels of a run (MLflow tags; also what the registry indexes)."""
    return {
        "run_key": cfg.run_key,
        "group_key": cfg.group_key,
        "task": cfg.task.name,
        "model": cfg.model,
        "method": cfg.method,
        "pipeline": str(cfg.pipeline),
        "seed": str(cfg.seed),
        "sparsity": "" if cfg.sparsity is None else str(cfg.sparsity),
        "lambda": str(cfg.gates.lambda_),
        "task_version": TASKS[cfg.task.name].VERSION,
        "method_version": METHODS[cfg.method].VERSION,
        "git_commit": code_version(),
    }


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The git commit of this checkout ('+dirty' with local changes), or 'unknown'."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
