"""`headsweep submit` with bad grids: one line naming the problem, exit 2, nothing written anywhere."""

import os
import subprocess
import sys

import pytest
import yaml

GOOD = {
    "name": "bad",
    "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
    "axes": {"seed": [0, 1]},
}


def _bad(**changes):
    grid = yaml.safe_load(yaml.safe_dump(GOOD))
    for key, value in changes.items():
        grid[key] = value
    return yaml.safe_dump(grid)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: bad\naxes: {seed: [0, 1\n", "not valid YAML"),
        (_bad(axes={"sed": [0, 1]}), "did you mean 'seed'?"),
        (_bad(axes={"seed": []}), "seed"),
        (_bad(axes={"seed": [0, "a"]}), "seed"),
        (_bad(axes={"model": ["tiny-bert", "tiny-bret"]}), "did you mean 'tiny-bert'?"),
        (_bad(axes={"task": ["synthetic-cls", "sst-2"]}), "did you mean 'sst2'?"),
        (_bad(axes={"method": ["head-gates"]}), "did you mean 'head_gates'?"),
        (_bad(axis={"seed": [0]}), "did you mean 'axes'?"),
        (_bad(resources={"cpus": -1}), "resources.cpus"),
    ],
)
def test_bad_grids_fail_at_submit_and_write_nothing(tmp_path, text, message):
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    env = os.environ | {"HEADSWEEP_HOME": str(tmp_path / "home")}
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    for extra in ([], ["--dry-run"]):
        result = subprocess.run([sys.executable, "-m", "orchestrator.cli", "submit", str(grid), *extra],
                                capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
    home = tmp_path / "home"
    assert not (home / "registry.db").exists() and not (home / "mlflow.db").exists()


def test_dry_run_prints_the_expansion(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GOOD, "axes": {"seed": [0, 1, 2], "lambda": [0.01, 0.1]}}))
    env = os.environ | {"HEADSWEEP_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", "submit", str(grid), "--dry-run"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "6 runs, 6 new, 0 already finished" in result.stdout
