"""The analysis service: HTTP (JSON, PNG, an OpenAPI document) over ``analysis.queries``.

Read only: it reads the registry's read model and the sweeps' recorded history, never writes
(a sweep's driver liveness is the orchestrator's, recorded by the supervisor and the CLI).
``build_app(registry_url)`` is a plain FastAPI app (tests call it
directly); ``serve_app`` runs the same app on Ray Serve, bound to 127.0.0.1
unless told otherwise. Each endpoint translates query parameters into a
``queries`` call and its answer into a pydantic model; nothing else.

Every ``{sweep_id}`` in a path may be ``last``, the newest sweep, as on the command line.
Bad input is a 4xx ``{"detail": "one line"}``: 404 for an unknown sweep,
400 for an unknown axis, metric, value or query parameter (with the nearest
valid one), 422 for a malformed parameter. Answers are memoised,
serialised, per (sweep, its version, question): the data is immutable
between versions and every random answer uses a fixed seed, so a repeated
question is a lookup.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, Field, create_model

from analysis import compare, figure_plan, masks, queries, select, statistics
from analysis.loading import AXES, SCALE_LABELS, SweepData, load_sweep
from analysis.select import QueryError
from experiments.common.naming import suggest
from orchestrator.registry import LABELS, LAST, NotFound, Registry
from orchestrator.registry.history import history as sweep_history
from orchestrator.status import RUN_DONE

APP_NAME = "headsweep-analysis"
MAX_RUN_MATRIX = 500  # across=run answers an N x N matrix: larger selections must be filtered
MAX_RUN_PERMS = 2_500_000
"""Runs x permutations of one agreement answer (and pairs x permutations of a compare-maps one that
must gather its relabelled maps). Agreement across seed of 2,004 runs (668 cells x 3 seeds) at 1,000
permutations measured 3.5 s on MiniLM's 6 x 12 head maps and 1.2 s on tiny-bert's 2 x 4 (2-core VM,
load ~1, 2026-11-27; 8-13 s before the nulls were batched), so ~4.4 s at this bound on head maps.
Time grows with units per run, and with seeds per cell (10 seeds: ~2x per run)."""
_MEMO_SIZE = 256


# --------------------------------------------------------------------------- models (the edge)


class ErrorOut(BaseModel):
    detail: str


class SweepOut(BaseModel):
    id: str
    name: str
    status: str
    created_at: datetime
    updated_at: datetime
    counts: dict[str, int] = Field(description="Runs per status.")
    total: int
    progress: float = Field(description="Fraction of runs that are finished, failed or cancelled.")
    mlflow_experiment_id: str | None = None
    mlflow_parent_run_id: str | None = None


class SweepDetailOut(SweepOut):
    history: list[str] = Field(description="What happened to its driver and workers, oldest first, as "
                               "`headsweep status` prints it: lost drivers with their orphaned runs, "
                               "resumes, workers that died.")
    grid: str = Field(description="The grid YAML as submitted.")
    axes: dict[str, list[str | float | int | None]] = Field(description="Distinct values of each axis.")
    metrics: list[str]


def _label_type(label: str) -> Any:
    """A label's JSON type: a setting on a scale (NaN = unset: null), the seed, else text ("" = unset)."""
    return float | None if label in SCALE_LABELS else int if label == "seed" else str


RunOut = create_model(
    "RunOut",
    run_key=(str, ...),
    group_key=(str, ...),
    status=(str, ...),
    **{label: (_label_type(label), ...) for label in LABELS},  # the registry's labels, by name
    metrics=(dict[str, float], ...),
    maps=(list[str], Field(description="The unit maps the run has stored (none until it finishes; "
                                       "none for a method that reports none).")),
)


class RunsPage(BaseModel):
    total: int = Field(description="Runs matching the filters.")
    offset: int
    limit: int
    runs: list[RunOut]


class AggregateRow(BaseModel):
    group: dict[str, str | float | int | None] = Field(description="The group's axis values.")
    mean: float | None
    std: float | None
    n: int = Field(description="Runs with the metric (finished).")
    ci_lo: float | None = Field(description="Lower end of the 95 % CI of the mean.")
    ci_hi: float | None
    ci_method: str = Field(description="t (a t interval, below 10 runs), bootstrap (from 10) or none (n < 2).")
    runs: int = Field(description="Runs in the group, finished or not.")


class AggregateOut(BaseModel):
    metric: str
    group_by: list[str]
    rows: list[AggregateRow]


class NullOut(BaseModel):
    null: str = Field(description="within_layers: units shuffled within each layer (the same units beyond "
                                  "the per-layer profile?); all_units: shuffled across all units (at all?).")
    question: str = Field(description="What this null asks, in words.")
    observed: float | None
    null_mean: float | None = Field(description="What chance gives: the mean of the null distribution.")
    excess: float | None = Field(description="observed - null_mean.")
    band_lo: float | None = Field(description="2.5th percentile of the null.")
    band_hi: float | None = Field(description="97.5th percentile of the null.")
    p_value: float | None = Field(description="One-sided permutation p; never below 1 / (n_perm + 1).")
    p_text: str = Field(description="'p = 0.03', or 'p < 0.001' when no permutation reached the observed value.")
    n_perm: int


class TestedOut(BaseModel):
    observed: float | None
    pooled: str = Field(description="What was pooled into the number.")
    nulls: list[NullOut] = Field(description="The statistic against each permutation null (empty: n_perm = 0).")


def _described(stat: statistics.Statistic) -> str:
    return f"{stat.label}: {stat.computes}; chance: {stat.null}."


def _tested_fields(question: str, matrix: str) -> dict[str, Any]:
    """A ``TestedOut`` field per statistic of ``question`` (``statistics.asked``) but its matrix's
    (and the top-k ones): the answers' fields come from the registry."""
    return {stat.name: (TestedOut, Field(description=_described(stat))) for stat in statistics.asked(question)
            if stat.name != matrix and stat.shape != "top_k"}


def _top_k_fields(prefix: str = "") -> dict[str, Any]:
    """A float field per top-k statistic of compare-maps (``prefix`` + its name)."""
    return {prefix + stat.name: (float if prefix else float | None,
                                 Field(description=("Chance of " if prefix else "") + _described(stat)))
            for stat in statistics.asked("compare_maps") if stat.shape == "top_k"}


AgreementOut = create_model(
    "AgreementOut",
    across=(str, ...),
    map=(str, Field(description="The unit map compared (the continuous companion when the asked map is "
                                "constant in some run: see notes).")),
    labels=(list[str], ...),
    matrix=(list[list[float | None]], ...),
    n_runs=(list[int], ...),
    mean_offdiag=(TestedOut, Field(description="Mean off-diagonal entry of the matrix: "
                                               f"{_described(statistics.STATISTICS[queries.MATRIX])}")),
    **_tested_fields("agreement", queries.MATRIX),
    n_cells=(int, Field(description="Cells with 3+ finished seeds behind stem_cell.")),
    matched_on=(list[str], Field(description="Axes every compared pair of runs agrees on.")),
    pooled_axes=(list[str], Field(description="Axes averaged over on request.")),
    notes=(list[str], ...),
)


class SpearmanOut(BaseModel):
    a: str
    b: str
    map: str
    n_a: int
    n_b: int
    spearman: float | None = Field(description="Spearman rho of the two groups' mean maps.")
    nulls: list[NullOut]
    mean_pairwise: float | None = Field(description="Mean rho over every (run of a, run of b) pair.")
    k_frac: float
    k: int
    jaccard: float
    overlap: float
    chance_jaccard: float = Field(description="Expected Jaccard of two independent random top-k sets.")
    chance_overlap: float = Field(description="Expected overlap of two independent random top-k sets (k / P).")
    notes: list[str]


ComparedPairOut = create_model(
    "ComparedPairOut",
    a=(str, ...),
    b=(str, ...),
    n_pairs=(int, Field(description="Pairs of runs compared (one run when it has both maps), or settings of the "
                                    "other axes (across).")),
    n_same_run=(int, ...),
    rho=(float | None, Field(description="Mean Spearman rho over the pairs (signs as named: '-map' is flipped).")),
    pooled=(str, ...),
    nulls=(list[NullOut], Field(description="Units relabelled at random, one relabelling per map (or value) "
                                            "shared by its runs: within layers, and across all units.")),
    **_top_k_fields(),
    **_tested_fields("compare_maps", compare.MATRIX),
)

CompareMapsOut = create_model(
    "CompareMapsOut",
    sweep=(str, ...),
    maps=(list[str], ...),
    across=(str | None, ...),
    kind=(str, ...),
    shape=(list[int], ...),
    labels=(list[str], ...),
    matrix=(list[list[float | None]], Field(description="Mean Spearman rho between labels (maps or across values).")),
    n_runs=(list[int], ...),
    pairs=(list[ComparedPairOut], ...),
    mean_offdiag=(TestedOut, ...),
    **{name: (TestedOut, Field(description=f"Mean over the pairs of labels of {field.description}"))
       for name, (_, field) in _tested_fields("compare_maps", compare.MATRIX).items()},
    top=(float, ...),
    k=(int, ...),
    **_top_k_fields("chance_"),
    models=(list[str], ...),
    tasks=(list[str], ...),
    matched_on=(list[str], Field(description="Config keys every compared pair of runs agrees on.")),
    pooled_axes=(list[str], ...),
    notes=(list[str], ...),
)


class MaskIouOut(BaseModel):
    across: str
    labels: list[str]
    pairs: int = Field(description="Pairs of runs compared: they differ in `across` only.")
    runs: int = Field(description="Runs whose stored masks were read.")
    iou: float = Field(description="Mean IoU of the kept weights over the pairs, pooled over every matrix.")
    chance: float = Field(description="Mean IoU of random masks with the same density per matrix.")
    excess: float
    matrix: list[list[float | None]] = Field(description="Mean IoU between each two values of `across`.")
    per_matrix: dict[str, float] = Field(description="Mean IoU per matrix (layer.<l>.<role>).")
    per_role: dict[str, list[float]] = Field(description="Mean IoU per matrix role, one value per layer.")
    matched_on: list[str]
    notes: list[str]
    pooled: str


class FigureOut(BaseModel):
    name: str = Field(description="The file `headsweep figures` writes it to.")
    kind: str
    url: str = Field(description="The PNG: this service's figures/{kind}.png with the plan's parameters.")


class FiguresOut(BaseModel):
    sweep: str
    figures: list[FigureOut] = Field(description="Every figure worth drawing for the sweep (analysis.figure_plan), "
                                                 "the ones `headsweep figures` writes.")


# --------------------------------------------------------------------------- state


class _Memo:
    """A small thread-safe LRU of answers."""

    def __init__(self, size: int):
        self.size, self.entries, self.lock = size, OrderedDict(), threading.Lock()

    def get_or_compute(self, key: tuple, compute: Callable[[], Any]) -> Any:
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key]
        value = compute()  # outside the lock: a slow answer must not block the others
        with self.lock:
            self.entries[key] = value
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return value


class _State:
    def __init__(self, registry_url: str):
        self.registry = Registry(registry_url)
        self.memo = _Memo(_MEMO_SIZE)

    def resolve(self, sweep_id: str) -> str:
        """``last`` -> the newest sweep's id, as on the command line (404 when there is none)."""
        try:
            return self.registry.resolve_sweep(sweep_id)
        except NotFound as err:
            raise HTTPException(404, str(err)) from None

    def data(self, sweep_id: str) -> SweepData:
        try:
            return load_sweep(self.registry, sweep_id)
        except NotFound:
            known = [s["id"] for s in self.registry.list_sweeps()]
            hint = suggest(sweep_id, known, cutoff=0.0) or " (the registry has no sweeps)"
            raise HTTPException(404, f"unknown sweep '{sweep_id}'{hint}") from None

    def answer(self, sweep_id: str, question: tuple, compute: Callable[[SweepData], Response]) -> Response:
        data = self.data(sweep_id)
        done = self.memo.get_or_compute((sweep_id, data.version, *question), lambda: compute(data))
        return Response(done.body, media_type=done.media_type)  # a fresh response per request


# --------------------------------------------------------------------------- parameters


def _check_params(request: Request, *names: str, axes: bool = True) -> None:
    """400 for a query parameter this endpoint does not take (a typo would be ignored silently)."""
    allowed = (*(AXES if axes else ()), *(("where",) if axes else ()), *names)
    for key in request.query_params:
        if key not in allowed:
            if not allowed:
                raise QueryError(f"unknown query parameter '{key}': this endpoint takes none")
            raise QueryError(f"unknown query parameter '{key}'{suggest(key, allowed, cutoff=0.0)} "
                             f"(this endpoint takes: {', '.join(allowed)})")


_FILTER_HELP = "Comma-separated values; a run matches any of them."
_MAP_HELP = "Unit map, e.g. heads.gate, heads.log_alpha (default: the map most runs of the sweep have)."


_WHERE_HELP = "Filters on any config key, as the CLI's --where: e.g. head_gates.lr:0.001,task.max_train:500|1000"
_ACROSS_HELP = f"run, {', '.join(a for a in AXES if a not in ('status', 'group_key', 'run_key'))} or a config key."


def axis_filters(request: Request, where: str | None = None, **_: Any) -> dict[str, list[str]]:
    """The axis filters of the request: a query parameter per axis (``AXES``, declared in the
    signature below for the OpenAPI document) and ``where``; a repeated parameter,
    ``seed=0&seed=1``, adds values."""
    filters: dict[str, list[str]] = {}
    for axis in AXES:
        for raw in request.query_params.getlist(axis):
            filters.setdefault(axis, []).extend(v.strip() for v in raw.split(","))
    for key, values in select.parse_filter(where or "").items():
        filters.setdefault(key, []).extend(values)
    return filters


axis_filters.__signature__ = inspect.Signature([  # what FastAPI reads: one optional parameter per axis
    inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
    *(inspect.Parameter(f"axis_{i}", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        str | None, Query(alias=axis, description=_FILTER_HELP + (" 'none' = unset." if axis in SCALE_LABELS else ""))])
      for i, axis in enumerate(AXES)),
    inspect.Parameter("where", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, Query(description=_WHERE_HELP)]),
])


Filters = Annotated[dict[str, list[str]], Depends(axis_filters)]


def sweep_path(request: Request, sweep_id: Annotated[str, Path(
        description=f"A sweep id, or '{LAST}' (the newest sweep), as on the command line.")]) -> str:
    """The sweep id of the path, ``last`` resolved."""
    return request.app.state.analysis.resolve(sweep_id)


SweepId = Annotated[str, Depends(sweep_path)]


def _frozen(filters: dict[str, list[str]]) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in filters.items()))


_FIGURE_QUERY = {"across": "across", "metric": "metric", "x": "x", "map_name": "map", "maps": "maps"}
"""figure() keyword -> the query parameter of ``figures/{kind}.png`` that sets it (filters aside)."""


def figure_url(sweep_id: str, kind: str, params: dict[str, Any]) -> str:
    """The URL of a planned figure (``figure_plan.figure_plan``): its figure() keywords as the query of
    ``figures/{kind}.png``; filters on an axis as that parameter, on another config key in ``where``."""
    query: dict[str, str] = {}
    filters = params.get("filters") or {}
    query |= {key: ",".join(map(str, values)) for key, values in filters.items() if key in AXES}
    where = [f"{key}:{'|'.join(map(str, values))}" for key, values in filters.items() if key not in AXES]
    if where:
        query["where"] = ",".join(where)
    for key, value in params.items():
        if key != "filters":
            query[_FIGURE_QUERY[key]] = ",".join(value) if key == "maps" else str(value)
    return f"/sweeps/{sweep_id}/figures/{kind}.png" + (f"?{urlencode(query)}" if query else "")


def _json(model: BaseModel) -> Response:
    """The serialised answer, memoised as is (a repeated question costs no validation or encoding)."""
    return Response(model.model_dump_json(by_alias=True), media_type="application/json")


def _matrix(matrix: np.ndarray) -> list[list[float | None]]:
    return [[select.py(v) for v in row] for row in np.asarray(matrix, dtype=np.float64)]


def _sweep_out(sweep: dict[str, Any], model: type[SweepOut] = SweepOut, **extra: Any) -> SweepOut:
    counts = sweep["counts"]
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in RUN_DONE)
    fields = {k: sweep.get(k) for k in model.model_fields if k in sweep}
    return model(**fields, total=total, progress=done / total if total else 0.0, **extra)


# --------------------------------------------------------------------------- the app


def build_app(registry_url: str) -> FastAPI:
    """The FastAPI app over the registry at ``registry_url`` (no Ray needed)."""
    state = _State(registry_url)
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
        _check_params(request, axes=False)
        return [_sweep_out(s) for s in state.registry.list_sweeps()]

    @app.get("/sweeps/{sweep_id}", response_model=SweepDetailOut, summary="One sweep, its axes and metrics")
    def get_sweep(sweep_id: SweepId, request: Request) -> SweepDetailOut:
        _check_params(request, axes=False)
        data = state.data(sweep_id)
        sweep = state.registry.get_sweep(sweep_id)
        axes = {axis: select.axis_values(data, axis) for axis in AXES if axis not in ("run_key", "group_key")}
        history = sweep_history(sweep | {"events": state.registry.events(sweep_id)})
        return _sweep_out(sweep, SweepDetailOut, axes=axes, metrics=sorted(data.metrics), history=history)

    @app.get("/sweeps/{sweep_id}/runs", response_model=RunsPage, summary="Runs, filtered by any axis")
    def list_runs(
        sweep_id: SweepId, request: Request, filters: Filters,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        _check_params(request, "offset", "limit")

        def compute(data: SweepData) -> Response:
            total, rows = queries.runs(data, filters, offset, limit)
            return _json(RunsPage(total=total, offset=offset, limit=limit, runs=[RunOut(**row) for row in rows]))

        return state.answer(sweep_id, ("runs", _frozen(filters), offset, limit), compute)

    @app.get("/sweeps/{sweep_id}/aggregate", response_model=AggregateOut,
             summary="Mean, std, n and 95 % CI of a metric per group")
    def aggregate(
        sweep_id: SweepId, request: Request, filters: Filters,
        metric: Annotated[str, Query(min_length=1, description="e.g. accuracy")] = "accuracy",
        group_by: Annotated[str, Query(description="Comma-separated axes; empty = per cell (over seeds).")] = "",
    ) -> Response:
        _check_params(request, "metric", "group_by")
        by = [a.strip() for a in group_by.split(",") if a.strip()]
        stat_keys = ("metric", "mean", "std", "n", "ci_lo", "ci_hi", "ci_method", "runs")

        def compute(data: SweepData) -> Response:
            rows = queries.aggregate(data, by, metric, filters)
            return _json(AggregateOut(metric=metric, group_by=by, rows=[
                AggregateRow(group={k: v for k, v in row.items() if k not in stat_keys},
                             **{k: row[k] for k in stat_keys if k != "metric"})
                for row in rows]))

        return state.answer(sweep_id, ("aggregate", _frozen(filters), metric, tuple(by)), compute)

    @app.get("/sweeps/{sweep_id}/agreement", response_model=AgreementOut,
             summary="Agreement of a unit map across seeds, tasks, ... with both permutation nulls")
    def agreement(
        sweep_id: SweepId, request: Request, filters: Filters,
        across: Annotated[str, Query(description=_ACROSS_HELP)] = "seed",
        map: Annotated[str | None, Query(description=_MAP_HELP)] = None,
        pool: Annotated[str, Query(description="Comma-separated axes to average over.")] = "",
        n_perm: Annotated[int, Query(ge=0, le=2000, description="Permutations per null (0 = none).")] = 1000,
    ) -> Response:
        _check_params(request, "across", "map", "pool", "n_perm")
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())

        def compute(data: SweepData) -> Response:
            map_name = map or select.default_map(data)
            if across == "run" and (n := len(select.map_runs(select.select(data, filters), map_name)[0])) > MAX_RUN_MATRIX:
                raise QueryError(f"across=run answers an N x N matrix: {n} runs selected, at most "
                                 f"{MAX_RUN_MATRIX}; filter them (e.g. task=..., seed=...)")
            result = queries.agreement(data, across, filters, n_perm=n_perm, max_run_perms=MAX_RUN_PERMS,
                                       map_name=map_name, pool=pooled)
            return _json(AgreementOut(**queries.agreement_json(result)))

        return state.answer(sweep_id, ("agreement", _frozen(filters), across, map, pooled, n_perm), compute)

    @app.get("/sweeps/{sweep_id}/spearman", response_model=SpearmanOut,
             summary="Spearman and top-k overlap of two groups' unit maps, with chance levels")
    def spearman(
        sweep_id: SweepId, request: Request, filters: Filters,
        a: Annotated[str, Query(description="Group a, e.g. task:sst2,pipeline:dp (values joined by |).")],
        b: Annotated[str, Query(description="Group b, e.g. task:ud-pos.")],
        k: Annotated[float, Query(gt=0, le=1, description="Top-k as a fraction of the units.")] = 0.2,
        map: Annotated[str | None, Query(description=_MAP_HELP)] = None,
        n_perm: Annotated[int, Query(ge=0, le=5000)] = 1000,
    ) -> Response:
        _check_params(request, "a", "b", "k", "map", "n_perm")
        group_a, group_b = select.parse_filter(a), select.parse_filter(b)
        return state.answer(
            sweep_id, ("spearman", _frozen(filters), _frozen(group_a), _frozen(group_b), k, map, n_perm),
            lambda data: _json(SpearmanOut(
                a=a, b=b, **queries.spearman_overlap(data, group_a, group_b, map or select.default_map(data), k,
                                                     filters, n_perm))))

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
        _check_params(request, "maps", "across", "top", "n_perm", "pool")
        names = tuple(m.strip() for m in maps.split(",") if m.strip())
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())
        return state.answer(
            sweep_id, ("compare-maps", _frozen(filters), names, across, top, n_perm, pooled),
            lambda data: _json(CompareMapsOut(**compare.compare_json(compare.compare_maps(
                data, names, filters, across=across, top=top, n_perm=n_perm, pool=pooled,
                max_run_perms=MAX_RUN_PERMS)))))

    @app.get("/sweeps/{sweep_id}/mask-iou", response_model=MaskIouOut,
             summary="Do runs keep the same weights? IoU of stored weight masks, beside chance")
    def mask_iou(
        sweep_id: SweepId, request: Request, filters: Filters,
        across: Annotated[str, Query(description="seed, or any axis: pairs of runs that differ in it only.")] = "seed",
        pool: Annotated[str, Query(description="Comma-separated axes to average over.")] = "",
    ) -> Response:
        _check_params(request, "across", "pool")
        pooled = tuple(a.strip() for a in pool.split(",") if a.strip())
        return state.answer(sweep_id, ("mask-iou", _frozen(filters), across, pooled), lambda data: _json(MaskIouOut(
            **masks.mask_iou(data, across, masks.stored_masks(), filters, pooled))))

    @app.get("/sweeps/{sweep_id}/figures", response_model=FiguresOut,
             summary="Every figure of the sweep, as `headsweep figures` writes them, each with its URL")
    def list_figures(sweep_id: SweepId, request: Request) -> Response:
        _check_params(request, axes=False)
        return state.answer(sweep_id, ("figures",), lambda data: _json(FiguresOut(sweep=sweep_id, figures=[
            FigureOut(name=name, kind=kind, url=figure_url(sweep_id, kind, params))
            for name, kind, params in figure_plan.figure_plan(data)])))

    @app.get("/sweeps/{sweep_id}/figures/{kind}.png", response_class=Response,
             responses={200: {"content": {"image/png": {}}, "description": "A PNG image."}},
             summary="A figure of the selection as PNG (every kind `headsweep figures` draws)")
    def figure(
        sweep_id: SweepId, kind: Literal[figure_plan.FIGURE_KINDS], request: Request,
        filters: Filters,
        across: str = "seed",
        metric: Annotated[str | None, Query(min_length=1)] = None,
        x: Literal[figure_plan.CURVE_X] | None = None,
        map: Annotated[str | None, Query(description="Unit map of rgb, grey and agreement figures "
                                                     "(default: the map most runs have).")] = None,
        maps: Annotated[str | None, Query(description="compare_maps: comma-separated maps of one kind "
                                                      "('-' before a name flips it).")] = None,
        n_perm: Annotated[int, Query(ge=0, le=2000)] = 1000,
    ) -> Response:
        _check_params(request, "across", "metric", "x", "map", "maps", "n_perm")
        names = [m.strip() for m in (maps or "").split(",") if m.strip()]
        return state.answer(
            sweep_id, ("figure", kind, _frozen(filters), across, metric, x, map, tuple(names), n_perm),
            lambda data: Response(
                figure_plan.figure(data, kind, filters, across=across, metric=metric, x=x, n_perm=n_perm,
                                   max_run_perms=MAX_RUN_PERMS, map_name=map or select.default_map(data), maps=names),
                media_type="image/png"))

    return app


# --------------------------------------------------------------------------- Ray Serve


def _deployment():
    from ray import serve

    @serve.deployment(name="analysis", num_replicas=1, max_ongoing_requests=100)
    @serve.ingress()
    class AnalysisService:
        """Ray Serve ingress: the FastAPI app is built in the replica, from the URL."""

        def __init__(self, registry_url: str):
            self.registry_url = registry_url

        def __serve_build_asgi_app__(self) -> FastAPI:
            return build_app(self.registry_url)

    return AnalysisService


def _replica_grpc_on_loopback() -> None:
    """Serve 2.60 replicas open their inter-deployment gRPC server on ``[::]:0``, every interface, with
    no option to change it: in a private (single-machine) Ray, put it on 127.0.0.1 (a worker setup hook)."""
    from ray.serve._private import replica

    add_port = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: add_port(server, address.replace("[::]:", "127.0.0.1:", 1))


def serve_app(registry_url: str, host: str = "127.0.0.1", port: int = 8000, blocking: bool = False) -> str:
    """Run the app on Ray Serve at ``http://host:port/`` and return that URL.

    Starts a private local Ray unless one is initialised (or ``RAY_ADDRESS``
    names a cluster). ``blocking=True`` waits for Ctrl-C, then shuts Serve
    (and the Ray it started) down.
    """
    import ray
    from ray import serve

    address = os.environ.get("RAY_ADDRESS") or "local"
    private = not ray.is_initialized() and address == "local"
    if private:
        # Ray's single-machine mode: node IP 127.0.0.1, so the private Ray (GCS, raylet, workers)
        # listens on loopback only, as the local head does (orchestrator/cluster.py); read at call
        # time, and inherited by the processes it starts.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        # Serve's controller kills a proxy that is not ready within 5 s, and serve.start() then fails:
        # starting a worker takes longer than that on a loaded 2-core machine.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"worker_process_setup_hook": _replica_grpc_on_loopback} if private else None)
    # No access log: one line per request in the proxy and the replica costs ~10 % of a cached answer.
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
        serve.run(_deployment().bind(registry_url), name=APP_NAME, route_prefix="/", blocking=blocking,
                  logging_config=quiet)
    except KeyboardInterrupt:
        # Ctrl-C. A private Ray goes with Serve in it: serve.shutdown() first would wait for the
        # controller to drain each proxy and replica, tens of seconds on a loaded machine. Whatever
        # happens, `headsweep serve` ends within 10 s: the processes of a private Ray die with this one
        # (Ray starts them with the kernel's parent-death signal).
        if blocking:
            watchdog = threading.Timer(8.0, os._exit, args=(0,))
            watchdog.daemon = True
            watchdog.start()
        if not private:
            serve.shutdown()
        if started:
            ray.shutdown()
    return f"http://{host}:{port}"
