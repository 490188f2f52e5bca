"""UD POS: universal part-of-speech (UPOS) tagging on the English Web Treebank.

Files: `<data_dir or default>/ud_ewt/en_ewt-ud-{dev,test}.conllu`. Only the dev
and test splits of UD English-EWT ship with the shared data, so this task
TRAINS on the UD dev file and EVALUATES on the UD test file (its `dev` split is
UD's test set). Comment lines, multiword-token ranges and empty nodes are
skipped; each word's first subword carries its tag.
"""

from __future__ import annotations

from experiments.tasks._common import (
    TaggingDecoder,
    TaskData,
    build_task_data,
    encode_words,
    read_conllu,
    require_files,
    tagging_accuracy,
    task_data_dir,
)

VERSION = "1"
KIND = "tagging"
METRIC = "accuracy"

# The 17 UPOS tags in the order of the UD documentation: fixed label ids.
LABEL_NAMES = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip
_TAG_ID = {tag: i for i, tag in enumerate(LABEL_NAMES)}
_SUBDIR = "ud_ewt"
_FILES = {"train": "en_ewt-ud-dev.conllu", "dev": "en_ewt-ud-test.conllu"}
_FORM, _UPOS = 1, 3  # CoNLL-U columns


def check(cfg) -> None:
    """Raise FileNotFoundError if either CoNLL-U file is missing."""
    require_files(cfg.name, task_data_dir(cfg, _SUBDIR), list(_FILES.values()))


def read_upos(path) -> tuple[list[list[str]], list[list[int]]]:
    """Words and UPOS label ids per sentence of a CoNLL-U file."""
    words, tags = [], []
    for sentence in read_conllu(path):
        unknown = {row[_UPOS] for row in sentence} - _TAG_ID.keys()
        if unknown:
            raise ValueError(f"{path}: UPOS tag(s) {sorted(unknown)} not in the 17 UD tags")
        words.append([row[_FORM] for row in sentence])
        tags.append([_TAG_ID[row[_UPOS]] for row in sentence])
    return words, tags


def load(cfg, tokenizer) -> TaskData:
    """Read, subset (max_train / max_eval sentences, drawn from data_seed) and tokenise."""
    check(cfg)
    read = lambda split: read_upos(task_data_dir(cfg, _SUBDIR) / _FILES[split])  # noqa: E731
    return build_task_data(cfg, tokenizer, read, encode_words, LABEL_NAMES)


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = tagging_accuracy  # (logits, labels) -> {'accuracy': ...}
