"""`headsweep cancel` on a real SQLite registry, in this process (no Ray): the sweep whose driver is
gone, where nobody else will stop its running runs, and a sweep that is already done. Cancelling a
sweep whose detached driver still runs is in test_cluster.py (slow: a real cluster)."""

from __future__ import annotations

import threading

import pytest

from experiments.harness.config import parse_config
from headsweep.cli import main as headsweep
from orchestrator import settings
from orchestrator.registry import Registry

FOLLOW_POLL_S = 1.5  # `status --follow` reads the registry every second (orchestrator/driving/sweeps.py wait)
FOLLOW_ENDS_S = 30  # generous: it returns at its first poll after the sweep ended


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """The registry of an empty HEADSWEEP_HOME of the test's own: no local head on record, so no
    driver of its sweeps can be alive."""
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_RAY_DASHBOARD"):
        monkeypatch.delenv(name, raising=False)
    with Registry(settings.registry_url()) as opened:
        yield opened


def _sweep(registry: Registry, seeds: list[int]) -> tuple[str, list[str]]:
    configs = [parse_config({"model": "tiny-bert", "task": {"name": "synthetic-cls"}, "seed": s}) for s in seeds]
    sweep_id, _ = registry.create_sweep("cancel", "name: cancel\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)
    return sweep_id, [cfg.run_key for cfg in configs]


def test_cancel_of_a_sweep_whose_driver_is_gone_marks_its_runs_at_once(registry, capsys):
    """Its driver's Ray job is unknown (the head is gone): the running runs would stay RUNNING with
    nobody to stop them, so cancel marks them cancelled itself, and the sweep too."""
    sweep_id, keys = _sweep(registry, [0, 1, 2, 3])
    assert registry.claim(keys[0], "w") and registry.finish(keys[0], {"accuracy": 0.5})
    for key in keys[1:3]:
        assert registry.claim(key, "trial@host:1") is not None
    registry.set_sweep(sweep_id, driver="raysubmit_gone", status="running")

    assert headsweep(["cancel", "last"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out == f"{sweep_id}: cancel requested; running trials stop at their next check; 1 of 4 runs finished, 3 cancelled"
    assert [registry.get_run(key)["status"] for key in keys] == ["finished", "cancelled", "cancelled", "cancelled"]
    sweep = registry.get_sweep(sweep_id)
    assert sweep["status"] == "cancelled" and sweep["cancel_requested"]


def test_cancel_of_a_finished_sweep_changes_nothing_it_did(registry, capsys):
    sweep_id, keys = _sweep(registry, [0, 1])
    for key in keys:
        assert registry.claim(key, "w") and registry.finish(key, {"accuracy": 0.5})
    registry.set_sweep(sweep_id, driver="raysubmit_done", status="finished")
    assert headsweep(["cancel", sweep_id]) == 0
    assert "2 of 2 runs finished" in capsys.readouterr().out
    assert registry.get_sweep(sweep_id)["status"] == "finished"
    assert registry.sweep_counts(sweep_id) == {"finished": 2}


def test_cancel_of_an_unknown_sweep_is_one_line(registry, capsys):
    sweep_id, _ = _sweep(registry, [0])
    assert headsweep(["cancel", sweep_id[:-1] + "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"did you mean '{sweep_id}'?" in err[0]
    assert registry.sweep_counts(sweep_id) == {"pending": 1} and not registry.get_sweep(sweep_id)["cancel_requested"]


def test_status_follow_re_attaches_until_the_sweep_ends(registry, capsys):
    """`status --follow` on a sweep that another process finishes meanwhile: the progress bar until
    it ends, then its status; exit 0 as every run finished (1 otherwise). The follow runs in a thread
    (its exit code or error kept); the runs are finished here, in the test's own thread, so that what
    it asserts fails the test."""
    sweep_id, keys = _sweep(registry, [0, 1])
    registry.set_sweep(sweep_id, status="running")
    outcome: list = []

    def follow():
        try:
            outcome.append(headsweep(["status", sweep_id, "--follow"]))
        except BaseException as error:  # noqa: BLE001 - raised again in the test's thread
            outcome.append(error)

    follower = threading.Thread(target=follow, daemon=True)  # daemon: a follow that hangs cannot hold pytest
    follower.start()
    for key in keys:
        assert registry.claim(key, "w") and registry.finish(key, {"accuracy": 0.5})
        follower.join(FOLLOW_POLL_S)  # a poll of the follow's sees this state
        assert follower.is_alive(), f"status --follow returned before the sweep ended: {outcome}"
    registry.set_sweep(sweep_id, status="finished")
    follower.join(FOLLOW_ENDS_S)
    assert not follower.is_alive(), f"status --follow did not return within {FOLLOW_ENDS_S} s of the sweep's end"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    assert outcome == [0]
    out = " ".join(capsys.readouterr().out.split())
    assert f"{sweep_id} (cancel): finished: 2 of 2 runs finished" in out
    assert headsweep(["status", "--follow"]) == 2
    assert "status --follow needs a sweep id" in capsys.readouterr().err
