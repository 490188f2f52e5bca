"""Sweeps on a real local Ray (Tune), a real SQLite registry and a real MLflow store.

The driver runs in this process (``execute_sweep``) so tests can inject a run
function; the detached path (Ray Jobs, a killed driver, resume) is in
test_cluster.py.
"""

import functools
import os
import threading
import time

import numpy as np
import pytest
import yaml

from base.result import RunResult
from experiments.harness.runner import run as real_run
from orchestrator import settings, tracking
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

pytestmark = pytest.mark.ray

GRID = {
    "name": "tsweep",
    "base": {
        "model": "tiny-bert",
        "task": {"name": "synthetic-cls", "num_train": 48, "num_eval": 16, "max_length": 24},
        "train": {"max_steps": 6, "batch_size": 8, "eval_every": 3},
        "head_gates": {"lambda": 0.1, "lr": 0.1},
    },
    "axes": {"seed": [0, 1], "pipeline": ["dp", "sp"]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
    "max_failures": 1,
}




@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.delenv("HEADSWEEP_DB", raising=False)
    monkeypatch.delenv("HEADSWEEP_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _submit(grid: dict, track: bool = True) -> tuple[Registry, str]:
    """What `headsweep submit` does before it starts the driver (registry + MLflow parent run)."""
    spec = parse_grid(grid)
    registry = Registry(settings.registry_url())
    sweep_id, _ = registry.create_sweep(
        spec.name, yaml.safe_dump(grid), expand(spec), spec.resources.model_dump(),
        spec.max_concurrent, spec.max_failures,
    )
    if track:
        mlflow = tracking.client()
        experiment_id = tracking.ensure_experiment(mlflow, spec.name)
        parent = tracking.start_run(mlflow, experiment_id, sweep_id)
        registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)
    return registry, sweep_id


def _execute(sweep_id, **kw):
    return execute_sweep(sweep_id, registry_url=settings.registry_url(), **kw)


def test_a_sweep_runs_every_cell_once_and_tracks_it(local_ray, home):
    """... with stages (DESIGN.md decision 10): each SP cell's fine-tune runs once, before it, and
    keeps its weights in the checkpoint store; a later sweep that needs it again reuses it."""
    from orchestrator.checkpoints import CheckpointStore

    registry, sweep_id = _submit(GRID)
    assert registry.sweep_dag(sweep_id) == {"upstream": 2, "dependants": 2}
    counts = _execute(sweep_id)
    assert counts == {"finished": 6}  # 4 cells + the 2 fine-tunes (one per seed) the SP cells start from
    assert registry.get_sweep(sweep_id)["status"] == "finished"
    results, gates = registry.sweep_runs(sweep_id), registry.sweep_map(sweep_id, "heads.gate")
    assert gates.values.shape == (6, 2, 4) and gates.has.sum() == 4  # finetune learns no gates
    assert all(run["attempts"] == 1 for run in map(registry.get_run, results["run_key"]))

    mlflow = tracking.client()
    sweep = registry.get_sweep(sweep_id)
    runs = mlflow.search_runs([sweep["mlflow_experiment_id"]])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep["mlflow_parent_run_id"]]
    assert len(children) == 6 and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["run_key"] for r in children} == set(results["run_key"])
    assert len({r.info.run_name for r in children}) == 6  # every child its own name
    # a cell's seeds share its `cell` tag (the name without the seed): one per group_key
    assert len({(r.data.tags["cell"], r.data.tags["group_key"]) for r in children}) == len(set(results["group_key"])) == 3
    gated = next(r for r in children if r.data.tags["method"] == "head_gates")
    assert {a.path for a in mlflow.list_artifacts(gated.info.run_id)} == {
        "maps.npz", "heads.gate.png"}

    every = [registry.get_run(k) for k in results["run_key"]]
    fine_tunes = [r for r in every if r["labels"]["method"] == "finetune"]
    dependants = [r for r in every if r["labels"]["method"] == "head_gates" and r["labels"]["pipeline"] == "sp"]
    assert len(fine_tunes) == len(dependants) == 2
    assert all(f["finished_at"] <= d["started_at"] for f in fine_tunes for d in dependants)  # before them
    assert all(CheckpointStore().exists(f["run_key"]) for f in fine_tunes)

    # the same grid again: nothing new, nothing rerun
    again, counts = registry.create_sweep("tsweep", "", expand(parse_grid(GRID)), {"cpus": 1}, 2, 1)
    assert counts["new"] == 0 and registry.unfinished(again) == []
    # an overlapping grid with one more SP cell: only that cell runs, from the fine-tune kept above
    more = {**GRID, "include": [{"seed": 0, "pipeline": "sp", "lambda": 0.5}]}
    _, second = _submit(more)
    assert _execute(second) == {"finished": 7}
    (new,) = [registry.get_run(k) for k in registry.sweep_runs(second)["run_key"] if k not in set(results["run_key"])]
    assert new["attempts"] == 1 and registry.get_config(new["run_key"])["head_gates"]["lambda"] == 0.5
    assert all(registry.get_run(f["run_key"])["attempts"] == 1 for f in fine_tunes)  # reused, not run again
    runs = mlflow.search_runs([registry.get_sweep(second)["mlflow_experiment_id"]])
    assert sum(r.data.tags.get("method") == "finetune" for r in runs) == 2  # one MLflow run of each


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_registry_and_mlflow_share_one_database(local_ray, home, monkeypatch, request, database):
    """HEADSWEEP_DB = HEADSWEEP_TRACKING_URI: both would make a table ``runs`` but for the registry's
    own namespace (``hs_``). MLflow opens the database first here, so its ``runs`` and
    ``alembic_version`` are there before the registry makes its tables."""
    import sqlalchemy as sa

    url = request.getfixturevalue("fresh_pg_database") if database == "postgresql" else f"sqlite:///{home / 'all.db'}"
    monkeypatch.setenv("HEADSWEEP_DB", url)
    monkeypatch.setenv("HEADSWEEP_TRACKING_URI", url)
    tracking.client().search_experiments()  # MLflow's tables first
    registry, sweep_id = _submit({**GRID, "axes": {"seed": [0, 1]}})
    assert _execute(sweep_id) == {"finished": 2}
    assert registry.sweep_counts(sweep_id) == {"finished": 2}
    sweep = registry.get_sweep(sweep_id)
    runs = tracking.client().search_runs([sweep["mlflow_experiment_id"]])
    children = {r.data.tags["run_key"] for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep["mlflow_parent_run_id"]}
    assert children == set(registry.sweep_runs(sweep_id)["run_key"]) and {r.info.status for r in runs} == {"FINISHED"}
    engine = sa.create_engine(url)
    assert {"runs", "alembic_version", "hs_runs", "hs_alembic_version"} <= set(sa.inspect(engine).get_table_names())
    engine.dispose()
    registry.close()


@pytest.mark.slow  # in CI (make test-slow); the default run has its points in the test above
def test_an_upstream_shared_by_cells_runs_once_before_them_and_is_reused(local_ray, home):
    """Stages (DESIGN.md decision 10): three SP cells start from one fine-tune; it runs once, first,
    keeps its weights in the checkpoint store, and a later sweep that needs it again reuses it."""
    from orchestrator.checkpoints import CheckpointStore

    grid = {**GRID, "axes": {"seed": [0], "pipeline": ["sp"], "lambda": [0.1, 0.5, 1.0]}}
    registry, sweep_id = _submit(grid)
    assert registry.sweep_dag(sweep_id) == {"upstream": 1, "dependants": 3}
    assert _execute(sweep_id) == {"finished": 4}
    every = [registry.get_run(k) for k in registry.sweep_runs(sweep_id)["run_key"]]
    (fine_tune,) = [r for r in every if r["labels"]["method"] == "finetune"]
    gated = [r for r in every if r["labels"]["method"] == "head_gates"]
    assert fine_tune["attempts"] == 1 and all(r["attempts"] == 1 for r in gated)
    assert all(fine_tune["finished_at"] <= r["started_at"] for r in gated)  # before its dependants
    assert CheckpointStore().exists(fine_tune["run_key"])
    mlflow = tracking.client()
    runs = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
    assert sum(r.data.tags.get("method") == "finetune" for r in runs) == 1  # one MLflow run of it

    more = {**grid, "axes": {**grid["axes"], "lambda": [0.1, 0.5, 1.0, 2.0]}}
    again, second = _submit(more)
    assert _execute(second) == {"finished": 5}
    assert registry.get_run(fine_tune["run_key"])["attempts"] == 1  # reused, not run again
    runs = mlflow.search_runs([registry.get_sweep(second)["mlflow_experiment_id"]])
    assert sum(r.data.tags.get("method") == "finetune" for r in runs) == 1


def _flaky(cfg, ctx) -> RunResult:
    if cfg.seed == 1 and cfg.method == "finetune":
        raise ValueError(f"seed {cfg.seed} is cursed")
    return real_run(cfg, ctx)


def test_a_failing_run_is_recorded_while_the_others_finish(local_ray, home):
    # one wave: the dp cells and seed 1's fine-tune (no sp cell of seed 0 to start a second one)
    grid = {**GRID, "axes": {"seed": [0, 1], "pipeline": ["dp"]}, "include": [{"seed": 1, "pipeline": "sp"}]}
    registry, sweep_id = _submit(grid)
    counts = _execute(sweep_id, run_fn=_flaky)
    # seed 1's fine-tune fails; its sp cell, which starts from it, is blocked (never run, the reason
    # kept), not failed; the others finish, seed 1's dp cell included
    assert counts == {"finished": 2, "failed": 1, "blocked": 1}
    assert registry.get_sweep(sweep_id)["status"] == "failed"
    every = [registry.get_run(k) for k in registry.sweep_runs(sweep_id)["run_key"]]
    (failed,) = [r for r in every if r["status"] == "failed"]
    (blocked,) = [r for r in every if r["status"] == "blocked"]
    assert failed["labels"]["method"] == "finetune" and failed["labels"]["seed"] == 1
    assert blocked["error"] == f"blocked: its init_from run {failed['run_key']} failed" and blocked["attempts"] == 0
    assert "seed 1 is cursed" in failed["error"] and "Traceback" in failed["error"]
    assert failed["attempts"] == 2  # max_failures=1: one retry
    assert {r["labels"]["seed"] for r in every if r["status"] == "finished"} == {0, 1}
    mlflow = tracking.client()
    assert mlflow.get_run(failed["mlflow_run_id"]).info.status == "FAILED"


def _killed_once(cfg, ctx, marker_dir) -> RunResult:
    """Kills its own worker process at step 4 on the first attempt (after the checkpoint at step 3)."""
    marker = os.path.join(marker_dir, f"killed-{cfg.run_key}")
    progress = ctx.on_progress

    def maybe_die(step, total, metrics):
        if step == 4 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        if progress:
            progress(step, total, metrics)

    ctx.on_progress = maybe_die
    return real_run(cfg, ctx)


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_a_killed_worker_is_retried_from_its_checkpoint(local_ray, home):
    grid = {**GRID, "axes": {"seed": [0]}}
    registry, sweep_id = _submit(grid, track=False)
    counts = _execute(sweep_id, run_fn=functools.partial(_killed_once, marker_dir=str(home)), track=False, checkpoint_every_s=0)
    assert counts == {"finished": 1}
    (run_key,) = registry.sweep_runs(sweep_id)["run_key"]
    assert registry.get_run(run_key)["attempts"] == 2
    (event,) = registry.events(sweep_id)  # status names it: "worker of run ... died at ..."
    assert event["kind"] == "worker_lost" and event["detail"]["run_key"] == run_key
    assert event["detail"]["attempt"] == 1 and event["detail"]["then"] == "retried"
    straight = real_run(expand(parse_grid(grid))[0])
    np.testing.assert_array_equal(registry.sweep_map(sweep_id, "heads.gate").values[0], straight.maps["heads.gate"].values)


def test_a_killed_worker_with_no_retry_left_fails_with_what_happened(local_ray, home):
    """max_failures 0: Tune does not retry the trial whose worker died. Its run must not stay RUNNING
    until the orphan reset and then pending forever (the sweep 'failed' with nothing failed): it
    fails with what happened, its MLflow run FAILED, and the sweep's history names the worker."""
    grid = {**GRID, "axes": {"seed": [0]}, "max_failures": 0}
    registry, sweep_id = _submit(grid)
    # no bound on the time taken (a loaded machine is slow): without the fix the run stayed RUNNING,
    # then pending forever, and the sweep never ended; with it, the error says what happened
    counts = _execute(sweep_id, run_fn=functools.partial(_killed_once, marker_dir=str(home)))
    assert counts == {"failed": 1}
    (failure,) = registry.failures(sweep_id)
    assert failure["attempts"] == 1 and "died during attempt 1" in failure["error"]
    assert "no retry left (max_failures 0)" in failure["error"]
    assert registry.get_sweep(sweep_id)["status"] == "failed"
    (event,) = registry.events(sweep_id)
    assert event["kind"] == "worker_lost" and event["detail"]["then"] == "failed"
    run = registry.get_run(failure["run_key"])
    mlflow_run = tracking.client().get_run(run["mlflow_run_id"])
    assert mlflow_run.info.status == "FAILED" and "died during attempt 1" in mlflow_run.data.tags["error"]


def _given_up_once(cfg, ctx, marker_dir, registry_url) -> RunResult:
    """First attempt: puts its own run back to pending (the orphan reset) and raises, so that with
    max_failures 0 Tune errors the trial while the run neither failed nor finished: what a lost node
    does when Tune sees its dead trial actor fail twice (it requeues the trial, then errors it,
    before the trial claimed its run). Later attempts run."""
    marker = os.path.join(marker_dir, f"given-up-{cfg.run_key}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        registry = Registry(registry_url)
        (sweep,) = registry.list_sweeps()
        assert [r["run_key"] for r in registry.reset_orphans(sweep["id"], stale_after_s=0)] == [cfg.run_key]
        raise RuntimeError("trial given up by Tune")
    return real_run(cfg, ctx)


def test_a_run_its_wave_left_pending_runs_in_another_wave(local_ray, home):
    grid = {**GRID, "axes": {"seed": [0]}, "max_failures": 0}
    registry, sweep_id = _submit(grid, track=False)
    counts = _execute(sweep_id, run_fn=functools.partial(_given_up_once, marker_dir=str(home),
                                                                registry_url=settings.registry_url()), track=False)
    assert counts == {"finished": 1}  # was {"pending": 1}: the driver never tried it again
    (run_key,) = registry.sweep_runs(sweep_id)["run_key"]
    assert registry.get_run(run_key)["attempts"] == 2
    assert registry.get_sweep(sweep_id)["status"] == "finished"


def _slow(cfg, ctx) -> RunResult:
    """Runs until cancelled; one not cancelled within 2 minutes of its start fails. Cancellation is
    seen within CANCEL_POLL_S (2 s) of the request, which comes as soon as a run is running: the
    2 minutes count from the run's own start, not Ray's, so a loaded machine does not race them."""
    for step in range(2400):
        ctx.progress(step, 2400, {"loss": 0.0, "open_heads": 8})  # raises RunCancelled when cancelled
        time.sleep(0.05)
    raise AssertionError("not cancelled")


def test_cancel_stops_running_trials_and_scheduling(local_ray, home):
    grid = {**GRID, "axes": {"seed": [0, 1, 2, 3, 4, 5]}}
    registry, sweep_id = _submit(grid)

    def cancel_when_running():
        deadline = time.time() + 300
        while time.time() < deadline and registry.sweep_counts(sweep_id).get("running", 0) == 0:
            time.sleep(0.2)
        registry.cancel_sweep(sweep_id)

    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    counts = _execute(sweep_id, run_fn=_slow)
    canceller.join()
    assert counts == {"cancelled": 6}  # a run that missed the cancellation would have failed
    assert registry.get_sweep(sweep_id)["status"] == "cancelled"
    mlflow = tracking.client()
    runs = mlflow.search_runs([registry.get_sweep(sweep_id)["mlflow_experiment_id"]])
    assert "RUNNING" not in {r.info.status for r in runs}


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_orphans_are_reconciled_and_rerun(local_ray, home):
    registry, sweep_id = _submit(GRID)
    keys = registry.unfinished(sweep_id)
    # a driver crashed while these two ran: rows left RUNNING, MLflow runs left RUNNING
    mlflow = tracking.client()
    sweep = registry.get_sweep(sweep_id)
    for key in keys[:2]:
        registry.claim(key, "dead-trial@host:1")
        run_id = tracking.start_run(mlflow, sweep["mlflow_experiment_id"], key, parent_run_id=sweep["mlflow_parent_run_id"])
        registry.set_mlflow_run(key, run_id)
    counts = _execute(sweep_id, stale_after_s=0)
    assert counts == {"finished": 6}
    for key in keys[:2]:
        run = registry.get_run(key)
        assert run["attempts"] == 2
        assert mlflow.get_run(run["mlflow_run_id"]).info.status == "FINISHED"  # the orphan's run, reused
