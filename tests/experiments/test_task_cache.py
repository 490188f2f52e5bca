"""The tokenised-data cache (experiments/tasks/cache.py): a hit equals a fresh tokenisation, a changed
file or tokenizer is a new entry, writes are atomic, and a broken entry is rebuilt."""

import copy
import threading

import pytest
import torch

from base.sections import TaskConfig
from experiments.tasks import TASKS, cache
from experiments.tasks.cache import cache_folder, data_key, load_task, tokenizer_fingerprint

SHORTCUT = {"name": "synthetic-shortcut", "num_train": 40, "num_eval": 12, "max_length": 16}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def loads(monkeypatch):
    """Counts the tasks' own (real) loads: what a cache hit skips."""
    counted = []
    for name, module in TASKS.items():
        real = module.load
        monkeypatch.setattr(module, "load", lambda cfg, tok, real=real, name=name: counted.append(name) or real(cfg, tok))
    return counted


def assert_same(a, b):
    """Two TaskData hold equal tensors of the same dtypes, split by split."""
    assert (a.num_labels, a.label_names, set(a.eval_sets)) == (b.num_labels, b.label_names, set(b.eval_sets))
    for x, y in [(a.train, b.train), (a.dev, b.dev)] + [(a.eval_sets[k], b.eval_sets[k]) for k in a.eval_sets]:
        for field in ("input_ids", "attention_mask", "labels", "features"):
            p, q = getattr(x, field), getattr(y, field)
            assert (p is None) == (q is None), field
            if p is not None:
                assert p.dtype == q.dtype and torch.equal(p, q), field


@pytest.mark.parametrize("task", [
    {"name": "sst2", "max_train": 300, "max_eval": 50, "max_length": 32, "data_seed": 3},  # real files
    {"name": "ud-pos", "max_train": 40, "max_eval": 10, "max_length": 32},  # tagging: labels (N, T)
    SHORTCUT,  # generated, with bias features and an ood evaluation set
])
def test_a_hit_equals_a_fresh_tokenisation(home, loads, minilm_tokenizer, task):
    cfg = TaskConfig(**task)
    fresh = TASKS[cfg.name].load(cfg, minilm_tokenizer)
    first = load_task(cfg, minilm_tokenizer)
    second = load_task(cfg, minilm_tokenizer)
    assert loads == [cfg.name, cfg.name]  # the fresh one and the first through the cache; the second a hit
    assert [p.name for p in cache_folder().iterdir()] == [f"{data_key(cfg, minilm_tokenizer)}.pt"]
    assert_same(first, fresh)
    assert_same(second, fresh)


def test_another_subset_is_another_entry(home, loads, minilm_tokenizer):
    load_task(TaskConfig(**SHORTCUT), minilm_tokenizer)
    load_task(TaskConfig(**SHORTCUT, data_seed=1), minilm_tokenizer)
    load_task(TaskConfig(**SHORTCUT | {"max_length": 24}), minilm_tokenizer)
    assert len(loads) == 3 and len(list(cache_folder().iterdir())) == 3


def test_a_changed_file_is_tokenised_again(home, loads, tmp_path, minilm_tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n")
    (data / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    cfg = TaskConfig(name="classification", data_dir=str(data), train="train.tsv", dev="dev.tsv", text="sentence")
    before = load_task(cfg, minilm_tokenizer)
    assert_same(load_task(cfg, minilm_tokenizer), before) and len(loads) == 1
    (data / "train.tsv").write_text("sentence\tlabel\na truly wonderful film\t1\na dull film\t0\n")
    after = load_task(cfg, minilm_tokenizer)
    assert len(loads) == 2 and len(list(cache_folder().iterdir())) == 2
    assert_same(after, TASKS["classification"].load(cfg, minilm_tokenizer))
    assert not torch.equal(after.train.input_ids[:, :4], before.train.input_ids[:, :4])


def test_a_changed_tokenizer_is_tokenised_again(home, loads, minilm_tokenizer):
    """Same name, another vocabulary: the key follows what the tokenizer does, not what it is called."""
    other = copy.deepcopy(minilm_tokenizer)
    other.add_tokens(["pari"])  # an added token splits "paris" (a marker word of the shortcut sentences) apart
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(minilm_tokenizer)
    assert other.name_or_path == minilm_tokenizer.name_or_path
    cfg = TaskConfig(**SHORTCUT)
    ours = load_task(cfg, minilm_tokenizer)
    theirs = load_task(cfg, other)
    assert len(loads) == 2
    assert_same(theirs, TASKS[cfg.name].load(cfg, other))
    assert not torch.equal(ours.train.input_ids, theirs.train.input_ids)


def test_the_fingerprint_ignores_what_a_call_sets(minilm_tokenizer):
    """Each call sets the backend's truncation and padding: the same tokenizer keeps its key."""
    before = tokenizer_fingerprint(minilm_tokenizer)
    minilm_tokenizer(["a b c"], truncation=True, max_length=9, padding="max_length")
    assert tokenizer_fingerprint(minilm_tokenizer) == before


def test_the_fingerprint_follows_the_normaliser_and_the_sides(minilm_tokenizer):
    from tokenizers import normalizers

    cased = copy.deepcopy(minilm_tokenizer)
    cased.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    left = copy.deepcopy(minilm_tokenizer)
    left.padding_side = "left"
    prints = {tokenizer_fingerprint(t) for t in (minilm_tokenizer, cased, left)}
    assert len(prints) == 3


def test_runs_loading_at_once_write_one_whole_entry(home, loads, minilm_tokenizer):
    cfg = TaskConfig(**SHORTCUT)
    results, barrier = [], threading.Barrier(4)

    def one():
        barrier.wait()
        results.append(load_task(cfg, minilm_tokenizer))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    for data in results:
        assert_same(data, results[0])
    assert [p.name for p in cache_folder().iterdir()] == [f"{data_key(cfg, minilm_tokenizer)}.pt"]  # no temp files


def test_an_interrupted_write_leaves_no_entry(home, monkeypatch, minilm_tokenizer):
    cfg = TaskConfig(**SHORTCUT)

    def dies(obj, path):
        path.write_bytes(b"half a fi")
        raise OSError("disk full")

    monkeypatch.setattr(cache.torch, "save", dies)
    data = load_task(cfg, minilm_tokenizer)  # the run goes on uncached
    assert data.train.input_ids.shape[0] == 40
    assert list(cache_folder().iterdir()) == []


def test_an_unreadable_entry_is_rebuilt(home, loads, minilm_tokenizer, caplog):
    cfg = TaskConfig(**SHORTCUT)
    good = load_task(cfg, minilm_tokenizer)
    (cache_folder() / f"{data_key(cfg, minilm_tokenizer)}.pt").write_bytes(b"not a torch file")
    assert_same(load_task(cfg, minilm_tokenizer), good)
    assert len(loads) == 2 and "unreadable" in caplog.text
    assert_same(load_task(cfg, minilm_tokenizer), good) and len(loads) == 2  # rewritten


def test_without_a_home_nothing_is_cached(monkeypatch, loads, minilm_tokenizer):
    monkeypatch.delenv("HEADSWEEP_HOME")
    assert cache_folder() is None
    load_task(TaskConfig(**SHORTCUT), minilm_tokenizer)
    load_task(TaskConfig(**SHORTCUT), minilm_tokenizer)
    assert len(loads) == 2
