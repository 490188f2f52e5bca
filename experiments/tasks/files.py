"""The glue every task that reads files shares, written once.

A file task (``classification``, ``tagging``, and the built-ins over the shared data: ``sst2``,
``ud-pos``, ``ud-dep``) names its files as ``Source`` s (train, dev, then the evaluation sets);
its checks run at submit and are cached by the files' content; its fingerprint is their content
hash. A task described by a ``spec(cfg)`` (anything with ``.sources``), its ``read_all(spec)``
(read and check every file) and ``load_spec`` gets the ``check``, ``load`` and ``fingerprint``
of the task contract from :func:`file_task`, so a built-in task is its spec and one line.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from experiments.tasks.parts import TaskData, require_files, task_data_dir
from experiments.tasks.sources import Source, fingerprint_sources

_CHECKED: set[tuple[Hashable, str]] = set()
"""(what, content hash) pairs already checked: a 1,000-cell grid over the same files reads them once."""


def check_once(what: Hashable, sources: Sequence[Source], read: Callable[[], object]) -> None:
    """Run ``read()`` (it raises on bad content) unless ``what`` over the same content passed before.

    ``what``: how the files are read (a task's spec, or its name when nothing else varies); the
    same files read another way are checked again."""
    key = (what, fingerprint_sources(sources))
    if key not in _CHECKED:
        read()
        _CHECKED.add(key)


def fixed_sources(cfg, subdir: str, files: Mapping[str, str], fmt: str) -> tuple[Source, ...]:
    """A built-in task's files by role (``files``: role -> file name) in ``<data_dir or
    default>/<subdir>``, all of format ``fmt``; FileNotFoundError naming the first one missing."""
    folder = task_data_dir(cfg, subdir)
    require_files(cfg.name, folder, list(files.values()))
    return tuple(Source(role, str(folder / name), fmt) for role, name in files.items())


def eval_set_names(sources: Sequence[Source]) -> list[str]:
    """The names of the evaluation sets among ``sources``: the roles ``eval_sets.<name>`` after train and dev."""
    return [source.role.removeprefix("eval_sets.") for source in sources[2:]]


def file_task(
    spec: Callable[[Any], Any], read_all: Callable[[Any], object], load_spec: Callable[[Any, Any, Any], TaskData],
) -> tuple[Callable[[Any], None], Callable[[Any, Any], TaskData], Callable[[Any], str]]:
    """The task contract's ``check``, ``load`` and ``fingerprint`` of a task whose config ``cfg``
    reads the files ``spec(cfg).sources``: ``read_all(spec)`` reads and checks them all (raising
    on bad content), ``load_spec(spec, cfg, tokenizer)`` loads them. ``spec`` fails first on a
    missing file."""

    def check(cfg) -> None:
        """Check the files, columns and labels of the config (cached by content); one-line ValueError."""
        s = spec(cfg)
        check_once(s, s.sources, lambda: read_all(s))

    def load(cfg, tokenizer) -> TaskData:
        """Read, check, subset (max_train / max_eval, drawn from data_seed) and tokenise every file."""
        return load_spec(spec(cfg), cfg, tokenizer)

    def fingerprint(cfg) -> str:
        """Content hash (16 hex) of every file the task reads, roles included."""
        return fingerprint_sources(spec(cfg).sources)

    return check, load, fingerprint
