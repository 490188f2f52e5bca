"""The scale harness (tests/benchmarks/scale_sweep.py) at a small size, so that it cannot rot: a real
sweep of 27 runs through `headsweep submit --wait` on SQLite, then every figure of its report."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).parent / "benchmarks" / "scale_sweep.py"
SWEEP = ["runs", "wall", "ideal", "throughput", "throughput_runs_span", "in_trial_share", "report", "first_in_worker",
         *(f"cost.{part}" for part in ("claim", "mlflow", "model", "data", "train", "figures", "artifacts",
                                       "finish", "total")),
         "driver_rss", "head_rss", "stores"]
QUERIES = ["cli_status", "cli_results", "cli_agreement", "cli_compare_maps", "cli_figures", "serve_start",
           *(f"http_{name}_{attempt}" for name in ("sweeps", "sweep", "runs", "aggregate", "agreement", "figures")
             for attempt in ("first", "cached"))]
UI = ["ui_server_start", "ui_experiment_page", "ui_expand_sweep", "ui_load_every_child", "ui_parent_page",
      "ui_parent_note_links", "ui_note_every_run", "ui_note_one_cell"]
HARNESS_S = 1800


@pytest.mark.slow  # a real sweep, the analysis commands, Serve and the MLflow UI: minutes (make test-slow)
@pytest.mark.timeout(HARNESS_S + 120)  # pytest's limit above the harness's own, so the harness's says what hung
def test_the_harness_reports_every_figure_of_a_small_sweep(tmp_path):
    # a failure, not a skipped row: CI without it would pass without the UI's figures (.ci/run installs it)
    assert shutil.which("chromium"), "no chromium on PATH: install Debian's chromium (.ci/run does)"
    done = subprocess.run([sys.executable, str(HARNESS), "--runs", "20", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=HARNESS_S)
    report = tmp_path / "report.jsonl"
    assert report.exists(), done.stderr[-3000:]
    rows = {row["figure"]: row for row in map(json.loads, report.read_text().splitlines())}
    assert list(rows) == SWEEP + QUERIES + UI, done.stderr[-3000:]
    assert rows["runs"]["value"] == 27 and rows["runs"]["finished"] == 27  # 3 seeds x 2 x 2 x 2 lambdas + 3 fine-tunes
    assert rows["ideal"]["source"] == "cost.train_s" and rows["ideal"]["value"] > 0
    assert rows["throughput"]["target"] == ">= 90 %" and isinstance(rows["throughput"]["met"], bool)
    assert rows["driver_rss"]["samples"] > 0 and rows["driver_rss"]["value"] > 50  # a Python driver, not its shell
    assert rows["stores"]["artifact_files"] > 27 and rows["stores"]["registry_mb"] > 0
    failed = {name: row for name, row in rows.items() if row.get("ok") is False}
    assert not failed, failed
    assert rows["ui_note_one_cell"]["found"] == 3  # a cell's 3 seeds, found by its cell tag
    assert rows["ui_parent_page"]["children_linked"] == 10  # MLflow's run page: 10 children at a time
    for name in ("experiment", "experiment_expanded", "parent", "parent_note", "note_every_run", "note_one_cell"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")), "headsweep figures wrote no PNG"
