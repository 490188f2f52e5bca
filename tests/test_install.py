"""Installing headsweep into a researcher's environment keeps the torch already there (a CUDA build,
another version): the package asks for a range; only make's set-up pins the CPU build (constraints.txt)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=True, timeout=900, **kwargs)


@pytest.mark.slow
def test_pip_install_keeps_the_users_torch(tmp_path):
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    # "their" torch: another version than make's pin (a stand-in package: the real one is gigabytes)
    theirs = tmp_path / "their_torch"
    (theirs / "torch").mkdir(parents=True)
    (theirs / "torch" / "__init__.py").write_text("__version__ = '2.9.0+cu128'\n")
    (theirs / "pyproject.toml").write_text('[project]\nname = "torch"\nversion = "2.9.0"\n'
                                           '[build-system]\nrequires = ["setuptools>=68"]\n'
                                           'build-backend = "setuptools.build_meta"\n')
    _run(*pip, "install", "--quiet", theirs)
    report = tmp_path / "report.json"
    _run(*pip, "install", "--quiet", "--dry-run", "--report", report, "-e", ROOT)
    to_install = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                  for item in json.loads(report.read_text())["install"]}
    assert "headsweep" in to_install and "transformers" in to_install  # pip resolved the dependencies
    assert "torch" not in to_install, f"installing headsweep would replace their torch 2.9.0 with {to_install['torch']}"
