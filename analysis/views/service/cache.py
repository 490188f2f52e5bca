"""The service's state: the registry's reader, what the questions read besides the sweep, and a memo of
serialised answers per (sweep, version, question)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException
from fastapi.responses import Response

from analysis.data.loading import open_sweep
from analysis.data.sweep import SweepData
from analysis.questions.run_table import ArtifactUris
from analysis.views.vocabulary import Context
from orchestrator.registry.reader import NotFound, RegistryReader

_MEMO_SIZE = 256


class Memo:
    """A small thread-safe LRU of answers."""

    def __init__(self, size: int):
        self.size, self.entries, self.lock = size, OrderedDict(), threading.Lock()

    def get_or_compute(self, key: tuple, compute: Callable[[], Any]) -> Any:
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key]
        value = compute()  # outside the lock: a slow answer must not block the others
        with self.lock:
            self.entries[key] = value
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return value


class State:
    """The app's registry (its reader: the service never writes or migrates), what its questions read
    besides the sweep (``context``: the service's limits apply) and its memo of answers."""

    def __init__(self, registry_url: str, artifact_uris: ArtifactUris | None = None):
        self.registry = RegistryReader(registry_url)
        self.context = Context(self.registry, artifact_uris, limited=True)
        self.memo = Memo(_MEMO_SIZE)

    def resolve(self, sweep_id: str) -> str:
        """``last`` -> the newest sweep's id, as on the command line (404 when there is none)."""
        try:
            return self.registry.resolve_sweep(sweep_id)
        except NotFound as err:
            raise HTTPException(404, str(err)) from None

    def data(self, sweep_id: str) -> SweepData:
        """The sweep, loaded (cached); an unknown id is ``UnknownSweep``, a 404 naming the nearest."""
        return open_sweep(self.registry, sweep_id)

    def answer(self, sweep_id: str, question: tuple, compute: Callable[[SweepData], Response]) -> Response:
        data = self.data(sweep_id)
        done = self.memo.get_or_compute((sweep_id, data.version, *question), lambda: compute(data))
        own = {k: v for k, v in done.headers.items() if k not in ("content-length", "content-type")}
        return Response(done.body, media_type=done.media_type, headers=own)  # a fresh response per request
