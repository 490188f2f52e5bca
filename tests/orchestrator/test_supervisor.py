"""The supervisor's decisions (pure), the sweep history it writes and ``status`` reads, one look
(``tick``) over a real registry (SQLite and PostgreSQL) with the Jobs API calls given as functions,
and migration 0005. The real thing (a driver SIGKILLed on a Ray head, resumed by the supervisor's
job) is the slow test in test_cluster.py."""

from datetime import timedelta

import pytest
import sqlalchemy as sa

from orchestrator.driving import supervisor
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.driving.trial import worker_name, worker_trial
from orchestrator.registry import Registry, upgrade
from orchestrator.registry import db as registry_db
from orchestrator.registry.events import DRIVER_LOST, GAVE_UP, ORPHANED, RESUMED, WORKER_LOST
from orchestrator.registry.history import clock, history, worker_node
from orchestrator.registry.supervision import Action, decide


def _event(kind, **detail):
    return {"kind": kind, "at": registry_db.now(), "detail": detail}


LOST = _event(DRIVER_LOST, driver="d0", state="FAILED")
AUTO = [_event(RESUMED, driver=f"d{i}", auto=True, attempt=i, of=3) for i in (1, 2, 3)]


def _sweep(status="failed", events=(), auto_resumes=3, cancel=False):
    return {"id": "sw-1", "status": status, "auto_resumes": auto_resumes, "cancel_requested": cancel,
            "events": list(events)}


@pytest.mark.parametrize("sweep, state, expected", [
    (_sweep("running"), "RUNNING", Action("reconcile")),
    (_sweep("submitted"), "PENDING", Action("reconcile")),
    (_sweep("running"), "FAILED", Action("lose")),
    (_sweep("running"), "STOPPED", Action("lose")),
    (_sweep("running"), "SUCCEEDED", None),  # it wrote the final status itself
    (_sweep("running"), "UNKNOWN", None),  # not this cluster's job, or gone with its head
    (_sweep("running", cancel=True), "RUNNING", None),  # cancelled: its driver stops it
    (_sweep("running", cancel=True), "FAILED", Action("lose")),  # ... unless it died first
    (_sweep(events=[LOST]), None, Action("resume", 1, 3)),
    (_sweep(events=[LOST, AUTO[0], LOST]), None, Action("resume", 2, 3)),
    (_sweep(events=[LOST, AUTO[0], LOST, AUTO[1], LOST, AUTO[2], LOST]), None, Action("give_up", 3, 3)),
    # a resume by hand gives the automatic resumes back
    (_sweep(events=[LOST, *AUTO, _event(RESUMED, driver="d9", auto=False), LOST]), None, Action("resume", 1, 3)),
    (_sweep(events=[LOST, AUTO[0], LOST], auto_resumes=1), None, Action("give_up", 1, 1)),
    (_sweep(events=[LOST, AUTO[0], LOST, _event(GAVE_UP, used=1, of=1)], auto_resumes=1), None, None),
    (_sweep(events=[LOST], auto_resumes=0), None, None),  # --no-auto-resume
    # without automatic resumes: a dead driver is still recorded (no reader ever sees the sweep
    # running), nothing reconciled or resumed
    (_sweep("running", auto_resumes=0), "FAILED", Action("lose")),
    (_sweep("running", auto_resumes=0), "RUNNING", None),
    (_sweep(events=[LOST], cancel=True), None, None),
    (_sweep(events=[_event(DRIVER_LOST, driver="d0", state="UNKNOWN")]), None, None),
    (_sweep(events=[]), None, None),  # failed by its own driver: runs failed, nothing to resume
    (_sweep("finished", events=[LOST, AUTO[0]]), None, None),
])
def test_decide(sweep, state, expected):
    assert decide(sweep, state) == expected


def test_history_lines_say_when_the_driver_died_and_what_followed():
    at = registry_db.now().replace(hour=9, minute=5)  # 09:05 UTC, shown in local time
    hhmm = clock(at)
    lost = {"kind": DRIVER_LOST, "at": at, "detail": {"driver": "d0", "state": "FAILED"}}
    auto = {"kind": RESUMED, "at": at, "detail": {"driver": "d1", "auto": True, "attempt": 1, "of": 3}}
    assert history(_sweep("running", events=[lost, auto])) == [f"driver failed at {hhmm}; resumed automatically (1/3)"]
    assert history(_sweep(events=[lost])) == [f"driver failed at {hhmm}; the supervisor resumes it within seconds"]
    assert history(_sweep(events=[lost]), supervised=lambda: False) == [  # the OOM killer took the supervisor too
        f"driver failed at {hhmm}; no supervisor runs to resume it (its Ray job ended too); "
        "`headsweep resume sw-1` runs what is left"]
    assert history(_sweep(events=[lost], auto_resumes=0)) == [
        f"driver failed at {hhmm}; `headsweep resume sw-1` runs what is left"]
    gave_up = {"kind": GAVE_UP, "at": at, "detail": {"used": 3, "of": 3}}
    (line,) = history(_sweep(events=[lost, gave_up]))
    assert line.startswith(f"driver failed at {hhmm}; not resumed: its 3 automatic resumes are used up")
    assert "`headsweep resume sw-1`" in line
    by_hand = {"kind": RESUMED, "at": at, "detail": {"driver": "d2", "auto": False}}
    assert history(_sweep("running", events=[by_hand])) == [f"resumed by hand at {hhmm}"]


def test_history_names_orphans_and_lost_workers():
    at = registry_db.now().replace(hour=9, minute=5)
    hhmm = clock(at)
    lost = {"kind": DRIVER_LOST, "at": at, "detail": {"driver": "d0", "state": "FAILED", "orphaned": 2}}
    auto = {"kind": RESUMED, "at": at, "detail": {"driver": "d1", "auto": True, "attempt": 1, "of": 3}}
    assert history(_sweep("running", events=[lost, auto])) == [
        f"driver failed at {hhmm}; 2 runs orphaned; resumed automatically (1/3)"]
    retried = {"kind": WORKER_LOST, "at": at,
               "detail": {"run_key": "3f2a9c01d4e5ffff", "worker": "t1@h:9", "attempt": 1, "then": "retried"}}
    failed = {"kind": WORKER_LOST, "at": at,
              "detail": {"run_key": "aa2a9c01d4e5ffff", "worker": "t2@h:9", "attempt": 2, "then": "failed"}}
    orphaned = {"kind": ORPHANED, "at": at, "detail": {"run_keys": ["bb2a9c01d4e5ffff"]}}
    lines = history(_sweep("running", events=[retried, failed, orphaned]))
    assert lines[0] == f"worker of run 3f2a9c01d4e5 died at {hhmm} (attempt 1): Tune retried it"
    assert lines[1].startswith(f"worker of run aa2a9c01d4e5 died at {hhmm} (attempt 2): no retry left")
    assert "--rerun-failed" in lines[1]
    assert lines[2] == f"1 run orphaned at {hhmm} (worker stopped heartbeating): back to pending (bb2a9c01d4e5)"
    on_node = {"kind": ORPHANED, "at": at, "detail": {"run_keys": ["cc2a9c01d4e5ffff", "dd2a9c01d4e5ffff"], "workers": [
        "t1_0001@n3[3f2a9c01 10.0.0.7]:41", "t2_0002@n3[3f2a9c01 10.0.0.7]:42"]}}
    assert history(_sweep("running", events=[on_node])) == [
        f"2 runs orphaned at {hhmm} on n3 (Ray node 3f2a9c01, 10.0.0.7) (worker stopped heartbeating): back to "
        "pending (cc2a9c01d4e5, dd2a9c01d4e5)"]


def test_history_says_which_node_was_lost():
    """The workers of one Ray node that died together (Tune tells of each trial within seconds) are
    one line naming the node; one worker of a node that died alone keeps its run's line, with its
    node; a later loss of the same node, or one after another event, is a line of its own."""
    at = registry_db.now().replace(hour=9, minute=5)
    hhmm = clock(at)
    worker = "3f2a9c_00007@box[3f2a9c01 127.0.0.1]:4242"
    assert worker_node(worker) == ("3f2a9c01", "127.0.0.1") and worker_trial(worker) == "3f2a9c_00007"
    assert worker_node("t1@h:9") is None  # recorded before workers named their node
    named = worker_name("a1b2c_00003", "3f2a9c01d4e5" * 4, "10.0.0.7")
    assert worker_trial(named) == "a1b2c_00003" and worker_node(named) == ("3f2a9c01", "10.0.0.7")

    def lost(key, node, then="retried", after_s=0.0):
        return {"kind": WORKER_LOST, "at": at + timedelta(seconds=after_s), "detail": {
            "run_key": key * 16, "worker": f"t{key}_0001@box[{node} 127.0.0.1]:{ord(key)}", "attempt": 1, "then": then}}

    events = [lost("a", "3f2a9c01"), lost("b", "77777777", after_s=1), lost("c", "3f2a9c01", after_s=2),
              lost("d", "3f2a9c01", "failed", after_s=3), lost("e", "3f2a9c01", after_s=300),
              _event(ORPHANED, run_keys=["f" * 16]) | {"at": at}, lost("g", "3f2a9c01", after_s=301)]
    assert history(_sweep("running", events=events)) == [
        f"workers lost on box (Ray node 3f2a9c01, 127.0.0.1) at {hhmm}: 2 runs rerun by Tune; 1 run failed, no retry "
        "left (max_failures); --rerun-failed requeues them",
        f"worker of run bbbbbbbbbbbb died at {hhmm} (attempt 1) on box (Ray node 77777777, 127.0.0.1): Tune retried it",
        f"worker of run eeeeeeeeeeee died at {clock(at + timedelta(seconds=300))} (attempt 1) on box (Ray "
        "node 3f2a9c01, 127.0.0.1): Tune retried it",
        f"1 run orphaned at {hhmm} (worker stopped heartbeating): back to pending (ffffffffffff)",
        f"worker of run gggggggggggg died at {clock(at + timedelta(seconds=301))} (attempt 1) on box (Ray "
        "node 3f2a9c01, 127.0.0.1): Tune retried it",
    ]


@pytest.mark.parametrize("counts, cancel_requested, expected", [
    ({"finished": 3}, False, "finished"),
    ({"finished": 2, "failed": 1}, False, "failed"),
    ({"finished": 2, "pending": 1}, False, "failed"),  # left over: never "finished"
    ({"finished": 2, "cancelled": 1}, False, "cancelled"),  # a run cancelled alone: not "failed" with 0 failed
    ({"cancelled": 3}, False, "cancelled"),
    ({"finished": 1, "cancelled": 1, "failed": 1}, False, "failed"),
    ({"finished": 3}, True, "cancelled"),
])
def test_a_sweep_ends_with_the_status_its_runs_say(counts, cancel_requested, expected):
    from orchestrator.driving.driver import final_status

    assert final_status(counts, cancel_requested) == expected


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("fresh_pg_database")


def _register(registry, auto_resumes=3, driver="d0", status="running"):
    spec = parse_grid({"name": "t", "axes": {"seed": [0, 1, 2]}})
    sweep_id, _ = registry.create_sweep("t", "name: t\n", expand(spec), {"cpus": 1.0}, None, 1)
    registry.set_sweep(sweep_id, auto_resumes=auto_resumes, driver=driver, status=status)
    return sweep_id


class Cluster:
    """The Jobs API as the supervisor sees it: a state per driver job; starting a driver does what
    ``sweeps.start_driver`` does to the registry."""

    def __init__(self):
        self.states, self.started = {}, []

    def job(self, dashboard, driver):
        return self.states.get(driver, "UNKNOWN"), None

    def start(self, registry, sweep_id, head, track):
        driver = f"d{len(self.started) + 1}"
        self.started.append(driver)
        self.states[driver] = "RUNNING"
        registry.set_sweep(sweep_id, driver=driver, status="submitted")
        return driver


def test_tick_resumes_a_dead_driver_three_times_then_gives_up(registry_url):
    head = {"dashboard": "http://127.0.0.1:1", "address": "127.0.0.1:2"}
    fake = Cluster()
    with Registry(registry_url) as registry:
        sweep_id = _register(registry)
        off = _register(registry, auto_resumes=0, driver="x0")  # --no-auto-resume
        fake.states.update(d0="RUNNING", x0="FAILED")
        assert supervisor.tick(registry, head, fake.job, fake.start) == [f"{off}: driver x0 failed"]
        for attempt in (1, 2, 3):
            fake.states[registry.get_sweep(sweep_id)["driver"]] = "FAILED"
            did = supervisor.tick(registry, head, fake.job, fake.start)
            assert any(f"resumed automatically ({attempt}/3)" in line for line in did), did
            assert registry.get_sweep(sweep_id)["status"] == "submitted"
        fake.states["d3"] = "STOPPED"
        supervisor.tick(registry, head, fake.job, fake.start)
        assert fake.started == ["d1", "d2", "d3"]  # bounded
        sweep = registry.get_sweep(sweep_id) | {"events": registry.events(sweep_id)}
        assert sweep["status"] == "failed"
        assert [e["kind"] for e in sweep["events"]] == [DRIVER_LOST, RESUMED] * 3 + [DRIVER_LOST, GAVE_UP]
        lines = history(sweep)
        assert [line.split("; ", 1)[1] for line in lines[:3]] == [f"resumed automatically ({i}/3)" for i in (1, 2, 3)]
        assert lines[3].startswith("driver stopped at") and "automatic resumes are used up" in lines[3]
        assert supervisor.tick(registry, head, fake.job, fake.start) == []  # nothing more to do
        # the sweep without auto-resume: its dead driver recorded (no reader sees it running), never resumed
        assert registry.get_sweep(off)["status"] == "failed"
        assert [e["kind"] for e in registry.events(off)] == [DRIVER_LOST]
        assert history(registry.get_sweep(off) | {"events": registry.events(off)})[-1].endswith(
            f"`headsweep resume {off}` runs what is left")


def test_lose_driver_writes_once_and_only_for_the_current_driver(registry_url):
    with Registry(registry_url) as registry:
        sweep_id = _register(registry)
        assert not registry.lose_driver(sweep_id, "an-old-driver", "FAILED")
        registry.claim(registry.unfinished(sweep_id)[0], "t0@host:1")  # the dead driver's trial's run
        assert registry.lose_driver(sweep_id, "d0", "FAILED")
        assert not registry.lose_driver(sweep_id, "d0", "FAILED")  # noticed already (status and supervisor)
        (event,) = registry.events(sweep_id)
        assert event["kind"] == DRIVER_LOST and event["detail"] == {"driver": "d0", "state": "FAILED", "orphaned": 1}
        finished = _register(registry, status="finished")
        assert not registry.lose_driver(finished, "d0", "FAILED")  # its driver wrote the final status
        assert [s["id"] for s in registry.supervised_sweeps()] == [sweep_id]  # lost; the finished one is not


def test_tick_reconciles_orphans_while_the_driver_runs(registry_url):
    with Registry(registry_url) as registry:
        sweep_id = _register(registry)
        first, second, _ = registry.unfinished(sweep_id)
        registry.claim(first, "dead-trial@host:1")
        registry.claim(second, "live-trial@host:2")
        old = registry_db.now() - timedelta(seconds=supervisor.ORPHAN_AFTER_S + 5)
        engine = sa.create_engine(registry_url)
        with engine.begin() as connection:
            connection.execute(sa.text("UPDATE hs_runs SET heartbeat_at = :t WHERE run_key = :k"), {"t": old, "k": first})
        engine.dispose()
        fake = Cluster()
        fake.states["d0"] = "RUNNING"
        did = supervisor.tick(registry, {"dashboard": "", "address": ""}, fake.job, fake.start)
        assert did == [f"{sweep_id}: 1 orphaned runs back to pending: {first}"]
        assert [(e["kind"], e["detail"]) for e in registry.events(sweep_id)] == [
            (ORPHANED, {"run_keys": [first], "workers": ["dead-trial@host:1"]})]
        assert registry.get_run(first)["status"] == "pending" and registry.get_run(second)["status"] == "running"
        assert fake.started == []


def test_a_registry_at_0004_upgrades_with_auto_resume_off_and_downgrades(registry_url):
    engine = sa.create_engine(registry_url)
    upgrade(engine, "0004")
    when = registry_db.now()
    with engine.begin() as connection:
        connection.execute(sa.text(
            "INSERT INTO sweeps (id, name, grid, created_at, updated_at, resources, max_concurrent, max_failures,"
            " cancel_requested, status, driver) VALUES ('sw-old', 'old', '', :t, :t, '{}', NULL, 1, false, 'running', 'd0')"),
            {"t": when})
    engine.dispose()
    with Registry(registry_url) as registry:  # opening upgrades to head
        sweep = registry.get_sweep("sw-old")
        assert sweep["auto_resumes"] == 0 and registry.events("sw-old") == []
        (old,) = registry.supervised_sweeps()  # watched: its driver's death is recorded
        assert old["id"] == "sw-old" and decide(old, "FAILED") == Action("lose")
        assert registry.lose_driver("sw-old", "d0", "FAILED")
        assert registry.supervised_sweeps() == []  # a sweep from before never resumes by itself
    engine = registry_db.make_engine(registry_url)
    registry_db.downgrade(engine, "0004")
    with engine.connect() as connection:
        columns = {c["name"] for c in sa.inspect(connection).get_columns("sweeps")}
        assert "auto_resumes" not in columns and not sa.inspect(connection).has_table("sweep_events")
        assert connection.execute(sa.text("SELECT status FROM sweeps")).scalar() == "failed"
    engine.dispose()
