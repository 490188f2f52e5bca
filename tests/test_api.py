"""``import headsweep`` against a small real sweep: its answers are the CLI's and the service's for
the same sweep (the same numbers, the same figure bytes), and examples/notebook.ipynb runs in a real
kernel (nbclient) and shows them.

The sweep: 6 real tiny-bert head-gate runs (3 seeds x 2 lambdas, a few steps), run in this process
as a trial runs them (claim, ``experiments.harness.runner.run``, finish) into a real SQLite registry,
without Ray; ``headsweep.submit`` through a real local Ray head is the slow test at the end.
"""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import headsweep
from analysis import statistics
from analysis.views import figures
from base.png import figure_png
from headsweep.cli import main as headsweep_cli
from orchestrator.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
GRID = {
    "name": "api",
    "base": {
        "model": "tiny-bert",
        "method": "head_gates",
        "task": {"name": "synthetic-cls", "num_train": 48, "num_eval": 16, "max_length": 24},
        "train": {"max_steps": 6, "batch_size": 8, "eval_every": 3, "lr": 5.0e-5},  # lr: the default, set
        "head_gates": {"lr": 0.1},
    },
    "axes": {"seed": [0, 1, 2], "lambda": [0.01, 0.1]},
    "resources": {"cpus": 1},
    "max_concurrent": 2,
}
N_RUNS, LAYERS, HEADS = 6, 2, 4  # tiny-bert: 2 layers of 4 heads


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory) -> tuple[str, str, str]:
    """(registry URL, sweep id, MLflow store) of the GRID's runs, each run for real as a trial runs it,
    logged to its own MLflow run in a real local store (its id in the registry)."""
    from experiments.harness.runner import run
    from experiments.training.context import RunContext
    from orchestrator import tracking
    from orchestrator.driving.grid import expand, parse_grid

    spec = parse_grid(GRID)
    configs = expand(spec)
    folder = tmp_path_factory.mktemp("api-registry")
    url, mlflow_uri = f"sqlite:///{folder / 'registry.db'}", f"sqlite:///{folder / 'mlflow.db'}"
    mlflow = tracking.client(mlflow_uri)
    experiment = mlflow.create_experiment("api", artifact_location=(folder / "mlartifacts").as_uri())
    with Registry(url) as registry:
        sweep_id, counts = registry.create_sweep(spec.name, yaml.safe_dump(GRID), configs,
                                                 spec.resources.model_dump(), spec.max_concurrent, 0)
        assert counts["new"] == N_RUNS
        for cfg in configs:
            assert registry.claim(cfg.run_key, "test-worker") is not None
            run_id = tracking.start_run(mlflow, experiment, tracking.run_name(cfg, ()), tags={"sweep": sweep_id})
            registry.set_mlflow_run(cfg.run_key, run_id)
            tracker = tracking.MlflowTracker(mlflow, run_id)
            result = run(cfg, RunContext(tracker=tracker))
            tracker.finish()
            assert registry.finish(cfg.run_key, result.metrics, worker="test-worker", maps=result.maps)
        registry.set_sweep(sweep_id, status="finished")
    return url, sweep_id, mlflow_uri


@pytest.fixture
def db(tiny_sweep, monkeypatch) -> str:
    """The tiny sweep's id, its registry and MLflow store the ones the CLI and the API read
    (HEADSWEEP_DB, HEADSWEEP_TRACKING_URI)."""
    url, sweep_id, mlflow_uri = tiny_sweep
    monkeypatch.setenv("HEADSWEEP_DB", url)
    monkeypatch.setenv("HEADSWEEP_TRACKING_URI", mlflow_uri)
    return sweep_id


def _cli_json(capsys, *argv: str):
    capsys.readouterr()
    assert headsweep_cli(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _service(path: str, **params):
    from fastapi.testclient import TestClient

    from analysis.views.service.app import build_app
    from orchestrator import settings

    with TestClient(build_app(settings.registry_url(), headsweep.api.MlflowArtifacts())) as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _same(a, b) -> bool:
    """Equal values, NaN and None alike (a DataFrame's NaN is JSON's null)."""
    missing = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    if missing(a) or missing(b):
        return missing(a) and missing(b)
    return a == pytest.approx(b, rel=1e-12) if isinstance(a, float) else a == b


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def _rows_equal(frame: pd.DataFrame, rows: list[dict]) -> None:
    records = _records(frame)
    assert len(records) == len(rows)
    for got, want in zip(records, rows, strict=True):
        assert set(got) == set(want), (sorted(got), sorted(want))
        assert all(_same(got[k], want[k]) for k in want), (got, want)


# --------------------------------------------------------------------------- the sweep


def test_last_is_the_newest_sweep_and_an_unknown_id_names_the_nearest(db, tmp_path):
    s = headsweep.sweep("last")
    assert s.id == db and headsweep.sweep(db).id == db
    assert repr(s) == f"<Sweep {db} (api): finished, {N_RUNS} finished>"
    with pytest.raises(ValueError, match=f"unknown sweep '{db[:-1]}x'; did you mean '{db}'"):
        headsweep.sweep(db[:-1] + "x")
    with pytest.raises(ValueError, match="no sweeps yet"):
        headsweep.sweep("last", db=f"sqlite:///{tmp_path / 'empty.db'}")


def test_runs_are_one_table_from_the_cli_the_service_and_python(db, capsys, tiny_sweep, tmp_path):
    """``headsweep runs``, ``GET /runs`` and ``Sweep.runs()``: the same columns and rows, with the params
    the grid sets (train.lr at its default) or varies, the MLflow run id and artifact URI as MLflow has them."""
    from orchestrator import tracking

    frame = headsweep.sweep(db).runs()
    body = _service(f"/sweeps/{db}/runs")
    cli = _cli_json(capsys, "runs", db, "--format", "json")
    assert list(frame.columns) == body["columns"] == list(cli[0])
    assert {"params.train.lr", "params.train.max_steps", "params.head_gates.lambda", "params.seed", "mlflow_run_id",
            "artifact_uri", "started_at", "duration_s", "metrics.accuracy", "metrics.open_heads"} <= set(frame.columns)
    assert "params.train.decoder_lr" not in frame.columns  # a default the grid neither sets nor varies
    _rows_equal(frame, body["runs"])
    _rows_equal(frame, cli)
    assert len(frame) == N_RUNS and set(frame["params.train.lr"]) == {5e-5}
    parquet = tmp_path / "runs.parquet"
    assert headsweep_cli(["runs", db, "--format", "parquet", "--out", str(parquet)]) == 0
    _rows_equal(frame, _records(pd.read_parquet(parquet)))
    assert list(pd.read_parquet(parquet).columns) == list(frame.columns)
    mlflow = tracking.client(tiny_sweep[2])
    for row in cli:
        logged = mlflow.get_run(row["mlflow_run_id"])
        assert row["artifact_uri"] == logged.info.artifact_uri and row["artifact_uri"].endswith("/artifacts")
        assert float(logged.data.params["train.lr"]) == row["params.train.lr"]
        assert logged.data.metrics["accuracy"] == pytest.approx(row["metrics.accuracy"])
        assert row["duration_s"] > 0 and row["status"] == "finished"


@pytest.mark.parametrize("where", ["metrics.accuracy >= 0.5 and seed != 1", "seed:0|2,lambda > 0.05",
                                   "params.head_gates.lambda = 0.01 and metrics.open_heads <= 8"])
def test_runs_filtered_are_one_table_too(db, capsys, where):
    """The same --where, parsed once, selects the same runs on every surface: the runs numpy selects."""
    frame = headsweep.sweep(db).runs(where=where)
    all_runs = headsweep.sweep(db).runs()
    body = _service(f"/sweeps/{db}/runs", where=where)
    cli = _cli_json(capsys, "runs", db, "--where", where, "--format", "json")
    assert list(frame.columns) == body["columns"] == list(all_runs.columns)  # a filter keeps the columns
    _rows_equal(frame, body["runs"])
    _rows_equal(frame, cli)
    expected = {
        "metrics.accuracy >= 0.5 and seed != 1": (all_runs["metrics.accuracy"] >= 0.5) & (all_runs["seed"] != 1),
        "seed:0|2,lambda > 0.05": all_runs["seed"].isin([0, 2]) & (all_runs["lambda"] > 0.05),
        "params.head_gates.lambda = 0.01 and metrics.open_heads <= 8":
            (all_runs["params.head_gates.lambda"] == 0.01) & (all_runs["metrics.open_heads"] <= 8),
    }[where]
    assert list(frame["run_key"]) == list(all_runs["run_key"][expected]) and 0 < len(frame) < N_RUNS


def test_a_bad_where_is_one_line_on_every_surface(db, capsys):
    from analysis.data.where import EXAMPLE

    message = f"--where 'metrics.accuracy >> 1': at '>' (character 19): expected a value after '>' ({EXAMPLE})"
    with pytest.raises(ValueError, match=re.escape(message)):
        headsweep.sweep(db).runs(where="metrics.accuracy >> 1")
    assert headsweep_cli(["runs", db, "--where", "metrics.accuracy >> 1"]) == 2
    assert capsys.readouterr().err.strip() == f"headsweep: error: {message}"
    from fastapi.testclient import TestClient

    from analysis.views.service.app import build_app
    from orchestrator import settings

    with TestClient(build_app(settings.registry_url())) as client:
        response = client.get(f"/sweeps/{db}/runs", params={"where": "metrics.accuracy >> 1"})
    assert (response.status_code, response.json()["detail"]) == (400, message)


def test_results_are_the_clis_and_the_services(db, capsys):
    s = headsweep.sweep(db)
    results = s.results(group_by="lambda", metric="accuracy")
    assert list(results["lambda"]) == [0.01, 0.1] and list(results["n"]) == [3, 3]
    _rows_equal(results, _cli_json(capsys, "results", db, "--group-by", "lambda", "--metric", "accuracy",
                                   "--format", "json"))
    service = _service(f"/sweeps/{db}/results", group_by="lambda")["rows"]  # the default metric: accuracy
    assert service == _service(f"/sweeps/{db}/aggregate", group_by="lambda", metric="accuracy")["rows"]  # old path
    assert all(row.pop("expected_open") is None for row in service)  # beside open_heads only
    _rows_equal(results, [row["group"] | {k: v for k, v in row.items() if k != "group"} | {"metric": "accuracy"}
                          for row in service])
    # open heads: the expected open heads beside them, as `headsweep results` shows them (per cell by default)
    heads = s.results(metric="open_heads")
    assert "expected_open" in heads.columns and len(heads) == N_RUNS // 3
    _rows_equal(heads, _cli_json(capsys, "results", db, "--metric", "open_heads", "--format", "json"))


def test_a_map_is_the_registrys_with_the_runs_labels(db, tiny_sweep):
    values, runs = headsweep.sweep(db).map("heads.gate")
    assert values.shape == (N_RUNS, LAYERS, HEADS) and len(runs) == N_RUNS
    with Registry(tiny_sweep[0]) as registry:
        stored = registry.sweep_map(db, "heads.gate")
        assert list(runs["run_key"]) == list(registry.sweep_runs(db)["run_key"])
    np.testing.assert_array_equal(values, stored.values)
    assert list(runs.columns[:3]) == ["task", "model", "method"] and set(runs["seed"]) == {0, 1, 2}
    some, labels = headsweep.sweep(db).map("heads.log_alpha", where="seed:0")
    assert some.shape == (2, LAYERS, HEADS) and set(labels["seed"]) == {0}


def test_agreement_is_the_clis_and_the_services_with_the_same_figure(db, capsys, tmp_path):
    agreement = headsweep.sweep(db).agreement(across="seed")
    png = tmp_path / "agreement.png"
    cli = _cli_json(capsys, "agreement", db, "--across", "seed", "--format", "json", "--png", str(png))
    assert math.isfinite(agreement.value) and agreement.value == cli["mean_offdiag"]["observed"]
    assert agreement.labels == cli["labels"] == ["0", "1", "2"] and agreement.map_name == cli["map"]
    np.testing.assert_array_equal(agreement.matrix().to_numpy(), np.array(cli["matrix"], dtype=float))
    table = agreement.table()
    # every statistic, each against both nulls; one that 3 seeds do not allow (stem_cell_triples needs 4):
    # one row, untested
    asked = statistics.asked("agreement")
    assert list(table["statistic"]) == [stat.name for stat in asked for _ in range(2 if stat.min_runs <= 3 else 1)]
    for row in _records(table):
        if not isinstance(row["null"], str):  # untested (NaN in the frame): no null on either side
            assert not cli[row["statistic"]]["nulls"], cli[row["statistic"]]
            continue
        (null,) = [n for n in cli["mean_offdiag" if row["statistic"] == "r" else row["statistic"]]["nulls"]
                   if n["null"] == row["null"]]
        assert all(_same(row[k], null[k]) for k in ("null_mean", "band_lo", "band_hi", "excess", "p_value", "p_text"))
    service = _service(f"/sweeps/{db}/agreement", across="seed")
    assert service["mean_offdiag"]["observed"] == agreement.value
    assert figure_png(agreement.figure(), figures.DPI) == png.read_bytes()


def test_compare_maps_is_the_clis_with_the_same_figure(db, capsys, tmp_path):
    comparison = headsweep.sweep(db).compare_maps("heads.log_alpha", across="lambda", n_perm=200)
    png = tmp_path / "compare.png"
    cli = _cli_json(capsys, "compare-maps", db, "heads.log_alpha", "--across", "lambda", "--n-perm", "200",
                    "--format", "json", "--png", str(png))
    table = comparison.table()
    assert list(table[["a", "b"]].itertuples(index=False, name=None)) == [(p["a"], p["b"]) for p in cli["pairs"]]
    assert list(table["rho"]) == [p["rho"] for p in cli["pairs"]] and comparison.labels == cli["labels"]
    assert math.isfinite(table["rho"][0])
    assert figure_png(comparison.figure(), figures.DPI) == png.read_bytes()


def test_a_figure_is_the_services_with_the_same_parameters(db, tmp_path):
    """``Sweep.figure(kind, ...)`` takes the route's parameters by the same names (``map``, not a bridge
    table's ``map_name``) and draws the very PNG ``/figures/{kind}`` answers, and ``Sweep.figures(where=)``
    the files ``headsweep figures --where`` writes."""
    from fastapi.testclient import TestClient

    from analysis.views.service.app import build_app
    from orchestrator import settings

    s = headsweep.sweep(db)
    with TestClient(build_app(settings.registry_url())) as client:
        for kind, params in (("grey", {"map": "heads.log_alpha"}), ("agreement", {"across": "lambda", "n_perm": 20}),
                             ("curves", {"metric": "accuracy", "x": "lambda", "where": "seed:0|1"})):
            response = client.get(f"/sweeps/{db}/figures/{kind}", params=params)
            assert response.status_code == 200, response.text
            assert figure_png(s.figure(kind, **params), figures.DPI) == response.content, (kind, params)
    folder = tmp_path / "figs"
    assert headsweep_cli(["figures", db, "--where", "lambda:0.1", "--out", str(folder)]) == 0
    drawn = s.figures(where="lambda:0.1")
    assert sorted(drawn) == sorted(path.name for path in folder.iterdir()) and len(drawn) >= 2
    assert all(figure_png(figure, figures.DPI) == (folder / name).read_bytes() for name, figure in drawn.items())


def test_cancel_and_resume_in_python_are_the_commands(tmp_path, monkeypatch):
    """``headsweep.cancel`` is ``headsweep cancel``: a sweep whose driver is gone has its running runs and
    itself cancelled at once (no Ray needed); ``cancel`` and ``resume`` name the nearest sweep for an
    unknown id, as the commands do, before touching anything."""
    from experiments.harness.config import parse_config
    from orchestrator import settings

    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_RAY_DASHBOARD"):
        monkeypatch.delenv(name, raising=False)
    configs = [parse_config({"model": "tiny-bert", "task": {"name": "synthetic-cls"}, "seed": s}) for s in (0, 1, 2)]
    with Registry(settings.registry_url()) as registry:
        sweep_id, _ = registry.create_sweep("cancel", "name: cancel\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)
        assert registry.claim(configs[0].run_key, "w") and registry.finish(configs[0].run_key, {"accuracy": 0.5})
        assert registry.claim(configs[1].run_key, "trial@host:1") is not None
        registry.set_sweep(sweep_id, driver="raysubmit_gone", status="running")
        for call in (headsweep.cancel, headsweep.resume):
            with pytest.raises(ValueError, match=f"unknown sweep '{sweep_id[:-1]}x'; did you mean '{sweep_id}'"):
                call(sweep_id[:-1] + "x")
        assert registry.sweep_counts(sweep_id) == {"finished": 1, "running": 1, "pending": 1}
        assert headsweep.cancel("last") == {"finished": 1, "cancelled": 2}
        assert registry.get_sweep(sweep_id)["status"] == "cancelled"


def test_bad_input_is_a_value_error_naming_the_nearest(db):
    s = headsweep.sweep(db)
    with pytest.raises(ValueError, match="did you mean 'lambda'"):
        s.results(group_by="lamda")
    with pytest.raises(ValueError, match="did you mean 'heads.gate'"):
        s.map("heads.gates")


# --------------------------------------------------------------------------- the notebook


def _outputs(nb) -> list[tuple[str, dict]]:
    """(the printed text, the displayed data) of each code cell."""
    cells = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        text = "".join(o["text"] for o in cell.outputs if o.output_type == "stream" and o["name"] == "stdout")
        data = {k: v for o in cell.outputs if o.output_type == "execute_result" for k, v in o["data"].items()}
        cells.append((text, data))
    return cells


def test_the_example_notebook_runs_and_shows_the_sweep(db, capsys, tmp_path):
    """examples/notebook.ipynb in a real kernel on the tiny sweep: what it prints is what the API and
    the CLI answer (the runs' and results' shapes and columns, the agreement across seeds and its
    nulls), and its figure is the CLI's PNG."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # kept without outputs
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    opened, runs, results, agreement, figure, gates = _outputs(nb)

    assert opened[1]["text/plain"] == f"<Sweep {db} (api): finished, {N_RUNS} finished>"
    s = headsweep.sweep(db)
    assert runs[0] == f"runs: {s.runs().shape}\n"
    table = s.results(group_by="lambda", metric="accuracy")
    assert results[0] == f"results: {table.shape} {list(table.columns)}\n"
    assert "<table" in results[1]["text/html"]

    png = tmp_path / "agreement.png"
    cli = _cli_json(capsys, "agreement", "last", "--across", "seed", "--format", "json", "--png", str(png))
    printed = re.fullmatch(r"(\S+) across seeds: r = (\S+)\n", agreement[0])
    assert printed and printed[1] == cli["map"]
    assert math.isfinite(float(printed[2])) and printed[2] == f"{cli['mean_offdiag']['observed']:.4f}"
    shown = agreement[1]["text/plain"]  # the statistics against both nulls: each statistic's chance and p
    for name in (stat.name for stat in statistics.asked("agreement")):
        tested = cli["mean_offdiag" if name == "r" else name]
        assert all(null["p_text"] in shown for null in tested["nulls"]), (name, shown)
    assert base64.b64decode(figure[1]["image/png"]) == png.read_bytes()
    assert gates[0] == f"map: ({N_RUNS}, {LAYERS}, {HEADS})\n" and "mean_gate" in gates[1]["text/html"]


# --------------------------------------------------------------------------- submit


@pytest.mark.slow  # a real local Ray head, the driver as a Ray Job: minutes on 2 cores (make test-slow)
@pytest.mark.ray
def test_submit_a_grid_dict_and_wait(tmp_path, monkeypatch, capsys):
    """``headsweep.submit(dict, wait=True)`` is ``headsweep submit --wait``: the sweep is done when it
    returns, its grid kept as submitted, and its results are the CLI's."""
    from orchestrator.cluster.head import stop_local_head

    home = tmp_path / "home"
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    grid = {**GRID, "name": "api-submit", "axes": {"seed": [0, 1]}}
    try:
        s = headsweep.submit(grid, wait=True)
    finally:
        stop_local_head(home=home)
    assert repr(s) == f"<Sweep {s.id} (api-submit): finished, 2 finished>"
    with Registry(f"sqlite:///{home / 'registry.db'}") as registry:
        assert yaml.safe_load(registry.get_sweep(s.id)["grid"]) == grid
    assert (home / "grids").is_dir() and len(list((home / "grids").iterdir())) == 1
    _rows_equal(s.results(), _cli_json(capsys, "results", s.id, "--format", "json"))
    assert len(s.runs()) == 2 and s.map()[0].shape == (2, LAYERS, HEADS)
