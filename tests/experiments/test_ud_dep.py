"""ud-dep: dependency arcs as tagging, each word's head as its clipped offset (our formulation)."""

import doctest
import types

import pytest
import torch

from experiments.tasks import TASKS, ud_dep
from experiments.tasks.parts import IGNORE_INDEX

ROW = "\t".join


def _conllu(path, heads_per_sentence):
    """A CoNLL-U file: one sentence per list of HEAD values (words w1, w2, ...), plus a
    multiword range and an empty node in the first sentence, which must not shift ids."""
    lines = []
    for s, heads in enumerate(heads_per_sentence):
        lines.append(f"# sent_id = {s}")
        for i, head in enumerate(heads, start=1):
            if s == 0 and i == 2:
                lines.append(ROW(["2-3", "w2w3", "_", "_", "_", "_", "_", "_", "_", "_"]))
            lines.append(ROW([str(i), f"w{i}", "_", "X", "_", "_", str(head), "dep", "_", "_"]))
            if s == 0 and i == 1:
                lines.append(ROW(["1.1", "e", "_", "_", "_", "_", "_", "_", "_", "_"]))
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_words_class_is_its_heads_offset_clipped_to_five():
    assert doctest.testmod(ud_dep).failed == 0
    assert len(ud_dep.LABEL_NAMES) == 13 and ud_dep.LABEL_NAMES[ud_dep.ROOT] == "root"
    assert [ud_dep.LABEL_NAMES[i] for i in ud_dep.FAR] == ["<-5", ">+5"]
    for word, head, name in [(1, 0, "root"), (7, 6, "-1"), (7, 2, "-5"), (7, 1, "<-5"), (1, 2, "+1"),
                             (1, 6, "+5"), (1, 7, ">+5"), (1, 40, ">+5")]:
        assert ud_dep.LABEL_NAMES[ud_dep.arc_label(word, head)] == name


def test_reads_heads_by_word_id_skipping_ranges_and_empty_nodes(tmp_path):
    path = _conllu(tmp_path / "t.conllu", [[2, 0, 2, 3, 2, 2, 2, 2, 2], [0]])
    words, labels = ud_dep.read_arcs("train", path)
    assert words == [[f"w{i}" for i in range(1, 10)], ["w1"]]
    assert [[ud_dep.LABEL_NAMES[x] for x in s] for s in labels] == [
        ["+1", "root", "-1", "-1", "-3", "-4", "-5", "<-5", "<-5"], ["root"]]


@pytest.mark.parametrize("head", ["_", "-1", "12", "2"])  # none, negative, past the sentence, itself
def test_a_bad_head_names_the_key_file_and_line(tmp_path, head):
    path = _conllu(tmp_path / "t.conllu", [[0, head, 2]])
    with pytest.raises(ValueError, match=rf"^task.dev: {path} sentence at line 2: word 2 \('w2'\) has HEAD '{head}'"):
        ud_dep.read_arcs("dev", path)


def test_reads_the_real_files(shared_data, minilm_tokenizer):
    words, labels = ud_dep.read_arcs("train", str(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"))
    assert len(words) == 2_001 and sum(map(len, labels)) == 25_147
    assert words[0] == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert [ud_dep.LABEL_NAMES[t] for t in labels[0]] == ["+2", "+1", "+1", "root", "+1", "-2", "-3"]
    flat = [t for s in labels for t in s]
    assert flat.count(ud_dep.ROOT) == 2_001  # one root per sentence
    cfg = types.SimpleNamespace(name="ud-dep", data_dir=None, max_train=30, max_eval=10, max_length=64, data_seed=0)
    TASKS["ud-dep"].check(cfg)
    data = ud_dep.load(cfg, minilm_tokenizer)
    assert (len(data.train), len(data.dev), data.num_labels) == (30, 10, 13)
    scored = data.train.labels[data.train.labels != IGNORE_INDEX]
    assert scored.numel() > 30 and scored.min() >= 0 and scored.max() < 13
    assert len(ud_dep.fingerprint(cfg)) == 16


def test_arc_accuracy_counts_only_heads_recovered_exactly():
    labels = torch.tensor([[0, 6, 7, 12, IGNORE_INDEX]])  # <-5, root, +1, >+5, not scored
    logits = torch.nn.functional.one_hot(torch.tensor([[0, 6, 8, 12, 3]]), 13).float()  # right, right, wrong, right
    metrics = ud_dep.compute_metrics(logits, labels)
    assert metrics == {"accuracy": 3 / 4, "arc_accuracy": 1 / 4}  # only root is a head named exactly and right
