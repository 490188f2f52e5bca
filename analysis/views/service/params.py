"""The service's query parameters and the helpers every endpoint shares: a question's declared parameters
as query parameters, axis filters, ``{sweep_id}`` (``last`` resolved), unknown parameters as 400s, figure
URLs, serialised answers."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import Depends, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from analysis.data import select
from analysis.data.select import QueryError, did_you_mean
from analysis.data.sweep import AXES, SCALE_LABELS
from analysis.views.figure_kinds import DPI
from analysis.views.service.models import SweepOut
from analysis.views.vocabulary import Param, names
from orchestrator.registry.reader import LAST
from orchestrator.status import RUN_DONE


def check_params(request: Request, *names: str, axes: bool = True) -> None:
    """400 for a query parameter this endpoint does not take (a typo would be ignored silently)."""
    allowed = (*(AXES if axes else ()), *(("where",) if axes else ()), *names)
    for key in request.query_params:
        if key not in allowed:
            if not allowed:
                raise QueryError(f"unknown query parameter '{key}': this endpoint takes none")
            raise QueryError(f"unknown query parameter '{key}'{did_you_mean(key, allowed)} "
                             f"(this endpoint takes: {', '.join(allowed)})")


_FILTER_HELP = "Comma-separated values; a run matches any of them."


_WHERE_HELP = ("Which runs, as the CLI's --where: e.g. metrics.accuracy > 0.8 and params.train.lr = 3e-4 and "
               "seed != 1, or head_gates.lr:0.001,task.max_train:500|1000")


def axis_filters(request: Request, where: str | None = None, **_: Any) -> select.Where:
    """The filters of the request as conditions: a query parameter per axis (``AXES``, declared in
    the signature below for the OpenAPI document; ``seed=0&seed=1`` adds values) and ``where``, the
    CLI's ``--where`` expression (``where.parse_where``)."""
    values: dict[str, list[str]] = {}
    for axis in AXES:
        for raw in request.query_params.getlist(axis):
            values.setdefault(axis, []).extend(names(raw))
    return select.as_where(values) + select.parse_filter(where)


axis_filters.__signature__ = inspect.Signature([  # what FastAPI reads: one optional parameter per axis
    inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
    *(inspect.Parameter(f"axis_{i}", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        str | None, Query(alias=axis, description=_FILTER_HELP + (" 'none' = unset." if axis in SCALE_LABELS else ""))])
      for i, axis in enumerate(AXES)),
    inspect.Parameter("where", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, Query(description=_WHERE_HELP)]),
])


Filters = Annotated[select.Where, Depends(axis_filters)]


def sweep_path(request: Request, sweep_id: Annotated[str, Path(
        description=f"A sweep id, or '{LAST}' (the newest sweep), as on the command line.")]) -> str:
    """The sweep id of the path, ``last`` resolved."""
    return request.app.state.analysis.resolve(sweep_id)


SweepId = Annotated[str, Depends(sweep_path)]


def frozen(filters: select.Filters) -> tuple:
    """Filters as a cache key."""
    return select.as_where(filters)


def query_parameter(param: Param) -> inspect.Parameter:
    """A declared parameter (``vocabulary.Param``) as a query parameter: its type (a list as comma-separated
    text, choices as an enum), default, bounds (the service's cap, where it has one, as the upper bound)
    and meaning, as FastAPI reads them and the OpenAPI document shows them."""
    kind = str if param.many else Literal[param.choices] if param.choices else param.type
    if param.default is None and not param.required:
        kind = kind | None
    query = Query(description=param.help[:1].upper() + param.help[1:] + ".", ge=param.ge, gt=param.gt,
                  le=param.cap or param.le, min_length=1 if param.type is str and not param.many else None)
    default = inspect.Parameter.empty if param.required else "" if param.many else param.default
    return inspect.Parameter(param.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, query])


def figure_url(sweep_id: str, kind: str, params: dict[str, Any], fmt: str = "png", dpi: float = DPI) -> str:
    """The URL of a planned figure (``figure_plan.figure_plan``): its figure() keywords as the query of
    ``figures/{kind}``; filters on an axis as that parameter, on another config key in ``where``; the
    format and resolution only where they are not the defaults."""
    query: dict[str, str] = {}
    if fmt != "png":
        query["format"] = fmt
    if dpi != DPI:
        query["dpi"] = f"{dpi:g}"
    filters = params.get("filters") or {}
    query |= {key: ",".join(map(str, values)) for key, values in filters.items() if key in AXES}
    where = [f"{key}:{'|'.join(map(str, values))}" for key, values in filters.items() if key not in AXES]
    if where:
        query["where"] = ",".join(where)
    for key, value in params.items():
        if key != "filters":
            query[key] = ",".join(value) if isinstance(value, list | tuple) else str(value)
    return f"/sweeps/{sweep_id}/figures/{kind}" + (f"?{urlencode(query)}" if query else "")


def as_json(model: BaseModel) -> Response:
    """The serialised answer, memoised as is (a repeated question costs no validation or encoding)."""
    return Response(model.model_dump_json(by_alias=True), media_type="application/json")


def sweep_out(sweep: dict[str, Any], model: type[SweepOut] = SweepOut, **extra: Any) -> SweepOut:
    counts = sweep["counts"]
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in RUN_DONE)
    fields = {k: sweep.get(k) for k in model.model_fields if k in sweep}
    return model(**fields, total=total, progress=done / total if total else 0.0, **extra)
