"""The tests' one way to wait for something another process does: poll a condition, fail naming it.

A wait in a test is for an event (a state in the registry, a file, a port), never a wall-clock window:
the timeout only tells a hang from a loaded machine, so it is generous, and below pytest's limit for
the test that waits."""

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
