"""The sweep's one writer (orchestrator/driving/writer.py, DESIGN.md decision 16): when the trials
write through it, no trial process opens the registry or the MLflow store; every run is finished
once in both; a writer killed mid-sweep loses no run; and the rules that decide where it is needed."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from base.result import RunResult, UnitMap
from orchestrator import filesystems
from orchestrator.driving import writer
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

# ---------------------------------------------------------------------- pure: where a writer is needed

MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
40 22 0:35 / /home rw,relatime shared:2 - nfs4 server:/export/home rw,vers=4.2
41 40 0:36 / /home/lab/scratch rw - tmpfs tmpfs rw
42 22 0:37 / /shared\\040data rw,nosuid - fuse.sshfs storage:/srv/share rw,user_id=0
"""


@pytest.mark.parametrize(("path", "kind", "network"), [
    ("/home/lab/registry.db", "nfs4", True),
    ("/home/lab/scratch/registry.db", "tmpfs", False),  # a local mount inside the NFS home
    ("/shared data/home/mlflow.db", "fuse.sshfs", True),  # an escaped space
    ("/var/tmp/x.db", "ext4", False),
])
def test_the_filesystem_of_a_path_is_its_nearest_mount(path, kind, network):
    assert filesystems.filesystem_type(path, MOUNTINFO) == kind
    assert filesystems.on_network_filesystem(path, MOUNTINFO) is network


def test_a_writer_is_needed_for_embedded_stores_on_several_nodes_or_a_network_filesystem(monkeypatch, tmp_path):
    monkeypatch.delenv(writer.WRITER_ENV, raising=False)
    sqlite, pg, server = f"sqlite:///{tmp_path}/registry.db", "postgresql://db/headsweep", "http://login:5000"
    assert not writer.writer_needed(sqlite, f"sqlite:///{tmp_path}/mlflow.db", nodes=1)  # one host, local disk
    assert writer.writer_needed(sqlite, None, nodes=3)
    assert writer.writer_needed(pg, f"sqlite:///{tmp_path}/mlflow.db", nodes=2)  # MLflow's file is embedded
    assert not writer.writer_needed(pg, server, nodes=8)  # servers are written directly
    monkeypatch.setattr(filesystems, "on_network_filesystem", lambda path, mountinfo=None: True)
    assert writer.writer_needed(sqlite, server, nodes=1)  # a shared home: another host may read or join
    monkeypatch.setenv(writer.WRITER_ENV, "off")
    assert not writer.writer_needed(sqlite, None, nodes=3)
    monkeypatch.setenv(writer.WRITER_ENV, "on")
    assert writer.writer_needed(pg, server, nodes=1)


def test_one_module_writes_run_and_sweep_state_to_mlflow():
    """``set_terminated`` and a status ``update_run`` appear in the writer alone (and in tracking.py,
    which defines the client; headsweep run's single run outside any sweep finishes its own)."""
    root = Path(__file__).resolve().parents[2]
    writers = set()
    for folder in ("orchestrator", "headsweep", "analysis"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            if "set_terminated(" in text or "update_run(" in text:
                writers.add(str(path.relative_to(root)))
    assert writers == {"orchestrator/driving/writer.py", "orchestrator/tracking.py"}


# ---------------------------------------------------------------------- real: sweeps through a writer

pytestmark = pytest.mark.ray




def _stores_opened_here() -> dict[str, float]:
    """What this trial's process holds: whether its state goes through a Remote writer, and how many
    registry databases and MLflow clients it has opened (none, through a writer)."""
    from mlflow import MlflowClient

    from orchestrator.driving import trial
    from orchestrator.registry.db import ReadOnlyDatabase

    objects = gc.get_objects()
    return {"remote": float(all(isinstance(w, writer.Remote) for w in trial._writers.values())),
            "registries": float(sum(isinstance(o, ReadOnlyDatabase) for o in objects)),
            "mlflow_clients": float(sum(isinstance(o, MlflowClient) for o in objects)), "pid": float(os.getpid())}


def _run(cfg, ctx) -> RunResult:
    ctx.tracker.log_metrics({"loss": 0.5}, 1)
    ctx.tracker.log_artifact("note.txt", b"through the writer")
    time.sleep(float(os.environ.get("TEST_RUN_S", "0.3")))
    gate = UnitMap(np.ones((2, 4), dtype=np.float32), "heads", "test")
    return RunResult(cfg.run_key, cfg.group_key, {"accuracy": 1.0, **_stores_opened_here()}, {"heads.gate": gate}, steps=1)


def _tracked_sweep(home: Path, monkeypatch, seeds: int) -> tuple[str, str, Registry, str]:
    """(registry URL, tracking URI, registry, sweep id): ``seeds`` tiny runs with an MLflow parent run."""
    from orchestrator import tracking

    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    url, uri = f"sqlite:///{home}/registry.db", f"sqlite:///{home}/mlflow.db"
    monkeypatch.setenv("HEADSWEEP_TRACKING_URI", uri)
    grid = {"name": "writer", "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
            "axes": {"seed": list(range(seeds))}, "resources": {"cpus": 0.5}, "max_concurrent": 3}
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep("writer", "", expand(parse_grid(grid)), {"cpus": 0.5}, 3, 1)
    mlflow = tracking.client(uri)
    experiment = tracking.ensure_experiment(mlflow, "writer")
    parent = tracking.start_run(mlflow, experiment, sweep_id)
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment, mlflow_parent_run_id=parent)
    return url, uri, registry, sweep_id


def _mlflow_children(uri: str, registry: Registry, sweep_id: str) -> dict[str, str]:
    """Each child MLflow run's status by the run key whose registry row names it."""
    from orchestrator import tracking

    mlflow = tracking.client(uri)
    sweep = registry.get_sweep(sweep_id)
    children = mlflow.search_runs([sweep["mlflow_experiment_id"]], f"tags.sweep = '{sweep_id}'", max_results=1000)
    by_id = {run.info.run_id: run.info.status for run in children}
    keys = registry.sweep_runs(sweep_id)["run_key"]
    assert len(children) == len(keys), f"{len(children)} MLflow runs for {len(keys)} run keys"
    return {key: by_id[registry.get_run(key)["mlflow_run_id"]] for key in keys}


def test_trials_through_the_writer_open_no_store_and_every_run_is_finished_once(local_ray, tmp_path, monkeypatch):
    monkeypatch.setenv(writer.WRITER_ENV, "on")
    url, uri, registry, sweep_id = _tracked_sweep(tmp_path, monkeypatch, seeds=6)
    assert execute_sweep(sweep_id, registry_url=url, tracking_uri=uri, run_fn=_run) == {"finished": 6}
    runs = [registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]]
    assert [run["attempts"] for run in runs] == [1] * 6
    for run in runs:  # each trial's process went through the writer and opened neither store
        assert run["metrics"]["remote"] == 1.0, run["metrics"]
        assert run["metrics"]["registries"] == 0 and run["metrics"]["mlflow_clients"] == 0, run["metrics"]
        assert run["metrics"]["cost.total_s"] > 0  # the costs added after the finish came through too
    assert set(_mlflow_children(uri, registry, sweep_id).values()) == {"FINISHED"}
    from orchestrator import tracking

    mlflow = tracking.client(uri)
    sweep = registry.get_sweep(sweep_id)
    assert sweep["status"] == "finished"
    assert mlflow.get_run(sweep["mlflow_parent_run_id"]).info.status == "FINISHED"
    child = runs[0]["mlflow_run_id"]
    assert [m.value for m in mlflow.get_metric_history(child, "loss")] == [0.5]
    assert [a.path for a in mlflow.list_artifacts(child)] == ["note.txt"]


@pytest.mark.timeout(240)  # a writer that never comes back hangs its trials' calls: fail, not hang
def test_a_writer_killed_mid_sweep_loses_no_run(local_ray, tmp_path, monkeypatch):
    """SIGKILL the writer's process while trials run: Ray restarts it (same name, same node), the
    trials' calls wait for it and go through, and every run finishes once, in both stores."""
    monkeypatch.setenv(writer.WRITER_ENV, "on")
    monkeypatch.setenv("TEST_RUN_S", "1.5")
    url, uri, registry, sweep_id = _tracked_sweep(tmp_path, monkeypatch, seeds=8)
    killed: list[str] = []

    def kill_the_writer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            counts = registry.sweep_counts(sweep_id)
            if counts.get("finished", 0) >= 2 and counts.get("running", 0) >= 1:
                where = writer.Remote(writer.actor_name(sweep_id)).ping()
                os.kill(int(where.rsplit(":", 1)[1]), signal.SIGKILL)
                killed.append(where)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_the_writer, daemon=True)
    killer.start()
    counts = execute_sweep(sweep_id, registry_url=url, tracking_uri=uri, run_fn=_run)
    killer.join(timeout=5)
    assert killed, "the writer was never killed: the sweep ended before two runs finished with one running"
    assert counts == {"finished": 8}
    runs = [registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]]
    # none ran twice: a trial claims again only its own run (a claim whose reply the kill lost)
    assert all(run["attempts"] <= 2 for run in runs), [run["attempts"] for run in runs]
    assert set(_mlflow_children(uri, registry, sweep_id).values()) == {"FINISHED"}
    assert registry.get_sweep(sweep_id)["status"] == "finished"


def test_a_run_the_registry_ended_while_mlflow_missed_it_is_ended_in_mlflow_by_the_next_flush(tmp_path, monkeypatch):
    """A writer cut off between the registry's write and MLflow's (its host lost the share) leaves
    the run finished in the registry and RUNNING in MLflow; the next driver's writer ends it there
    from the registry (each run's own status), and leaves alone what the registry has running."""
    url, uri, registry, sweep_id = _tracked_sweep(tmp_path, monkeypatch, seeds=3)
    states = writer.Writer(registry, uri)
    sweep = registry.get_sweep(sweep_id)
    keys = list(registry.sweep_runs(sweep_id)["run_key"])
    for key in keys:
        assert registry.claim(key, "w1") is not None
        states.track(key, None, sweep["mlflow_experiment_id"], key, {"sweep": sweep_id}, sweep["mlflow_parent_run_id"])
    # the registry's writes only, as a writer that died before its MLflow writes leaves them
    assert registry.finish(keys[0], {"accuracy": 1.0}, worker="w1")
    assert registry.fail(keys[1], "boom", "w1")
    assert set(_mlflow_children(uri, registry, sweep_id).values()) == {"RUNNING"}
    assert writer.Writer(registry, uri).flush(sweep_id) == 0
    assert _mlflow_children(uri, registry, sweep_id) == {keys[0]: "FINISHED", keys[1]: "FAILED", keys[2]: "RUNNING"}


# ---------------------------------------------------------------------- one writer host: the lease


@pytest.fixture
def shared_registry(tmp_path, monkeypatch):
    """A real SQLite registry with one sweep, its folder taken for a network filesystem (the one
    fake: what mountinfo would say on a cluster's shared home)."""
    from orchestrator.registry import db

    for module in (filesystems, db):
        monkeypatch.setattr(module, "on_network_filesystem", lambda path, mountinfo=None: True)
    monkeypatch.setattr(filesystems, "filesystem_type", lambda path, mountinfo=None: "nfs4")
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/registry.db"
    grid = {"name": "lease", "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}}, "axes": {"seed": [0, 1]}}
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep("lease", "", expand(parse_grid(grid)), {"cpus": 1}, None, 1)
    return url, registry, sweep_id


def _held_by(url: str, host: str, age_s: float, sweep: str = "sw-other") -> None:
    writer.lease_path(url).write_text(json.dumps({"host": host, "pid": 1, "sweep": sweep, "at": time.time() - age_s}))


def test_a_writer_holds_the_lease_of_a_registry_on_a_network_filesystem_while_it_lives(shared_registry):
    url, registry, sweep_id = shared_registry
    held = writer.Writer(url, None, lease=sweep_id)
    lease = json.loads(writer.lease_path(url).read_text())
    assert lease["sweep"] == sweep_id and lease["pid"] == os.getpid()
    assert writer.lease_holder(url) is None  # this host's own lease: another driver here may write
    held.release()
    assert not writer.lease_path(url).exists()


def test_submit_and_resume_from_another_host_are_refused_in_one_line_while_a_writer_holds_it(shared_registry):
    from base.sections import ConfigError
    from orchestrator.driving import sweeps

    url, registry, sweep_id = shared_registry
    _held_by(url, "n1", age_s=3)
    with pytest.raises(ConfigError) as refused:
        sweeps.resume(sweep_id)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("resume: sweep sw-other's writer on host n1 is writing the SQLite")
    assert "nfs4" in line and "HEADSWEEP_DB" in line and re.search(r"holds it 2\d s more", line)
    _held_by(url, "n1", age_s=writer.LEASE_S + 1)  # not renewed: its writer died
    writer.refuse_if_written_elsewhere(url, "resume")


def test_cancel_on_another_host_is_left_for_the_writer_which_records_it(shared_registry):
    from orchestrator.driving import sweeps

    url, registry, sweep_id = shared_registry
    held = writer.Writer(url, None, lease=sweep_id)  # the writer "on n1": its lease, renewed as it runs
    _held_by(url, "n1", age_s=0, sweep=sweep_id)
    sweeps.cancel(sweep_id)
    assert not registry.cancel_requested(sweep_id)  # nothing written from here
    assert writer.cancel_flag(url, sweep_id).exists()
    assert held.cancel_requested(sweep_id)  # the writer records it at its next poll
    assert registry.cancel_requested(sweep_id) and not writer.cancel_flag(url, sweep_id).exists()
    held.release()


def test_status_and_ls_read_a_registry_on_a_network_filesystem_read_only(shared_registry, monkeypatch):
    """A reader on another host does not see the writer's locks: read-write, it would take the writer's
    journal for a crashed one's and roll it back into the file (the registry "malformed" after a sweep
    followed from the login host, test_shared_home.py). What status, ls and wait open cannot write."""
    import sqlalchemy as sa

    from orchestrator.registry import RegistryReader

    url, registry, sweep_id = shared_registry
    monkeypatch.setenv("HEADSWEEP_RETRY_S", "1")
    looking = writer.for_looking(url)
    assert isinstance(looking, RegistryReader) and looking.sweep_counts(sweep_id) == {"pending": 2}
    with pytest.raises(sa.exc.OperationalError, match="readonly database"), looking._engine.begin() as connection:
        connection.exec_driver_sql("UPDATE hs_runs SET attempts = 9")
    assert registry.sweep_counts(sweep_id) == {"pending": 2}
    assert registry._engine.url.query == {}  # the writer's own connection stays read-write
