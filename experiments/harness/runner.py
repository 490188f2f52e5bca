"""``run(cfg, ctx) -> RunResult``: what ONE run does, whoever calls it (CLI, Ray trial, test)."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import torch

from base import collapse, outputs
from base.costs import active, timed
from base.result import RunResult
from base.sections import flatten
from base.sources import hash_sources
from experiments.harness.config import RunConfig
from experiments.harness.plots import gate_map_png, map_png
from experiments.interventions.masks import ROLES
from experiments.maths.hard_concrete import prob_open
from experiments.methods import METHODS
from experiments.tasks import TASKS
from experiments.training.context import RunContext
from experiments.training.precision import check_precision
from experiments.training.seeding import sub_seeds
from experiments.training.tracking import Tracker


def run(cfg: RunConfig, ctx: RunContext | None = None) -> RunResult:
    """Run the config's method; log tags, params, metrics and the map artifacts to ``ctx.tracker``.
    A precision the run's device cannot run (fp16 off CUDA) is a ConfigError before anything runs."""
    ctx = ctx or RunContext()
    check_precision(cfg, ctx.device)
    with active(ctx.costs):  # the method's model and data loads time themselves (costs.timed)
        with timed("mlflow"):
            ctx.tracker.set_tags(run_tags(cfg))
            ctx.tracker.log_params(flatten(cfg.to_dict()) | {f"seeds.{k}": v for k, v in sub_seeds(cfg.seed).items()})
        started = time.perf_counter()
        with timed("train"):
            result = METHODS[cfg.method].run(cfg, ctx)
        result = replace(result, seconds=time.perf_counter() - started)
        flag = collapse.collapsed(result.metrics)  # one class on dev, or the uniform guess's loss
        if flag is not None:
            result = replace(result, metrics=result.metrics | {collapse.COLLAPSED: float(flag)})
        with timed("mlflow"):
            ctx.tracker.log_metrics({"run_seconds": result.seconds}
                                    | ({} if flag is None else {collapse.COLLAPSED: float(flag)}), result.steps)
            if flag is not None:
                ctx.tracker.set_tags({collapse.COLLAPSED: str(flag).lower()})
        log_maps(ctx.tracker, result, cfg.labels())
        with timed("artifacts"):
            for name, data in result.artifacts.items():
                ctx.tracker.log_artifact(name, data)
                if ctx.save_artifact is not None:
                    ctx.save_artifact(name, data)
    return result


def log_maps(tracker: Tracker, result: RunResult, labels: dict) -> None:
    """``maps.npz`` (every map and trajectory) and one heat map ``<name>.png`` per ``heads.*`` and
    ``layers.*`` map and per weight mask's layer x matrix density (``weights.mask_density``), but
    for a gate map's own ``heads.log_alpha``: its gate map draws it (the gate is a monotone function
    of log_alpha, and the map's title counts its expected open heads), and a second matplotlib
    figure would cost a tiny run ~0.1 s, a third of what the rest of it costs (issue 19). It stays in
    ``maps.npz``, the registry and ``headsweep figures``.

    A run without maps (plain fine-tuning learns no gates) logs only the (empty) ``maps.npz``.
    """
    with timed("artifacts"):
        tracker.log_artifact("maps.npz", result.maps_npz())
    with timed("figures"):
        pngs = map_pngs(result, labels)
    with timed("artifacts"):
        for name, png in pngs.items():
            tracker.log_artifact(name, png)


def map_pngs(result: RunResult, labels: dict) -> dict[str, bytes]:
    """``<map name>.png`` -> the heat map :func:`log_maps` logs for each map that gets one."""
    method = "/".join(str(labels[k]) for k in ("method", "pipeline") if labels.get(k) is not None)
    title = f"{method} {labels['task']} {labels['model']} seed {labels['seed']}"
    pngs = {}
    for name, unit_map in result.maps.items():
        if unit_map.kind == "weights" and unit_map.values.shape[1] == len(ROLES):  # a mask's layer x matrix
            png = map_png(unit_map.values, f"{title}\n{name}: fraction of each matrix kept", name,
                          units=list(ROLES), xlabel="matrix")
        elif unit_map.kind == "layers":  # one value per layer (an ablation of whole layers)
            png = map_png(unit_map.values, f"{title}\n{name}: {unit_map.meaning}", name, units=[""], xlabel="")
        elif unit_map.kind != "heads" or _drawn_by_its_gate_map(name, result):
            continue
        elif outputs.GATE.matches(name):  # several gate sets: multitask's heads.gate.<task>
            png = gate_map_png(unit_map.values, title if name == outputs.GATE.name else f"{title}\n{name}",
                               _expected_open(result, name))
        else:
            png = map_png(unit_map.values, f"{title}\n{name}: {unit_map.meaning}", name, xlabel="head")
        pngs[f"{name}.png"] = png
    return pngs


def _drawn_by_its_gate_map(name: str, result: RunResult) -> bool:
    """The companion (``heads.log_alpha[.<task>]``) of a gate map (``heads.gate[.<task>]``) the run has."""
    return any(outputs.companion(gate) == name for gate in result.maps if outputs.GATE.matches(gate))


def _expected_open(result: RunResult, gate_map: str) -> float | None:
    """Expected open heads of a gate map, from its companion ``heads.log_alpha[.<task>]`` (None without one)."""
    log_alpha = result.maps.get(outputs.companion(gate_map) or "")
    return None if log_alpha is None else float(prob_open(torch.tensor(log_alpha.values)).sum())


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """The searchable labels of a run (MLflow tags; also what the registry indexes)."""
    labels = {k: "" if v is None else str(v) for k, v in cfg.labels().items()}
    return {
        "run_key": cfg.run_key,
        "group_key": cfg.group_key,
        **labels,
        "task_version": TASKS[cfg.task.name].VERSION,
        "method_version": METHODS[cfg.method].VERSION,
        "git_commit": code_version(),
    }


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code this process runs: ``'<commit>[+dirty] src:<source_hash()>'``.

    The commit is the git checkout's that holds this file; code shipped to a Ray cluster has no
    ``.git``, and then ``HEADSWEEP_CODE_COMMIT`` (set by the submitter) or 'unknown'. The source
    hash is what tells two versions apart, committed or not.
    """
    root = Path(__file__).resolve().parents[2]  # the folder that holds experiments/ (a checkout's top)
    sha = os.environ.get("HEADSWEEP_CODE_COMMIT") or "unknown"
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
        if Path(top[0]).resolve() == root:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
            sha = top[1] + ("+dirty" if dirty else "")
    except (OSError, IndexError, subprocess.CalledProcessError):
        pass
    return f"{sha} src:{source_hash()}"


def source_hash() -> str:
    """sha256 (12 hex) of every .py file of base/, experiments/, orchestrator/ and analysis/ as this process imports them."""
    import importlib.util

    digest = hashlib.sha256()
    for package in ("base", "experiments", "orchestrator", "analysis"):
        spec = importlib.util.find_spec(package)  # finds, does not import
        if spec is None or not spec.submodule_search_locations:
            continue
        hash_sources(digest, Path(spec.submodule_search_locations[0]), package)
    return digest.hexdigest()[:12]
