"""The analysis service: HTTP (JSON, figures as PNG, PDF or SVG, an OpenAPI document) over the questions of ``analysis.questions``.

Read only: it reads the registry's read model and the sweeps' recorded history, never writes
(a sweep's driver liveness is the orchestrator's, recorded by the supervisor and the CLI).
``build_app(registry_url)`` is a plain FastAPI app (tests call it
directly); ``serve.serve_app`` runs the same app on Ray Serve, bound to 127.0.0.1
unless told otherwise. Each endpoint translates query parameters into a
question's call and its answer into a pydantic model (``models``); nothing else.

Every ``{sweep_id}`` in a path may be ``last``, the newest sweep, as on the command line.
Bad input is a 4xx ``{"detail": "one line"}``: 404 for an unknown sweep,
400 for an unknown axis, metric, value or query parameter (with the nearest
valid one), 422 for a malformed parameter. Answers are memoised,
serialised, per (sweep, its version, question): the data is immutable
between versions and every random answer uses a fixed seed, so a repeated
question is a lookup.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline

from analysis.data import select
from analysis.data.select import QueryError
from analysis.data.sweep import AXES, SweepData
from analysis.questions import masks, results, run_table
from analysis.questions.agreement import across_runs, compare
from analysis.questions.transfer import transfer_tables
from analysis.views import answers, figure_plan
from analysis.views.service.cache import State
from analysis.views.service.models import (
    AggregateOut,
    AggregateRow,
    AgreementOut,
    CompareMapsOut,
    ErrorOut,
    FigureOut,
    FiguresOut,
    MaskIouOut,
    RunsPage,
    SpearmanOut,
    SweepDetailOut,
    SweepOut,
    TransferOut,
)
from analysis.views.service.params import (
    ACROSS_HELP,
    DPI,
    MAP_HELP,
    Dpi,
    FigureFormat,
    Filters,
    SweepId,
    as_json,
    check_params,
    figure_url,
    frozen,
    sweep_out,
)
from analysis.views.transfer import transfer_json
from experiments.common.png import MEDIA_TYPES
from orchestrator.registry.history import history as sweep_history

MAX_RUN_MATRIX = 500  # across=run answers an N x N matrix: larger selections must be filtered
MAX_RUN_PERMS = 2_500_000
"""Runs x permutations of one agreement answer (and pairs x permutations of a compare-maps one that
must gather its relabelled maps). Agreement across seed of 2,004 runs (668 cells x 3 seeds) at 1,000
permutations measured 3.5 s on MiniLM's 6 x 12 head maps and 1.2 s on tiny-bert's 2 x 4 (2-core VM,
load ~1, 2026-11-27; 8-13 s before the nulls were batched), so ~4.4 s at this bound on head maps.
Time grows with units per run, and with seeds per cell (10 seeds: ~2x per run)."""


# --------------------------------------------------------------------------- models (the edge)


# --------------------------------------------------------------------------- state


# --------------------------------------------------------------------------- parameters


# --------------------------------------------------------------------------- the app


def build_app(registry_url: str, artifact_uris: run_table.ArtifactUris | None = None) -> FastAPI:
    """The FastAPI app over the registry at ``registry_url`` (no Ray needed); ``artifact_uris`` reads
    the runs' artifact URIs from the MLflow store (``headsweep.api.mlflow_artifact_uris``; none: null)."""
    state = State(registry_url)
    errors = {code: {"model": ErrorOut} for code in (400, 404, 422)}
    # /docs and /redoc load Swagger UI and ReDoc from the fastapi-offline package, not from a CDN:
    # they work on a machine with no internet
    app = FastAPIOffline(title="headsweep analysis", version="1", responses=errors,
                         description="Read-only answers about sweeps: runs, aggregates, gate agreement, figures.")
    app.state.analysis = state  # read by sweep_path

    @app.exception_handler(QueryError)
    def _query_error(_: Request, err: QueryError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        loc = [str(p) for p in first.get("loc", ())] or ["request"]
        where = f"{loc[0]} parameter '{'.'.join(loc[1:])}'" if len(loc) > 1 else loc[0]
        got = f" (got {first['input']!r})" if "input" in first else ""
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}{got}"}, status_code=422)

    @app.get("/sweeps", response_model=list[SweepOut], summary="Every sweep with its progress")
    def list_sweeps(request: Request) -> list[SweepOut]:
        check_params(request, axes=False)
        return [sweep_out(s) for s in state.registry.list_sweeps()]

    @app.get("/sweeps/{sweep_id}", response_model=SweepDetailOut, summary="One sweep, its axes and metrics")
    def get_sweep(sweep_id: SweepId, request: Request) -> SweepDetailOut:
        check_params(request, axes=False)
        data = state.data(sweep_id)
        sweep = state.registry.get_sweep(sweep_id)
        axes = {axis: select.axis_values(data, axis) for axis in AXES if axis not in ("run_key", "group_key")}
        history = sweep_history(sweep | {"events": state.registry.events(sweep_id)})
        return sweep_out(sweep, SweepDetailOut, axes=axes, metrics=sorted(data.metrics), history=history)

    @app.get("/sweeps/{sweep_id}/runs", response_model=RunsPage,
             summary="The run table: labels, status, times, MLflow run, params.*, metrics.*; filtered by --where")
    def runs(
        sweep_id: SweepId, request: Request, filters: Filters,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> Response:
        check_params(request, "offset", "limit")

        def compute(data: SweepData) -> Response:  # the sweep is known by now (404 else): its grid
            table = run_table.run_table(data, filters, state.registry.get_sweep(sweep_id)["grid"], artifact_uris)
            return as_json(RunsPage(sweep=sweep_id, total=len(table.rows), offset=offset, limit=limit,
                                    columns=table.columns, runs=table.rows[offset:offset + limit]))

        return state.answer(sweep_id, ("runs", frozen(filters), offset, limit), compute)

    @app.get("/sweeps/{sweep_id}/results", response_model=AggregateOut,
             summary="Mean, std, n and 95 % CI of a metric per group (`headsweep results`)")
    @app.get("/sweeps/{sweep_id}/aggregate", response_model=AggregateOut, include_in_schema=False)  # the old path
    def results_(
        sweep_id: SweepId, request: Request, filters: Filters,
        metric: Annotated[str | None, Query(min_length=1, description="Default: accuracy, else the first metric.")] = None,
        group_by: Annotated[str, Query(description="Comma-separated axes; empty = per cell (over seeds).")] = "",
    ) -> Response:
        check_params(request, "metric", "group_by")
        by = [a.strip() for a in group_by.split(",") if a.strip()]
        stat_keys = ("metric", "mean", "std", "n", "ci_lo", "ci_hi", "ci_method", "runs", "expected_open")

        def compute(data: SweepData) -> Response:
            used, rows = results.results(data, by, metric, filters)
            return as_json(AggregateOut(metric=used, group_by=by, rows=[
                AggregateRow(group={k: v for k, v in row.items() if k not in stat_keys},
                             **{k: row[k] for k in stat_keys if k != "metric" and k in row})
                for row in rows]))

        return state.answer(sweep_id, ("results", frozen(filters), metric, tuple(by)), compute)

    @app.get("/sweeps/{sweep_id}/agreement", response_model=AgreementOut,
             summary="Agreement of a unit map across seeds, tasks, ... with both permutation nulls")
    def agreement(
        sweep_id: SweepId, request: Request, filters: Filters,
        across: Annotated[str, Query(description=ACROSS_HELP)] = "seed",
        map: Annotated[str | None, Query(description=MAP_HELP)] = None,
        pool: Annotated[str, Query(description="Comma-separated axes to average over.")] = "",
        n_perm: Annotated[int, Query(ge=0, le=2000, description="Permutations per null (0 = none).")] = 1000,
    ) -> Response:
        check_params(request, "across", "map", "pool", "n_perm")
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())

        def compute(data: SweepData) -> Response:
            map_name = map or select.default_map(data)
            if across == "run" and (n := len(select.map_runs(select.select(data, filters), map_name)[0])) > MAX_RUN_MATRIX:
                raise QueryError(f"across=run answers an N x N matrix: {n} runs selected, at most "
                                 f"{MAX_RUN_MATRIX}; filter them (e.g. task=..., seed=...)")
            result = across_runs.agreement(data, across, filters, n_perm=n_perm, max_run_perms=MAX_RUN_PERMS,
                                       map_name=map_name, pool=pooled)
            return as_json(AgreementOut(**answers.agreement_json(result)))

        return state.answer(sweep_id, ("agreement", frozen(filters), across, map, pooled, n_perm), compute)

    @app.get("/sweeps/{sweep_id}/spearman", response_model=SpearmanOut,
             summary="Spearman and top-k overlap of two groups' unit maps, with chance levels")
    def spearman(
        sweep_id: SweepId, request: Request, filters: Filters,
        a: Annotated[str, Query(description="Group a, e.g. task:sst2,pipeline:dp (values joined by |).")],
        b: Annotated[str, Query(description="Group b, e.g. task:ud-pos.")],
        top: Annotated[float, Query(gt=0, le=1, description="Top-k as a fraction of the units.")] = compare.DEFAULT_TOP,
        map: Annotated[str | None, Query(description=MAP_HELP)] = None,
        n_perm: Annotated[int, Query(ge=0, le=2000, description="Relabellings per null (0 = none).")] = 1000,
    ) -> Response:
        check_params(request, "a", "b", "top", "map", "n_perm")
        group_a, group_b = select.parse_filter(a), select.parse_filter(b)
        return state.answer(
            sweep_id, ("spearman", frozen(filters), group_a, group_b, top, map, n_perm),
            lambda data: as_json(SpearmanOut(a=a, b=b, **answers.overlap_json(compare.overlap(
                data, group_a, group_b, map or select.default_map(data), top, filters, n_perm)))))

    @app.get("/sweeps/{sweep_id}/compare-maps", response_model=CompareMapsOut,
             summary="Do maps (methods) or one map's tasks rank the units alike? Spearman, top-k, nulls")
    def compare_maps(
        sweep_id: SweepId, request: Request, filters: Filters,
        maps: Annotated[str, Query(description="Comma-separated maps of one kind, e.g. heads.log_alpha,heads.importance; "
                                               "'-' before a name flips it (-heads.ablation_delta); one map with across.")],
        across: Annotated[str | None, Query(description="Compare one map across this axis (task, model, ...).")] = None,
        top: Annotated[float, Query(gt=0, le=1, description="Top-k as a fraction of the units.")] = compare.DEFAULT_TOP,
        n_perm: Annotated[int, Query(ge=0, le=2000, description="Relabellings per null (0 = none).")] = 1000,
        pool: Annotated[str, Query(description="With across: comma-separated axes to average over.")] = "",
    ) -> Response:
        check_params(request, "maps", "across", "top", "n_perm", "pool")
        names = tuple(m.strip() for m in maps.split(",") if m.strip())
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())
        return state.answer(
            sweep_id, ("compare-maps", frozen(filters), names, across, top, n_perm, pooled),
            lambda data: as_json(CompareMapsOut(**answers.compare_json(compare.compare_maps(
                data, names, filters, across=across, top=top, n_perm=n_perm, pool=pooled,
                max_run_perms=MAX_RUN_PERMS)))))

    @app.get("/sweeps/{sweep_id}/iou", response_model=MaskIouOut,
             summary="Do runs keep the same weights? IoU of stored weight masks, beside chance (`headsweep iou`)")
    @app.get("/sweeps/{sweep_id}/mask-iou", response_model=MaskIouOut, include_in_schema=False)  # the old path
    def iou(
        sweep_id: SweepId, request: Request, filters: Filters,
        across: Annotated[str, Query(description="seed, or any axis: pairs of runs that differ in it only.")] = "seed",
        pool: Annotated[str, Query(description="Comma-separated axes to average over.")] = "",
    ) -> Response:
        check_params(request, "across", "pool")
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())
        return state.answer(sweep_id, ("iou", frozen(filters), across, pooled), lambda data: as_json(MaskIouOut(
            **masks.mask_iou(data, across, masks.stored_masks(), filters, pooled,
                             load_initial=masks.stored_masks(name=masks.INITIAL_FILE)))))

    @app.get("/sweeps/{sweep_id}/transfer", response_model=TransferOut,
             summary="Prompt transfer between tasks: task x task tables, overlap vs transfer (`headsweep transfer`)")
    def transfer(
        sweep_id: SweepId, request: Request, filters: Filters,
        fraction: Annotated[float | None, Query(gt=0, le=1, description="The perturbed fraction of the neurons in "
                                                "the drop tables (default: the largest reported).")] = None,
        noise_std: Annotated[float | None, Query(ge=0, description="The runs at this prompt_transfer.noise_std "
                                                 "(default: the value most runs have).")] = None,
        n_perm: Annotated[int, Query(ge=0, le=2000, description="Shuffles of the transfer values (0 = none).")] = 1000,
    ) -> Response:
        check_params(request, "fraction", "noise_std", "n_perm")
        return state.answer(sweep_id, ("transfer", frozen(filters), fraction, noise_std, n_perm), lambda data: as_json(
            TransferOut(**transfer_json(transfer_tables(data, filters, fraction=fraction, noise_std=noise_std,
                                                        n_perm=n_perm)))))

    @app.get("/sweeps/{sweep_id}/figures", response_model=FiguresOut,
             summary="Every figure of the sweep, as `headsweep figures` writes them, each with its URL")
    def list_figures(sweep_id: SweepId, request: Request, format: FigureFormat = "png", dpi: Dpi = DPI) -> Response:
        check_params(request, "format", "dpi", axes=False)
        return state.answer(sweep_id, ("figures", format, dpi), lambda data: as_json(FiguresOut(sweep=sweep_id, figures=[
            FigureOut(name=str(PurePath(name).with_suffix(f".{format}")), kind=kind,
                      url=figure_url(sweep_id, kind, params, format, dpi))
            for name, kind, params in figure_plan.figure_plan(data)])))

    @app.get("/sweeps/{sweep_id}/figures/{kind}", response_class=Response,
             responses={200: {"content": {media: {} for media in MEDIA_TYPES.values()},
                              "description": "The figure as PNG, PDF or SVG (`format`)."}},
             summary="A figure of the selection as PNG, PDF or SVG (every kind `headsweep figures --kind` draws)")
    @app.get("/sweeps/{sweep_id}/figures/{kind}.png", response_class=Response, include_in_schema=False)  # the old path
    def figure(
        sweep_id: SweepId, kind: Literal[figure_plan.FIGURE_KINDS], request: Request,
        filters: Filters,
        format: FigureFormat = "png",
        dpi: Dpi = DPI,
        across: str = "seed",
        metric: Annotated[str | None, Query(min_length=1)] = None,
        x: Literal[figure_plan.CURVE_X] | None = None,
        map: Annotated[str | None, Query(description="Unit map of rgb, grey and agreement figures "
                                                     "(default: the map most runs have).")] = None,
        maps: Annotated[str | None, Query(description="compare_maps: comma-separated maps of one kind "
                                                      "('-' before a name flips it).")] = None,
        n_perm: Annotated[int, Query(ge=0, le=2000)] = 1000,
    ) -> Response:
        check_params(request, "format", "dpi", "across", "metric", "x", "map", "maps", "n_perm")
        names = [m.strip() for m in (maps or "").split(",") if m.strip()]
        return state.answer(
            sweep_id, ("figure", kind, format, dpi, frozen(filters), across, metric, x, map, tuple(names), n_perm),
            lambda data: Response(
                figure_plan.figure(data, kind, filters, fmt=format, dpi=dpi, across=across, metric=metric, x=x,
                                   n_perm=n_perm, max_run_perms=MAX_RUN_PERMS,
                                   map_name=map or select.default_map(data), maps=names),
                media_type=MEDIA_TYPES[format],
                headers={"Content-Disposition": f'inline; filename="{kind}.{format}"'}))

    return app


# --------------------------------------------------------------------------- Ray Serve


