"""The one error of a question the data cannot answer as asked, and its "did you mean".

Below every other analysis module (data, questions, views), which raise it.
"""

from __future__ import annotations

from collections.abc import Sequence

from base.naming import suggest


class QueryError(ValueError):
    """A question the data cannot answer as asked: one line, naming the bad value."""


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """'; did you mean 'x'?' for the closest choice: always one when there are choices (the
    list of valid values follows in every message, so even a far guess orients the reader)."""
    return suggest(word, choices, cutoff=0.0)


def list_choices(values: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
