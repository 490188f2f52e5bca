"""The checkpoint store on a local folder and on another fsspec filesystem (the in-memory one)."""

import pytest
import torch

from orchestrator.checkpoints import CheckpointStore


@pytest.mark.parametrize("root", ["local", "memory://hs-test-store"])
def test_save_then_load_round_trips_tensors_bit_for_bit(tmp_path, root):
    store = CheckpointStore((tmp_path / "ckpt").as_uri() if root == "local" else root)
    state = {"encoder": {"w": torch.randn(4, 3), "b": torch.arange(3)}, "step": 7, "labels": ["a", "b"]}
    assert not store.exists("abc123")
    store.save("abc123", state)
    assert store.exists("abc123")
    loaded = store.load("abc123")
    assert torch.equal(loaded["encoder"]["w"], state["encoder"]["w"]) and loaded["step"] == 7
    assert loaded["labels"] == ["a", "b"]
    assert [p.rsplit("/", 1)[-1] for p in store.fs.ls(f"{store.base}/abc123", detail=False)] == ["weights.pt"]  # no partial left


def test_missing_checkpoint_names_the_run(tmp_path):
    store = CheckpointStore(tmp_path.as_uri())
    with pytest.raises(FileNotFoundError, match="no checkpoint of run deadbeef"):
        store.load("deadbeef")


def test_default_root_is_under_headsweep_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    monkeypatch.delenv("HEADSWEEP_CHECKPOINTS", raising=False)
    store = CheckpointStore()
    store.save("k1", {"x": torch.ones(1)})
    assert (tmp_path / "checkpoints" / "k1" / "weights.pt").is_file()


def test_the_store_pickles_as_its_root(tmp_path):
    import pickle

    store = CheckpointStore(tmp_path.as_uri())
    store.save("k2", {"x": torch.zeros(2)})
    again = pickle.loads(pickle.dumps(store))
    assert again.root == store.root and torch.equal(again.load("k2")["x"], torch.zeros(2))
