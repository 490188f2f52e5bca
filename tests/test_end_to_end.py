"""End to end: a small real sweep (tiny model, 2 synthetic tasks x 3 seeds) through the orchestrator
on a real local Ray, then every analysis CLI command and every HTTP endpoint on a real Serve server.

``iou`` and ``transfer`` need runs of their own methods (mask_train's stored masks, prompt_transfer's
pairs): on the head_gates sweep the default run checks they name what is missing; the slow set runs
a second real sweep of those methods (``mask_and_transfer_sweeps``) and checks their answers, by CLI
and through Serve."""

import json
import os
import socket

import httpx
import pytest
import ray
import yaml

from analysis.views.report import sweep_report
from headsweep import sweep_job
from headsweep.cli import main as headsweep
from orchestrator import tracking
from orchestrator.driving.driver import execute_sweep
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry
from orchestrator.report import log_sweep_report

pytestmark = pytest.mark.ray

GRID = {
    "name": "e2e",
    "base": {
        "model": "tiny-bert",
        "task": {"num_train": 64, "num_eval": 24, "max_length": 24},
        "train": {"max_steps": 8, "batch_size": 8, "eval_every": 4, "lr": 1e-3},
        "head_gates": {"lambda": 0.1, "lr": 0.1},
    },
    "axes": {"task": ["synthetic-cls", "synthetic-tag"], "seed": [0, 1, 2]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
}


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    env = {"HEADSWEEP_HOME": str(home)}
    old = {k: os.environ.get(k) for k in ("HEADSWEEP_HOME", "HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI")}
    for key in old:
        os.environ.pop(key, None)
    os.environ.update(env)
    url = f"sqlite:///{home}/registry.db"
    spec = parse_grid(GRID)
    registry = Registry(url)
    sweep_id, _ = registry.create_sweep("e2e", yaml.safe_dump(GRID), expand(spec), {"cpus": 1}, 2, 0)
    mlflow = tracking.client()
    experiment_id = tracking.ensure_experiment(mlflow, "e2e")
    parent = tracking.start_run(mlflow, experiment_id, sweep_id)
    registry.set_sweep(sweep_id, mlflow_experiment_id=experiment_id, mlflow_parent_run_id=parent)
    # imported here: Ray's workers import this module without tests/ on their path
    from local_ray import start_local_ray

    start_local_ray()
    try:
        assert execute_sweep(sweep_id, registry_url=url) == {"finished": 6}
        yield {"home": home, "sweep": sweep_id, "url": url, "parent": parent}
    finally:
        ray.shutdown()
        for key, value in old.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def test_figures_are_logged_to_the_sweeps_parent_run(finished_sweep):
    logged = log_sweep_report(finished_sweep["sweep"], sweep_report)
    assert logged and all(path.endswith(".png") for path in logged)
    mlflow = tracking.client()
    names = {a.path for a in mlflow.list_artifacts(finished_sweep["parent"], "figures")}
    assert len(names) == len(logged)


def test_the_sweeps_job_logs_the_report_after_its_driver(finished_sweep, monkeypatch, capsys):
    """What a sweep's Ray Job runs once its driver finished (headsweep.sweep_job, the same call as
    ``headsweep report``): nothing for an untracked sweep; else every figure into the parent run, each
    path said; a report that fails is said on stderr and never raised (the job's status is the driver's)."""
    monkeypatch.setenv("HEADSWEEP_TRACK", "0")
    sweep_job.report(finished_sweep["sweep"])
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("HEADSWEEP_TRACK", "1")
    sweep_job.report(finished_sweep["sweep"])
    said = capsys.readouterr().out.split()
    names = {a.path for a in tracking.client().list_artifacts(finished_sweep["parent"], "figures")}
    assert said and set(said) == names and all(path.endswith(".png") for path in said)
    sweep_job.report("sw-no-such-sweep")
    assert "sw-no-such-sweep" in capsys.readouterr().err


def test_every_cli_command(finished_sweep, tmp_path, capsys):
    sweep = finished_sweep["sweep"]
    assert headsweep(["status", sweep]) == 0
    assert "finished: 6 of 6 runs finished" in capsys.readouterr().out
    assert headsweep(["ls"]) == 0
    assert sweep in capsys.readouterr().out
    assert headsweep(["results", sweep, "--group-by", "task", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["task"] for row in rows} == {"synthetic-cls", "synthetic-tag"} and all(row["n"] == 3 for row in rows)
    assert headsweep(["results", "last", "--group-by", "task", "--format", "csv", "--out", str(tmp_path / "r.csv")]) == 0
    assert (tmp_path / "r.csv").read_text().startswith("task,")
    png = tmp_path / "agreement.png"
    assert headsweep(["agreement", sweep, "--across", "seed", "--png", str(png)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "95% of chance" in text and "stem cell" in text and png.read_bytes()[:4] == b"\x89PNG"
    assert headsweep(["figures", sweep, "--out", str(tmp_path / "figs")]) == 0
    figures = list((tmp_path / "figs").glob("*.png"))
    assert len(figures) >= 4
    assert set(capsys.readouterr().out.split()) == {str(path) for path in figures}  # it names what it wrote
    assert headsweep(["compare-maps", sweep, "heads.gate", "heads.log_alpha", "--n-perm", "20", "--format", "json"]) == 0
    (pair,) = json.loads(capsys.readouterr().out)["pairs"]
    assert pair["rho"] > 0.5  # gates are the scores thresholded: the two maps rank the heads alike
    assert headsweep(["compare-maps", sweep, "heads.log_alpha", "--across", "task", "--n-perm", "20",
                      "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == ["synthetic-cls", "synthetic-tag"]
    # the weight-mask and prompt-transfer analyses, on a sweep without such runs: one line saying so
    assert headsweep(["iou", sweep, "--across", "seed"]) == 2
    assert "unknown map 'heads.mask_density'" in capsys.readouterr().err  # what weight-mask methods report
    assert headsweep(["transfer", sweep]) == 2
    assert "no finished prompt_transfer run" in capsys.readouterr().err
    assert headsweep(["agreement", sweep, "--across", "sead"]) == 2  # any config key is an axis: checked on the data
    assert "unknown across 'sead'; did you mean 'seed'?" in capsys.readouterr().err
    assert headsweep(["results", sweep, "--metric", "acuracy"]) == 2  # ours: one line naming it, exit 2
    assert "did you mean 'accuracy'?" in capsys.readouterr().err


# after the tests above: they read `last`, the e2e sweep
SMALL = {"model": "tiny-bert", "task": {"num_train": 64, "num_eval": 24, "max_length": 24},
         "train": {"max_steps": 8, "batch_size": 8, "eval_every": 4, "lr": 1e-3}}
# neither reads train.lr (prune_only's masks learn at mask_train.lr, the prompt at its own): refused there
WITHOUT_LR = {**SMALL, "train": {k: v for k, v in SMALL["train"].items() if k != "lr"}}
MASKS = {"name": "e2e-masks", "base": {**WITHOUT_LR, "method": "mask_train", "task": {**SMALL["task"], "name": "synthetic-cls"}},
         "axes": {"seed": [0, 1, 2]}}
TRANSFER = {"name": "e2e-transfer", "base": {**WITHOUT_LR, "method": "prompt_transfer"},
            "axes": {"seed": [0, 1], "task": ["synthetic-cls", "synthetic-shortcut"],
                     "source_task": ["synthetic-cls", "synthetic-shortcut"]}}


@pytest.fixture(scope="module")
def mask_and_transfer_sweeps(finished_sweep):
    """Two more real sweeps in the same registry, on the same Ray (~1 min on 2 cores): mask_train x 3
    seeds (each run's masks.npz in the home's checkpoint store), and prompt_transfer over 2 tasks x 2
    source tasks x 2 seeds (8 pairs, from 4 skill_neurons runs). {"masks": id, "transfer": id}."""
    registry = Registry(finished_sweep["url"])
    sweeps = {}
    for key, grid in (("masks", MASKS), ("transfer", TRANSFER)):
        configs = expand(parse_grid(grid))
        sweeps[key], _ = registry.create_sweep(grid["name"], yaml.safe_dump(grid), configs, {"cpus": 1}, 2, 0)
        assert execute_sweep(sweeps[key], registry_url=finished_sweep["url"], track=False) == {
            "finished": {"masks": 3, "transfer": 12}[key]}
    return sweeps


@pytest.mark.slow  # in CI (make test-slow): two more sweeps; the default run checks these commands' errors
def test_iou_and_transfer_on_runs_of_their_methods(mask_and_transfer_sweeps, capsys):
    assert headsweep(["iou", mask_and_transfer_sweeps["masks"], "--across", "seed", "--format", "json"]) == 0
    iou = json.loads(capsys.readouterr().out)
    assert (iou["pairs"], iou["runs"], iou["notes"]) == (3, 3, []) and 0 < iou["chance"] < 1 and 0 < iou["iou"] <= 1
    assert headsweep(["transfer", mask_and_transfer_sweeps["transfer"], "--n-perm", "20", "--format", "json"]) == 0
    transfer = json.loads(capsys.readouterr().out)
    assert transfer["tasks"] == ["synthetic-cls", "synthetic-shortcut"] and transfer["runs"] == 8
    assert transfer["model"] == "tiny-bert" and transfer["tables"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_every_endpoint_through_serve(finished_sweep, mask_and_transfer_sweeps):
    from ray import serve

    from analysis.views.service.serve import serve_app

    sweep = finished_sweep["sweep"]
    assert ray.is_initialized()  # the sweep's Ray; Serve runs on it
    try:
        base = serve_app(finished_sweep["url"], port=_free_port())
        with httpx.Client(base_url=base, timeout=60) as http:
            assert sweep in {s["id"] for s in http.get("/sweeps").json()}
            assert http.get(f"/sweeps/{sweep}").status_code == 200
            page = http.get(f"/sweeps/{sweep}/runs", params={"task": "synthetic-tag", "limit": 2}).json()
            assert page["total"] == 3 and len(page["runs"]) == 2
            aggregate = http.get(f"/sweeps/{sweep}/aggregate", params={"group_by": "task", "metric": "accuracy"})
            assert aggregate.status_code == 200
            assert http.get(f"/sweeps/{sweep}/agreement", params={"across": "seed"}).status_code == 200
            spearman = http.get(f"/sweeps/{sweep}/spearman", params={"a": "task:synthetic-cls", "b": "task:synthetic-tag"})
            assert spearman.status_code == 200
            maps = http.get(f"/sweeps/{sweep}/compare-maps", params={"maps": "heads.gate,heads.log_alpha", "n_perm": 20})
            assert maps.status_code == 200 and maps.json()["pairs"][0]["rho"] > 0.5
            masks = mask_and_transfer_sweeps["masks"]
            iou = http.get(f"/sweeps/{masks}/mask-iou", params={"across": "seed"})  # masks from the home's store
            assert iou.status_code == 200 and (iou.json()["pairs"], iou.json()["runs"]) == (3, 3)
            listed = http.get(f"/sweeps/{sweep}/figures").json()["figures"]
            assert {"grey", "agreement", "curves"} <= {f["kind"] for f in listed}
            for kind in ("grey", "agreement", "curves"):
                figure = http.get(next(f["url"] for f in listed if f["kind"] == kind))
                assert figure.status_code == 200 and figure.content[:4] == b"\x89PNG", kind
            assert http.get("/openapi.json").json()["openapi"].startswith("3.")
            assert http.get("/sweeps/sw-nope").status_code == 404
            bad = http.get(f"/sweeps/{sweep}/aggregate", params={"group_by": "tsak", "metric": "accuracy"})
            assert bad.status_code == 400 and "task" in bad.json()["detail"]
    finally:
        serve.shutdown()
