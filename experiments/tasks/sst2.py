"""SST-2: binary sentiment of movie-review phrases (Socher et al. 2013; GLUE).

Files: `<data_dir or default>/sst2/{train,dev}.tsv`, GLUE-style TSV with the
header `sentence<TAB>label` and labels 0 (negative) / 1 (positive). A fixed
configuration of the general `classification` task (same reader, checks and
content hash).

The shared copy's dev.tsv (6,735 rows) is not GLUE's 872-sentence dev set:
60,614 + 6,735 = 67,349 = GLUE's SST-2 train, i.e. a held-out tenth of the
train phrases. Phrases of one review sentence overlap heavily across the two
files, so accuracy here reads higher than published SST-2 dev numbers.
"""

from __future__ import annotations

from experiments.tasks import classification, reads
from experiments.tasks.files import file_task, fixed_sources
from experiments.tasks.parts import ClassificationDecoder, classification_accuracy

VERSION = "1"
KIND = "classification"
METRIC = "accuracy"
READS = reads.SHARED_FILES  # the task.* keys it reads; any other set is refused

LABEL_NAMES = ("negative", "positive")
_SUBDIR = "sst2"
_FILES = {"train": "train.tsv", "dev": "dev.tsv"}


def spec(cfg) -> classification.Spec:
    """The files, columns and labels of SST-2 as a classification Spec; FileNotFoundError if
    train.tsv or dev.tsv is missing."""
    sources = fixed_sources(cfg, _SUBDIR, _FILES, "tsv")
    return classification.Spec(sources, ("sentence",), "label", labels=("0", "1"), names=LABEL_NAMES)


check, load, fingerprint = file_task(spec, classification.read_all, classification.load_spec)


build_decoder = ClassificationDecoder  # (hidden_size, num_labels) -> nn.Module


compute_metrics = classification_accuracy  # (logits, labels) -> {'accuracy': ...}
