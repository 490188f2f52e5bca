"""The registry against real SQLite files and a real PostgreSQL (one fresh schema per test).

PostgreSQL must be reachable at 127.0.0.1:5432 (``HEADSWEEP_TEST_PG`` overrides
the URL): when it is not, the PostgreSQL cases fail rather than skip.
"""

from __future__ import annotations

import multiprocessing
import os
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

from orchestrator import registry as registry_module
from orchestrator.grid import expand, parse_grid
from orchestrator.registry import ORPHAN_ERROR, NotFound, Registry, upgrade

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("HEADSWEEP_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
GATES = np.arange(72, dtype=np.float32).reshape(6, 12) / 72


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
    schema = f"hs_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as connection:  # fails (not skips) when PostgreSQL is unreachable
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield sa.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
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
    then = registry_module._now() - timedelta(seconds=seconds)
    _sql(url, "UPDATE runs SET heartbeat_at = :t WHERE run_key = :k", t=then, k=run_key)


# --------------------------------------------------------------------------- submit


def test_same_grid_twice_adds_no_runs(registry, registry_url):
    configs = _configs()
    first, counts = _submit(registry, configs)
    assert counts == {"total": 6, "new": 6, "finished": 0, "requeued": 0, "other": 0}
    second, counts = _submit(registry, configs)
    assert counts == {"total": 6, "new": 0, "finished": 0, "requeued": 0, "other": 6}
    assert first != second
    assert _sql(registry_url, "SELECT count(*) FROM runs") == [(6,)]
    assert _sql(registry_url, "SELECT count(*) FROM sweep_runs") == [(12,)]


def test_overlapping_grid_adds_only_new_cells(registry):
    _submit(registry, _configs(seeds=(0, 1, 2)))
    sweep_id, counts = _submit(registry, _configs(seeds=(1, 2, 3, 4)))
    assert counts["total"] == 8 and counts["new"] == 4 and counts["other"] == 4
    assert sum(registry.sweep_counts(sweep_id).values()) == 8


def test_configs_may_be_an_iterator(registry):
    configs = _configs()
    _, counts = _submit(registry, iter(configs))
    assert counts["new"] == 6
    assert registry.plan(iter(configs)) == {"total": 6, "new": 0, "finished": 0, "other": 6}


def test_plan_writes_nothing(registry, registry_url):
    configs = _configs()
    assert registry.plan(configs) == {"total": 6, "new": 6, "finished": 0, "other": 0}
    assert _sql(registry_url, "SELECT count(*) FROM runs") == [(0,)]
    _submit(registry, configs[:4])
    key = configs[0].run_key
    registry.claim(key, "w")
    registry.finish(key, {}, GATES)
    assert registry.plan(configs + configs) == {"total": 6, "new": 2, "finished": 1, "other": 3}


def test_finished_runs_are_never_rerun_without_force(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    assert registry.claim(key, "w:1") is not None
    registry.set_mlflow_run(key, "mlflow-1")
    assert registry.finish(key, {"accuracy": 0.75}, GATES)

    sweep_id, counts = _submit(registry, configs, rerun_failed=True)
    assert counts["finished"] == 1 and counts["requeued"] == 0
    assert registry.get_run(key)["status"] == "finished"
    assert registry.claim(key, "w:2") is None
    assert key not in registry.unfinished(sweep_id)

    _, counts = _submit(registry, configs, force=True)
    assert counts["requeued"] == 1 and counts["finished"] == 0
    run = registry.get_run(key)
    assert (run["status"], run["attempts"], run["metrics"], run["mlflow_run_id"]) == ("pending", 0, None, None)
    assert registry.results(sweep_id)["has_gates"].sum() == 0


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
    assert claimed == {"run_key": key, "config": configs[0].to_dict(), "mlflow_run_id": None, "attempts": 1}
    assert registry.get_config(key) == configs[0].to_dict()
    registry.set_mlflow_run(key, "mlflow-1")
    assert registry.fail(key, "boom")
    again = registry.claim(key, "host:2")
    assert again["attempts"] == 2 and again["mlflow_run_id"] == "mlflow-1"
    assert registry.heartbeat(key)
    assert registry.finish(key, {"accuracy": np.float64(0.5), "loss": float("nan")}, GATES, scores=GATES * 2)
    run = registry.get_run(key)
    assert run["status"] == "finished" and run["error"] is None and run["worker"] == "host:2"
    assert run["metrics"] == {"accuracy": 0.5, "loss": None} and run["gates_shape"] == [6, 12]


def test_finish_twice_is_impossible(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    assert not registry.finish(key, {}, GATES)  # pending: not running
    registry.claim(key, "w")
    assert registry.finish(key, {"accuracy": 1.0}, GATES)
    assert not registry.finish(key, {"accuracy": 0.0}, GATES)
    assert not registry.fail(key, "late")
    assert not registry.heartbeat(key)
    assert registry.get_run(key)["metrics"] == {"accuracy": 1.0}


def test_a_stale_worker_cannot_finish_a_reclaimed_run(registry, registry_url):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    registry.claim(key, "old:1")
    assert registry.claim(key, "new:2") is None  # held by a live worker
    _age_heartbeat(registry_url, key, 3600)
    assert registry.claim(key, "new:2")["attempts"] == 2
    assert not registry.heartbeat(key, worker="old:1")
    assert not registry.finish(key, {}, GATES, worker="old:1")
    assert registry.finish(key, {}, GATES, worker="new:2")


def test_claim_of_a_running_run_with_zero_staleness(registry):
    configs = _configs()
    _submit(registry, configs)
    key = configs[0].run_key
    registry.claim(key, "a")
    assert registry.claim(key, "b", stale_after_s=0)["attempts"] == 2  # a Ray retry of its own trial


def test_finish_checks_the_gates_shape(registry):
    configs = _configs()
    _submit(registry, configs)
    registry.claim(configs[0].run_key, "w")
    with pytest.raises(ValueError, match="layers, heads"):
        registry.finish(configs[0].run_key, {}, np.zeros(72))
    with pytest.raises(ValueError, match="scores must have the gates' shape"):
        registry.finish(configs[0].run_key, {}, GATES, scores=np.zeros(72))
    assert registry.get_run(configs[0].run_key)["status"] == "running"


def _claim_all(url: str, keys: list[str], worker: str, barrier) -> list[str]:
    """In a spawned process: open the registry, wait for the others, claim and finish every key."""
    registry = Registry(url)
    barrier.wait()
    won = []
    for key in keys:
        if registry.claim(key, worker) is not None:
            won.append(key)
            assert registry.finish(key, {"worker": worker}, GATES, worker=worker)
        assert not registry.finish(key, {}, GATES, worker=worker)  # done, or another worker's
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
        registry.finish(key, {}, GATES)
    # two runs took 10 s in all: 6 pending -> about 30 s left
    sweep = registry.get_sweep(sweep_id)
    _sql(registry_url, "UPDATE runs SET started_at = :s, finished_at = :f WHERE status = 'finished'",
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
    assert registry.reset_orphans(sweep_id, stale_after_s=60) == [{"run_key": dead, "mlflow_run_id": "mlflow-dead"}]
    run = registry.get_run(dead)
    assert (run["status"], run["error"], run["worker"]) == ("pending", ORPHAN_ERROR, None)
    assert registry.get_run(alive)["status"] == "running"
    assert registry.orphans(sweep_id, stale_after_s=60) == []
    assert registry.claim(dead, "w:3") == {
        "run_key": dead, "config": configs[1].to_dict(), "mlflow_run_id": "mlflow-dead", "attempts": 2
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
                 lambda: registry.get_config("nope"), lambda: registry.results("sw-nope"),
                 lambda: registry.cancel_sweep("sw-nope")):
        with pytest.raises(NotFound):
            call()


# --------------------------------------------------------------------------- results


def test_results_shapes_and_order(registry):
    configs = expand(parse_grid({
        "name": "t", "axes": {"seed": [0, 1], "lambda": [0.1, 0.2]},
        "include": [{"seed": 9, "model": "tiny-bert", "sparsity": 0.5}],
    }))
    sweep_id, _ = _submit(registry, configs)
    keys = [c.run_key for c in configs]
    registry.claim(keys[0], "w")
    registry.finish(keys[0], {"accuracy": 0.0}, GATES, scores=-GATES)
    registry.claim(keys[3], "w")
    registry.finish(keys[3], {"accuracy": 0.3}, GATES + 3)
    registry.claim(keys[4], "w")
    registry.finish(keys[4], {"accuracy": 1.0}, np.ones((2, 4)))  # a smaller model
    registry.claim(keys[1], "w")
    registry.fail(keys[1], "boom")

    res = registry.results(sweep_id)
    assert list(res["run_key"]) == keys
    assert list(res["status"]) == ["finished", "failed", "pending", "finished", "finished"]
    assert res["seed"].tolist() == [0, 0, 1, 1, 9] and res["seed"].dtype == np.int64
    assert res["lambda"].tolist() == [0.1, 0.2, 0.1, 0.2, 0.01]
    assert np.isnan(res["sparsity"][:4]).all() and res["sparsity"][4] == 0.5
    assert list(res["model"]) == ["minilm-l6"] * 4 + ["tiny-bert"]
    assert set(res["task"]) == {"synthetic-cls"} and set(res["pipeline"]) == {"dp"}
    assert list(res["group_key"]) == [c.group_key for c in configs]
    assert res["metrics"] == [{"accuracy": 0.0}, {}, {}, {"accuracy": 0.3}, {"accuracy": 1.0}]
    assert res["gates"].shape == (5, 6, 12) and res["gates"].dtype == np.float32
    assert res["has_gates"].tolist() == [True, False, False, True, True]
    assert res["gates_shape"].tolist() == [[6, 12], [0, 0], [0, 0], [6, 12], [2, 4]]
    np.testing.assert_array_equal(res["gates"][3], GATES + 3)
    assert np.isnan(res["gates"][1]).all()
    assert res["scores"].shape == (5, 6, 12) and res["has_scores"].tolist() == [True] + [False] * 4
    np.testing.assert_array_equal(res["scores"][0], -GATES)
    assert np.isnan(res["scores"][1:]).all()
    assert (res["gates"][4, :2, :4] == 1).all() and np.isnan(res["gates"][4, 2:]).all()
    assert res["updated_at"] == max(registry.get_run(k)["updated_at"] for k in keys)


def test_results_with_one_gate_size_stack_exactly(registry):
    configs = _configs()
    sweep_id, _ = _submit(registry, configs)
    for i, cfg in enumerate(configs):
        registry.claim(cfg.run_key, "w")
        registry.finish(cfg.run_key, {}, GATES * i)
    res = registry.results(sweep_id)
    np.testing.assert_array_equal(res["gates"], np.stack([GATES * i for i in range(6)]))


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
def test_plain_postgresql_urls_use_psycopg():
    engine = registry_module._make_engine(PG_URL.replace("postgresql+psycopg://", "postgresql://"))
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
    head = registry_module._head_revision()
    assert _sql(registry_url, "SELECT version_num FROM alembic_version") == [(head,)]


def test_models_and_migrations_agree(registry, registry_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = sa.create_engine(registry_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, registry_module.Base.metadata)
    engine.dispose()
    assert diff == []


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
    assert len(_sql(registry_url, "SELECT version_num FROM alembic_version")) == 1


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
    monkeypatch.setattr(registry_module.time, "sleep", lambda s: None)
    calls = []

    def flaky(message):
        calls.append(message)
        if len(calls) < 3:
            raise sa.exc.OperationalError("UPDATE runs", {}, sqlite3.OperationalError(message))
        return "done"

    assert registry_module._retrying(flaky)("database is locked") == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(sa.exc.OperationalError):
        registry_module._retrying(flaky)("no such table: runs")
    assert len(calls) == 1
