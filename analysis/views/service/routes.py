"""The service's routes, in three small routers: the sweeps, the questions and the figures. A question's route
is built from its declaration (``analysis.views.vocabulary``): its parameters as query parameters,
its answer asked through ``Question.ask``, memoised (``State.answer``) and written as its response
model (``models``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import PurePath
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel

from analysis.data import select
from analysis.data.sweep import AXES
from analysis.views import vocabulary
from analysis.views.figure_kinds import FIGURE_KINDS
from analysis.views.service.cache import State
from analysis.views.service.models import (
    AggregateOut,
    AggregateRow,
    AgreementOut,
    CompareMapsOut,
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
    Filters,
    SweepId,
    as_json,
    check_params,
    figure_url,
    frozen,
    query_parameter,
    sweep_out,
)
from analysis.views.vocabulary import FIGURE, FIGURE_DPI, FIGURE_FORMAT, FIGURES, Param, Question
from base.png import MEDIA_TYPES, figure_bytes
from orchestrator.registry.history import history as sweep_history

PAGE = (Param("offset", "the first run of the page", int, 0, ge=0, le=10**9),
        Param("limit", "runs in the page", int, 1000, ge=1, le=100_000))
"""The run table's page: the service's own parameters (the CLI and Python give the table whole)."""
_STATS = ("metric", "mean", "std", "n", "ci_lo", "ci_hi", "ci_method", "runs", "expected_open")


def _runs_page(table, values: dict[str, Any], sweep_id: str) -> RunsPage:
    offset, limit = values["offset"], values["limit"]
    return RunsPage(sweep=sweep_id, total=len(table.rows), offset=offset, limit=limit, columns=table.columns,
                    runs=table.rows[offset:offset + limit])


def _aggregate(answer: tuple[str, list[dict]], values: dict[str, Any], _: str) -> AggregateOut:
    used, rows = answer
    return AggregateOut(metric=used, group_by=list(values["group_by"]), rows=[
        AggregateRow(group={k: v for k, v in row.items() if k not in _STATS},
                     **{k: row[k] for k in _STATS if k != "metric" and k in row}) for row in rows])


def _model(model: type[BaseModel], question: Question) -> Callable[[Any, dict, str], BaseModel]:
    return lambda answer, values, sweep_id: model(**question.json(answer))


ROUTES = (  # question, response model, what writes the answer as it, the old path (hidden)
    (vocabulary.RUNS, RunsPage, _runs_page, None),
    (vocabulary.RESULTS, AggregateOut, _aggregate, "aggregate"),
    (vocabulary.AGREEMENT, AgreementOut, _model(AgreementOut, vocabulary.AGREEMENT), None),
    (vocabulary.SPEARMAN, SpearmanOut, _model(SpearmanOut, vocabulary.SPEARMAN), None),
    (vocabulary.COMPARE_MAPS, CompareMapsOut, _model(CompareMapsOut, vocabulary.COMPARE_MAPS), None),
    (vocabulary.IOU, MaskIouOut, _model(MaskIouOut, vocabulary.IOU), "mask-iou"),
    (vocabulary.TRANSFER, TransferOut, _model(TransferOut, vocabulary.TRANSFER), None),
)


def _signature(*leading: tuple[str, Any], params: tuple[Param, ...] = ()) -> inspect.Signature:
    """What FastAPI reads of an endpoint: the leading parameters (the path's, the request, the filters),
    then each declared parameter as a query parameter (``query_parameter``)."""
    return inspect.Signature([
        *(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind) for name, kind in leading),
        *(query_parameter(param) for param in params)])


def _answering(state: State, question: Question, out: Callable[[Any, dict, str], BaseModel]) -> Callable:
    """The endpoint of ``question``: its answer memoised per (sweep, version, filters, values), as ``out`` writes it."""
    extra = PAGE if question is vocabulary.RUNS else ()

    def endpoint(sweep_id: str, request: Request, filters: select.Where, **given: Any) -> Response:
        check_params(request, *given)
        values = question.values({p.name: given[p.name] for p in question.params})
        values |= {p.name: given[p.name] for p in extra}
        return state.answer(sweep_id, (question.name, frozen(filters), *values.values()), lambda data: as_json(
            out(question.ask(data, filters, state.context, **{p.name: values[p.name] for p in question.params}),
                values, sweep_id)))

    endpoint.__signature__ = _signature(("sweep_id", SweepId), ("request", Request), ("filters", Filters),
                                        params=(*question.params, *extra))
    endpoint.__name__ = question.name.replace("-", "_")
    return endpoint


def add_questions(app: FastAPI, state: State) -> None:
    """``/sweeps/{sweep_id}/<question>`` for each question of ``ROUTES`` (and its old path, hidden)."""
    for question, model, out, old in ROUTES:
        endpoint = _answering(state, question, out)
        for name, shown in ((question.name, True), *(((old, False),) if old else ())):
            app.add_api_route(f"/sweeps/{{sweep_id}}/{name}", endpoint, response_model=model,
                              summary=question.summary[:1].upper() + question.summary[1:] +
                              f" (`headsweep {question.name}`)", include_in_schema=shown)


def add_sweeps(app: FastAPI, state: State) -> None:
    """``/sweeps`` (every sweep with its progress) and ``/sweeps/{sweep_id}`` (one, its axes and metrics)."""

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


def _listing(state: State) -> Callable:
    """``/figures``: the plan of the sweep (``FIGURES``), each figure with its file name and URL."""

    def list_figures(sweep_id: str, request: Request, **given: Any) -> Response:
        check_params(request, *given, axes=False)
        values = FIGURES.values({"kind": given["kind"]})
        fmt, dpi = given["format"], given["dpi"]
        return state.answer(sweep_id, ("figures", values["kind"], fmt, dpi), lambda data: as_json(FiguresOut(
            sweep=sweep_id, figures=[FigureOut(name=str(PurePath(name).with_suffix(f".{fmt}")), kind=kind,
                                               url=figure_url(sweep_id, kind, params, fmt, dpi))
                                     for name, kind, params in FIGURES.ask(data, (), state.context, **values)])))

    list_figures.__signature__ = _signature(("sweep_id", SweepId), ("request", Request),
                                            params=(*FIGURES.params, FIGURE_FORMAT, FIGURE_DPI))
    return list_figures


def _drawing(state: State) -> Callable:
    """``/figures/{kind}``: one figure of the selection (``FIGURE``) as PNG, PDF or SVG."""
    own = tuple(p for p in FIGURE.params if p.name != "kind")

    def figure(sweep_id: str, kind: str, request: Request, filters: select.Where, **given: Any) -> Response:
        check_params(request, *given)
        fmt, dpi = given.pop("format"), given.pop("dpi")
        values = FIGURE.values({"kind": kind, **given})
        return state.answer(sweep_id, ("figure", fmt, dpi, frozen(filters), *values.values()), lambda data: Response(
            figure_bytes(FIGURE.ask(data, filters, state.context, **values), fmt, dpi), media_type=MEDIA_TYPES[fmt],
            headers={"Content-Disposition": f'inline; filename="{kind}.{fmt}"'}))

    kind = Annotated[Literal[FIGURE_KINDS], Path(description=FIGURE.params[0].help[:1].upper() + FIGURE.params[0].help[1:])]
    figure.__signature__ = _signature(("sweep_id", SweepId), ("kind", kind), ("request", Request), ("filters", Filters),
                                      params=(FIGURE_FORMAT, FIGURE_DPI, *own))
    return figure


def add_figures(app: FastAPI, state: State) -> None:
    """``/figures`` (the list, as ``headsweep figures`` writes them) and ``/figures/{kind}`` (one; the old
    ``/figures/{kind}.png`` hidden)."""
    app.add_api_route("/sweeps/{sweep_id}/figures", _listing(state), response_model=FiguresOut,
                      summary="Every figure of the sweep, as `headsweep figures` writes them, each with its URL")
    drawing = _drawing(state)
    media = {200: {"content": {media: {} for media in MEDIA_TYPES.values()},
                   "description": "The figure as PNG, PDF or SVG (`format`)."}}
    # the old path first: {kind} alone would take "rgb.png" for a kind
    for path, shown in (("/sweeps/{sweep_id}/figures/{kind}.png", False), ("/sweeps/{sweep_id}/figures/{kind}", True)):
        app.add_api_route(path, drawing, response_class=Response, responses=media, include_in_schema=shown,
                          summary="A figure of the selection as PNG, PDF or SVG (every kind `headsweep figures "
                                  "--kind` draws)")
