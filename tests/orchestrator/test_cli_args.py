"""The ``headsweep`` parser and the sweep argument: help on every argument, ``last``, the status line."""

from __future__ import annotations

import argparse

import pytest

from experiments.harness.config import parse_config
from headsweep import cli
from orchestrator.registry import LAST, NotFound, Registry


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_every_command_and_argument_has_help():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {c.dest for c in sub._choices_actions if c.help} == set(sub.choices)  # the command list
    missing = [f"{name} {action.dest}" for name, command in _commands(parser).items()
               for action in command._actions
               if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert missing == []


def test_every_sweep_argument_says_it_takes_last():
    for name, command in _commands(cli.build_parser()).items():
        for action in command._actions:
            if action.dest == "sweep":
                assert "'last'" in action.help, name


def _sweep(registry: Registry, name: str, seeds: list[int]) -> str:
    configs = [parse_config({"model": "tiny-bert", "task": {"name": "synthetic-cls"}, "seed": s}) for s in seeds]
    sweep_id, _ = registry.create_sweep(name, f"name: {name}\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)
    return sweep_id


def test_last_is_the_newest_sweep_of_the_registry_the_command_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    registry = Registry(f"sqlite:///{tmp_path / 'other.db'}")
    with pytest.raises(NotFound, match="no sweeps yet"):
        registry.resolve_sweep(LAST)
    first = _sweep(registry, "first", [0])
    newest = _sweep(registry, "newest", [1])
    assert registry.resolve_sweep("last") == newest and registry.resolve_sweep(first) == first
    (key,) = registry.unfinished(newest)
    assert registry.claim(key, "w") is not None and registry.finish(key, {"accuracy": 0.5})
    # --db names the registry: `last` is its newest sweep, not the default home's
    url = f"sqlite:///{tmp_path / 'other.db'}"
    assert cli.main(["results", "last", "--db", url, "--format", "csv"]) == 0
    assert "accuracy,0.5," in capsys.readouterr().out
    assert cli.main(["status", "last"]) == 2  # the default home has no sweeps
    assert "no sweeps yet" in capsys.readouterr().err


def test_status_line_says_how_many_runs_finished(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    sweep_id = _sweep(registry, "wording", [0, 1, 2])
    keys = registry.unfinished(sweep_id)
    for key in keys[:2]:
        assert registry.claim(key, "w") is not None
        assert registry.finish(key, {"accuracy": 0.5})
    registry.set_sweep(sweep_id, status="running")
    assert cli.main(["status", sweep_id]) == 0
    assert f"{sweep_id} (wording): running: 2 of 3 runs finished, 1 pending" in capsys.readouterr().out
    assert registry.claim(keys[2], "w") is not None and registry.finish(keys[2], {"accuracy": 0.5})
    registry.set_sweep(sweep_id, status="finished")
    assert cli.main(["status", "last"]) == 0
    text = capsys.readouterr().out
    assert f"{sweep_id} (wording): finished: 3 of 3 runs finished\n" in text and "finished  finished" not in text
