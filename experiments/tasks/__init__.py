"""The tasks of headsweep: one plain module per task, registered in TASKS.

Each task module exposes exactly VERSION, KIND ("classification" | "tagging"),
METRIC, check(cfg), load(cfg, tokenizer) -> TaskData,
build_decoder(hidden_size, num_labels) -> nn.Module and
compute_metrics(logits, labels) -> dict[str, float]. Bump a task's VERSION
whenever its results would change.
"""

from __future__ import annotations

import difflib
from types import ModuleType

from experiments.tasks import sst2, synthetic_cls, synthetic_tag, ud_pos
from experiments.tasks._common import Split, TaskData

__all__ = ["TASKS", "Split", "TaskData", "get_task"]

TASKS: dict[str, ModuleType] = {
    "synthetic-cls": synthetic_cls,
    "synthetic-tag": synthetic_tag,
    "sst2": sst2,
    "ud-pos": ud_pos,
}


def get_task(name: str) -> ModuleType:
    """The task module called `name`; ValueError with a suggestion for unknown names."""
    try:
        return TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known tasks: {', '.join(TASKS)}"
        raise ValueError(f"unknown task '{name}'; {hint}") from None
