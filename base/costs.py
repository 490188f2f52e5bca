"""What one run costs, part by part: the ``cost.<part>_s`` metrics of every run (issue 19).

A :class:`Costs` is a stopwatch with named parts. Parts nest and their times are exclusive: a part
started inside another pauses the outer one, so ``train`` (the method's own work) never counts the
model or data loading the method does inside it. The caller (a Ray trial, the CLI, a test) makes
one per run and lends it through ``RunContext.costs``; the runner makes it the *active* one while
the method runs, so code deep below that knows no context (``models.load_backbone``, the task
loader) times itself with :func:`timed`, a no-op when no run is being timed.

Parts: ``claim`` (trial entered -> run claimed, registry included), ``mlflow`` (start run, tags,
params), ``model`` (weights and tokenizer), ``data`` (task files read and tokenised), ``train``
(the method minus model and data), ``figures`` (PNG rendering), ``artifacts`` (logging the maps
and other artifacts), ``finish`` (MLflow and registry finish) and ``total`` (entered -> done).
Pure: no torch, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from base import outputs

PARTS = ("claim", "mlflow", "model", "data", "train", "figures", "artifacts", "finish")
"""The parts a run's set-up, work and bookkeeping are split into, in the order they happen."""


class Costs:
    """Seconds spent in each part of one run (exclusive), from ``started`` (``time.perf_counter``)."""

    def __init__(self, first_in_worker: bool = False, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.first_in_worker = first_in_worker
        """The worker process's first run: it pays the imports and first loads (analyses split on it)."""
        self.seconds: dict[str, float] = {}
        self._running: list[list] = []  # [part, since] of the open parts, innermost last
        self.ended: float | None = None

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as ``name``; an enclosing part is paused meanwhile."""
        now = time.perf_counter()
        if self._running:
            self._add(self._running[-1], now)
        self._running.append([name, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            self._add(self._running.pop(), end)
            if self._running:
                self._running[-1][1] = end  # the outer part resumes now

    def _add(self, running: list, now: float) -> None:
        name, since = running
        self.seconds[name] = self.seconds.get(name, 0.0) + now - since

    def end(self) -> None:
        """The run is done: ``total`` stops here."""
        self.ended = time.perf_counter()

    def metrics(self) -> dict[str, float]:
        """``cost.<part>_s`` of every part timed so far, ``cost.total_s`` once :meth:`end` was called,
        and ``cost.first_in_worker`` (1.0 / 0.0)."""
        out = {outputs.COST.name(part=name): seconds for name, seconds in self.seconds.items()}
        if self.ended is not None:
            out[outputs.COST_TOTAL] = self.ended - self.started
        out[outputs.FIRST_IN_WORKER.name] = float(self.first_in_worker)
        return out


_ACTIVE: ContextVar[Costs | None] = ContextVar("headsweep_costs", default=None)


@contextmanager
def active(costs: Costs) -> Iterator[Costs]:
    """Make ``costs`` the one :func:`timed` adds to inside the block (this thread / context only)."""
    token = _ACTIVE.set(costs)
    try:
        yield costs
    finally:
        _ACTIVE.reset(token)


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Time the block as part ``name`` of the active run's :class:`Costs`; nothing when none is active."""
    costs = _ACTIVE.get()
    if costs is None:
        yield
        return
    with costs.part(name):
        yield
