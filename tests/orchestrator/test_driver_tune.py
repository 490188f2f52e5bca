"""How the driver drives Tune: every key of a wave becomes one trial, in order, and a sweep's
``max_concurrent`` holds (the keys are handed to Tune as points of its variant generator, not a
grid_search, and a FIFO scheduler with a queue picks the next trial)."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
import ray

from base.result import RunResult, UnitMap
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

pytestmark = pytest.mark.ray




def _slow_run(cfg, ctx) -> RunResult:
    time.sleep(0.3)
    gate = UnitMap(np.ones((2, 4), dtype=np.float32), "heads", "test")
    return RunResult(cfg.run_key, cfg.group_key, {"accuracy": 1.0}, {"heads.gate": gate}, steps=1)


def _sweep(home, monkeypatch, seeds: int, max_concurrent: int, cpus: float = 1,
           max_failures: int = 0) -> tuple[str, Registry, str]:
    """(registry URL, registry, sweep id) of a sweep of ``seeds`` tiny runs, ``cpus`` each, ``max_failures``
    retries, in ``home``."""
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    url = f"sqlite:///{home}/registry.db"
    grid = {"name": "tune", "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
            "axes": {"seed": list(range(seeds))}, "resources": {"cpus": cpus}, "max_concurrent": max_concurrent,
            "max_failures": max_failures}
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep("tune", "", expand(parse_grid(grid)), {"cpus": cpus}, max_concurrent,
                                        max_failures)
    return url, registry, sweep_id


def test_one_trial_per_key_and_max_concurrent_holds(local_ray, tmp_path, monkeypatch):
    url, registry, sweep_id = _sweep(tmp_path, monkeypatch, seeds=5, max_concurrent=1)
    # two CPUs would let two 1-CPU trials run at once: only max_concurrent stops the second
    assert execute_sweep(sweep_id, registry_url=url, track=False, run_fn=_slow_run) == {"finished": 5}
    runs = sorted((registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]),
                  key=lambda run: run["started_at"])
    assert [run["attempts"] for run in runs] == [1] * 5  # each key ran once
    assert all(run["metrics"]["accuracy"] == 1.0 for run in runs)
    for before, after in zip(runs[:-1], runs[1:], strict=True):
        assert before["finished_at"] <= after["started_at"], "two runs at once under max_concurrent 1"
    assert registry.sweep_map(sweep_id, "heads.gate").has.all()


def test_a_wave_looks_its_trainable_up_once_and_puts_tune_back(monkeypatch):
    """Tune reads a trial's trainable from Ray's key-value store three times per trial; within a wave
    the driver's cache answers from the first read, and Tune's own lookups are back after it."""
    from ray.tune.experiment import trial as tune_trial

    from orchestrator.driving.driver import _trainable_looked_up_once

    reads: list[str] = []
    monkeypatch.setattr(tune_trial, "get_trainable_cls", lambda name: reads.append(name) or object())
    monkeypatch.setattr(tune_trial, "validate_trainable", lambda name: reads.append(f"validate {name}"))
    before = tune_trial.get_trainable_cls
    with _trainable_looked_up_once():
        first = [tune_trial.get_trainable_cls("trial") for _ in range(3)]
        for _ in range(3):
            tune_trial.validate_trainable("trial")
        other = tune_trial.get_trainable_cls("another")
    assert first[0] is first[1] is first[2] and other is not first[0]
    assert reads == ["trial", "validate trial", "another"]
    assert tune_trial.get_trainable_cls is before  # the next wave registers its own trainable: read again
    tune_trial.get_trainable_cls("trial")
    assert reads[-1] == "trial"


def _pid_run(cfg, ctx) -> RunResult:
    result = _slow_run(cfg, ctx)
    result.metrics["pid"] = os.getpid()
    return result


def test_trials_that_end_together_keep_their_worker_processes(local_ray, tmp_path, monkeypatch):
    """A trial's actor (a worker process that has imported torch and holds the per-worker model and
    data caches) goes on to the next run (``reuse_actors``): under max_concurrent 6 the 24 runs of
    equal length, ending in pairs and threes, use at most 6 processes, not one each."""
    url, registry, sweep_id = _sweep(tmp_path, monkeypatch, seeds=24, max_concurrent=6, cpus=0.25)
    assert execute_sweep(sweep_id, registry_url=url, track=False, run_fn=_pid_run) == {"finished": 24}
    pids = {registry.get_run(key)["metrics"]["pid"] for key in registry.sweep_runs(sweep_id)["run_key"]}
    assert len(pids) <= 6, f"{len(pids)} worker processes for 24 runs at max_concurrent 6"


def test_the_actor_cache_keeps_up_to_its_cap_and_flushes_all_at_the_end():
    """Pure: Tune's cache keeps one actor when no trial is staged; the driver's keeps up to the cap."""
    from orchestrator.driving.driver import _WarmActors

    cache = _WarmActors(keep=3)
    assert [cache.cache_object("quarter-gpu", actor) for actor in "abcd"] == [True, True, True, False]
    assert list(cache.flush_cached_objects()) == [] and cache.num_cached_objects == 3  # kept while trials come
    assert cache.pop_cached_object("quarter-gpu") == "a"  # the oldest reused first
    cache.increase_max("quarter-gpu", 4)  # four trials staged: Tune's own rule keeps one more
    assert cache.cache_object("quarter-gpu", "e") and cache.cache_object("quarter-gpu", "f")
    assert cache.num_cached_objects == 4 and not cache.cache_object("quarter-gpu", "g")
    cache.decrease_max("quarter-gpu", 4)
    assert list(cache.flush_cached_objects()) == ["b"] and cache.num_cached_objects == 3
    assert sorted(cache.flush_cached_objects(force_all=True)) == ["c", "e", "f"] and cache.num_cached_objects == 0


def test_a_wave_s_actor_cache_is_the_driver_s_and_tune_s_after_it():
    from ray.tune.execution import tune_controller

    from orchestrator.driving.driver import _actors_kept

    before = tune_controller._ObjectCache
    with _actors_kept(5):
        assert tune_controller._ObjectCache(may_keep_one=True)._keep == 5
    with _actors_kept(0):  # no cap: Tune stages trials ahead and keeps what they need itself
        assert tune_controller._ObjectCache is before
    assert tune_controller._ObjectCache is before


def _deaf_run(cfg, ctx, ended: str) -> RunResult:
    """Never looks at the cancel flag: only the driver's own poll can end it. One that ends by itself
    (after ``DEAF_S``) leaves a file in ``ended``."""
    time.sleep(DEAF_S)
    open(os.path.join(ended, cfg.run_key), "w").close()
    return _slow_run(cfg, ctx)


DEAF_S = 200.0


def test_a_cancel_the_driver_sees_first_leaves_no_run_running(local_ray, tmp_path, monkeypatch):
    """After a cancel, the driver's poll can end the Tuner before a trial's own poll cancels its run
    (a loaded machine: 2 of 4 runs were left "running" in a cancelled sweep). Trials that never poll
    make the driver's poll win every time: the wave's runs are cancelled by the driver itself."""
    url, registry, sweep_id = _sweep(tmp_path, monkeypatch, seeds=3, max_concurrent=2)
    seen: dict = {}

    def cancel_once_two_run() -> None:  # the guard only tells a hang: the test then fails on ``seen``
        deadline = time.monotonic() + DEAF_S
        while (counts := registry.sweep_counts(sweep_id)).get("running", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        seen["at_cancel"] = counts
        registry.cancel_sweep(sweep_id)

    ended = tmp_path / "ended"
    ended.mkdir()
    canceller = threading.Thread(target=cancel_once_two_run)
    canceller.start()
    counts = execute_sweep(sweep_id, registry_url=url, track=False,
                           run_fn=functools.partial(_deaf_run, ended=str(ended)))
    canceller.join()
    assert seen["at_cancel"].get("running") == 2, f"cancelled before two runs ran: {seen}"
    assert not list(ended.iterdir()), "the runs ended by themselves: the cancel never reached them"
    assert counts == {"cancelled": 3}  # two held by the ended trials, one pending
    assert registry.get_sweep(sweep_id)["status"] == "cancelled"


def _dies_once_run(cfg, ctx, marker: str, seed: int) -> RunResult:
    """Kills its own worker process (SIGKILL: a lost worker) the first time it runs ``seed``."""
    if cfg.seed == seed and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return _pid_run(cfg, ctx)


@pytest.mark.slow  # ~20 s: a worker's start-up while 40 runs end
def test_a_lost_worker_costs_one_new_worker_not_one_per_trial_after_it(local_ray, tmp_path, monkeypatch):
    """A trial whose worker died is retried on a new actor; while that worker starts (seconds: it
    imports torch), trials keep ending. Tune gave the retried trial each freed actor instead and
    dropped its starting worker, so the next trial asked for a new one, and so on: a worker started
    and thrown away per trial that ended (~64 at once on 8 simulated nodes, memory gone). The driver
    lets a trial whose worker is already starting keep it: one new worker replaces the lost one."""
    url, registry, sweep_id = _sweep(tmp_path, monkeypatch, seeds=40, max_concurrent=2, cpus=0.5, max_failures=1)
    before = set(ray._private.state.actors())  # actor ids
    run_fn = functools.partial(_dies_once_run, marker=str(tmp_path / "killed"), seed=4)
    assert execute_sweep(sweep_id, registry_url=url, track=False, run_fn=run_fn) == {"finished": 40}
    created = set(ray._private.state.actors()) - before
    attempts = sum(registry.get_run(key)["attempts"] for key in registry.sweep_runs(sweep_id)["run_key"])
    assert attempts == 41  # the killed run ran twice, every other once
    assert len(created) <= 4, f"{len(created)} trial actors created for 2 slots and 1 lost worker"
