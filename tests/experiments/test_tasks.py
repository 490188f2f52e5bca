"""Tests for experiments/tasks: registry, synthetic and real tasks, tokenisation, decoders, metrics."""

import math
import types

import pytest
import torch

from experiments.tasks import (
    TASKS,
    Split,
    get_task,
    sst2,
    synthetic_cls,
    synthetic_cue,
    synthetic_tag,
    ud_pos,
)
from experiments.tasks.parts import (
    IGNORE_INDEX,
    default_data_dir,
    encode_words,
    read_conllu,
    read_glue_tsv,
    subset_indices,
)

INTERFACE = ("VERSION", "KIND", "METRIC", "check", "load", "fingerprint", "build_decoder", "compute_metrics")


def make_cfg(name, **overrides):
    """A tiny task config with the attributes the lead's config class has."""
    fields = dict(
        name=name, data_dir=None, max_train=None, max_eval=None, max_length=64,
        data_seed=0, num_train=64, num_eval=32,
    )  # fmt: skip
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


# --------------------------------------------------------------------------- registry


def test_registry_has_exactly_the_nine_tasks_with_the_full_interface():
    assert list(TASKS) == ["synthetic-cls", "synthetic-tag", "synthetic-cue", "synthetic-shortcut", "sst2", "ud-pos",
                           "ud-dep", "classification", "tagging"]
    for name, module in TASKS.items():
        missing = [attr for attr in INTERFACE if not hasattr(module, attr)]
        assert not missing, f"{name} lacks {missing}"
        assert isinstance(module.VERSION, str) and module.VERSION
        assert module.KIND in ("classification", "tagging")
        assert module.METRIC == "accuracy"
        assert all(callable(getattr(module, f)) for f in INTERFACE[3:])
    assert get_task("sst2") is sst2


def test_get_task_suggests_the_closest_name():
    with pytest.raises(ValueError, match=r"unknown task 'sst-2'; did you mean 'sst2'\?"):
        get_task("sst-2")
    with pytest.raises(ValueError, match="known tasks: synthetic-cls"):
        get_task("imagenet")


# --------------------------------------------------------------------------- synthetic tasks


@pytest.mark.parametrize("name", ["synthetic-cls", "synthetic-tag", "synthetic-cue"])
def test_synthetic_tasks_are_deterministic_per_data_seed(name, minilm_tokenizer):
    task = get_task(name)
    a = task.load(make_cfg(name, data_seed=3), minilm_tokenizer)
    b = task.load(make_cfg(name, data_seed=3), minilm_tokenizer)
    c = task.load(make_cfg(name, data_seed=4), minilm_tokenizer)
    assert (len(a.train), len(a.dev)) == (64, 32)
    assert torch.equal(a.train.input_ids, b.train.input_ids)
    assert torch.equal(a.dev.labels, b.dev.labels)
    assert a.train.input_ids.shape != c.train.input_ids.shape or not torch.equal(
        a.train.input_ids, c.train.input_ids
    )
    # train and dev are drawn independently
    assert not torch.equal(a.train.input_ids[:32, :8], a.dev.input_ids[:, :8])
    assert a.num_labels == len(a.label_names)


def test_synthetic_cls_is_balanced_and_follows_its_rule(minilm_tokenizer):
    data = synthetic_cls.load(
        make_cfg("synthetic-cls", num_train=100, num_eval=40), minilm_tokenizer
    )
    assert data.train.labels.sum().item() == 50 and data.dev.labels.sum().item() == 20
    texts, labels = synthetic_cls.generate(200, seed=7)
    negated = 0
    for text, label in zip(texts, labels, strict=True):
        words, score = text.split(), 0
        for i, word in enumerate(words):
            sign = (
                1 if word in synthetic_cls.POSITIVE else -1 if word in synthetic_cls.NEGATIVE else 0
            )
            flipped = i > 0 and words[i - 1] == synthetic_cls.NEGATION
            negated += bool(sign and flipped)
            score += -sign if flipped else sign
        assert score != 0 and (score > 0) == bool(label), text
    assert negated > 0


def test_synthetic_tag_has_words_whose_tag_depends_on_context():
    words, tags = synthetic_tag.generate(300, seed=1)
    seen: dict[str, set[int]] = {}
    for sentence, sentence_tags in zip(words, tags, strict=True):
        assert len(sentence) == len(sentence_tags)
        for word, tag in zip(sentence, sentence_tags, strict=True):
            seen.setdefault(word, set()).add(tag)
    ambiguous = {w for w, t in seen.items() if len(t) > 1}
    assert {"watch", "play", "light", "fast"} <= ambiguous


def _fillers(words, tags):
    """(word, position, sentence index, tag) of every filler: the words whose tag another word decides."""
    return [(w, i, n, t) for n, (sentence, sentence_tags) in enumerate(zip(words, tags, strict=True))
            for i, (w, t) in enumerate(zip(sentence, sentence_tags, strict=True)) if w in synthetic_cue.FILLERS]


def test_synthetic_cue_tags_each_word_with_the_topic_of_the_cue_to_its_left():
    words, tags = synthetic_cue.generate(500, seed=2)
    topic_of = {w: synthetic_cue.LABEL_NAMES.index(t) for t, cues in synthetic_cue.CUES.items() for w in cues}
    assert not set(topic_of) & set(synthetic_cue.FILLERS)
    distances = set()
    for sentence, sentence_tags in zip(words, tags, strict=True):
        assert sentence[0] in topic_of and 2 <= sum(w in topic_of for w in sentence) <= 3
        topics = [topic_of[w] for w in sentence if w in topic_of]
        assert all(a != b for a, b in zip(topics[:-1], topics[1:], strict=True))  # neighbouring clauses: different topics
        cue_at = 0
        for i, (word, tag) in enumerate(zip(sentence, sentence_tags, strict=True)):
            cue_at = i if word in topic_of else cue_at
            assert tag == topic_of[sentence[cue_at]]
            distances.add(i - cue_at)
    assert distances == set(range(5))  # the cue itself, and 1 to 4 words back


@pytest.fixture
def one_thread():
    """Small matrices: on a loaded machine a second thread only waits (30 s instead of 5)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_synthetic_cue_is_not_solved_without_context(one_thread):
    """What a token sees with every head closed (itself and its position) leaves a filler at chance,
    and a position-free bag of words of the sentence beside it (logistic regression) does little
    better: the tag is decided by which cue stands before the word, not by which cues are there."""
    train, dev = synthetic_cue.generate(2000, seed=0), synthetic_cue.generate(500, seed=1)
    train_fillers, dev_fillers = _fillers(*train), _fillers(*dev)
    # word and position: the majority tag of each (word, position) in train
    counts: dict[tuple[str, int], list[int]] = {}
    for w, i, _, t in train_fillers:
        counts.setdefault((w, i), [0] * 4)[t] += 1
    right = [t == max(range(4), key=counts.get((w, i), [1, 0, 0, 0]).__getitem__) for w, i, _, t in dev_fillers]
    assert 0.2 < sum(right) / len(right) < 0.32  # chance: 1/4
    # bag of words: the word (one-hot), its sentence's word counts and a bias; no positions
    vocab = {w: k for k, w in enumerate([*synthetic_cue.FILLERS, *sum(synthetic_cue.CUES.values(), ())])}

    def features(words, fillers):
        bags = torch.zeros(len(words), len(vocab))
        for n, sentence in enumerate(words):
            for w in sentence:
                bags[n, vocab[w]] += 1
        own = torch.nn.functional.one_hot(torch.tensor([vocab[w] for w, *_ in fillers]), len(vocab)).float()
        x = torch.cat([own, bags[[n for _, _, n, _ in fillers]], torch.ones(len(fillers), 1)], dim=1)
        return x, torch.tensor([t for *_, t in fillers])

    x, y = features(train[0], train_fillers)
    x_dev, y_dev = features(dev[0], dev_fillers)
    weight, targets = torch.zeros(x.shape[1], 4), torch.nn.functional.one_hot(y, 4).float()
    x_t = x.T.contiguous() / len(x)
    for _ in range(300):  # logistic regression: full-batch gradient descent on the cross-entropy
        weight -= x_t @ (torch.softmax(x @ weight, dim=1) - targets)
    fits = (x @ weight).argmax(-1).eq(y).float().mean().item()
    bag_accuracy = (x_dev @ weight).argmax(-1).eq(y_dev).float().mean().item()
    assert bag_accuracy < 0.6 and fits < 0.6, (bag_accuracy, fits)
    assert bag_accuracy > 0.35  # it does learn: the topics of the sentence's cues, 2 or 3 of the 4


def test_synthetic_check_rejects_empty_sizes():
    with pytest.raises(ValueError, match="num_train"):
        synthetic_cls.check(make_cfg("synthetic-cls", num_train=0))


# --------------------------------------------------------------------------- tokenisation


def test_tagging_labels_sit_on_first_subwords(minilm_tokenizer):
    split = encode_words(
        minilm_tokenizer, [["Hello", "unbelievably", "world"], ["a"]], [[1, 2, 3], [4]], 64
    )
    tokens = minilm_tokenizer.convert_ids_to_tokens(split.input_ids[0])
    assert tokens == ["[CLS]", "hello", "un", "##bel", "##ie", "##va", "##bly", "world", "[SEP]"]
    x = IGNORE_INDEX
    assert split.labels.tolist() == [[x, 1, 2, x, x, x, x, 3, x], [x, 4, x, x, x, x, x, x, x]]
    assert split.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    truncated = encode_words(minilm_tokenizer, [["Hello", "unbelievably", "world"]], [[1, 2, 3]], 4)
    assert truncated.labels.tolist() == [[x, 1, 2, x]]


def test_subset_is_random_seeded_and_in_file_order():
    a = subset_indices(1000, 10, data_seed=0, split="train")
    assert a == subset_indices(1000, 10, data_seed=0, split="train")
    assert a == sorted(set(a)) and a != list(range(10))
    assert a != subset_indices(1000, 10, data_seed=1, split="train")
    assert a != subset_indices(1000, 10, data_seed=0, split="dev")
    assert (
        subset_indices(5, None, 0, "train") == subset_indices(5, 9, 0, "train") == [0, 1, 2, 3, 4]
    )


def test_default_data_dir(monkeypatch, tmp_path, shared_data):
    monkeypatch.delenv("HEADSWEEP_DATA", raising=False)
    assert default_data_dir().resolve() == shared_data.resolve()
    monkeypatch.setenv("HEADSWEEP_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path


# --------------------------------------------------------------------------- real data


def test_sst2_reads_the_real_files(shared_data, minilm_tokenizer):
    texts, labels = read_glue_tsv(shared_data / "sst2" / "train.tsv", "sentence", "label")
    assert len(texts) == 60_614 and set(labels) == {"0", "1"}
    assert (texts[0], labels[0]) == ("when are bears bears and", "1")
    assert len(read_glue_tsv(shared_data / "sst2" / "dev.tsv", "sentence", "label")[0]) == 6_735
    cfg = make_cfg("sst2", data_dir=str(shared_data), max_train=50, max_eval=20, max_length=32)
    data = sst2.load(cfg, minilm_tokenizer)
    assert (len(data.train), len(data.dev)) == (50, 20)
    assert data.train.input_ids.shape[1] <= 32 and data.train.labels.shape == (50,)
    assert data.label_names == ("negative", "positive")
    other = sst2.load(make_cfg("sst2", max_train=50, max_eval=20, data_seed=1), minilm_tokenizer)
    assert not torch.equal(data.train.labels, other.train.labels) or not torch.equal(
        data.train.input_ids[:, :8], other.train.input_ids[:, :8]
    )


def test_ud_pos_reads_the_real_files(shared_data, minilm_tokenizer):
    words, tags = ud_pos.read_upos(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu")
    assert len(words) == 2_001 and sum(map(len, words)) == 25_147
    assert words[0] == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert [ud_pos.LABEL_NAMES[t] for t in tags[0]] == [
        "ADP", "DET", "PROPN", "VERB", "DET", "NOUN", "PUNCT"
    ]  # fmt: skip
    data = ud_pos.load(make_cfg("ud-pos", max_train=30, max_eval=10), minilm_tokenizer)
    assert (len(data.train), len(data.dev)) == (30, 10)
    assert data.num_labels == 17 and data.label_names[:3] == ("ADJ", "ADP", "ADV")
    scored = data.train.labels[data.train.labels != IGNORE_INDEX]
    assert scored.numel() > 30 and scored.min() >= 0 and scored.max() < 17
    assert data.train.labels[data.train.attention_mask == 0].eq(IGNORE_INDEX).all()


def test_conllu_reader_skips_comments_ranges_and_empty_nodes(tmp_path):
    path = tmp_path / "tiny.conllu"
    row = "\t".join
    lines = [
        "# text = I don't know.",
        row(["1", "I", "I", "PRON", "_", "_", "4", "nsubj", "_", "_"]),
        row(["2-3", "don't", "_", "_", "_", "_", "_", "_", "_", "_"]),
        row(["2", "do", "do", "AUX", "_", "_", "4", "aux", "_", "_"]),
        row(["3", "n't", "not", "PART", "_", "_", "4", "advmod", "_", "_"]),
        row(["3.1", "x", "x", "X", "_", "_", "_", "_", "_", "_"]),
        row(["4", "know", "know", "VERB", "_", "_", "0", "root", "_", "_"]),
        "",
        row(["1", "Hi", "hi", "INTJ", "_", "_", "0", "root", "_", "_"]),
    ]
    path.write_text("\n".join(lines) + "\n")
    sentences = read_conllu(path)
    assert [[r[1] for r in s] for s in sentences] == [["I", "do", "n't", "know"], ["Hi"]]
    assert [r[0] for r in sentences[0]] == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("name", "first_file"), [("sst2", "train.tsv"), ("ud-pos", "en_ewt-ud-dev.conllu"), ("ud-dep", "en_ewt-ud-dev.conllu")]
)
def test_check_load_and_fingerprint_name_the_missing_file_and_folder(name, first_file, tmp_path):
    task, cfg = get_task(name), make_cfg(name, data_dir=str(tmp_path))
    for call in (task.check, task.fingerprint, lambda cfg: task.load(cfg, tokenizer=None)):
        with pytest.raises(FileNotFoundError) as err:
            call(cfg)
        assert first_file in str(err.value) and str(tmp_path) in str(err.value)


# --------------------------------------------------------------------------- decoders and metrics


@pytest.mark.parametrize("name", list(TASKS))
def test_decoders_give_the_right_shapes(name):
    task = get_task(name)
    decoder = task.build_decoder(16, 5)
    logits = decoder(torch.randn(2, 7, 16), torch.ones(2, 7, dtype=torch.long))
    assert logits.shape == ((2, 5) if task.KIND == "classification" else (2, 7, 5))


def test_metrics_by_hand():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])  # argmax 0, 1, 0, 1
    assert sst2.compute_metrics(logits, torch.tensor([0, 1, 1, 1])) == {"accuracy": 0.75}
    # argmax per token: 0, 1, 2, 0; the -100 position (predicted 1, label unknown) is ignored.
    tag_logits = torch.eye(3)[[0, 1, 2, 0]].unsqueeze(0)  # (1, 4, 3)
    labels = torch.tensor([[0, IGNORE_INDEX, 2, 1]])
    assert ud_pos.compute_metrics(tag_logits, labels)["accuracy"] == pytest.approx(2 / 3)
    assert math.isnan(
        ud_pos.compute_metrics(tag_logits, torch.full((1, 4), IGNORE_INDEX))["accuracy"]
    )


def test_split_rejects_mismatched_shapes():
    ids = torch.zeros(3, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="labels"):
        Split(input_ids=ids, attention_mask=ids, labels=torch.zeros(2, dtype=torch.long))
    assert (
        len(Split(input_ids=ids, attention_mask=ids, labels=torch.zeros(3, dtype=torch.long))) == 3
    )
