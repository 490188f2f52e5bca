"""A small real sweep in a real SQLite registry, with gates whose agreement we know.

2 tasks x 2 pipelines x 2 lambdas x 3 seeds = 24 finished runs (6 x 12 heads)
plus one pending run (seed 3 of the first cell). Each task has its own binary
head profile, uncorrelated with the other's (Pearson exactly 0: in every layer
one task keeps 6 adjacent heads, the other every second head); lambda = 0.1
closes the first CLOSE_AT_HIGH_LAMBDA open heads of the profile. Every run
keeps its cell's profile with FLIPS of its 72 heads flipped at random. So
seeds (and pipelines) of one task agree strongly, tasks do not, and

    accuracy = TASK_ACC[task] + 0.05 * (pipeline == "sp") + 0.01 * seed - 0.5 * lambda
    loss = 1 - accuracy,  open_heads = number of gates at 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

LAYERS, HEADS = 6, 12
TASKS = ("synthetic-cls", "synthetic-tag")
PIPELINES = ("dp", "sp")
LAMBDAS = (0.01, 0.1)
SEEDS = (0, 1, 2)
TASK_ACC = {"synthetic-cls": 0.7, "synthetic-tag": 0.8}
FLIPS = 4
CLOSE_AT_HIGH_LAMBDA = 6


def _profile(task: str) -> np.ndarray:
    """(L, H) binary; row l keeps heads h with (h + l) % 12 < 6 (cls) or (h + l) even (tag)."""
    shifted = (np.arange(HEADS)[None, :] + np.arange(LAYERS)[:, None]) % HEADS  # (L, H)
    keep = shifted < HEADS // 2 if task == TASKS[0] else shifted % 2 == 0
    return keep.astype(np.float32)


def cell_profile(task: str, lam: float) -> np.ndarray:
    z = _profile(task).ravel()
    if lam == max(LAMBDAS):
        z[np.flatnonzero(z)[:CLOSE_AT_HIGH_LAMBDA]] = 0.0
    return z.reshape(LAYERS, HEADS)


@dataclass(frozen=True)
class Sweep:
    url: str
    sweep_id: str
    pending_key: str
    profiles: dict[str, np.ndarray]  # task -> (L, H) binary
    gates: dict[tuple[str, str, float, int], np.ndarray]  # (task, pipeline, lambda, seed) -> (L, H)


def _config(task: str, pipeline: str, lam: float, seed: int):
    from experiments.harness.config import parse_config

    return parse_config({
        "model": "minilm-l6", "method": "head_gates", "seed": seed,
        "task": {"name": task}, "head_gates": {"pipeline": pipeline, "lambda": lam}, "train": {"max_steps": 10},
    })


def build_sweep(path: Path, name: str = "stem") -> Sweep:
    """Create and fill the registry file under ``path``; returns what the tests need to know."""
    from orchestrator.registry import Registry

    rng = np.random.default_rng(1234)
    profiles = {task: _profile(task) for task in TASKS}
    cells = [(t, p, lam, s) for t in TASKS for p in PIPELINES for lam in LAMBDAS for s in SEEDS]
    configs = {cell: _config(*cell) for cell in cells}
    pending = _config(TASKS[0], PIPELINES[0], LAMBDAS[0], 3)
    url = f"sqlite:///{path / 'registry.db'}"
    gates = {}
    with Registry(url) as registry:
        sweep_id, counts = registry.create_sweep(
            name, f"name: {name}\n", [*configs.values(), pending], {"cpus": 1.0, "gpus": 0.0}, None, 1)
        # + the SP cells' fine-tunes (their init_from stage, one per task and seed): real sweeps have them
        upstreams = {cfg.upstreams["init_from"].run_key: cfg.upstreams["init_from"]
                     for (_, p, _, _), cfg in configs.items() if p == "sp"}
        assert counts["new"] == len(cells) + 1 + len(upstreams) == len(cells) + 1 + 6
        for key, up in upstreams.items():  # finished, learning no gates: analysis must leave them out
            assert registry.claim(key, "test-worker") is not None
            assert registry.finish(key, {"accuracy": TASK_ACC[up.task.name] + 0.1, "loss": 0.2})
        for cell, cfg in configs.items():
            task, pipeline, lam, seed = cell
            z = cell_profile(task, lam).ravel()
            flip = rng.choice(z.size, FLIPS, replace=False)
            z[flip] = 1.0 - z[flip]
            z = z.reshape(LAYERS, HEADS)
            gates[cell] = z
            accuracy = TASK_ACC[task] + 0.05 * (pipeline == "sp") + 0.01 * seed - 0.5 * lam
            assert registry.claim(cfg.run_key, "test-worker") is not None
            assert registry.finish(
                cfg.run_key, {"accuracy": accuracy, "loss": 1.0 - accuracy, "open_heads": float(z.sum())},
                maps={"heads.gate": z, "heads.log_alpha": z * 4.0 - 2.0 + rng.normal(0, 0.1, z.shape)},
            )
    return Sweep(url, sweep_id, pending.run_key, profiles, gates)


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> Sweep:
    """The shared sweep (read only: tests that write build their own with ``build_sweep``)."""
    return build_sweep(tmp_path_factory.mktemp("analysis-registry"))


@pytest.fixture(scope="session")
def registry(sweep):
    from orchestrator.registry import Registry

    with Registry(sweep.url) as opened:
        yield opened


@pytest.fixture(scope="session")
def data(registry, sweep):
    from analysis.data.loading import load_sweep

    return load_sweep(registry, sweep.sweep_id)


@pytest.fixture
def fresh_sweep(tmp_path) -> Sweep:
    """A private copy of the sweep in this test's tmp_path, for tests that write to it."""
    return build_sweep(tmp_path)


@pytest.fixture(scope="session")
def sweep_builder():
    """``build_sweep`` itself, for module fixtures that need a sweep of their own."""
    return build_sweep


@pytest.fixture
def count_selects():
    """``count_selects(registry, fn)`` -> (fn(), the SELECT statements it ran on the registry's engine)."""
    from sqlalchemy import event

    def run(registry, fn):
        statements = []

        def count(_conn, _cursor, statement, *_):
            statements.append(statement)

        event.listen(registry._engine, "before_cursor_execute", count)
        try:
            value = fn()
        finally:
            event.remove(registry._engine, "before_cursor_execute", count)
        return value, [s for s in statements if s.lstrip().upper().startswith("SELECT")]

    return run
