"""synthetic-shortcut: a generated task with a planted marker word that agrees with the label
in train and dev but not in the `ood` evaluation set. That full fine-tuning of MiniLM learns the
shortcut is the real lane's (tests/real/test_shortcut.py, `make real`)."""

import types

import torch

from experiments.tasks import get_task, synthetic_cls, synthetic_shortcut

TASK = synthetic_shortcut


def make_cfg(**overrides):
    fields = dict(name="synthetic-shortcut", data_dir=None, max_train=None, max_eval=None, max_length=64,
                  data_seed=0, num_train=200, num_eval=100) | overrides  # fmt: skip
    return types.SimpleNamespace(**fields)


def splits(data):
    return {"train": data.train, "dev": data.dev, "ood": data.eval_sets["ood"]}


def agreement(split) -> float:
    """Fraction of examples whose marker (the argmax of the marker counts) is the label."""
    assert torch.equal(split.features.sum(dim=1), torch.ones(len(split)))  # exactly one marker each
    return (split.features.argmax(dim=1) == split.labels).double().mean().item()


def test_it_is_registered_and_deterministic_per_data_seed(minilm_tokenizer):
    assert get_task("synthetic-shortcut") is TASK and TASK.fingerprint(make_cfg()) is None
    a, b = TASK.load(make_cfg(data_seed=3), minilm_tokenizer), TASK.load(make_cfg(data_seed=3), minilm_tokenizer)
    c = TASK.load(make_cfg(data_seed=4), minilm_tokenizer)
    assert list(a.eval_sets) == ["ood"] and a.label_names == ("negative", "positive")
    for name, split in splits(a).items():
        other = splits(b)[name]
        for field in ("input_ids", "attention_mask", "labels", "features"):
            assert torch.equal(getattr(split, field), getattr(other, field)), (name, field)
        assert split.features.dtype == torch.float32 and split.features.shape == (len(split), 2)
    assert (len(a.train), len(a.dev), len(a.eval_sets["ood"])) == (200, 100, 100)
    assert not torch.equal(a.train.input_ids[:100, :8], c.train.input_ids[:100, :8])
    assert not torch.equal(a.dev.input_ids[:, :8], a.eval_sets["ood"].input_ids[:, :8])  # independent draws
    subset = TASK.load(make_cfg(data_seed=3, max_train=50, max_eval=20), minilm_tokenizer)
    assert (len(subset.train), len(subset.dev), len(subset.eval_sets["ood"])) == (50, 20, 20)
    assert subset.train.features.shape == (50, 2)


def test_the_marker_agrees_at_the_stated_rate_in_train_and_dev_and_not_in_ood(minilm_tokenizer):
    data = TASK.load(make_cfg(num_train=1000, num_eval=400), minilm_tokenizer)
    assert TASK.SHORTCUT_RATE == 0.9 and TASK.OOD_RATE == 0.5
    assert agreement(data.train) == 0.9 and agreement(data.dev) == 0.9  # exact, per class
    assert agreement(data.eval_sets["ood"]) == 0.5  # uncorrelated
    for split in splits(data).values():
        half = len(split) // 2
        assert split.labels.sum().item() == half  # balanced labels ...
        assert split.features[:, 1].sum().item() == half  # ... and balanced markers
    texts, labels = TASK.generate(40, seed=1, agreement=0.0)  # the rate is exact at any value
    assert all(TASK.MARKERS[1 - y] in text.split() for text, y in zip(texts, labels, strict=True))
    texts, labels = TASK.generate(40, seed=1, agreement=0.5)
    assert sum(TASK.MARKERS[y] in text.split() for text, y in zip(texts, labels, strict=True)) == 20


def test_the_label_follows_synthetic_cls_rule_whatever_the_marker():
    texts, labels = TASK.generate(300, seed=7, agreement=0.5)
    for text, label in zip(texts, labels, strict=True):
        words = [w for w in text.split() if w not in TASK.MARKERS]
        assert len(words) == len(text.split()) - 1
        score = 0
        for i, word in enumerate(words):
            sign = 1 if word in synthetic_cls.POSITIVE else -1 if word in synthetic_cls.NEGATIVE else 0
            score += -sign if i > 0 and words[i - 1] == synthetic_cls.NEGATION else sign
        assert abs(score) == TASK.MARGIN and (score > 0) == bool(label), text  # the majority wins by one
    assert not set(TASK.MARKERS) & set(synthetic_cls.POSITIVE + synthetic_cls.NEGATIVE + synthetic_cls.FILLER)


def test_synthetic_cls_data_is_unchanged_by_the_shared_helpers():
    """synthetic-cls keeps VERSION 1: factoring make_chunks out must not move its RNG draws."""
    texts, labels = synthetic_cls.generate(3, seed=0)  # pinned before the refactoring
    assert labels == [0, 0, 1]
    assert texts == ["but seemed its dull at music but is quite",
                     "its script very director not great awful its really rather story",
                     "annoying not annoying really overall cast very but beautiful and good"]

