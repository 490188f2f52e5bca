"""Retrying a call through a passing fault: one policy for the registry and for MLflow.

A PostgreSQL restart or failover drops every connection for seconds; a busy SQLite file or a
deadlock makes one transaction fail. Both are worth waiting out, a bug is not. :func:`call`
re-runs a call that raised an error ``is_transient`` accepts, after a jittered exponential
backoff (``Backoff``: 0.05 s doubling to at most 2 s), for at most ``budget_s`` seconds
(``HEADSWEEP_RETRY_S``, default 60: a restart takes 1-10 s) and ``max_attempts`` tries; then it
raises the last error unchanged, so the caller records it as the run's failure. Any other error
is raised at once. Users: ``registry.db.retrying`` (every registry transaction, with
:func:`transient_db_error`) and ``tracking.RetryingClient`` (every MLflow call of ours).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

from orchestrator import settings

_T = TypeVar("_T")
log = logging.getLogger("headsweep.retry")

_RETRY_SQLSTATES = ("40001", "40P01", "57P01", "57P02", "57P03")
"""PostgreSQL: serialization failure, deadlock, the server shut down (fast/immediate/crash), the
server is starting up or shutting down. Class 08 (connection exceptions) is retried too."""


@dataclass(frozen=True)
class Backoff:
    """How long to keep trying: delays ``first_s * 2**n`` capped at ``max_delay_s``, each scaled
    by a random factor in [0.5, 1) (workers that lost the database together do not come back in
    step), until ``budget_s`` seconds have passed since the first try or ``max_attempts`` tries."""

    first_s: float = 0.05
    max_delay_s: float = 2.0
    budget_s: float | None = None  # None: settings.retry_budget_s(), read at each call
    max_attempts: int = 200

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based)."""
        return min(self.max_delay_s, self.first_s * 2 ** min(attempt, 30)) * (0.5 + random.random() / 2)


def call(
    fn: Callable[[], _T],
    is_transient: Callable[[BaseException], bool],
    policy: Backoff | None = None,
    what: str = "",
    *,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> _T:
    """``fn()``, re-run after each transient error within ``policy``'s bounds; the last error raised
    as it was once they are spent. ``what`` names the call in the log (one warning when it starts
    retrying, one when it got through). ``sleep``/``clock``: for tests (default: ``time``'s)."""
    policy = policy or Backoff()
    budget = settings.retry_budget_s() if policy.budget_s is None else policy.budget_s
    sleep, clock = sleep or time.sleep, clock or time.monotonic
    started, attempt = clock(), 0
    while True:
        try:
            result = fn()
        except Exception as err:
            if not is_transient(err):
                raise
            delay = policy.delay(attempt)
            attempt += 1
            spent = clock() - started
            if attempt >= policy.max_attempts or spent + delay > budget:
                log.error("%s: giving up after %d tries in %.1f s: %s", what or "call", attempt, spent,
                          _first_line(err))
                raise
            if attempt == 1:
                log.warning("%s: %s; retrying for up to %.0f s", what or "call", _first_line(err), budget)
            sleep(delay)
            continue
        if attempt:
            log.warning("%s: got through after %d retries in %.1f s", what or "call", attempt, clock() - started)
        return result


def transient_db_error(err: BaseException) -> bool:
    """A SQLAlchemy error worth a retry: the connection was lost or refused (a restarting
    PostgreSQL), a deadlock or serialization failure, SQLite busy or locked, or a SQLite page read torn by a write on another host (a network filesystem: its
    one writer is elsewhere, and the next read sees the file whole).

    A refused connection has no SQLSTATE (psycopg says "connection failed: ... Connection
    refused", or "... the database system is starting up"); a wrong password looks the same
    and is given up on after the budget, with its own message."""
    if not isinstance(err, DBAPIError):
        return False
    if err.connection_invalidated:  # SQLAlchemy saw a disconnect; its pool drops the connection
        return True
    orig = err.orig
    text = str(orig).lower()
    if "database is locked" in text or "database is busy" in text:  # SQLite
        return True
    if "disk image is malformed" in text or "disk i/o error" in text:  # SQLite read on another host mid-write
        return True
    if "attempt to write a readonly database" in text:  # a read-only reader found the writer's journal
        return True
    if not type(orig).__module__.startswith("psycopg"):
        return False
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None:
        return type(orig).__name__ == "OperationalError"  # raised by the client: no server to answer
    return sqlstate.startswith("08") or sqlstate in _RETRY_SQLSTATES


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"
