"""Packaging the submitting checkout's code for a Ray Job's runtime environment.

A sweep runs the code that submitted it: the driver job, and every task and actor of the job
(the Tune trials), import headsweep's packages from the job's ``py_modules``, ahead of whatever
checkout the cluster's Python has installed; plug-in methods (``HEADSWEEP_METHODS``) ship with it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from orchestrator import settings

PACKAGES = ("base", "experiments", "orchestrator", "analysis", "headsweep")
"""headsweep too: the driver's job is ``python -m headsweep.sweep_job`` (the driver, then the report)."""


def shipped_code() -> list[str]:
    """The folders of this process's own base/, experiments/, orchestrator/, analysis/ and headsweep/:
    what a job ships."""
    import importlib.util

    return [importlib.util.find_spec(name).submodule_search_locations[0] for name in PACKAGES]


def plugin_code(value: str) -> tuple[list[str], list[str]]:
    """Where the method modules ``HEADSWEEP_METHODS`` names (``value``) live: the folders of those
    in a package, and the files of single-file modules (each one's top-level module). Modules inside
    headsweep's packages ship already; one that cannot be found here was refused at validation."""
    import importlib.util

    packages, files = [], []
    for path in (p.strip() for p in value.split(",")):
        top = path.split(".", 1)[0]
        spec = importlib.util.find_spec(top) if top and top not in PACKAGES else None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            packages.append(spec.submodule_search_locations[0])
        elif spec.origin:
            files.append(spec.origin)
    return sorted(set(packages)), sorted(set(files))


def _plugin_files_dir(files: list[str]) -> str:
    """A folder of this home holding copies of the single-file plug-ins (Ray ships folders, not files),
    named by their content, so a job ships them as its working dir (on the trials' path)."""
    import shutil

    digest = hashlib.sha256(b"".join(Path(f).name.encode() + Path(f).read_bytes() for f in files)).hexdigest()[:16]
    folder = settings.home() / "plugins" / digest
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for file in files:
            shutil.copy2(file, folder / Path(file).name)
    return str(folder)


def job_runtime_env(env: dict[str, str]) -> dict:
    """The driver job's runtime env: the submitting checkout's code and the given variables.

    The packages go as ``py_modules``: Ray puts them first on the path of the driver job and of
    every task and actor of the job (the Tune trials), ahead of whatever checkout the cluster's
    Python has installed, so a sweep runs the code that submitted it.
    """
    from experiments.harness.runner import code_version

    packages, files = plugin_code(env.get("HEADSWEEP_METHODS", ""))  # plug-in methods ship with the job too
    return {
        "py_modules": shipped_code() + packages,
        **({"working_dir": _plugin_files_dir(files)} if files else {}),
        "excludes": ["__pycache__", "*.pyc"],
        "env_vars": env | {"HEADSWEEP_CODE_COMMIT": code_version().split(" ", 1)[0]},
    }
