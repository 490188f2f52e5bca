"""SST-2: binary sentiment of movie-review phrases (Socher et al. 2013; GLUE).

Files: `<data_dir or default>/sst2/{train,dev}.tsv`, GLUE-style TSV with the
header `sentence<TAB>label` and labels 0 (negative) / 1 (positive).

The shared copy's dev.tsv (6,735 rows) is not GLUE's 872-sentence dev set:
60,614 + 6,735 = 67,349 = GLUE's SST-2 train, i.e. a held-out tenth of the
train phrases. Phrases of one review sentence overlap heavily across the two
files, so accuracy here reads higher than published SST-2 dev numbers.
"""

from __future__ import annotations

from experiments.tasks._common import (
    ClassificationDecoder,
    TaskData,
    build_task_data,
    classification_accuracy,
    encode_sentences,
    read_glue_tsv,
    require_files,
    task_data_dir,
)

VERSION = "1"
KIND = "classification"
METRIC = "accuracy"

LABEL_NAMES = ("negative", "positive")
_SUBDIR = "sst2"
_FILES = {"train": "train.tsv", "dev": "dev.tsv"}


def check(cfg) -> None:
    """Raise FileNotFoundError if train.tsv or dev.tsv is missing."""
    require_files(cfg.name, task_data_dir(cfg, _SUBDIR), list(_FILES.values()))


def _read(cfg, split: str) -> tuple[list[str], list[int]]:
    texts, raw = read_glue_tsv(task_data_dir(cfg, _SUBDIR) / _FILES[split], "sentence", "label")
    return texts, [int(label) for label in raw]


def load(cfg, tokenizer) -> TaskData:
    """Read, subset (max_train / max_eval, drawn from data_seed) and tokenise both splits."""
    check(cfg)
    return build_task_data(cfg, tokenizer, lambda split: _read(cfg, split), encode_sentences, LABEL_NAMES)


build_decoder = ClassificationDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = classification_accuracy  # (logits, labels) -> {'accuracy': ...}
