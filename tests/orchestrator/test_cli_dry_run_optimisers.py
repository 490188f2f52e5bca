"""``headsweep run --dry-run`` and ``headsweep submit --dry-run`` print what trains, per parameter group
(issue 44 item 1): the groups each method declares (experiments/training/optimisers.py), for a hub model
offline; tests/experiments/test_recipe_optimisers.py checks the declarations against the torch objects."""

from pathlib import Path

import pytest
import yaml

from headsweep.cli import main as headsweep

PAPERS = Path(__file__).resolve().parents[2] / "examples" / "papers"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)


def _rows(out: str) -> set[str]:
    """The table's rows as 'cell | cell | ...', spaces squeezed."""
    return {" | ".join(" ".join(cell.split()) for cell in line.split("│")[1:-1])
            for line in out.splitlines() if line.count("│") > 2}


def test_submit_dry_run_prints_each_recipe_group(home, shared_data, capsys):
    assert headsweep(["submit", str(PAPERS / "he_choi_2021.yaml"), "--dry-run"]) == 0
    rows = _rows(capsys.readouterr().out)
    clip = "1 (encoder+decoder+gates)"
    assert f"head_gates dp | encoder | AdamW | 1e-05 | 0 | linear: warm-up 0.1, decay to 0 | {clip} | (0.9, 0.999) | 1e-08" in rows
    assert f"head_gates dp | decoder | AdamW | 0.001 | 0 | linear: warm-up 0.1, decay to 0 | {clip} | (0.9, 0.999) | 1e-08" in rows
    assert f"head_gates dp | gates | Adam | 0.001 | 0 | constant | {clip} | (0.9, 0.999) | 1e-08" in rows
    # a stage's groups too, and a method that trains nothing says it declares none
    assert headsweep(["submit", str(PAPERS / "michel_2019.yaml"), "--dry-run"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert "finetune | decoder | AdamW | 2e-05 | 0.01 | linear: warm-up 0.1, decay to 0 | 1 (encoder+decoder) | " \
           "(0.9, 0.999) | 1e-08" in rows
    assert any(row.startswith("head_importance | (declares no optimiser)") for row in rows)


def test_run_dry_run_prints_the_groups_and_runs_nothing(home, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": "tiny-bert", "method": "skill_neurons",
                                      "task": {"name": "synthetic-cls"}, "train": {"max_steps": 5}}))
    assert headsweep(["run", str(config), "--dry-run", "--set", "skill_neurons.prompt_optimizer=reference"]) == 0
    out = capsys.readouterr().out
    assert "validated, nothing run" in out and "steps in" not in out  # no run's "N steps in S s"
    rows = _rows(out)
    assert "skill_neurons | prompt | Adam | 0.001 | 0 | linear: warm-up 0.006, decay to 0 | 1 (prompt+read-out) | " \
           "(0.9, 0.98) | 1e-06" in rows
    assert "skill_neurons | read-out | Adam | 0.01 | 0 | linear: warm-up 0.006, decay to 0 | 1 (prompt+read-out) | " \
           "(0.9, 0.98) | 1e-06" in rows
