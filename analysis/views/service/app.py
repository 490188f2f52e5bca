"""The analysis service: HTTP (JSON, figures as PNG, PDF or SVG, an OpenAPI document) over the questions of ``analysis.questions``.

Read only: it reads the registry's read model and the sweeps' recorded history, never writes
(a sweep's driver liveness is the orchestrator's, recorded by the supervisor and the CLI).
``build_app(registry_url)`` is a plain FastAPI app (tests call it
directly); ``serve.serve_app`` runs the same app on Ray Serve, bound to 127.0.0.1
unless told otherwise. Its routers (``routes``) are built from the questions'
declarations (``analysis.views.vocabulary``): each translates query parameters into a
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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from analysis.data.loading import UnknownSweep
from analysis.data.select import QueryError
from analysis.questions.run_table import ArtifactUris
from analysis.views.service.cache import State
from analysis.views.service.models import ErrorOut
from analysis.views.service.routes import add_figures, add_questions, add_sweeps
from analysis.views.vocabulary import MAX_RUN_PERMS  # noqa: F401  (the service's limit, read here by benchmarks)


def build_app(registry_url: str, artifact_uris: ArtifactUris | None = None) -> FastAPI:
    """The FastAPI app over the registry at ``registry_url`` (no Ray needed); ``artifact_uris`` reads
    the runs' artifact URIs from the MLflow store (``headsweep.api.MlflowArtifacts``; none: null)."""
    state = State(registry_url, artifact_uris)
    errors = {code: {"model": ErrorOut} for code in (400, 404, 422)}
    # /docs and /redoc load Swagger UI and ReDoc from the fastapi-offline package, not from a CDN:
    # they work on a machine with no internet
    app = FastAPIOffline(title="headsweep analysis", version="1", responses=errors,
                         description="Read-only answers about sweeps: runs, aggregates, gate agreement, figures.")
    app.state.analysis = state  # read by sweep_path
    app.add_exception_handler(QueryError, _bad_input)
    app.add_exception_handler(UnknownSweep, _unknown_sweep)
    app.add_exception_handler(RequestValidationError, _invalid)
    for add_routes in (add_sweeps, add_questions, add_figures):
        add_routes(app, state)
    return app


def _bad_input(_: Request, err: QueryError) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=400)


def _unknown_sweep(_: Request, err: UnknownSweep) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=404)


def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ())] or ["request"]
    where = f"{loc[0]} parameter '{'.'.join(loc[1:])}'" if len(loc) > 1 else loc[0]
    got = f" (got {first['input']!r})" if "input" in first else ""
    return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}{got}"}, status_code=422)
