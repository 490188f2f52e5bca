"""Label sets of file tasks: the order of label ids, and the checks that catch bad labels at submit.

A label set is either given (``task.labels``: ids in that order) or read from
the TRAIN file: its distinct labels sorted, numerically when every label is an
integer (``'2'`` before ``'10'``), else as strings (``'entailment'`` before
``'neutral'``). Sorting, not order of appearance, so the ids do not depend on
how the file happens to be shuffled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from experiments.tasks.sources import Source, suggest

E = TypeVar("E")

_SHOWN = 8  # labels listed in an error message


def label_order(labels: Iterable[str]) -> tuple[str, ...]:
    """Distinct labels, sorted numerically when all are integers, else as strings."""
    distinct = set(labels)
    try:
        return tuple(sorted(distinct, key=int))
    except ValueError:
        return tuple(sorted(distinct))


def _listed(labels: Iterable[str]) -> str:
    shown = list(labels)
    more = f", ... ({len(shown)} in all)" if len(shown) > _SHOWN else ""
    return ", ".join(shown[:_SHOWN]) + more


def label_set(train: Iterable[tuple[str, int]], given: tuple[str, ...] | None, source: Source) -> tuple[str, ...]:
    """The label values in id order: ``given`` (every train label must be in it) or read from train.

    train: (label, line) pairs of the train file.
    """
    pairs = list(train)
    if given is None:
        return label_order(label for label, _ in pairs)
    if len(set(given)) != len(given):
        raise ValueError(f"task.labels: repeated label in {list(given)}")
    allowed = set(given)
    for label, line in pairs:
        if label not in allowed:
            raise ValueError(
                f"task.labels: label '{label}' (line {line} of {source.path}) is not one of "
                f"{_listed(given)}{suggest(label, given)}"
            )
    return tuple(given)


def check_seen(pairs: Iterable[tuple[str, int]], seen: set[str], source: Source, train: Source) -> None:
    """ValueError naming the first label of an evaluation file that never occurs in train.

    Such a label can never be predicted right: usually a typo or a split made wrong.
    """
    for label, line in pairs:
        if label not in seen:
            raise ValueError(
                f"task.{source.role}: label '{label}' (line {line} of {source.path}) never occurs in "
                f"the train file {train.path} (its labels: {_listed(label_order(seen))})"
            )


def read_labelled(
    sources: tuple[Source, ...], read: Callable[[Source], E], label_lines: Callable[[E], Iterable[tuple[str, int]]],
    given: tuple[str, ...] | None,
) -> tuple[dict[str, E], tuple[str, ...]]:
    """Every file's examples by role, ``read(source)``, and the label values in id order, with the
    checks every file task makes: train's labels against ``given`` (``label_set``), every other
    file's against train's (``check_seen``). ``sources``: train first; ``label_lines(examples)``
    walks their (label, line) pairs (a label per sentence, or per word)."""
    examples = {source.role: read(source) for source in sources}
    train_source, train = sources[0], examples["train"]
    values = label_set(label_lines(train), given, train_source)
    seen = {label for label, _ in label_lines(train)}
    for source in sources[1:]:
        check_seen(label_lines(examples[source.role]), seen, source, train_source)
    return examples, values
