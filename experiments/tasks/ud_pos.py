"""UD POS: universal part-of-speech (UPOS) tagging on the English Web Treebank.

Files: `<data_dir or default>/ud_ewt/en_ewt-ud-{dev,test}.conllu`. Only the dev
and test splits of UD English-EWT ship with the shared data, so this task
TRAINS on the UD dev file and EVALUATES on the UD test file (its `dev` split is
UD's test set). A fixed configuration of the general `tagging` task (column
UPOS, the 17 UD tags in a fixed order): comment lines, multiword-token ranges
and empty nodes are skipped; each word's first subword carries its tag.
"""

from __future__ import annotations

from experiments.tasks import reads, tagging
from experiments.tasks.files import file_task, fixed_sources
from experiments.tasks.parts import TaggingDecoder, tagging_accuracy
from experiments.tasks.sources import Source

VERSION = "1"
KIND = "tagging"
METRIC = "accuracy"
READS = reads.SHARED_FILES  # the task.* keys it reads; any other set is refused

# The 17 UPOS tags in the order of the UD documentation: fixed label ids.
LABEL_NAMES = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip
_TAG_ID = {tag: i for i, tag in enumerate(LABEL_NAMES)}
_SUBDIR = "ud_ewt"
_FILES = {"train": "en_ewt-ud-dev.conllu", "dev": "en_ewt-ud-test.conllu"}


def spec(cfg) -> tagging.Spec:
    """The files, column and tag set of UD POS as a tagging Spec; FileNotFoundError if either
    CoNLL-U file is missing."""
    return tagging.Spec(fixed_sources(cfg, _SUBDIR, _FILES, "conllu"), "upos", labels=LABEL_NAMES)


check, load, fingerprint = file_task(spec, tagging.read_all, tagging.load_spec)


def read_upos(path) -> tuple[list[list[str]], list[list[int]]]:
    """Words and UPOS label ids per sentence of a CoNLL-U file."""
    examples = tagging.read_examples(Source("train", str(path), "conllu"), tagging.Spec((), "upos"))
    unknown = {tag for tags in examples.tags for tag in tags} - _TAG_ID.keys()
    if unknown:
        raise ValueError(f"{path}: UPOS tag(s) {sorted(unknown)} not in the 17 UD tags")
    return examples.words, [[_TAG_ID[t] for t in tags] for tags in examples.tags]


build_decoder = TaggingDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = tagging_accuracy  # (logits, labels) -> {'accuracy': ...}
