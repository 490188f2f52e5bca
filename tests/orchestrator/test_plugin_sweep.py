"""Adding a method needs one file, through a real sweep (DESIGN.md decision 8).

``tests/plugins/tiny_method.py`` is named in ``HEADSWEEP_METHODS`` (its folder on
``PYTHONPATH``) for this process and for the local Ray it starts, whose workers import
``experiments.methods`` afresh and find it there. Nothing in headsweep is patched: the
sweep, the registry, ``load_sweep(...).map``, ``agreement`` and ``headsweep agreement
--map`` all work with the method's own map, ``heads.tiny``.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import yaml

from base.sections import ConfigError
from experiments import methods
from orchestrator import tracking
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
ROOT = Path(__file__).resolve().parents[2]

GRID = {
    "name": "plugin-sweep",
    "base": {"method": "tiny", "model": "tiny-bert", "tiny": {"layers": 3}},
    "axes": {"strength": [0.2, 0.8], "seed": [0, 1]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
    "max_failures": 0,
}


@pytest.fixture(scope="module")
def plugin_ray():
    """HEADSWEEP_METHODS and PYTHONPATH set for this process, then a local Ray that inherits them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(methods.ENV_VAR, "tiny_method")
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
        mp.syspath_prepend(str(PLUGINS))
        # experiments.methods was imported before the variable was set: read it now, as its import does
        found = methods.from_env()
        assert list(found) == ["tiny"] and found["tiny"].__file__ == str(PLUGINS / "tiny_method.py")
        for name, module in found.items():
            mp.setitem(methods.METHODS, name, module)
        # imported here: Ray's workers import this module without tests/ on their path
        from local_ray import start_local_ray

        start_local_ray()
        try:
            yield
        finally:
            ray.shutdown()
            sys.modules.pop("tiny_method", None)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.ray
def test_a_method_from_headsweep_methods_runs_a_sweep_and_is_analysed_by_its_map(plugin_ray, home, capsys):
    from analysis.data.loading import clear_cache, load_sweep
    from analysis.questions.agreement import across_runs
    from headsweep.cli import main

    url = f"sqlite:///{home}/registry.db"
    spec = parse_grid(GRID)
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep(spec.name, yaml.safe_dump(GRID), expand(spec), {"cpus": 1}, 2, 0)
    mlflow = tracking.client()
    experiment_id = tracking.ensure_experiment(mlflow, spec.name)
    parent = tracking.start_run(mlflow, experiment_id, sweep_id)
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)

    assert execute_sweep(sweep_id, registry_url=url) == {"finished": 4}

    # the registry: the method's own map for every run, from the workers' import of the plugin
    results = registry.sweep_runs(sweep_id)
    assert {(found["method"], found["pipeline"]) for found in results["labels"]} == {("tiny", "once")}
    stack = registry.sweep_map(sweep_id, "heads.tiny")
    assert stack.kind == "heads" and stack.has.all() and stack.values.shape == (4, 3, 4)
    strength = np.array([run["tiny"]["strength"] for run in results["config"]])
    assert np.all((stack.values >= strength[:, None, None]) & (stack.values < strength[:, None, None] + 0.01))
    assert [info.name for info in results["maps"]] == ["heads.tiny"]  # no heads.gate: it learns none
    runs = mlflow.search_runs([experiment_id])
    assert sorted(r.data.tags.get("method") for r in runs if r.info.run_id != parent) == ["tiny"] * 4

    # analysis loads it by name and answers agreement on it
    clear_cache()
    data = load_sweep(registry, sweep_id)
    values, has = data.map("heads.tiny")
    assert has.all() and np.array_equal(values, stack.values)
    answer = across_runs.agreement(data, "seed", map_name="heads.tiny", n_perm=50)
    assert answer.map_name == "heads.tiny" and answer.notes == []
    assert np.isfinite(answer.mean_offdiag.observed) and answer.mean_offdiag.pooled.startswith("mean over 2 cells")
    assert set(answer.mean_offdiag.nulls) == {"within_layers", "all_units"}

    # and so does the CLI
    capsys.readouterr()
    assert main(["agreement", sweep_id, "--across", "seed", "--map", "heads.tiny", "--n-perm", "50",
                 "--db", url]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"heads.tiny: Pearson r across seed ({sweep_id})" in text
    assert f"seed r {answer.mean_offdiag.observed:.3f} in layers" in text
    assert "the same units beyond how many each layer keeps?" in text and "the same units at all?" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope_mod", "HEADSWEEP_METHODS: module 'nope_mod' cannot be imported: no module named 'nope_mod' "
                     "(is its folder on PYTHONPATH?)"),
        ("json", "HEADSWEEP_METHODS: module 'json' is not a method module: method 'json' (json): has no VERSION"),
        ("broken_method", "HEADSWEEP_METHODS: module 'broken_method' cannot be imported: "
                          "ModuleNotFoundError: No module named 'a_missing_dependency'"),
        ("finetune_again", "HEADSWEEP_METHODS: module 'finetune_again' is method 'finetune', a name "
                           "experiments.methods.finetune already has"),
    ],
)
def test_a_bad_module_in_headsweep_methods_is_one_line_naming_it(tmp_path, monkeypatch, value, message):
    (tmp_path / "broken_method.py").write_text("import a_missing_dependency\n")
    (tmp_path / "finetune_again.py").write_text("from experiments.methods.finetune import *  # noqa\n"
                                                "NAME = 'finetune'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        methods.from_env({methods.ENV_VAR: f" , {value} ,"})  # blanks and empty entries are skipped
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    for name in ("broken_method", "finetune_again", "a_missing_dependency"):
        sys.modules.pop(name, None)


def test_headsweep_methods_lists_it_in_a_fresh_process(tmp_path):
    """The import-time path: a new process with the variable set, the CLI, exit status."""
    env = os.environ | {methods.ENV_VAR: "tiny_method", "PYTHONPATH": str(PLUGINS)}
    shown = subprocess.run([sys.executable, "-m", "headsweep.cli", "methods", "tiny"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "tiny VERSION 1 pipelines: once, twice" in " ".join(shown.stdout.split())
    bad = subprocess.run([sys.executable, "-m", "headsweep.cli", "methods"], capture_output=True, text=True,
                         env=env | {methods.ENV_VAR: "tiny_method,nope_mod"}, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "headsweep: error: HEADSWEEP_METHODS: module 'nope_mod' cannot be imported: no module named 'nope_mod' "
        "(is its folder on PYTHONPATH?)"]


SUBMIT = """
import sys
sys.path.insert(0, sys.argv[1])  # the plug-in is on this process's path only, not in the environment
from headsweep.cli import main
sys.exit(main(["submit", sys.argv[2], "--wait"]))
"""


@pytest.mark.slow
@pytest.mark.ray
def test_submit_ships_the_plugin_to_a_head_that_cannot_import_it(tmp_path):
    """``headsweep submit`` passes HEADSWEEP_METHODS to its driver and ships the module with the job:
    the local head it starts has no PYTHONPATH, so its driver and trials find tiny_method only in
    what the job brought."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "tiny_method.py").write_text((PLUGINS / "tiny_method.py").read_text())
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID | {"axes": {"seed": [0, 1]}}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI",
                                                            "RAY_ADDRESS", "HEADSWEEP_RAY_DASHBOARD")}
    env |= {methods.ENV_VAR: "tiny_method", "HEADSWEEP_HOME": str(tmp_path / "home")}
    try:
        done = subprocess.run([sys.executable, "-c", SUBMIT, str(plugins), str(grid)], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        # a quiet submit: Ray's INFO lines are in the sweep's log, not on the terminal
        # (nor MLflow's "Creating initial MLflow database tables")
        assert "INFO" not in done.stderr and "Uploading package" not in done.stderr + done.stdout, done.stderr[-2000:]
        registry = Registry(f"sqlite:///{tmp_path}/home/registry.db")
        sweep = registry.list_sweeps()[0]
        runs = registry.sweep_runs(sweep["id"])
        assert sweep["status"] == "finished" and list(runs["status"]) == ["finished", "finished"]
        assert "Uploading package" in (tmp_path / "home" / "logs" / f"{sweep['id']}.log").read_text()
        assert all("heads.tiny" in names for names in runs["run_maps"])  # the plug-in's own map, from its trials
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cluster.head", "stop"], env=env, cwd=ROOT, timeout=120)
