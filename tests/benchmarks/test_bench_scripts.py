"""The bench scripts themselves still run: each one that scales (``BENCH_SCALE``) at a hundredth of
its size, end to end, through the product's current code (a bench that inserts rows by hand broke
when the run table gained its ``labels`` column, and nothing noticed until ``make bench``).

At this size a ratio says little, so a missed target is allowed here; what must hold is what the
contract asks of a script: it ends (exit 0, or 1 naming only missed figures), every figure line
carries its target and ``met``, each figure ``_bench.TARGETS`` names for its bench is there with
its target, and its correctness checks (asserts: ours equal to the reference, every request
answered) pass. The MiniLM scripts have fixed sizes (minutes each): ``make bench``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCALABLE = ["bench_analysis.py", "bench_orchestration.py", "bench_registry.py", "bench_run_cost.py",
            "bench_stats.py", "bench_tracking.py", "bench_writer.py"]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.postgres
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", SCALABLE)
def test_script_runs_at_a_small_size(script, pg_url, tmp_path):
    args = {"bench_analysis.py": ["--pg", pg_url], "bench_registry.py": ["--pg", pg_url]}.get(script, [])
    env = {**os.environ, "BENCH_SCALE": "0.01", "BENCH_TIGHTEN": "", "HF_HUB_OFFLINE": "1"}  # not TMPDIR=tmp_path:
    # Ray's socket paths under pytest's long temp folder pass the 107 bytes AF_UNIX allows
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True,
                          timeout=840, env=env, cwd=tmp_path)
    figures = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    tail = f"\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert figures, f"{script} printed no figure{tail}"
    assert all("target" in row and "met" in row for row in figures), tail
    spec = importlib.util.spec_from_file_location("_bench_targets", HERE / "_bench.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    benches = {row["bench"] for row in figures}
    targeted = {row["figure"] if "backend" not in row else f"{row['figure']} ({row['backend']})"
                for row in figures if row["target"] is not None}
    for name in bench.TARGETS:  # a figure with a peer is never left out nor emitted without its target
        owner, figure = name.split(".", 1)
        assert owner not in benches or figure in targeted, f"{name}: not emitted with its target{tail}"
    missed = [row["figure"] for row in figures if row["met"] is False]
    if missed:  # a miss at 1 % of the size is allowed; a crash or a failed check is not
        assert done.returncode == 1 and "MISSED:" in done.stderr, tail
        assert "Traceback" not in done.stderr, tail
    else:
        assert done.returncode == 0, tail
