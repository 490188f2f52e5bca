"""The tasks of headsweep: one plain module per task, registered in TASKS.

Each task module exposes VERSION, KIND ("classification" | "tagging"), METRIC,
check(cfg), load(cfg, tokenizer) -> TaskData, fingerprint(cfg) -> str | None,
build_decoder(hidden_size, num_labels) -> nn.Module and
compute_metrics(logits, labels) -> dict[str, float]. Bump a task's VERSION
whenever its results would change for the same files.

Tasks from your own files (DESIGN.md, decision 11):

- ``classification``: one text or a text pair with any label set, from TSV,
  CSV, JSONL or an hf ``save_to_disk`` folder (keys ``train``, ``dev``,
  ``eval_sets``, ``text``, ``label``, ``labels``, ``format``); see
  experiments/tasks/classification.py and examples/run_my_csv.yaml.
- ``tagging``: CoNLL-U (any column: ``column: upos | xpos | deprel``), BIO
  files or an hf folder; see experiments/tasks/tagging.py.

Relative paths are resolved once, when the config is validated, against
``task.data_dir`` (else the current directory). Each extra evaluation set
``eval_sets: {ood: path}`` adds metrics named ``<metric>/ood``.

``check`` runs at submit and fails with one line (missing file, unknown
format, missing column, empty file, an evaluation label never seen in train,
undecodable text); ``fingerprint`` is the content hash of every file a task
reads (None for generated data), so a changed file never reuses a result.
Built-ins: ``sst2`` and ``ud-pos`` are fixed configurations of the general
tasks over the shared data; ``synthetic-cls`` and ``synthetic-tag`` generate
their data from ``data_seed``.
"""

from __future__ import annotations

from types import ModuleType

from experiments.naming import suggest
from experiments.tasks import classification, sst2, synthetic_cls, synthetic_tag, tagging, ud_pos
from experiments.tasks._common import Split, TaskData

__all__ = ["TASKS", "Split", "TaskData", "get_task"]

TASKS: dict[str, ModuleType] = {
    "synthetic-cls": synthetic_cls,
    "synthetic-tag": synthetic_tag,
    "sst2": sst2,
    "ud-pos": ud_pos,
    "classification": classification,
    "tagging": tagging,
}


def get_task(name: str) -> ModuleType:
    """The task module called `name`; ValueError with a suggestion for unknown names."""
    try:
        return TASKS[name]
    except KeyError:
        hint = suggest(name, TASKS) or f"; known tasks: {', '.join(TASKS)}"
        raise ValueError(f"unknown task '{name}'{hint}") from None
