"""The registry against real SQLite files and a real PostgreSQL (one fresh schema per test).

Lifecycle, sweeps, the read model (run columns, maps by name), and migrations (including
a registry made at revision 0001, with gates/scores columns, upgraded to unit maps).

PostgreSQL: the session's server (tests/conftest.py's ``pg_url``: a private one, or
``HEADSWEEP_TEST_PG_URL``'s); when it cannot start, the PostgreSQL cases fail rather than skip.
"""

from __future__ import annotations

import multiprocessing
import pickle
import sqlite3
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from base.result import UnitMap
from experiments.harness.config import parse_config
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import ORPHAN_ERROR, NotFound, Registry, RunStatus, read_model, upgrade
from orchestrator.registry import db as registry_db
from orchestrator.registry.schema import VERSION_TABLE, Base

ROOT = Path(__file__).resolve().parents[2]
GATES = np.arange(72, dtype=np.float32).reshape(6, 12) / 72


def _maps(gates=GATES, scores=None, **more):
    """{"heads.gate": gates, "heads.log_alpha": scores, ...} as UnitMaps (scores only if given)."""
    maps = {"heads.gate": UnitMap(gates, "heads", "gate")}
    if scores is not None:
        maps["heads.log_alpha"] = UnitMap(scores, "heads", "log_alpha")
    return maps | {name.replace("__", "."): UnitMap(v, name.split("__")[0], name) for name, v in more.items()}


def _configs(seeds=(0, 1, 2), tasks=("synthetic-cls", "synthetic-tag")):
    return expand(parse_grid({"name": "t", "axes": {"seed": list(seeds), "task": list(tasks)}}))


def _submit(registry, configs, **flags):
    return registry.create_sweep("t", "name: t\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1, **flags)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    """A URL to an empty database: a SQLite file, or a fresh PostgreSQL schema dropped after."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    pg_url = request.getfixturevalue("pg_url")
    schema = f"hs_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url)
    with admin.begin() as connection:  # fails (not skips) when PostgreSQL is unreachable
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield sa.make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def registry(registry_url):
    with Registry(registry_url) as opened:
        yield opened


def _sql(url: str, statement: str, **params):
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            result = connection.execute(sa.text(statement), params)
            return result.all() if result.returns_rows else result.rowcount
    finally:
        engine.dispose()


def _age_heartbeat(url: str, run_key: str, seconds: float) -> None:
    then = registry_db.now() - timedelta(seconds=seconds)
    _sql(url, "UPDATE hs_runs SET heartbeat_at = :t WHERE run_key = :k", t=then, k=run_key)


# --------------------------------------------------------------------------- submit


def test_same_grid_twice_adds_no_runs(registry, registry_url):
    configs = _configs()
    first, counts = _submit(registry, configs)
    assert counts == {"total": 6, "new": 6, "finished": 0, "requeued": 0, "other": 0}
    second, counts = _submit(registry, configs)
    assert counts == {"total": 6, "new": 0, "finished": 0, "requeued": 0, "other": 6}
    assert first != second
    assert _sql(registry_url, "SELECT count(*) FROM hs_runs") == [(6,)]
    assert _sql(registry_url, "SELECT count(*) FROM hs_sweep_runs") == [(12,)]


def test_overlapping_grid_adds_only_new_cells(registry):
    _submit(registry, _configs(seeds=(0, 1, 2)))
    sweep_id, counts = _submit(registry, _configs(seeds=(1, 2, 3, 4)))
    assert counts["total"] == 8 and counts["new"] == 4 and counts["other"] == 4
    assert sum(registry.sweep_counts(sweep_id).values()) == 8


def test_configs_may_be_an_iterator(registry):
    configs = _configs()
    _, counts = _submit(registry, iter(configs))
    assert counts["new"] == 6
    assert registry.plan(iter(configs)) == {"total": 6, "new": 0, "finished": 0, "other": 6, "dag": NO_DAG}


def test_plan_writes_nothing(registry, registry_url):
    configs = _configs()
    assert registry.plan(configs) == {"total": 6, "new": 6, "finished": 0, "other": 0, "dag": NO_DAG}
    assert _sql(registry_url, "SELECT count(*) FROM hs_runs") == [(0,)]
    _submit(registry, configs[:4])
    key = configs[0].run_key
    registry.claim(key, "w")
    registry.finish(key, {}, maps=_maps())
    assert registry.plan(configs + configs) == {"total": 6, "new": 2, "finished": 1, "other": 3, "dag": NO_DAG}


def test_finished_runs_are_never_rerun_without_force(registry, registry_url):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    assert registry.claim(key, "w:1") is not None
    registry.set_mlflow_run(key, "mlflow-1")
    assert registry.finish(key, {"accuracy": 0.75}, maps=_maps(scores=-GATES))

    sweep_id, counts = _submit(registry, configs, rerun_failed=True)
    assert counts["finished"] == 1 and counts["requeued"] == 0
    assert registry.get_run(key)["status"] == "finished"
    assert registry.claim(key, "w:2") is None
    assert key not in registry.unfinished(sweep_id)

    _, counts = _submit(registry, configs, force=True)
    assert counts["requeued"] == 1 and counts["finished"] == 0
    run = registry.get_run(key)
    assert (run["status"], run["attempts"], run["metrics"], run["mlflow_run_id"]) == ("pending", 0, None, None)
    assert registry.sweep_map(sweep_id, "heads.gate").has.sum() == 0
    assert registry.sweep_map_names(sweep_id) == []  # its maps went with its result
    assert _sql(registry_url, "SELECT count(*) FROM hs_run_maps") == [(0,)]


def test_rerun_failed_requeues_failed_and_cancelled(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    failed, cancelled_sweep_key = configs[0].run_key, configs[1].run_key
    registry.claim(failed, "w")
    registry.set_mlflow_run(failed, "mlflow-f")
    assert registry.fail(failed, "Traceback ...\nValueError: boom")
    registry.cancel_sweep(sweep_id)
    assert registry.get_run(cancelled_sweep_key)["status"] == "cancelled"

    _, counts = _submit(registry, configs)
    assert counts["requeued"] == 0 and counts["other"] == 6
    assert registry.get_run(failed)["status"] == "failed"

    _, counts = _submit(registry, configs, rerun_failed=True)
    assert counts["requeued"] == 6
    run = registry.get_run(failed)
    assert (run["status"], run["attempts"], run["mlflow_run_id"]) == ("pending", 0, "mlflow-f")
    assert run["error"].endswith("ValueError: boom")  # kept until the next attempt finishes


# --------------------------------------------------------------------------- claim / finish


def test_claim_finish_and_retry_reuse_the_mlflow_run(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    claimed = registry.claim(key, "host:1")
    assert claimed == {"run_key": key, "config": configs[0].to_dict(), "mlflow_run_id": None, "attempts": 1,
                       "upstreams": {}, "has_dependants": False}
    assert registry.get_config(key) == configs[0].to_dict()
    registry.set_mlflow_run(key, "mlflow-1")
    assert registry.fail(key, "boom")
    again = registry.claim(key, "host:2")
    assert again["attempts"] == 2 and again["mlflow_run_id"] == "mlflow-1"
    assert registry.heartbeat(key)
    assert registry.finish(key, {"accuracy": np.float64(0.5), "loss": float("nan")}, maps=_maps(scores=GATES * 2))
    run = registry.get_run(key)
    assert run["status"] == RunStatus.FINISHED and run["error"] is None and run["worker"] == "host:2"
    assert run["metrics"] == {"accuracy": 0.5, "loss": None} and run["labels"]["lambda"] == 0.01
    # every label stored whole, once; unset ones left out
    assert run["labels"] == {name: v for name, v in configs[0].labels().items() if v is not None}
    assert "sparsity" not in run["labels"] and configs[0].labels()["sparsity"] is None


def test_finish_twice_is_impossible(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    assert not registry.finish(key, {}, maps=_maps())  # pending: not running
    registry.claim(key, "w")
    assert registry.finish(key, {"accuracy": 1.0}, maps=_maps())
    assert not registry.finish(key, {"accuracy": 0.0}, maps=_maps(GATES * 0))
    assert not registry.fail(key, "late")
    assert not registry.heartbeat(key)
    assert registry.get_run(key)["metrics"] == {"accuracy": 1.0}
    sweep_id = registry.list_sweeps()[0]["id"]
    np.testing.assert_array_equal(registry.sweep_map(sweep_id, "heads.gate").values[0], GATES)  # not the late zeros


def test_a_stale_worker_cannot_finish_a_reclaimed_run(registry, registry_url):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    registry.claim(key, "old:1")
    assert registry.claim(key, "new:2") is None  # held by a live worker
    _age_heartbeat(registry_url, key, 3600)
    assert registry.claim(key, "new:2")["attempts"] == 2
    assert not registry.heartbeat(key, worker="old:1")
    assert not registry.finish(key, {}, maps=_maps(), worker="old:1")
    assert registry.finish(key, {}, maps=_maps(), worker="new:2")


def test_claim_of_a_running_run_with_zero_staleness(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    registry.claim(key, "a")
    assert registry.claim(key, "b", stale_after_s=0)["attempts"] == 2  # a Ray retry of its own trial


def test_finish_checks_every_map_before_writing(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    registry.claim(key, "w")
    with pytest.raises(ValueError, match="'heads.gate' must be \\(layers, units\\)"):
        registry.finish(key, {}, maps={"heads.gate": np.zeros(72)})
    with pytest.raises(ValueError, match="name must start with a unit kind"):
        registry.finish(key, {}, maps={"gate": GATES})
    with pytest.raises(ValueError, match="'neurons.gate' is a heads map"):
        registry.finish(key, {}, maps={"neurons.gate": UnitMap(GATES, "heads", "x")})
    assert registry.get_run(key)["status"] == RunStatus.RUNNING


def _claim_all(url: str, keys: list[str], worker: str, barrier) -> list[str]:
    """In a spawned process: open the registry, wait for the others, claim and finish every key."""
    registry = Registry(url)
    barrier.wait()
    won = []
    for key in keys:
        if registry.claim(key, worker) is not None:
            won.append(key)
            assert registry.finish(key, {"worker": worker}, maps=_maps(), worker=worker)
        assert not registry.finish(key, {}, maps=_maps(), worker=worker)  # done, or another worker's
    registry.close()
    return won


def test_claim_is_exclusive_across_processes(registry, registry_url, monkeypatch):
    configs = _configs(seeds=range(10))
    sweep_id, _ = _submit(registry, configs)
    keys = [c.run_key for c in configs]
    monkeypatch.syspath_prepend(str(ROOT))  # spawned children import this module by name
    context = multiprocessing.get_context("spawn")
    processes = 3
    with context.Manager() as manager, context.Pool(processes) as pool:
        barrier = manager.Barrier(processes)
        jobs = [(registry_url, keys[::step], f"p{i}", barrier) for i, step in enumerate((1, -1, 1))]
        results = pool.starmap_async(_claim_all, jobs).get(timeout=120)
    winners = [key for won in results for key in won]
    assert sorted(winners) == sorted(keys)  # every run claimed exactly once
    assert registry.sweep_counts(sweep_id)["finished"] == 20


def test_claim_is_exclusive_across_threads(registry_url, registry):
    configs = _configs(seeds=range(5))
    _submit(registry, configs)
    keys = [c.run_key for c in configs]
    barrier = threading.Barrier(4)
    won: list[list[str]] = [[] for _ in range(4)]

    def race(i: int) -> None:
        with Registry(registry_url) as mine:
            barrier.wait()
            won[i] = [key for key in keys if mine.claim(key, f"t{i}") is not None]

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(key for keys_won in won for key in keys_won) == sorted(keys)


# --------------------------------------------------------------------------- cancel, orphans


def test_cancel_sweep(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    running = configs[0].run_key
    registry.claim(running, "w:9")
    registry.set_mlflow_run(running, "mlflow-9")
    assert not registry.cancel_requested(sweep_id)
    assert registry.cancel_sweep(sweep_id) == [{"run_key": running, "worker": "w:9", "mlflow_run_id": "mlflow-9"}]
    assert registry.cancel_requested(sweep_id)
    assert registry.sweep_counts(sweep_id) == {"running": 1, "cancelled": 5}  # statuses present only
    assert registry.claim(configs[1].run_key, "w") is None
    assert registry.unfinished(sweep_id) == [running]


def test_cancel_keeps_runs_another_live_sweep_wants(registry):
    configs = _configs()
    first, _ = _submit(registry, configs[:4])
    _submit(registry, configs[2:])
    registry.cancel_sweep(first)
    statuses = [registry.get_run(c.run_key)["status"] for c in configs]
    assert statuses == ["cancelled", "cancelled", "pending", "pending", "pending", "pending"]


def test_cancel_run(registry):
    configs = _configs()
    _submit(registry, configs)
    running, pending = configs[0].run_key, configs[1].run_key
    registry.claim(running, "w:1")
    assert not registry.cancel_run(running, worker="w:2")  # someone else's
    assert registry.cancel_run(running, worker="w:1")
    assert not registry.cancel_run(pending, worker="w:1")  # with a worker: only its running run
    assert registry.cancel_run(pending)
    assert not registry.cancel_run(pending)
    assert [registry.get_run(k)["status"] for k in (running, pending)] == ["cancelled", "cancelled"]
    assert registry.claim(running, "w:3") is None


def test_failures_and_eta(registry, registry_url):
    configs = _configs(seeds=range(5))
    sweep_id, _ = _submit(registry, configs)
    keys = [c.run_key for c in configs]
    assert registry.eta_seconds(sweep_id) is None
    registry.claim(keys[3], "w")
    registry.fail(keys[3], "Traceback\nValueError: three")
    registry.claim(keys[1], "w")
    registry.fail(keys[1], "Traceback\nValueError: one")
    assert [(f["run_key"], f["attempts"], f["error"].splitlines()[-1]) for f in registry.failures(sweep_id)] == [
        (keys[1], 1, "ValueError: one"), (keys[3], 1, "ValueError: three")
    ]
    for key in keys[4:6]:
        registry.claim(key, "w")
        registry.finish(key, {}, maps=_maps())
    # two runs took 10 s in all: 6 pending -> about 30 s left
    sweep = registry.get_sweep(sweep_id)
    _sql(registry_url, "UPDATE hs_runs SET started_at = :s, finished_at = :f WHERE status = 'finished'",
         s=sweep["created_at"], f=sweep["created_at"] + timedelta(seconds=10))
    assert registry.sweep_counts(sweep_id)["pending"] == 6
    assert registry.eta_seconds(sweep_id) == pytest.approx(30.0)
    with pytest.raises(NotFound):
        registry.eta_seconds("sw-nope")


def test_orphans_are_listed_and_reset(registry, registry_url):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    alive, dead = configs[0].run_key, configs[1].run_key
    registry.claim(alive, "w:1")
    registry.claim(dead, "w:2")
    registry.set_mlflow_run(dead, "mlflow-dead")
    _age_heartbeat(registry_url, dead, 600)
    assert [o["run_key"] for o in registry.orphans(sweep_id, stale_after_s=60)] == [dead]
    assert registry.reset_orphans(sweep_id, stale_after_s=60) == [
        {"run_key": dead, "mlflow_run_id": "mlflow-dead", "worker": "w:2"}]  # the worker that held it: where it ran
    run = registry.get_run(dead)
    assert (run["status"], run["error"], run["worker"]) == ("pending", ORPHAN_ERROR, None)
    assert registry.get_run(alive)["status"] == "running"
    assert registry.orphans(sweep_id, stale_after_s=60) == []
    assert registry.claim(dead, "w:3") == {
        "run_key": dead, "config": configs[1].to_dict(), "mlflow_run_id": "mlflow-dead", "attempts": 2,
        "upstreams": {}, "has_dependants": False,
    }


# --------------------------------------------------------------------------- sweeps


def test_sweep_fields_listing_and_lookups(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    registry.set_sweep(sweep_id, status="running", driver="raysubmit_1", mlflow_experiment_id="7",
                       mlflow_parent_run_id="p")
    sweep = registry.get_sweep(sweep_id)
    assert sweep["status"] == "running" and sweep["driver"] == "raysubmit_1" and sweep["grid"] == "name: t\n"
    assert sweep["resources"] == {"cpus": 1.0, "gpus": 0.0} and sweep["max_failures"] == 1
    assert sweep["counts"]["pending"] == 6 and not sweep["cancel_requested"]
    assert sweep["updated_at"] >= sweep["created_at"]
    second, _ = _submit(registry, configs[:2])
    listed = registry.list_sweeps()
    assert {s["id"] for s in listed} == {sweep_id, second}
    assert {s["id"]: s["counts"]["pending"] for s in listed} == {sweep_id: 6, second: 2}
    assert "grid" not in listed[0]
    assert registry.unfinished(sweep_id) == [c.run_key for c in configs]
    with pytest.raises(ValueError, match="unknown field"):
        registry.set_sweep(sweep_id, colour="red")
    with pytest.raises(ValueError, match="status"):
        registry.set_sweep(sweep_id, status="done")
    for call in (lambda: registry.get_sweep("sw-nope"), lambda: registry.set_sweep("sw-nope", driver="x"),
                 lambda: registry.get_config("nope"), lambda: registry.sweep_runs("sw-nope"),
                 lambda: registry.cancel_sweep("sw-nope")):
        with pytest.raises(NotFound):
            call()


# --------------------------------------------------------------------------- results


def _statements(registry, fn):
    """(fn(), the SQL statements it ran on the registry's engine, BEGIN/COMMIT left out).

    On PostgreSQL the map blobs are fetched on a binary driver cursor, which SQLAlchemy's
    events do not see: those fetches are recorded by wrapping ``_fetch_blobs``."""
    statements = []

    def record(_conn, _cursor, statement, *_):
        if statement.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            statements.append(statement)

    fetch = read_model._fetch_blobs

    def fetch_recorded(connection, query):
        if connection.dialect.name == "postgresql":
            statements.append(str(query))
        return fetch(connection, query)

    sa.event.listen(registry._engine, "before_cursor_execute", record)
    read_model._fetch_blobs = fetch_recorded
    try:
        return fn(), statements
    finally:
        read_model._fetch_blobs = fetch
        sa.event.remove(registry._engine, "before_cursor_execute", record)


def _mixed_sweep(registry):
    """5 runs: head maps of two model sizes, a neuron map on one run, a failed and a pending run."""
    configs = expand(parse_grid({
        "name": "t", "axes": {"seed": [0, 1], "lambda": [0.1, 0.2]},
        "include": [{"seed": 9, "model": "tiny-bert", "sparsity": 0.5}],
    }))
    sweep_id, _ = _submit(registry, configs)
    keys = [c.run_key for c in configs]
    neurons = np.linspace(0, 1, 6 * 1536, dtype=np.float32).reshape(6, 1536)
    for i, maps in ((0, _maps(scores=-GATES, neurons__predictivity=neurons)), (3, _maps(GATES + 3)),
                    (4, _maps(np.ones((2, 4))))):  # run 4: a smaller model
        registry.claim(keys[i], "w")
        registry.finish(keys[i], {"accuracy": i / 10}, maps=maps)
    registry.claim(keys[1], "w")
    registry.fail(keys[1], "boom")
    return sweep_id, configs, neurons


def test_sweep_runs_is_one_query_in_cell_order(registry):
    sweep_id, configs, _ = _mixed_sweep(registry)
    keys = [c.run_key for c in configs]
    runs, statements = _statements(registry, lambda: registry.sweep_runs(sweep_id))
    assert len(statements) == 2  # the runs, and the maps with which run has which (same transaction)
    assert list(runs["run_key"]) == keys
    assert list(runs["status"]) == ["finished", "failed", "pending", "finished", "finished"]
    labels = runs["labels"]  # every label of each run, from the one stored place; unset ones left out
    assert labels == [{name: v for name, v in c.labels().items() if v is not None} for c in configs]
    assert [found["seed"] for found in labels] == [0, 0, 1, 1, 9]
    assert [found["lambda"] for found in labels] == [0.1, 0.2, 0.1, 0.2, 0.01]
    assert ["sparsity" in found for found in labels] == [False] * 4 + [True] and labels[4]["sparsity"] == 0.5
    assert [found["model"] for found in labels] == ["minilm-l6"] * 4 + ["tiny-bert"]
    assert {found["task"] for found in labels} == {"synthetic-cls"}
    assert list(runs["group_key"]) == [c.group_key for c in configs]
    assert runs["metrics"] == [{"accuracy": 0.0}, {}, {}, {"accuracy": 0.3}, {"accuracy": 0.4}]
    assert runs["config"] == [c.to_dict() for c in configs]
    assert runs["updated_at"] == max(registry.get_run(k)["updated_at"] for k in keys)
    assert [(m.name, m.kind, m.count, m.rows, m.cols) for m in runs["maps"]] == [
        ("heads.gate", "heads", 3, 6, 12), ("heads.log_alpha", "heads", 1, 6, 12),
        ("neurons.predictivity", "neurons", 1, 6, 1536)]
    assert registry.sweep_map_names(sweep_id) == runs["maps"]
    assert runs["run_maps"] == [("heads.gate", "heads.log_alpha", "neurons.predictivity"), (), (),
                                ("heads.gate",), ("heads.gate",)]


def test_each_map_is_one_query_with_nan_rows_and_padding(registry):
    sweep_id, _, neurons = _mixed_sweep(registry)
    gate, statements = _statements(registry, lambda: registry.sweep_map(sweep_id, "heads.gate"))
    assert len(statements) == 1
    assert gate.kind == "heads" and gate.values.shape == (5, 6, 12) and gate.values.dtype == np.float32
    assert gate.has.tolist() == [True, False, False, True, True]
    np.testing.assert_array_equal(gate.values[3], GATES + 3)
    assert np.isnan(gate.values[1:3]).all()
    assert (gate.values[4, :2, :4] == 1).all() and np.isnan(gate.values[4, 2:]).all()  # padded
    assert np.isnan(gate.values[4, :, 4:]).all()

    neuron = registry.sweep_map(sweep_id, "neurons.predictivity")
    assert neuron.kind == "neurons" and neuron.values.shape == (5, 6, 1536)
    assert neuron.has.tolist() == [True, False, False, False, False]
    np.testing.assert_array_equal(neuron.values[0], neurons)
    absent = registry.sweep_map(sweep_id, "heads.importance")
    assert absent.values.shape == (5, 0, 0) and not absent.has.any() and absent.kind == ""

    with pytest.raises(NotFound):
        registry.sweep_map("sw-nope", "heads.gate")
    with pytest.raises(NotFound):
        registry.sweep_map_names("sw-nope")


def test_maps_are_stored_compressed_one_row_per_run_and_name(registry, registry_url):
    sweep_id, configs, _ = _mixed_sweep(registry)
    rows = _sql(registry_url, "SELECT run_key, name, kind, rows, cols, length(data) FROM hs_run_maps "
                "ORDER BY run_key, name")
    assert len(rows) == 5 and {(name, kind) for _, name, kind, *_ in rows} == {
        ("heads.gate", "heads"), ("heads.log_alpha", "heads"), ("neurons.predictivity", "neurons")}
    small = [(r, c, size) for key, name, _, r, c, size in rows if key == configs[4].run_key]
    assert len(small) == 1 and small[0][:2] == (2, 4) and small[0][2] < 32  # 2 x 4 ones: 32 bytes raw


def test_maps_with_one_size_stack_exactly(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    for i, cfg in enumerate(configs):
        registry.claim(cfg.run_key, "w")
        registry.finish(cfg.run_key, {}, maps=_maps(GATES * i))
    gate = registry.sweep_map(sweep_id, "heads.gate")
    np.testing.assert_array_equal(gate.values, np.stack([GATES * i for i in range(6)]))
    assert gate.has.all()


def test_sweep_version_changes_with_every_run_write(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    first = registry.sweep_version(sweep_id)
    assert first[1] == 6
    time.sleep(0.002)
    registry.claim(configs[0].run_key, "w")
    claimed = registry.sweep_version(sweep_id)
    assert claimed[0] > first[0]
    time.sleep(0.002)
    registry.finish(configs[0].run_key, {}, maps=_maps())
    assert registry.sweep_version(sweep_id)[0] > claimed[0]
    assert registry.sweep_version("sw-nope") == (None, 0)


# --------------------------------------------------------------------------- engine, migrations


def test_sqlite_settings(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    registry = Registry(url)
    with registry._engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 20000
    registry.close()


def test_other_backends_are_refused():
    with pytest.raises(ValueError, match="SQLite or PostgreSQL"):
        Registry("mysql://localhost/db")


@pytest.mark.postgres
def test_plain_postgresql_urls_use_psycopg(pg_url):
    engine = registry_db.make_engine(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    assert engine.dialect.driver == "psycopg"
    engine.dispose()


def test_registry_pickles_by_url(registry, registry_url):
    clone = pickle.loads(pickle.dumps(registry))
    assert clone.url == registry_url
    clone.close()


def test_upgrade_keeps_existing_rows(registry_url):
    engine = sa.create_engine(registry_url)
    upgrade(engine, "0001")
    engine.dispose()
    with Registry(registry_url) as registry:
        sweep_id, _ = _submit(registry, _configs())
    with Registry(registry_url) as registry:  # opening again runs `upgrade head` again
        assert registry.sweep_counts(sweep_id)["pending"] == 6
    head = registry_db.head_revision()
    assert _sql(registry_url, "SELECT version_num FROM hs_alembic_version") == [(head,)]


NO_DAG = {"upstream": 0, "dependants": 0, "upstream_methods": {}}

OLD_CONFIG = {  # a run config as revision 0001 stored it (gates section, every default)
    "model": "minilm-l6", "seed": 0, "method": "head_gates", "pipeline": "dp", "sparsity": None,
    "task": {"name": "synthetic-cls", "num_train": 2000}, "gates": {"lambda": 0.01, "lr": 0.1},
    "train": {"lr": 5e-05, "max_steps": 10},
}


def _registry_at_0001(url: str) -> tuple[str, list[str]]:
    """A registry as the code before unit maps left it: sweep, 4 runs (finished with gates and
    scores, finished with gates only, running, a finetune run finished with its invented all-ones
    gates), rows written with that revision's columns."""
    engine = sa.create_engine(url)
    upgrade(engine, "0001")
    tables = sa.MetaData()
    tables.reflect(engine, only=("sweeps", "runs", "sweep_runs"))
    when = registry_db.now()
    keys = [f"{i:064x}" for i in range(4)]
    runs = []
    for i, key in enumerate(keys[:3]):
        finished = i < 2
        runs.append({
            "run_key": key, "group_key": "g" * 64, "config": OLD_CONFIG | {"seed": i}, "task": "synthetic-cls",
            "model": "minilm-l6", "method": "head_gates", "pipeline": "dp", "seed": i, "sparsity": None,
            "lambda": 0.01, "status": "finished" if finished else "running", "attempts": 1, "created_at": when,
            "updated_at": when, "metrics": {"accuracy": 0.5 + i / 10} if finished else None,
            "gates": (GATES * (i + 1)).tobytes() if finished else None,
            "gates_shape": [6, 12] if finished else None, "scores": (-GATES).tobytes() if i == 0 else None,
        })
    runs.append({  # 0001's finetune reported all-ones gates and carried the gates section too
        "run_key": keys[3], "group_key": "f" * 64, "config": OLD_CONFIG | {"method": "finetune", "pipeline": "none"},
        "task": "synthetic-cls", "model": "minilm-l6", "method": "finetune", "pipeline": "none", "seed": 0,
        "sparsity": None, "lambda": 0.01, "status": "finished", "attempts": 1, "created_at": when,
        "updated_at": when, "metrics": {"accuracy": 0.8}, "gates": np.ones((6, 12), np.float32).tobytes(),
        "gates_shape": [6, 12], "scores": None,
    })
    with engine.begin() as connection:
        connection.execute(tables.tables["sweeps"].insert(), [{
            "id": "sw-old", "name": "old", "grid": "name: old\n", "created_at": when, "updated_at": when,
            "resources": {"cpus": 1.0}, "max_concurrent": None, "max_failures": 1, "cancel_requested": False,
            "status": "running"}])
        connection.execute(tables.tables["runs"].insert(), runs)
        connection.execute(tables.tables["sweep_runs"].insert(),
                           [{"sweep_id": "sw-old", "run_key": key, "position": i} for i, key in enumerate(keys)])
    engine.dispose()
    return "sw-old", keys


def test_a_registry_at_0001_upgrades_and_its_sweep_still_loads(registry_url):
    from analysis.data.loading import clear_cache, load_sweep

    sweep_id, keys = _registry_at_0001(registry_url)
    with Registry(registry_url) as registry:  # opening upgrades to head: gates/scores -> run_maps
        assert _sql(registry_url, "SELECT version_num FROM hs_alembic_version") == [(registry_db.head_revision(),)]
        assert registry.sweep_counts(sweep_id) == {"finished": 3, "running": 1}
        assert [(m.name, m.count) for m in registry.sweep_map_names(sweep_id)] == [
            ("heads.gate", 2), ("heads.log_alpha", 1)]  # the finetune run's invented gates are gone
        clear_cache()
        data = load_sweep(registry, sweep_id)
        assert data.has_gates.tolist() == [True, True, False, False]
        np.testing.assert_array_equal(data.gates[:2], np.stack([GATES, GATES * 2]))
        np.testing.assert_array_equal(data.map("heads.log_alpha")[0][0], -GATES)
        assert data.metrics["accuracy"][:2].tolist() == [0.5, 0.6]
        # stored configs take today's shape, so a pending run of an old sweep still parses and resumes
        assert data.config["head_gates.lambda"][:3].tolist() == [0.01] * 3 and "gates.lambda" not in data.config
        assert parse_config(registry.get_config(keys[2]), check_files=False).section.lambda_ == 0.01
        assert parse_config(registry.get_config(keys[3]), check_files=False).method == "finetune"
        # the upgraded registry keeps working: the running run finishes with a map of any kind
        neurons = np.ones((6, 1536), dtype=np.float32)
        assert registry.finish(keys[2], {"accuracy": 0.9}, maps=_maps(neurons__predictivity=neurons))
        assert registry.sweep_map(sweep_id, "neurons.predictivity").has.tolist() == [False, False, True, False]
    assert _schema_diff(registry_url) == []  # the rebuilt runs table (SQLite) included: no gates, lambda nullable
    clear_cache()


def test_downgrade_to_0001_puts_the_head_maps_back(registry_url):
    _registry_at_0001(registry_url)
    Registry(registry_url).close()
    engine = registry_db.make_engine(registry_url)
    registry_db.downgrade(engine, "0001")
    engine.dispose()
    rows = _sql(registry_url, "SELECT gates, gates_shape, scores FROM runs ORDER BY run_key")
    assert bytes(rows[1][0]) == (GATES * 2).tobytes() and rows[0][2] is not None and rows[1][2] is None
    assert rows[2] == (None, None, None) and rows[3] == (None, None, None)


def _schema_diff(url: str) -> list:
    """What alembic's autogenerate would change to make the database match the models."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = sa.create_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True, "version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return diff


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


HS_TABLES = {"hs_alembic_version", "hs_sweeps", "hs_runs", "hs_sweep_runs", "hs_run_maps", "hs_run_deps",
             "hs_sweep_events"}


def test_models_and_migrations_agree(registry_url):
    """A new registry gets today's tables from the models at once; one made at revision 0001 and taken
    through every revision since gets the same tables, constraints and indexes."""
    Registry(registry_url).close()
    assert _tables(registry_url) == HS_TABLES and _schema_diff(registry_url) == []
    registry_db.downgrade(registry_db.make_engine(registry_url), "0001")  # every revision down ...
    assert _tables(registry_url) == {"alembic_version", "sweeps", "runs", "sweep_runs"}
    Registry(registry_url).close()  # ... and up again
    assert _tables(registry_url) == HS_TABLES and _schema_diff(registry_url) == []


def test_a_registry_from_before_the_prefix_moves_into_it_and_back(registry_url):
    """Revision 0006 on a registry with rows in every table: down at 0005 its tables are unprefixed
    and its revision in ``alembic_version`` (as older code keeps them); opened again, it is upgraded
    in place (rows, foreign keys and indexes renamed) and reads back the same."""
    configs = expand(parse_grid({"name": "t", "axes": {"seed": [0, 1], "pipeline": ["dp", "sp"]}}))
    with Registry(registry_url) as registry:
        sweep_id, _ = _submit(registry, configs)
        key = registry.unfinished(sweep_id)[0]
        registry.claim(key, "w")
        registry.finish(key, {"accuracy": 0.5}, maps=_maps())
        registry.add_event(sweep_id, "resumed", {"driver": "d1", "auto": False})

        def read(registry):
            stack = registry.sweep_map(sweep_id, "heads.gate")
            return (registry.get_sweep(sweep_id), registry.sweep_counts(sweep_id), registry.sweep_dag(sweep_id),
                    registry.events(sweep_id), registry.get_run(key), stack.has.tolist(), stack.values[stack.has])

        before = read(registry)
    assert before[2] == {"upstream": 2, "dependants": 2} and before[3] and before[5].count(True) == 1
    engine = registry_db.make_engine(registry_url)
    registry_db.downgrade(engine, "0005")
    assert _tables(registry_url) == {"alembic_version", "sweeps", "runs", "sweep_runs", "run_maps", "run_deps",
                                     "sweep_events"}
    assert _sql(registry_url, "SELECT version_num FROM alembic_version") == [("0005",)]
    assert _sql(registry_url, "SELECT count(*) FROM runs") == [(6,)]
    engine.dispose()
    with Registry(registry_url) as registry:  # opening upgrades to head
        after = read(registry)
        # every label but ``data`` (the run's data source, newer than the labels column): down at 0005 a
        # run keeps the labels its columns held (migration 0007)
        kept = dict(before[4], labels={k: v for k, v in before[4]["labels"].items() if k != "data"})
        assert "data" in before[4]["labels"] and after[:4] == before[:4] and after[4] == kept and after[5] == before[5]
        np.testing.assert_array_equal(after[-1], before[-1])
    engine = registry_db.make_engine(registry_url)  # foreign keys on, as the registry has them
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:  # the renamed ones still hold
        connection.execute(sa.text("INSERT INTO hs_run_maps (run_key, name, kind, rows, cols, data)"
                                   " VALUES ('no-such-run', 'x', 'heads', 1, 1, :d)"), {"d": b""})
    engine.dispose()
    assert _tables(registry_url) == HS_TABLES and _schema_diff(registry_url) == []
    assert _sql(registry_url, "SELECT version_num FROM hs_alembic_version") == [(registry_db.head_revision(),)]


def test_concurrent_opens_migrate_once(registry_url):
    errors: list[BaseException] = []

    def open_registry() -> None:
        try:
            Registry(registry_url).close()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=open_registry) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(_sql(registry_url, "SELECT version_num FROM hs_alembic_version")) == 1


def test_sqlite_writer_waits_for_a_held_lock(tmp_path):
    path = tmp_path / "r.db"
    configs = _configs()
    with Registry(f"sqlite:///{path}") as registry:
        _submit(registry, configs)
        key = configs[0].run_key
        registry.claim(key, "w")
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        release = threading.Timer(0.3, blocker.commit)
        release.start()
        start = time.perf_counter()
        assert registry.heartbeat(key)
        assert time.perf_counter() - start >= 0.2
        release.join()
        blocker.close()


def test_transient_errors_are_retried_and_others_are_not(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    calls = []

    def flaky(message):
        calls.append(message)
        if len(calls) < 3:
            raise sa.exc.OperationalError("UPDATE runs", {}, sqlite3.OperationalError(message))
        return "done"

    assert registry_db.retrying(flaky)("database is locked") == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(sa.exc.OperationalError):
        registry_db.retrying(flaky)("no such table: runs")
    assert len(calls) == 1


def test_a_registry_migrated_by_newer_code_is_refused_in_one_line(registry_url):
    """Older code meeting a newer schema (another checkout upgraded it) stops with what to do,
    instead of an Alembic traceback in every trial."""
    from sqlalchemy import text

    from base.sections import ConfigError

    Registry(registry_url).close()  # at this code's head
    engine = registry_db.make_engine(registry_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE hs_alembic_version SET version_num = '9999'"))
    with pytest.raises(ConfigError, match="schema revision 9999, newer than this code knows") as info:
        Registry(registry_url)
    assert "\n" not in str(info.value)
    engine.dispose()
