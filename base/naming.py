"""The one "did you mean" of headsweep (configs, grids, tasks, models, the CLI, analysis).

Every error about an unknown name ends the same way, so a user reads one
pattern: ``unknown key 'train.lrr'; did you mean 'train.lr'?``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.5
"""Similarity (difflib ratio) below which nothing is suggested: a wild guess misleads more than none."""


def closest(word: str, choices: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The choice nearest to ``word``, or None when nothing is close enough."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=cutoff)
    return match[0] if match else None


def suggest(word: str, choices: Iterable[str], cutoff: float = CUTOFF) -> str:
    """``"; did you mean 'x'?"`` for the nearest choice, or ``""`` when nothing is close."""
    match = closest(word, choices, cutoff)
    return f"; did you mean '{match}'?" if match else ""
