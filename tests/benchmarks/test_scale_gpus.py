"""scale_gpus.py's checks on records written here (fast: what would let a broken packing or a run
finished twice through), and the script itself at a tiny size on a real 3-node Ray (slow)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT_S = 900


def _script():
    spec = importlib.util.spec_from_file_location("scale_gpus_under_test", HERE / "scale_gpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(run_key, attempt, node, gpu, start, end=None, pid=7):
    where = {"run_key": run_key, "attempt": attempt, "node": node, "gpus": gpu, "pid": pid}
    return [where | {"event": "start", "t": start}] + ([where | {"event": "end", "t": end}] if end is not None else [])


def test_the_packing_check_sees_a_fifth_trial_on_a_gpu_and_lets_an_end_and_a_start_meet():
    scale = _script()
    four = [line for i in range(4) for line in _lines(f"r{i}", f"a{i}", "n1", "0", 10.0, 20.0)]
    follows = _lines("r4", "a4", "n1", "0", 20.0, 30.0)  # starts when the others end: still 4 at once
    other_gpu = _lines("r5", "a5", "n1", "1", 12.0, 18.0)
    runs = scale.attempts(four + follows + other_gpu, None, None)
    peak, peaks = scale.peak_per_gpu(runs)
    assert (peak, peaks) == (4, {("n1", "0"): 4, ("n1", "1"): 1})
    assert scale.peak_overall(runs) == 5
    fifth = scale.attempts(four + _lines("r4", "a4", "n1", "0", 19.0, 30.0), None, None)
    assert scale.peak_per_gpu(fifth)[0] == 5


def test_a_killed_attempt_holds_its_gpu_until_the_kill_and_is_told_from_the_rerun():
    scale = _script()
    lines = (_lines("r0", "a0", "lost", "0", 10.0) + _lines("r0", "a1", "n2", "3", 40.0, 41.0, pid=9)
             + _lines("r1", "a2", "lost", "0", 11.0, 12.0))
    runs = scale.attempts(lines, killed_at=30.0, lost_node="lost")
    killed = next(a for a in runs if a["run_key"] == "r0" and a["node"] == "lost")
    assert killed["end"] is None and killed["until"] == 30.0
    registry_runs = {"r0": {"worker": "t_00001@box[n2 127.0.0.1]:9"}, "r1": {"worker": "t_00002@box[lost 127.0.0.1]:7"},
                     "r9": {"worker": "t_00003@box:7"}}  # r9: a worker that does not name its node
    finisher = scale.finishers(registry_runs, runs)
    assert finisher["r0"]["node"] == "n2" and finisher["r0"]["end"] == 41.0
    assert finisher["r1"]["node"] == "lost" and finisher["r9"] is None


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.timeout(SCRIPT_S + 120)  # pytest's limit above the script's own, so the script's says what hung
def test_the_scale_script_runs_a_tiny_cluster_and_loses_a_node(tmp_path):
    """2 nodes x 2 logical GPUs, 24 trials, a node killed after 8 finished: every check met."""
    done = subprocess.run([sys.executable, str(HERE / "scale_gpus.py"), "--nodes", "2", "--gpus-per-node", "2",
                           "--trials", "24", "--sleep", "0.5,1.0", "--kill-after", "8", "--max-concurrent", "8"],
                          capture_output=True, text=True, timeout=SCRIPT_S)
    rows = {row["figure"]: row for row in map(json.loads, filter(None, done.stdout.splitlines()))}
    missed = [row for row in rows.values() if row.get("met") is False]  # first: the log's tail may not hold them
    assert done.returncode == 0, f"missed: {missed}\n" + done.stdout[-3000:] + done.stderr[-3000:]
    assert {"max_concurrent_per_gpu", "every_trial_once", "gpus_used", "lost_node", "throughput", "wall_vs_ideal",
            "gpu_busy", "trial_worker_memory"} <= set(rows)
    assert rows["max_concurrent_per_gpu"]["peak"] <= 4 and rows["every_trial_once"]["counts"] == {"finished": 24}
    assert rows["lost_node"]["failed"] == [], rows["lost_node"]  # which comparison missed, and on what
    assert rows["lost_node"]["status_names_it"] and rows["lost_node"]["rerun_elsewhere"] >= 1
