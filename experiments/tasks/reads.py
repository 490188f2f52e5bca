"""Which ``task.*`` keys each task reads, and the one line for a key it does not.

A key that no code of the chosen task reads would still enter the run key (every key set
does) and change nothing else: ``task: {train: my.tsv}`` without ``name`` would train on the
default ``synthetic-cls`` under the user's label. So each task module declares ``READS`` (its
keys, built from the groups below) and validation refuses any other key set away from its
default (issue 43). tests/experiments/test_task_reads.py checks each declaration against
what the task's code consults.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

EVERY_TASK = ("name", "id", "max_train", "max_eval", "max_length", "data_seed")
"""Read by every task: the name picks it, the id labels its runs, the rest subset and tokenise."""
GENERATED = (*EVERY_TASK, "num_train", "num_eval")
"""A task that generates its data from ``data_seed`` (the ``synthetic-*`` tasks)."""
SHARED_FILES = (*EVERY_TASK, "data_dir")
"""A built-in task over fixed files of the shared data (sst2, ud-pos, ud-dep): only where they are."""
_USER_FILES = (*SHARED_FILES, "train", "dev", "eval_sets", "format", "text", "labels", "hf", "hf_config")
CLASSIFICATION = (*_USER_FILES, "label", "columns")
"""The ``classification`` task over the user's files (tsv/csv: ``columns`` for a file without a header)."""
TAGGING = (*_USER_FILES, "column")
"""The ``tagging`` task over the user's files (its tags from ``column``)."""

FILE_KEYS = ("train", "dev", "eval_sets", "format", "text", "label", "labels", "column", "columns", "hf", "hf_config")
"""The keys that describe a user's files: a task that reads none of them reads no files of the user's."""


def readers(key: str, tasks: Mapping[str, ModuleType]) -> list[str]:
    """The tasks whose ``READS`` has ``key``, in ``tasks`` order."""
    return [name for name, module in tasks.items() if key in module.READS]


def unread_line(key: str, name: str, tasks: Mapping[str, ModuleType], *, prefix: str = "task",
                name_written: bool = True) -> str:
    """``task.train: the synthetic-cls task reads no files; the file tasks read it (set task.name:
    classification or tagging)``: the key, why task ``name`` ignores it, and which tasks read it."""
    module = tasks[name]
    which = f"the {name} task"
    if key in FILE_KEYS and not set(FILE_KEYS) & set(module.READS):
        why = "reads no files" if "data_dir" not in module.READS else f"reads its own files (under {prefix}.data_dir)"
    else:
        why = f"does not read {prefix}.{key}"
    if not name_written:  # the user named no task: say where this one came from
        why += f" ({prefix}.name is unset, and {name} is its default)"
    found = readers(key, tasks)
    if set(found) == {"classification", "tagging"}:
        who = "the file tasks read it"
    elif found:
        who = f"{'the ' + found[0] + ' task reads' if len(found) == 1 else 'the tasks ' + ', '.join(found) + ' read'} it"
    else:
        return f"{prefix}.{key}: {which} {why}, nor does any task"
    return f"{prefix}.{key}: {which} {why}; {who} (set {prefix}.name: {' or '.join(found)})"
