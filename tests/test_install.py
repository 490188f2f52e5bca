"""Installing headsweep into a researcher's environment keeps the torch already there (a CUDA build,
another version): the package asks for a range; only make's set-up pins the CPU build (constraints.txt).

The test resolves through pip's package index, as a researcher's install does: it needs one that holds
headsweep's dependencies and setuptools (PyPI, or the index pip.conf or PIP_INDEX_URL names); without
one it fails saying where pip looked."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPI = "https://pypi.org/simple"


def _run(*args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=True, timeout=900, **kwargs)


def _where_pip_looks(pip: list) -> str:
    """pip's index (PyPI unless index-url names another), extra indexes and find-links here, from its
    configuration files and PIP_* variables (``pip config list``)."""
    where: dict[str, list[str]] = {}
    for key, value in re.findall(r"^[^.\n]*\.(index-url|extra-index-url|find-links)='(.*)'$",
                                 _run(*pip, "config", "list").stdout, re.M):
        where.setdefault(key, []).extend(url for url in value.split() if url not in where.get(key, []))
    where.setdefault("index-url", [PYPI])
    return "; ".join(f"{key} {' '.join(urls)}" for key, urls in sorted(where.items()))


def _pip_install(pip: list, *args) -> None:
    """``pip install ARGS``, resolved through the package index: a failure says where pip looked."""
    done = subprocess.run([str(a) for a in (*pip, "install", *args)], capture_output=True, text=True, timeout=900)
    if done.returncode:
        pytest.fail(f"pip install could not resolve through its package index ({_where_pip_looks(pip)}): this test "
                    f"needs an index that holds headsweep's dependencies and setuptools\n{done.stderr[-2000:]}")


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
    _pip_install(pip, "--quiet", theirs)
    report = tmp_path / "report.json"
    _pip_install(pip, "--quiet", "--dry-run", "--report", report, "-e", ROOT)
    to_install = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                  for item in json.loads(report.read_text())["install"]}
    assert "headsweep" in to_install and "transformers" in to_install  # pip resolved the dependencies
    assert "torch" not in to_install, f"installing headsweep would replace their torch 2.9.0 with {to_install['torch']}"
