"""The one handle type every intervention returns: how to take it off the model again.

An intervention (head or token gates, uniform attention, weight masks, neuron noise, FFN masks,
the pooler read) changes a model only through hooks or parametrisations it registers, never by
editing it; its handle keeps one undo step per registration. ``remove()`` runs them, last
registered first, and forgets them, so removing twice is harmless; ``with attach_...(...):``
removes it when the block ends, also on an error. A handle that carries more (the gates of the
last forward, a removal option) is a subclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self


@dataclass
class Handle:
    """What an attach returns: ``remove()`` gives the plain model back; idempotent; a context manager.

    ``undo``: the steps that take the intervention off, in the order it was put on (e.g. each
    ``RemovableHandle.remove`` of the hooks it registered).
    """

    undo: list[Callable[[], None]] = field(default_factory=list)

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
