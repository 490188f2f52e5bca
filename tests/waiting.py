"""The tests' one way to wait for something another process does: poll a condition, fail naming it.

A wait in a test is for an event (a state in the registry, a file, a port), never a wall-clock window:
the timeout only tells a hang from a loaded machine, so it is generous. A test's pytest timeout is at
least the sum of its waits and its fixtures' (their set-up and teardown): each until's timeout with its
condition's command timeout and its message's (one may be under way when the time is up), each
command's timeout, each sleep; so a wait that runs out fails naming what it waited for, before pytest
kills the test."""

import time
from collections.abc import Callable
from typing import Any


def until(condition: Callable[[], Any], timeout: float, message: str | Callable[[], str],
          every_s: float = 0.5) -> Any:
    """``condition()`` again until it is truthy; returns that value. Past ``timeout`` seconds, an
    AssertionError with ``message`` (a callable is asked then: a log's tail, what was last seen)."""
    deadline = time.monotonic() + timeout
    while not (seen := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(every_s)
    return seen
