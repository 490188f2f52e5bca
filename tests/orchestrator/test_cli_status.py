"""`headsweep status` and `results` on a real SQLite registry, in this process (no Ray): a real tiny
run forced to collapse (lr 1) is named in status and counted in results beside one that learns."""

from __future__ import annotations

import pytest
import torch

from experiments import RunContext, parse_config, run
from headsweep.cli import main as headsweep
from orchestrator import settings
from orchestrator.registry import Registry


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_RAY_DASHBOARD"):
        monkeypatch.delenv(name, raising=False)
    with Registry(settings.registry_url()) as opened:
        yield opened


def test_a_collapsed_run_is_named_in_status_and_counted_in_results(registry, capsys):
    torch.set_num_threads(1)
    task = {"name": "synthetic-tag", "num_train": 128, "num_eval": 64, "max_length": 24}
    configs = [parse_config({"model": "tiny-bert", "method": "finetune", "task": task, "seed": 0,
                             "train": {"max_steps": 40, "batch_size": 16, "eval_every": 40, "lr": lr}})
               for lr in (1.0, 1e-3)]
    sweep_id, _ = registry.create_sweep("collapse", "name: collapse\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)
    for cfg in configs:
        assert registry.claim(cfg.run_key, "w") and registry.finish(cfg.run_key, run(cfg, RunContext()).metrics)
    registry.set_sweep(sweep_id, status="finished")

    assert headsweep(["status", sweep_id]) == 0
    out = " ".join(capsys.readouterr().out.split())
    blown = configs[0].run_key
    assert f"1 of 2 checked runs collapsed (one class on dev, or the uniform guess's loss ln K): {blown} (finetune, seed 0)" in out

    assert headsweep(["results", sweep_id, "--group-by", "train.lr", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    header = rows[0].split(",")
    by_lr = {row.split(",")[header.index("train.lr")]: row.split(",")[header.index("collapsed")] for row in rows[1:]}
    assert by_lr == {"1.0": "1", "0.001": "0"}
    assert headsweep(["results", sweep_id, "--group-by", "train.lr"]) == 0
    table = capsys.readouterr().out
    assert "collapsed" in table and "not left out" in " ".join(table.split())
