"""Which of a sweep's paths every node must see (orchestrator/cluster/shared.py), pure parts; the
check across real hosts is in test_multihost.py (a home on the login host's own disk refused)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster import shared


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "data").mkdir(exist_ok=True)
    return {"HEADSWEEP_DB": f"sqlite:///{tmp_path}/home/registry.db", "HEADSWEEP_DATA": str(tmp_path / "data"),
            "HEADSWEEP_TRACKING_URI": f"sqlite:///{tmp_path}/home/mlflow.db", "HF_HUB_CACHE": str(tmp_path / "hub")} | extra


def test_the_embedded_defaults_are_all_on_local_disk(tmp_path):
    written, read = shared.local_paths(_env(tmp_path), track=True, artifacts=(tmp_path / "home/mlartifacts").as_uri(),
                                       checkpoints=(tmp_path / "home/checkpoints").as_uri(), staged=True,
                                       hub_models=["org/model"])
    assert written == {"the registry": f"{tmp_path}/home", "MLflow's store": f"{tmp_path}/home",
                       "MLflow's artifacts": f"{tmp_path}/home/mlartifacts",
                       "the checkpoints of upstream runs": f"{tmp_path}/home/checkpoints"}
    assert read == {"the data (HEADSWEEP_DATA)": str(tmp_path / "data"),
                    "hub model org/model": str(tmp_path / "hub" / "models--org--model")}


def test_servers_and_object_stores_need_no_shared_filesystem(tmp_path):
    env = _env(tmp_path, HEADSWEEP_DB="postgresql+psycopg://headsweep@10.0.0.2/headsweep",
               HEADSWEEP_TRACKING_URI="http://10.0.0.2:5000")
    written, read = shared.local_paths(env, track=True, artifacts=None, checkpoints="s3://bucket/ckpt", staged=True,
                                       hub_models=[])
    assert written == {}
    assert list(read) == ["the data (HEADSWEEP_DATA)"]


def test_checkpoints_count_only_with_stages_and_mlflow_only_when_tracked(tmp_path):
    written, _ = shared.local_paths(_env(tmp_path), track=False, artifacts=(tmp_path / "a").as_uri(),
                                    checkpoints=(tmp_path / "c").as_uri(), staged=False, hub_models=[])
    assert list(written) == ["the registry"]


def test_missing_names_what_this_host_does_not_see(tmp_path):
    (tmp_path / "here").mkdir()
    assert shared.missing({"a": str(tmp_path / "here"), "b": str(tmp_path / "gone")}) == ["b"]


def test_one_node_or_nothing_on_disk_asks_no_node(tmp_path):
    # no dashboard exists: a check that asked the cluster would fail
    shared.unseen_on_nodes("http://127.0.0.1:9", {}, {"the registry": str(tmp_path)}, {}, nodes=1)
    shared.unseen_on_nodes("http://127.0.0.1:9", {}, {}, {}, nodes=3)
    assert not list(tmp_path.iterdir())  # no marker left behind


def test_only_sqlite_files_and_local_folders_are_paths():
    assert shared._local_file("sqlite:////abs/registry.db") == "/abs/registry.db"
    assert shared._local_file("sqlite:///:memory:") is None
    assert shared._local_file("file:///abs/mlruns") == "/abs/mlruns"
    assert shared._local_file("/abs/mlruns") == "/abs/mlruns"
    for server in ("databricks", "http://10.0.0.2:5000", "s3://bucket/x", "postgresql://u@h/db"):
        assert shared._local_file(server) is None, server
