"""The agreement statistics, one module each, and ``STATISTICS``, the registry the rest iterates.

Every module of this package that defines ``STATISTICS`` (a tuple of
:class:`~analysis.statistics.base.Statistic`) is found here by discovery, so a new statistic is
one new module (and its test): ``agreement``, ``compare_maps``, the CLI, the service's response
models, the MLflow summary and the figures take it from ``STATISTICS`` without another edit.
A statistic is asked in the questions it names (``Statistic.asked_in``); ``asked(question)``
lists them in their ``order``.
"""

from __future__ import annotations

import importlib
import pkgutil

from analysis.statistics.base import QUESTIONS, Statistic


def _discover() -> dict[str, Statistic]:
    """``{name: statistic}`` of every module here that defines ``STATISTICS``, in ``order``."""
    found: list[Statistic] = []
    for module in pkgutil.iter_modules(__path__):
        found += getattr(importlib.import_module(f"{__name__}.{module.name}"), "STATISTICS", ())
    names = [stat.name for stat in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"statistics defined twice: {', '.join(twice)}")
    return {stat.name: stat for stat in sorted(found, key=lambda stat: (stat.order, stat.name))}


STATISTICS: dict[str, Statistic] = _discover()
"""Every statistic by name, in ``order``."""


def asked(question: str) -> list[Statistic]:
    """The statistics ``question`` (one of ``QUESTIONS``) computes, in order."""
    if question not in QUESTIONS:
        raise ValueError(f"unknown question {question!r} (one of {QUESTIONS})")
    return [stat for stat in STATISTICS.values() if question in stat.asked_in]
