"""The one retry policy (orchestrator/retry.py) the registry and MLflow writes share: what it retries,
its bounds (time and tries, on a fake clock), the original error when it gives up; and that a
retried MLflow run creation makes one run even when a try's reply was lost after its commit.
The real thing, a PostgreSQL restarted under a sweep, is the slow test in test_db_faults.py."""

import sqlite3

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE

from orchestrator import retry, tracking
from orchestrator.registry import db as registry_db


class FakeTime:
    """A clock that moves only when slept on; records every sleep."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def clock(self):
        return self.now


def _refused():
    """What SQLAlchemy raises while PostgreSQL is down (psycopg's connect error has no SQLSTATE)."""
    return sa.exc.OperationalError(None, None, psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5 failed: Connection refused'))


def _fails(times, error=_refused):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= times:
            raise error()
        return "done"

    return fn, calls


def test_a_call_that_fails_n_times_then_succeeds_returns_its_value():
    fake = FakeTime()
    fn, calls = _fails(4)
    policy = retry.Backoff(first_s=0.1, max_delay_s=0.5, budget_s=10)
    assert retry.call(fn, retry.transient_db_error, policy, sleep=fake.sleep, clock=fake.clock) == "done"
    assert len(calls) == 5 and len(fake.slept) == 4
    # exponential, jittered into [0.5, 1) of 0.1, 0.2, 0.4, then capped at 0.5
    for slept, full in zip(fake.slept, [0.1, 0.2, 0.4, 0.5], strict=True):
        assert full / 2 <= slept < full


def test_a_call_that_keeps_failing_gives_up_within_the_budget_with_the_original_error():
    fake = FakeTime()
    errors = []

    def fn():
        errors.append(_refused())
        raise errors[-1]

    policy = retry.Backoff(first_s=0.05, max_delay_s=2.0, budget_s=12)
    with pytest.raises(sa.exc.OperationalError) as raised:
        retry.call(fn, retry.transient_db_error, policy, sleep=fake.sleep, clock=fake.clock)
    assert raised.value is errors[-1]  # the database's own error, unchanged
    assert 8 < fake.now <= 12  # waited most of the budget (a ~10 s restart fits), never past it
    assert len(errors) == len(fake.slept) + 1 and max(fake.slept) < 2.0


def test_max_attempts_bounds_the_tries_whatever_the_clock_says():
    fake = FakeTime()
    fn, calls = _fails(100)
    with pytest.raises(sa.exc.OperationalError):
        retry.call(fn, retry.transient_db_error, retry.Backoff(first_s=0.0, budget_s=60, max_attempts=7),
                   sleep=fake.sleep, clock=fake.clock)
    assert len(calls) == 7


def test_a_real_bug_is_raised_at_once():
    fake = FakeTime()
    fn, calls = _fails(1, lambda: sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: runs")))
    with pytest.raises(sa.exc.OperationalError, match="no such table"):
        retry.call(fn, retry.transient_db_error, sleep=fake.sleep, clock=fake.clock)
    fn, calls = _fails(1, lambda: ValueError("a bug"))
    with pytest.raises(ValueError):
        retry.call(fn, retry.transient_db_error, sleep=fake.sleep, clock=fake.clock)
    assert len(calls) == 1 and fake.slept == []


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HEADSWEEP_RETRY_S", "3")
    fake = FakeTime()
    fn, calls = _fails(1000)
    with pytest.raises(sa.exc.OperationalError):
        retry.call(fn, retry.transient_db_error, sleep=fake.sleep, clock=fake.clock)
    # it gives up once the next (jittered) delay would pass the budget: never past 3 s, and never
    # while a whole delay (at most max_delay_s = 2 s) still fitted (1.5 s here was a race with the jitter)
    assert 3 - retry.Backoff().max_delay_s < fake.now <= 3


def _sa(orig, **kw):
    return sa.exc.OperationalError("UPDATE runs", {}, orig, **kw)


@pytest.mark.parametrize("error, transient", [
    (_refused(), True),  # down, or starting up
    (_sa(psycopg.errors.AdminShutdown("terminating connection due to administrator command")), True),
    (_sa(psycopg.errors.CannotConnectNow("the database system is starting up")), True),
    (_sa(psycopg.errors.lookup("08006")("connection failure")), True),
    (_sa(psycopg.errors.DeadlockDetected("deadlock detected")), True),
    (_sa(psycopg.errors.SerializationFailure("could not serialize")), True),
    (_sa(psycopg.errors.UndefinedTable('relation "runs" does not exist')), False),
    (sa.exc.IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")), False),
    (_sa(sqlite3.OperationalError("database is locked")), True),
    (_sa(sqlite3.OperationalError("no such table: runs")), False),
    (_sa(sqlite3.OperationalError("whatever"), connection_invalidated=True), True),  # SQLAlchemy saw a disconnect
    (ValueError("not a database error"), False),
])
def test_which_database_errors_are_transient(error, transient):
    assert retry.transient_db_error(error) is transient


def _wrapped(cause, code=TEMPORARILY_UNAVAILABLE):
    """As MLflow's SQL store raises it: an MlflowException from SQLAlchemy's error."""
    try:
        raise MlflowException(str(cause), error_code=code) from cause
    except MlflowException as err:
        return err


@pytest.mark.parametrize("error, transient", [
    (_wrapped(_refused()), True),
    (_wrapped(_sa(psycopg.errors.AdminShutdown("terminating connection"))), True),
    (_wrapped(_sa(sqlite3.OperationalError("no such table: runs"))), False),  # MLflow says temporary; it is not
    (MlflowException("a tracking server answered 503", error_code=TEMPORARILY_UNAVAILABLE), True),
    (MlflowException("bad param", error_code=INVALID_PARAMETER_VALUE), False),
])
def test_which_mlflow_errors_are_transient(error, transient):
    assert tracking.transient_mlflow_error(error) is transient


def test_registry_methods_retry_a_lost_connection(tmp_path, monkeypatch):
    """A real registry whose connection is refused twice (as while PostgreSQL restarts) answers."""
    fake = FakeTime()
    monkeypatch.setattr(retry.time, "sleep", fake.sleep)
    with registry_db.Database(f"sqlite:///{tmp_path / 'r.db'}") as database:
        calls = []
        real = database._read

        def flaky_read():
            calls.append(1)
            if len(calls) <= 2:
                raise _refused()
            return real()

        monkeypatch.setattr(database, "_read", flaky_read)

        @registry_db.retrying
        def revision(db):
            with db._read() as connection:
                return registry_db.current_revision(connection)

        assert revision(database) == registry_db.head_revision()
        assert len(calls) == 3 and len(fake.slept) == 2


def test_a_run_is_created_once_when_the_reply_to_its_creation_is_lost(tmp_path, monkeypatch):
    """The first try commits the run and then loses its connection (the reply never came): the
    retry finds that run by its creation token instead of making a second one."""
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    mlflow = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = tracking.ensure_experiment(mlflow, "faults")
    raw, tries = mlflow.unretried, []
    create = raw.create_run

    def create_then_lose_the_reply(*args, **kwargs):
        tries.append(1)
        created = create(*args, **kwargs)
        if len(tries) == 1:
            raise _wrapped(_sa(psycopg.errors.AdminShutdown("terminating connection")))
        return created

    monkeypatch.setattr(raw, "create_run", create_then_lose_the_reply)
    run_id = tracking.start_run(mlflow, experiment_id, "child", tags={"sweep": "s1"})
    runs = mlflow.search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] and len(tries) == 1  # found, not created again
    assert runs[0].data.tags["sweep"] == "s1"
    # a try that failed before committing is simply made again
    tries.clear()

    def refuse_then_create(*args, **kwargs):
        tries.append(1)
        if len(tries) == 1:
            raise _wrapped(_refused())
        return create(*args, **kwargs)

    monkeypatch.setattr(raw, "create_run", refuse_then_create)
    second = tracking.start_run(mlflow, experiment_id, "other")
    assert len(mlflow.search_runs([experiment_id])) == 2 and second != run_id and len(tries) == 2
