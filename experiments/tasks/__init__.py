"""The tasks of headsweep: one plain module per task, registered in TASKS.

Each task module exposes VERSION, KIND ("classification" | "tagging"), METRIC,
READS (the ``task.*`` keys it reads, experiments/tasks/reads.py: any other key set is
refused at validation, :func:`unread_key`), check(cfg), load(cfg, tokenizer) -> TaskData, fingerprint(cfg) -> str | None,
build_decoder(hidden_size, num_labels) -> nn.Module and
compute_metrics(logits, labels) -> dict[str, float]. Bump a task's VERSION
whenever its results would change for the same files. A task that reads files gets
check / load / fingerprint from ``files.file_task`` over its spec, a generated one from
``parts.generated_task`` over its generator: the glue is written once.

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
tasks over the shared data; ``ud-dep`` tags each UD word with its head's offset
(dependency arcs as tagging, experiments/tasks/ud_dep.py); ``synthetic-cls``,
``synthetic-tag`` and ``synthetic-cue`` generate their data from ``data_seed`` (synthetic-cue:
each word tagged with the topic of a cue word 1-4 positions to its left, so it needs attention;
the demo's task); ``synthetic-shortcut``
is synthetic-cls with a planted shortcut (a marker word that agrees with the label
90 % of the time in train and dev) and an ``ood`` evaluation set where it does not.

Bias features (debiasing with a bias model, DESIGN.md decision 10): a task MAY
also expose ``bias_feature_names(cfg) -> tuple[str, ...]`` (ValueError naming
the key when this config has none) and ``bias_features(cfg, inputs) -> (N, F)``
float32 tensor of hand-crafted features of raw examples; its ``load`` then fills
``Split.features`` of every split. ``synthetic-shortcut``: the marker counts;
``classification`` with a text pair: word-overlap, negation and hashed
hypothesis-only bag-of-words features. Use :func:`bias_feature_names` here,
which says clearly when a task defines none.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from types import ModuleType

from base.naming import suggest
from experiments.tasks import (
    classification,
    sst2,
    synthetic_cls,
    synthetic_cue,
    synthetic_shortcut,
    synthetic_tag,
    tagging,
    ud_dep,
    ud_pos,
)
from experiments.tasks.parts import Split, TaskData

__all__ = ["TASKS", "Split", "TaskData", "bias_feature_names", "data_label", "get_task", "unread_key"]

TASKS: dict[str, ModuleType] = {
    "synthetic-cls": synthetic_cls,
    "synthetic-tag": synthetic_tag,
    "synthetic-cue": synthetic_cue,
    "synthetic-shortcut": synthetic_shortcut,
    "sst2": sst2,
    "ud-pos": ud_pos,
    "ud-dep": ud_dep,
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


def bias_feature_names(task_cfg) -> tuple[str, ...]:
    """The names of the bias features the task defines for this config, in column order of
    ``Split.features``. ValueError, one line naming the key, when it defines none: a task
    without ``bias_feature_names`` ("task.name: task 'sst2' defines no bias features ..."), or
    the task's own reason for this config (classification with one text column)."""
    module = get_task(task_cfg.name)
    names = getattr(module, "bias_feature_names", None)
    if names is None:
        with_features = ", ".join(name for name, m in TASKS.items() if hasattr(m, "bias_feature_names"))
        raise ValueError(f"task.name: task '{task_cfg.name}' defines no bias features "
                         f"(tasks that do: {with_features})")
    return names(task_cfg)


def unread_key(task_cfg, also: Collection[str] = ()) -> str | None:
    """The first key of ``task_cfg`` set away from its default that its task does not read
    (``READS``, or ``also``: keys a stage reads), else None. Such a key would enter the run key and
    change nothing else, and a user's ``train`` file under the default ``synthetic-cls`` would be a
    run on synthetic data labelled as theirs. None for an unknown task (``check_names`` names it)."""
    module = TASKS.get(task_cfg.name)
    if module is None:
        return None
    for key, field in type(task_cfg).model_fields.items():
        if key not in module.READS and key not in also and getattr(task_cfg, key) != field.get_default(
                call_default_factory=True):
            return key
    return None


def data_label(task_cfg, fingerprint: str | None) -> str:
    """What a run's data is, short enough for a table cell: a generated task's name and
    ``data_seed`` (``synthetic-cls(data_seed=0)``), or the files' folder and names with the first 8
    hex of their content hash (``data/train.tsv+dev.tsv#1a2b3c4d``; ``hf:glue/sst2#...`` for a
    hub dataset). ``fingerprint`` None (files not there yet): the names alone."""
    module = TASKS[task_cfg.name]
    if "num_train" in module.READS:  # generated
        return f"{task_cfg.name}(data_seed={task_cfg.data_seed})"
    try:  # a file task's files: its spec's (ud-dep: its own sources)
        sources = module.sources(task_cfg) if hasattr(module, "sources") else module.spec(task_cfg).sources
    except (FileNotFoundError, ValueError):
        return task_cfg.name
    if sources[0].format == "hub":
        names = f"hf:{sources[0].path}" + (f"/{sources[0].config}" if sources[0].config else "")
    else:
        folders = {os.path.dirname(source.path) for source in sources}
        where = (os.path.basename(folders.pop()) + "/") if len(folders) == 1 else ""
        names = where + "+".join(os.path.basename(source.path) if where else source.path for source in sources)
    return names + (f"#{fingerprint[:8]}" if fingerprint else "")
