"""`headsweep submit` with bad grids: one line naming the problem, exit 2, nothing written anywhere.

The cases run ``headsweep.cli.main`` in this process (a fresh interpreter costs ~6 CPU-seconds of
imports, 20-40 s each on a loaded 2-core machine); one case goes through a real process, its exit
status and its stderr."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from headsweep.cli import main as headsweep

GOOD = {
    "name": "bad",
    "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
    "axes": {"seed": [0, 1]},
}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HEADSWEEP_HOME of the test's own (for this process and the processes it starts)."""
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


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
        (_bad(axes={"head_gates.lamda": [0.1]}), "axes: unknown key 'head_gates.lamda'; did you mean 'head_gates.lambda'?"),
        (_bad(include=[{"method": "finetune", "head_gates.lr": 0.1}]),
         "'head_gates.lr' is not a key of method 'finetune' (it is a key of head_gates)"),
        (_bad(axes={"lambda": [0.1, -1]}),
         "cell 1 (lambda=-1): head_gates.lambda: Input should be greater than or equal to 0 (got -1)"),
    ],
)
def test_bad_grids_fail_at_submit_and_write_nothing(tmp_path, home, capsys, text, message):
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    for extra in ([], ["--dry-run"]):
        assert headsweep(["submit", str(grid), *extra]) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], err
    assert not home.exists() or not any(home.iterdir())  # no registry, no MLflow store, no Ray head


def test_a_bad_grid_in_a_real_process_exits_2_with_one_line(tmp_path, home):
    grid = tmp_path / "grid.yaml"
    grid.write_text(_bad(axes={"sed": [0, 1]}))
    result = subprocess.run([sys.executable, "-m", "headsweep.cli", "submit", str(grid)],
                            capture_output=True, text=True, env=os.environ.copy(), timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"headsweep: error: {grid}: axes: unknown key 'sed'; did you mean 'seed'?"]
    assert not home.exists() or not any(home.iterdir())


def test_dry_run_prints_the_expansion(tmp_path, home, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GOOD, "axes": {"seed": [0, 1, 2], "lambda": [0.01, 0.1]}}))
    assert headsweep(["submit", str(grid), "--dry-run"]) == 0
    assert "6 runs, 6 new, 0 already finished" in capsys.readouterr().out


def test_dry_run_of_the_stem_cell_example(home, shared_data, capsys):
    """24 head_gates cells plus a random-init control with three seeds, and the 6 fine-tunes
    (task x seed) the SP cells start from, each once: as its comment says."""
    example = Path(__file__).resolve().parents[2] / "examples" / "grid_stem_cell.yaml"
    assert headsweep(["submit", str(example), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "33 runs, 33 new, 0 already finished" in out
    assert "27 cells + 6 upstream runs (6 finetune) that 12 runs start from" in out
    assert "27 cells" in example.read_text() and "33 runs in all" in example.read_text()


PAPERS = ("he_choi_2021", "kovaleva_2019", "michel_2019", "wang_2022", "liu_2022")


def test_the_paper_recipes_are_all_here():
    folder = Path(__file__).resolve().parents[2] / "examples" / "papers"
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted(PAPERS)


@pytest.mark.parametrize("paper", PAPERS)
def test_paper_recipe_validates_offline_with_its_hub_model(paper, home, shared_data, capsys):
    """examples/papers/: each paper's protocol at its scale (hub ids, full data, its steps) expands
    offline, as many runs as its header says, every one on the paper's hub model."""
    import re

    recipe = Path(__file__).resolve().parents[2] / "examples" / "papers" / f"{paper}.yaml"
    text = recipe.read_text()
    runs = int(re.search(r"^# (\d+) runs in all", text, re.M).group(1))
    models = set(re.findall(r"^\s+model: (\S+/\S+)", text, re.M))
    assert models, "a paper recipe names the paper's hub model"
    assert headsweep(["submit", str(recipe), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{runs} runs, {runs} new, 0 already finished" in out
    assert all(model in out for model in models) and "minilm-l6" not in out


def test_dry_run_with_set_counts_the_grid_they_make(tmp_path, home, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GOOD, "axes": {"seed": [0, 1]}}))
    assert headsweep(["submit", str(grid), "--dry-run", "--set", "seed=0,1,2", "--set", "lambda=0.01,0.1"]) == 0
    assert "6 runs, 6 new, 0 already finished" in capsys.readouterr().out
    assert headsweep(["submit", str(grid), "--dry-run", "--set", "seed=3"]) == 0
    assert "1 runs, 1 new, 0 already finished" in capsys.readouterr().out
    assert headsweep(["submit", str(grid), "--dry-run", "--set", "lamda=0.1,0.2"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"headsweep: error: {grid}: --set: unknown key 'lamda'; did you mean 'lambda'?")
