"""The analysis service: every endpoint through a real HTTP server on Ray Serve (``served``; the
answers of /compare-maps, /mask-iou and /figures there are also those of the in-process app), and a
schemathesis fuzz of its OpenAPI document against the ASGI app (no 5xx, ever)."""

from __future__ import annotations

import io
import itertools
import re
import socket
from collections import Counter

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from analysis.data.loading import load_sweep
from analysis.questions import results
from analysis.views import vocabulary
from analysis.views.service.app import build_app
from base.result import UnitMap
from headsweep.cli import questions
from orchestrator.registry import Registry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DRAWN_SHARE = 0.15
"""Of a figure's pixels, the share that is not white (test_figures_are_pngs)."""
CLS, TAG = "synthetic-cls", "synthetic-tag"


def _pixels(png: bytes) -> np.ndarray:
    """(height, width, 3) uint8 RGB of a PNG."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_TRIES = 3


def _serve_on_a_free_port(registry_url: str) -> str:
    """``serve_app`` on a port that was free a moment before (Serve's proxy binds its own: it cannot be
    handed a bound socket, nor tell which port 0 gave it); one taken meanwhile, which the proxy then fails
    to bind, is left for another, PORT_TRIES tries in all. Its URL."""
    from ray import serve

    from analysis.views.service.serve import serve_app

    for attempt in range(1, PORT_TRIES + 1):
        port = _free_port()
        try:
            return serve_app(registry_url, "127.0.0.1", port)
        except Exception as error:  # noqa: BLE001 - the proxy's bind error comes wrapped in Ray's task error
            if f"Failed to bind to address '127.0.0.1:{port}'" not in str(error) or attempt == PORT_TRIES:
                raise
            serve.shutdown()


MASK_NAMES = [f"layer.{layer}.{role}" for layer in range(2) for role in ("query", "key", "value", "attn_out")]


def _mask_sweep(url: str, store: str) -> str:
    """A mask_train sweep (3 seeds) in the registry at ``url``, each run's ``masks.npz`` in the checkpoint
    store ``store``; the seeds share 80 % of a base mask (so their IoU is well above chance)."""
    from base.mask_format import pack_masks
    from experiments.harness.config import parse_config
    from orchestrator.checkpoints import CheckpointStore

    rng = np.random.default_rng(0)
    base = {name: rng.random((8, 8)) < 0.5 for name in MASK_NAMES}
    configs = [parse_config({"model": "tiny-bert", "method": "mask_train", "seed": seed}, check_files=False)
               for seed in range(3)]
    with Registry(url) as registry:
        sweep_id, _ = registry.create_sweep("masks", "name: masks\n", configs, {"cpus": 1.0}, None, 1)
        for cfg in configs:
            masks = {name: np.where(rng.random((8, 8)) < 0.8, kept, rng.random((8, 8)) < 0.5)
                     for name, kept in base.items()}
            CheckpointStore(store).put(cfg.run_key, "masks.npz", pack_masks(masks))
            assert registry.claim(cfg.run_key, "w") is not None
            assert registry.finish(cfg.run_key, {"accuracy": 0.9}, maps={"heads.mask_density": rng.random((2, 4))})
    return sweep_id


@pytest.fixture(scope="module")
def served_store(tmp_path_factory) -> str:
    """The checkpoint store (URI) the served app reads masks from."""
    return tmp_path_factory.mktemp("served-store").as_uri()


@pytest.fixture(scope="module")
def served(tmp_path_factory, sweep_builder, served_store):
    """(a client of the app on a private local Ray Serve, 127.0.0.1, a free port; its own sweep). The
    Serve replica reads masks from ``served_store`` (HEADSWEEP_CHECKPOINTS, set before Ray starts its
    workers)."""
    import ray
    from ray import serve

    sweep = sweep_builder(tmp_path_factory.mktemp("served"))
    with pytest.MonkeyPatch.context() as env:  # Ray's processes keep it, the Serve replica's included
        env.setenv("HEADSWEEP_CHECKPOINTS", served_store)
        # as serve_app sets them when it starts its own Ray: Serve's controller kills a proxy that is not
        # ready within 5 s, and serve.start() then fails with ActorDiedError (seen at load 9)
        for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
            env.setenv(name, "60")
        # a port another process took meanwhile is a bind error (_serve_on_a_free_port tries another), not a
        # port shared in silence with another Serve (SO_REUSEPORT, Serve's default: the kernel splits requests)
        env.setenv("SERVE_SOCKET_REUSE_PORT_ENABLED", "0")
        # imported here: Ray's workers import this module without tests/ on their path
        from local_ray import start_local_ray

        start_local_ray(configure_logging=False)
    try:
        url = _serve_on_a_free_port(sweep.url)
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client, sweep
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.ray
def test_sweeps_list_with_progress(served):
    client, sweep = served
    response = client.get("/sweeps")
    assert response.status_code == 200
    (row,) = [s for s in response.json() if s["id"] == sweep.sweep_id]
    assert row["counts"]["finished"] == 30 and row["counts"]["pending"] == 1  # 24 + the 6 fine-tunes
    assert row["total"] == 31 and row["progress"] == pytest.approx(30 / 31)


@pytest.mark.ray
def test_sweep_detail_lists_axes_and_metrics(served):
    client, sweep = served
    body = client.get(f"/sweeps/{sweep.sweep_id}").json()
    assert body["axes"]["task"] == [CLS, TAG] and body["axes"]["seed"] == [0, 1, 2, 3]
    assert body["axes"]["sparsity"] == [None] and body["metrics"] == ["accuracy", "loss", "open_heads"]
    assert body["grid"].startswith("name: ")


@pytest.mark.ray
def test_a_sweep_whose_driver_died_is_failed_with_its_history(served):
    """The service only reads: a running sweep whose driver job no cluster knows stays as recorded
    (nothing written) until the orchestrator records the loss (the supervisor, or `status` as
    here); then it is failed, with its orphaned runs, and the workers that died are named."""
    from orchestrator.driving.driver_job import driver_gone
    from orchestrator.driving.grid import expand, parse_grid
    from orchestrator.registry.events import WORKER_LOST

    client, sweep = served  # served from the tests' temp home: no Ray head, no dashboard known
    registry = Registry(sweep.url)
    spec = parse_grid({"name": "lost", "base": {"task": CLS}, "axes": {"seed": [0, 1]}})
    lost, _ = registry.create_sweep("lost", "name: lost\n", expand(spec), {"cpus": 1.0}, None, 1)
    first, _ = registry.unfinished(lost)
    registry.claim(first, "t0@host:1")
    registry.add_event(lost, WORKER_LOST, {"run_key": first, "worker": "t9@host:2", "attempt": 1, "then": "retried"})
    registry.set_sweep(lost, driver="d-that-no-cluster-knows", status="running")
    before = registry.get_sweep(lost)
    assert client.get(f"/sweeps/{lost}").json()["status"] == "running"
    assert [s["status"] for s in client.get("/sweeps").json() if s["id"] == lost] == ["running"]
    assert registry.get_sweep(lost) == before and len(registry.events(lost)) == 1  # read, never written
    assert driver_gone(registry, before)  # what `headsweep status` (and the supervisor) records
    body = client.get(f"/sweeps/{lost}").json()
    assert body["status"] == "failed"
    worker, driver = body["history"]
    assert worker.startswith(f"worker of run {first[:12]} died at ") and worker.endswith("Tune retried it")
    assert driver.startswith("driver gone (with its Ray head?) at ") and "; 1 run orphaned;" in driver
    assert driver.endswith(f"`headsweep resume {lost}` runs what is left")
    assert [s["status"] for s in client.get("/sweeps").json() if s["id"] == lost] == ["failed"]


@pytest.mark.ray
def test_runs_filter_and_paginate(served):
    client, sweep = served
    body = client.get(f"/sweeps/{sweep.sweep_id}/runs",
                      params={"task": CLS, "seed": "0,1", "offset": 1, "limit": 2}).json()
    assert body["total"] == 10 and (body["offset"], body["limit"]) == (1, 2) and len(body["runs"]) == 2
    assert body["runs"][0]["seed"] == 1 and body["runs"][0]["lambda"] == 0.01
    assert body["runs"][0]["maps"] == "heads.gate,heads.log_alpha"  # what the run stored
    assert all(list(row) == body["columns"] for row in body["runs"])
    repeated = client.get(f"/sweeps/{sweep.sweep_id}/runs?seed=0&seed=1&task={CLS}").json()
    assert repeated["total"] == 10
    compared = client.get(f"/sweeps/{sweep.sweep_id}/runs", params={"where": f"task = {CLS} and seed < 2"}).json()
    assert [r["run_key"] for r in compared["runs"]] == [r["run_key"] for r in repeated["runs"]]
    pending = client.get(f"/sweeps/{sweep.sweep_id}/runs", params={"status": "pending"}).json()
    assert pending["runs"][0]["run_key"] == sweep.pending_key and pending["runs"][0]["metrics.accuracy"] is None
    assert pending["runs"][0]["maps"] == "" and pending["runs"][0]["started_at"] is None


@pytest.mark.ray
def test_aggregate_equals_the_query(served):
    client, sweep = served
    body = client.get(f"/sweeps/{sweep.sweep_id}/aggregate",
                      params={"group_by": "task,pipeline", "metric": "accuracy"}).json()
    with Registry(sweep.url) as registry:
        rows = results.aggregate(load_sweep(registry, sweep.sweep_id), ["task", "pipeline"], "accuracy")
    # the fine-tunes and the gate runs are different methods: never pooled, method is a group axis
    assert [r["group"] for r in body["rows"]] == [
        {"task": r["task"], "pipeline": r["pipeline"], "method": r["method"]} for r in rows]
    assert [r["mean"] for r in body["rows"]] == pytest.approx([r["mean"] for r in rows])
    assert [r["ci_hi"] for r in body["rows"]] == pytest.approx([r["ci_hi"] for r in rows])


def _stem_cell_fits(sweep) -> tuple[float, float]:
    """He & Choi's stem cell statistic of ``sweep``'s seeds 0-2, from its gates by statsmodels' OLS
    (the paper's tool): each cell's ``sqrt(max(adjusted R^2, 0))`` of one seed's gates on the other
    two's, averaged over cells. (ours: the mean over the three choices of response, the paper's: seed 2
    as the response)."""
    import statsmodels.api as sm

    def fit(response: np.ndarray, others: list[np.ndarray]) -> float:
        r2_adj = sm.OLS(response, sm.add_constant(np.column_stack(others))).fit().rsquared_adj
        return max(r2_adj, 0.0) ** 0.5

    ours, paper = [], []
    for cell in sorted({key[:3] for key in sweep.gates}):
        z = [sweep.gates[(*cell, seed)].ravel() for seed in (0, 1, 2)]
        ours.append(np.mean([fit(z[i], z[:i] + z[i + 1:]) for i in range(3)]))
        paper.append(fit(z[2], z[:2]))
    return float(np.mean(ours)), float(np.mean(paper))


@pytest.mark.ray
def test_agreement_and_spearman(served):
    client, sweep = served
    seed = client.get(f"/sweeps/{sweep.sweep_id}/agreement", params={"across": "seed", "n_perm": 50}).json()
    assert seed["map"] == "heads.gate"  # no map named: the one most runs have (ties by name)
    assert seed["labels"] == ["0", "1", "2"] and np.shape(seed["matrix"]) == (3, 3) and seed["n_cells"] == 8
    for null in seed["stem_cell"]["nulls"]:  # both nulls, each saying which it is
        assert null["observed"] > null["band_hi"] and null["p_text"] == "p < 0.02"
    assert [n["null"] for n in seed["stem_cell"]["nulls"]] == ["within_layers", "all_units"]
    paper = seed["stem_cell_paper"]  # the paper's single fit, beside ours: each the value its definition gives
    ours_fit, paper_fit = _stem_cell_fits(sweep)
    assert paper_fit != pytest.approx(ours_fit, abs=1e-3)  # the sweep tells them apart (0.824 vs 0.826)
    assert seed["stem_cell"]["observed"] == pytest.approx(ours_fit, abs=1e-9)
    assert paper["observed"] == pytest.approx(paper_fit, abs=1e-9) and "the paper's" in paper["pooled"]
    assert paper["nulls"][0]["observed"] > paper["nulls"][0]["band_hi"]
    task = client.get(f"/sweeps/{sweep.sweep_id}/agreement?across=task&n_perm=50").json()
    within = task["mean_offdiag"]["nulls"][0]
    assert within["band_lo"] < within["observed"] < within["band_hi"]
    assert sorted(task["matched_on"]) == ["head_gates.lambda", "head_gates.pipeline", "init_from.method"]
    rho = client.get(f"/sweeps/{sweep.sweep_id}/spearman",
                     params={"a": "pipeline:dp", "b": "pipeline:sp", "top": 0.2}).json()
    assert rho["spearman"] > 0.8 and rho["k"] == 15 and rho["n_a"] == 12
    assert rho["overlap"] > 3 * rho["chance_overlap"]


@pytest.mark.ray
@pytest.mark.parametrize(("kind", "params", "coloured"), [
    ("rgb", {"task": TAG, "pipeline": "sp", "lambda": "0.1"}, 0.03), ("grey", {}, 0.0),
    ("agreement", {"across": "task", "n_perm": 20}, 0.05),
    ("curves", {"task": CLS, "metric": "accuracy", "x": "lambda"}, 0.005),
])
def test_figures_are_pngs(served, kind, params, coloured):
    """Each a picture with its data drawn: at least DRAWN_SHARE of its pixels not white, and at least
    ``coloured`` of them coloured (not a grey; a heatmap's cells, curves' lines). Measured 2026-11-28:
    drawn 0.61 (grey) 0.34 (agreement) 0.29 (rgb) 0.26 (curves), coloured 0.088 (rgb) 0.144 (agreement)
    0.012 (curves); with the data left out (images all NaN, curves without points: title, axes, legend
    and colour bar stay), drawn 0.055-0.061 but 0.34 (agreement: NaN cells are grey), coloured
    0.003 (rgb) 0.011 (agreement: its colour bar) 0 (curves)."""
    client, sweep = served
    response = client.get(f"/sweeps/{sweep.sweep_id}/figures/{kind}.png", params=params)
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert response.content[:8] == PNG_MAGIC
    pixels = _pixels(response.content).astype(int)
    assert (pixels < 245).any(axis=2).mean() > DRAWN_SHARE, kind
    assert (pixels.max(axis=2) - pixels.min(axis=2) > 60).mean() >= coloured, kind


@pytest.mark.ray
def test_figures_as_pdf_and_svg_at_a_dpi(served):
    """`format` and `dpi`, as `headsweep figures --format --dpi`, through the real server: a one-page PDF
    and an SVG of the figure's own size with its title, a PNG at twice the dpi twice as many pixels a side,
    the list's names and URLs in the format asked, and a format it does not draw a 422 naming it."""
    import xml.etree.ElementTree as ET

    from analysis.views import figure_plan

    client, sweep = served
    curves = f"/sweeps/{sweep.sweep_id}/figures/curves"
    params = {"task": CLS, "metric": "accuracy", "x": "lambda"}
    with Registry(sweep.url) as registry:  # the figure's size in points (1/72 inch), as the PDF and SVG give it
        drawn = figure_plan.figure_of(load_sweep(registry, sweep.sweep_id), "curves", {"task": [CLS]},
                                      metric="accuracy", x="lambda")
    width, height = (round(72 * v, 1) for v in drawn.get_size_inches())

    pdf = client.get(curves, params=params | {"format": "pdf", "dpi": 300})
    assert pdf.status_code == 200 and pdf.headers["content-type"] == "application/pdf", pdf.text[:300]
    assert pdf.headers["content-disposition"] == 'inline; filename="curves.pdf"'
    assert pdf.content[:5] == b"%PDF-" and pdf.content.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page\b", pdf.content)) == 1
    (box,) = re.findall(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)\s+([\d.]+)\s*\]", pdf.content)
    assert (float(box[0]), float(box[1])) == pytest.approx((width, height), abs=0.1)

    svg = client.get(curves, params=params | {"format": "svg"})
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml"), svg.text[:300]
    root = ET.fromstring(svg.content)  # well-formed XML whose root is an SVG element
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert (float(root.get("width").removesuffix("pt")), float(root.get("height").removesuffix("pt"))) == \
        pytest.approx((width, height), abs=0.1)
    assert b"<!-- accuracy vs lambda -->" in svg.content  # the title's first line (the glyphs are paths)

    png = {dpi: client.get(curves, params=params | {"dpi": dpi}) for dpi in (100, 200)}
    assert all(r.headers["content-type"] == "image/png" for r in png.values())
    assert png[100].content == client.get(f"{curves}.png", params=params).content  # the default; the old path
    small, large = (_pixels(png[dpi].content).shape[:2] for dpi in (100, 200))
    assert large == (2 * small[0], 2 * small[1]), (small, large)

    listed = client.get(f"/sweeps/{sweep.sweep_id}/figures", params={"format": "svg", "dpi": 300}).json()["figures"]
    assert listed and all(f["name"].endswith(".svg") and "format=svg&dpi=300" in f["url"] for f in listed)
    one = next(f for f in listed if f["kind"] == "grey")
    assert client.get(one["url"]).content[:400].find(b"<svg") >= 0

    for bad, status, detail in (("jpg", 422, "query parameter 'format'"), ("PDF", 422, "query parameter 'format'")):
        refused = client.get(curves, params=params | {"format": bad})
        assert refused.status_code == status and detail in refused.json()["detail"], refused.text
    refused = client.get(curves, params=params | {"dpi": 5000})
    assert refused.status_code == 422 and "query parameter 'dpi'" in refused.json()["detail"]


@pytest.mark.ray
def test_the_rgb_figure_colours_each_head_by_the_seeds_that_keep_it(served):
    """He & Choi's RGB map: head colour (1 - z1, 1 - z2, 1 - z3) of seeds 1-3, so a head open in some
    seeds only is one of six pure colours; each colour's share of those pixels is its share of those
    heads in the cell's gates (each head is a cell of the same size; a legend patch is a few pixels)."""
    client, sweep = served
    cell = (TAG, "sp", 0.1)
    response = client.get(f"/sweeps/{sweep.sweep_id}/figures/rgb.png",
                          params={"task": cell[0], "pipeline": cell[1], "lambda": str(cell[2])})
    assert response.status_code == 200, response.text
    gates = np.stack([sweep.gates[(*cell, seed)].ravel() for seed in (0, 1, 2)], axis=1)  # (heads, seeds)
    heads = Counter(tuple(int(255 * (1 - g)) for g in head) for head in gates)
    colours = [c for c in itertools.product((0, 255), repeat=3) if len(set(c)) == 2]  # neither black nor white
    assert sum(heads[c] for c in colours) >= 6, heads  # the sweep has heads open in some seeds only
    drawn = Counter(map(tuple, _pixels(response.content).reshape(-1, 3).tolist()))
    shares = np.array([drawn[c] for c in colours]) / sum(drawn[c] for c in colours)
    expected = np.array([heads[c] for c in colours]) / sum(heads[c] for c in colours)
    assert shares == pytest.approx(expected, abs=0.02), dict(zip(colours, shares.round(3), strict=True))


@pytest.mark.ray
@pytest.mark.parametrize(("path", "status", "detail"), [
    ("/sweeps/sw-nope", 404, "unknown sweep 'sw-nope'; did you mean"),
    ("/sweeps/sw-nope/aggregate", 404, "unknown sweep"),
    ("/sweeps/sw-nope/runs", 404, "unknown sweep"),  # a 500 before the fuzz found it (the grid read first)
    ("{s}/runs?tsk=x", 400, "unknown query parameter 'tsk'; did you mean 'task'"),
    ("{s}/runs?task=synthetic-cl", 400, "no run with task 'synthetic-cl'; did you mean 'synthetic-cls'"),
    ("{s}/runs?limit=0", 422, "query parameter 'limit'"),
    ("{s}/runs?offset=x", 422, "query parameter 'offset'"),
    ("{s}/aggregate?metric=acc", 400, "unknown metric 'acc'; did you mean 'accuracy'"),
    ("{s}/aggregate?group_by=tsk", 400, "unknown axis 'tsk'; did you mean 'task'"),
    ("{s}/agreement?across=seeds", 400, "unknown across 'seeds'; did you mean 'seed'"),
    ("{s}/agreement?across=model", 400, "at least 2 values of model"),
    ("{s}/spearman?a=task:synthetic-cls", 422, "query parameter 'b'"),
    ("{s}/spearman?a=task&b=task:synthetic-tag", 400, "--where 'task': at its end: expected an operator"),
    ("{s}/spearman?a=task:synthetic-cls&b=task:synthetic-tag&top=1.5", 422, "query parameter 'top'"),
    ("{s}/runs?where=metrics.accuracy > x", 400, "metrics.accuracy > x: metrics.accuracy is a number, 'x' is not"),
    ("{s}/figures/rbg.png", 422, "path parameter 'kind'"),
    ("{s}/figures/curves.png?x=sparsity", 400, "no finished run has both accuracy and sparsity"),
    ("{s}/figures/rgb.png?task=synthetic-tag", 400, "4 cells with 3 finished seeds match task:synthetic-tag"),
])
def test_bad_input_is_a_clear_4xx(served, path, status, detail):
    client, sweep = served
    response = client.get(path.replace("{s}", f"/sweeps/{sweep.sweep_id}"))
    assert response.status_code == status, response.text
    assert detail in response.json()["detail"]


@pytest.mark.ray
def test_openapi_document(served):
    client, _ = served
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths) == {"/sweeps", "/sweeps/{sweep_id}", "/sweeps/{sweep_id}/runs",
                          "/sweeps/{sweep_id}/results", "/sweeps/{sweep_id}/agreement",
                          "/sweeps/{sweep_id}/spearman", "/sweeps/{sweep_id}/iou", "/sweeps/{sweep_id}/compare-maps",
                          "/sweeps/{sweep_id}/transfer", "/sweeps/{sweep_id}/figures",
                          "/sweeps/{sweep_id}/figures/{kind}"}  # the old /aggregate, /mask-iou, {kind}.png: hidden


@pytest.mark.ray
def test_compare_maps_mask_iou_and_figures_through_serve(served, served_store):
    """The three endpoints the other served tests leave out, through the real server: each answer is
    the in-process app's (the same registry and store), and says what it should of this sweep."""
    from fastapi.testclient import TestClient

    client, sweep = served
    mask_sweep_id = _mask_sweep(sweep.url, served_store)  # in the served registry
    s = f"/sweeps/{sweep.sweep_id}"
    requests = [(f"{s}/compare-maps", {"maps": "heads.gate,heads.log_alpha", "n_perm": 20}),
                (f"{s}/compare-maps", {"maps": "heads.log_alpha", "across": "task", "n_perm": 20}),
                (f"/sweeps/{mask_sweep_id}/mask-iou", {"across": "seed"}),
                (f"{s}/figures", {})]
    answers = [client.get(path, params=params) for path, params in requests]
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    with pytest.MonkeyPatch.context() as env, TestClient(build_app(sweep.url)) as local:
        env.setenv("HEADSWEEP_CHECKPOINTS", served_store)
        assert [a.json() for a in answers] == [local.get(path, params=params).json() for path, params in requests]
    maps, tasks, masks, figures = (a.json() for a in answers)
    # gates are scores thresholded, so the two maps rank the heads alike; the tasks keep different heads
    (pair,) = maps["pairs"]
    assert pair["rho"] > 0.8 and {pair["a"], pair["b"]} == {"heads.gate", "heads.log_alpha"}
    assert tasks["labels"] == [CLS, TAG] and tasks["pairs"][0]["rho"] < pair["rho"]
    assert masks["pairs"] == 3 and masks["runs"] == 3 and masks["iou"] > masks["chance"] + 0.3
    listed = {f["kind"] for f in figures["figures"]}
    assert figures["sweep"] == sweep.sweep_id and {"grey", "rgb", "agreement"} <= listed
    first = client.get(figures["figures"][0]["url"])  # a listed URL answers, through the server too
    assert first.status_code == 200 and first.content[:8] == PNG_MAGIC


@pytest.mark.ray
def test_zz_a_finished_run_shows_up_at_once(served):
    """Last in the module: it writes. The memoised answers are keyed by the sweep's version."""
    client, sweep = served
    before = client.get(f"/sweeps/{sweep.sweep_id}/aggregate?group_by=task").json()["rows"][1]
    with Registry(sweep.url) as registry:
        registry.claim(sweep.pending_key, "w")
        registry.finish(sweep.pending_key, {"accuracy": 0.0}, maps={"heads.gate": np.ones((6, 12))})
    after = client.get(f"/sweeps/{sweep.sweep_id}/aggregate?group_by=task").json()["rows"][1]
    assert before["group"] == after["group"] == {"task": CLS, "method": "head_gates"}
    assert (before["n"], after["n"]) == (12, 13) and after["mean"] < before["mean"]
    detail = client.get(f"/sweeps/{sweep.sweep_id}").json()
    assert detail["progress"] == 1.0


# --------------------------------------------------------------------------- the ASGI app, no Ray


@pytest.fixture(scope="module")
def asgi(sweep):
    from fastapi.testclient import TestClient

    with TestClient(build_app(sweep.url)) as client:
        yield client


def test_agreement_is_answered_up_to_max_run_perms_and_refused_beyond(asgi, sweep, monkeypatch):
    """The bound is on runs x permutations (24 runs here); the real one answers a 2,004-run sweep (668
    cells x 3 seeds) at the default 1,000 permutations (~3.5 s on 6 x 12 head maps)."""
    assert vocabulary.MAX_RUN_PERMS >= 2_004 * 1_000
    monkeypatch.setattr(vocabulary, "MAX_RUN_PERMS", 24 * 40)
    answered = asgi.get(f"/sweeps/{sweep.sweep_id}/agreement", params={"across": "seed", "n_perm": 40})
    assert answered.status_code == 200 and answered.json()["stem_cell"]["nulls"][0]["n_perm"] == 40
    refused = asgi.get(f"/sweeps/{sweep.sweep_id}/agreement", params={"across": "seed", "n_perm": 41})
    assert refused.status_code == 400
    assert "24 runs with 41 permutations is more than this service answers (960 runs x permutations): " \
           "lower n_perm (to 40 or less)" in refused.json()["detail"]


def test_last_is_the_newest_sweep_on_every_endpoint(asgi, sweep, tmp_path):
    assert asgi.get("/sweeps/last").json()["id"] == sweep.sweep_id
    for path, params in [("runs", {"task": CLS}), ("aggregate", {"group_by": "task"}),
                         ("agreement", {"across": "task", "n_perm": 10}),
                         ("spearman", {"a": f"task:{CLS}", "b": f"task:{TAG}", "n_perm": 10}),
                         ("figures/grey.png", {"task": CLS})]:
        last = asgi.get(f"/sweeps/last/{path}", params=params)
        assert last.status_code == 200, (path, last.text)
        assert last.content == asgi.get(f"/sweeps/{sweep.sweep_id}/{path}", params=params).content, path
    parameter = asgi.get("/openapi.json").json()["paths"]["/sweeps/{sweep_id}"]["get"]["parameters"][0]
    assert "'last'" in parameter["description"]
    from fastapi.testclient import TestClient

    with Registry(f"sqlite:///{tmp_path / 'empty.db'}") as empty, TestClient(build_app(empty.url)) as client:
        none = client.get("/sweeps/last/runs")
    assert none.status_code == 404 and "no sweeps yet" in none.json()["detail"]


@pytest.mark.parametrize(("page", "asset"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_docs_load_nothing_from_another_host(asgi, page, asset):
    """/docs and /redoc work offline: every script, style sheet and icon they load is served here."""
    html = asgi.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html.text)
    assert any(url.endswith(asset) for url in urls) and re.search(r"https?://", html.text) is None
    for url in urls:
        assert url.startswith("/"), url  # this server, not a CDN
        response = asgi.get(url)
        assert response.status_code == 200 and len(response.content) > 1000, url
    assert "/openapi.json" in html.text and asgi.get("/openapi.json").status_code == 200


# --------------------------------------------------------------------------- fuzz (ASGI, no Ray)


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_finds_no_server_error(sweep, mode):
    """Requests generated from the OpenAPI document (valid ones, then invalid ones), on
    random and on the real sweep id: never a 5xx, and every 4xx says why in one string.

    (schemathesis' pytest plugin does not run under pytest 9, so the operations'
    hypothesis strategies are driven directly.)"""
    schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(sweep.url))
    operations = [result.ok() for result in schema.get_all_operations()]
    api_routes = {route.path for route in build_app(sweep.url).routes
                  if route.path.startswith("/sweeps") and route.include_in_schema}  # not the old paths' aliases
    assert {operation.path for operation in operations} == api_routes  # every endpoint is fuzzed
    unsatisfiable = []

    for operation in operations:
        if mode == GenerationMode.NEGATIVE and operation.path == "/sweeps":
            continue  # no parameters: nothing to make invalid
        strategy = operation.as_strategy(mode)
        if "sweep_id" in operation.path:
            strategy = strategy | operation.as_strategy(mode, path_parameters={"sweep_id": sweep.sweep_id})

        @given(case=strategy)
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def no_server_error(case):
            response = case.call()
            assert response.status_code < 500, (case.as_curl_command(), response.text)
            if response.status_code >= 400:
                assert isinstance(response.json()["detail"], str), response.text

        try:
            no_server_error()
        except Unsatisfiable:  # nothing of this operation can be made invalid (e.g. a free string)
            assert mode == GenerationMode.NEGATIVE, operation.label
            unsatisfiable.append(operation.label)
    # /sweeps/{id} has only the free-string id; /figures has format and dpi, which can be made invalid
    assert unsatisfiable == ([] if mode == GenerationMode.POSITIVE else ["GET /sweeps/{sweep_id}"])


# --------------------------------------------------------------------------- every figure of the CLI (ASGI, no Ray)


@pytest.fixture(scope="module")
def every_kind_sweep(tmp_path_factory):
    """(url, sweep id) of a registry sweep with a figure of every kind: head_gates SP (2 lambdas x 3 seeds)
    and head_importance (3 seeds, a pruning curve) runs that start from the same 3 fine-tunes, and
    skill_neurons runs (3 seeds)."""
    from experiments.harness.config import parse_config

    rng = np.random.default_rng(5)
    url = f"sqlite:///{tmp_path_factory.mktemp('every_kind') / 'registry.db'}"
    base = {"model": "minilm-l6", "task": {"name": CLS}, "train": {"max_steps": 10}}
    gates = [parse_config({**base, "method": "head_gates", "seed": s, "head_gates": {"pipeline": "sp", "lambda": lam}})
             for s in range(3) for lam in (0.01, 0.1)]
    importance = [parse_config({**base, "method": "head_importance", "seed": s}) for s in range(3)]
    skill = [parse_config({**base, "method": "skill_neurons", "seed": s}) for s in range(3)]
    profile = rng.normal(size=(6, 12))
    with Registry(url) as registry:
        sweep_id, _ = registry.create_sweep("kinds", "name: kinds\n", [*gates, *importance, *skill], {"cpus": 1.0},
                                            None, 1)
        for key in {cfg.upstreams["init_from"].run_key for cfg in [*gates, *importance]}:
            assert registry.claim(key, "w") is not None and registry.finish(key, {"accuracy": 0.8})
        for cfg in gates:
            alpha = profile + rng.normal(scale=0.5, size=profile.shape) - 10 * cfg.section.lambda_
            assert registry.claim(cfg.run_key, "w") is not None
            costs = {"cost.train_s": 2.0 + rng.random(), "cost.load_model_s": 0.5, "cost.total_s": 3.0}  # one cost figure
            assert registry.finish(cfg.run_key, {"accuracy": 0.8 - cfg.section.lambda_, "open_heads": float((alpha > 0).sum()),
                                                 **costs},
                                   maps={"heads.gate": (alpha > 0).astype(np.float32), "heads.log_alpha": alpha})
        for cfg in importance:
            curve = {f"accuracy_pruned_{p}": 0.8 - 0.003 * p - 0.01 * cfg.seed for p in (0, 50, 100)}
            assert registry.claim(cfg.run_key, "w") is not None
            importance = profile + rng.normal(scale=0.5, size=profile.shape)
            order = importance.ravel().argsort().argsort().reshape(importance.shape) / importance.size
            assert registry.finish(cfg.run_key, {"accuracy": 0.8, **curve}, maps={  # pruned_at: derived from importance
                "heads.importance": importance, "heads.pruned_at": order.astype(np.float32)})
        for cfg in skill:  # skill neurons: a neuron map, the perturbation and FFN pruning's accuracy
            metrics = {"accuracy": 0.8, "accuracy_noise_top_0.1": 0.7, "accuracy_noise_random_0.1": 0.79,
                       "pruned_accuracy": 0.6, "pruned_kept_fraction": 0.02}
            assert registry.claim(cfg.run_key, "w") is not None
            assert registry.finish(cfg.run_key, metrics, maps={
                "neurons.predictivity": UnitMap(0.5 + 0.1 * rng.random((6, 16)), "neurons", "predictivity")})
    return url, sweep_id


def test_the_service_offers_every_figure_the_cli_writes(every_kind_sweep, tmp_path):
    """GET /figures lists figure_plan's figures under the CLI's file names; each URL answers the very
    PNG that `headsweep figures` writes, and every kind of figure_plan.FIGURE_KINDS is among them."""
    import argparse

    from fastapi.testclient import TestClient

    from analysis.views import figure_plan

    url, sweep_id = every_kind_sweep
    parser = argparse.ArgumentParser(prog="headsweep")
    questions.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["figures", sweep_id, "--out", str(tmp_path), "--db", url])
    assert args.func(args) == 0
    written = {path.name: path.read_bytes() for path in tmp_path.glob("*.png")}
    with TestClient(build_app(url)) as client:
        listed = client.get("/sweeps/last/figures")
        assert listed.status_code == 200, listed.text
        assert listed.json()["sweep"] == sweep_id
        figures = listed.json()["figures"]
        assert sorted(f["name"] for f in figures) == sorted(written)
        assert {f["kind"] for f in figures} == set(figure_plan.FIGURE_KINDS)
        for planned in figures:
            assert planned["url"].split("?")[0] == f"/sweeps/{sweep_id}/figures/{planned['kind']}"
            response = client.get(planned["url"])
            assert response.status_code == 200, (planned, response.text)
            assert response.headers["content-type"] == "image/png"
            assert response.content == written[planned["name"]], planned
        assert client.get(f"/sweeps/{sweep_id}/figures?task={CLS}").status_code == 400  # the whole sweep's plan
        compared = client.get(f"/sweeps/{sweep_id}/figures/compare_maps.png", params={"maps": "heads.importance"})
        assert compared.status_code == 400 and "give two or more maps" in compared.json()["detail"]


def test_figures_of_one_kind_as_pdf_and_svg_and_what_the_default_plan_leaves_out(every_kind_sweep, tmp_path, capsys):
    """`figures --kind K --format pdf|svg --dpi N` writes that kind only; an unknown kind is one line naming
    the nearest; the plan has one cost figure (never a curve of a cost.* timing) and compares
    heads.importance without heads.pruned_at, its own ranking; the Python API returns the same as Figures."""
    from matplotlib.figure import Figure

    import headsweep
    from analysis.data.loading import open_sweep
    from analysis.views import figure_plan
    from headsweep.cli import main
    from orchestrator.registry.reader import RegistryReader

    url, sweep_id = every_kind_sweep
    assert main(["figures", sweep_id, "--kind", "cost", "--format", "pdf", "--dpi", "300",
                 "--out", str(tmp_path / "pdf"), "--db", url]) == 0
    (pdf,) = (tmp_path / "pdf").iterdir()
    assert pdf.name == "cost.pdf" and pdf.read_bytes()[:5] == b"%PDF-"
    # journals refuse Type 3 fonts: the PDF embeds TrueType ones (matplotlib's default would be Type 3)
    fonts = set(re.findall(rb"/Subtype\s*/(\w+)", pdf.read_bytes())) & {b"Type3", b"TrueType", b"CIDFontType2"}
    assert fonts and b"Type3" not in fonts, fonts
    assert main(["figures", sweep_id, "--kind", "compare_maps", "--format", "svg", "--out", str(tmp_path / "svg"),
                 "--db", url]) == 0
    (svg,) = (tmp_path / "svg").iterdir()
    assert svg.name == "compare_maps_heads.svg" and b"<svg" in svg.read_bytes()[:400]
    capsys.readouterr()
    assert main(["figures", sweep_id, "--kind", "rbg", "--db", url]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "headsweep: error: unknown figure kind 'rbg'; did you mean 'rgb'? (one of "
        + ", ".join(figure_plan.FIGURE_KINDS) + ")"]
    for dpi, why in (("5000", "5000 is outside 10 to 600 dots per inch"), ("high", "'high' is not a number")):
        with pytest.raises(SystemExit):  # the service's bounds (422 there), before anything is drawn
            main(["figures", sweep_id, "--dpi", dpi, "--out", str(tmp_path / "none"), "--db", url])
        assert f"argument --dpi: {why}" in capsys.readouterr().err and not (tmp_path / "none").exists()

    plan = figure_plan.figure_plan(open_sweep(RegistryReader(url), sweep_id))
    assert [name for name, kind, _ in plan if kind == "cost"] == ["cost.png"]
    assert not [name for name, kind, _ in plan if kind == "curves" and "cost" in name]
    assert [sorted(params["maps"]) for _, kind, params in plan if kind == "compare_maps"] == [
        ["heads.importance", "heads.log_alpha"]]
    sweep = headsweep.sweep(sweep_id, db=url)
    assert isinstance(sweep.figure("cost"), Figure)
    drawn = sweep.figures("compare_maps")
    assert list(drawn) == ["compare_maps_heads.png"] and all(isinstance(f, Figure) for f in drawn.values())
