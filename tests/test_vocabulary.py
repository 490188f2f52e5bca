"""One vocabulary: each operation has one name and the same parameters and defaults on the command
line, over HTTP and in Python, read from the CLI's parser, the service's routes and the API's
signatures (no sweep needed); an operation without one of them says why, here and only here, and
the vocabulary table of docs/reference.md names the same three.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import tempfile
from pathlib import Path

import pytest

import headsweep
from analysis.views.service.app import build_app
from headsweep.cli import build_parser, run, slurm, sweeps, tracking

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = "<required>"

VOCABULARY = {
    # operation: (CLI command, HTTP paths (GET), Python call); None: see WHY_NOT
    "runs": ("runs", ("/sweeps/{sweep_id}/runs",), "Sweep.runs"),
    "results": ("results", ("/sweeps/{sweep_id}/results", "/sweeps/{sweep_id}/aggregate"), "Sweep.results"),
    "agreement": ("agreement", ("/sweeps/{sweep_id}/agreement",), "Sweep.agreement"),
    "compare-maps": ("compare-maps", ("/sweeps/{sweep_id}/compare-maps",), "Sweep.compare_maps"),
    "spearman": ("spearman", ("/sweeps/{sweep_id}/spearman",), "Sweep.spearman"),
    "iou": ("iou", ("/sweeps/{sweep_id}/iou", "/sweeps/{sweep_id}/mask-iou"), "Sweep.iou"),
    "transfer": ("transfer", ("/sweeps/{sweep_id}/transfer",), "Sweep.transfer"),
    "figures": ("figures", ("/sweeps/{sweep_id}/figures",), "Sweep.figures"),
    "figure": (None, ("/sweeps/{sweep_id}/figures/{kind}", "/sweeps/{sweep_id}/figures/{kind}.png"), "Sweep.figure"),
    "map": (None, None, "Sweep.map"),
    "sweeps": ("ls", ("/sweeps",), None),
    "sweep": ("status", ("/sweeps/{sweep_id}",), "sweep"),
    "submit": ("submit", None, "submit"),
    "serve": ("serve", None, None),
}
WHY_NOT = {
    ("figure", "cli"): "`headsweep figures --kind K` writes that kind's figures as files (`figures`)",
    ("map", "cli"): "a (runs, layers, units) array is for code: the CLI prints answers about maps, not maps",
    ("map", "http"): "as for the CLI; the service answers questions about maps and draws them",
    ("sweeps", "python"): "a notebook opens one sweep (headsweep.sweep('last')); `headsweep ls` lists them",
    ("submit", "http"): "the service reads and never writes (DESIGN.md): runs are started by the CLI and Python",
    ("serve", "http"): "it is the HTTP service",
    ("serve", "python"): "Python calls the answers themselves; build_app() is the same app for a test or a server",
}
"""Every missing surface of an operation, with the reason: the one place it is stated."""
WRITERS = (run, sweeps, slurm, tracking)
"""The CLI groups that run, submit, stop or serve things: the read-only service has no endpoint for their
commands and Python only ``submit`` (in VOCABULARY); their reads (ls, status) are in VOCABULARY."""
OUTPUT_ONLY = {"cli": {"sweep", "format", "out", "png", "db", "func", "artifact_uris", "command"},
               "http": {"sweep_id", "offset", "limit"}, "python": {"self"}}
"""Parameters of one surface only: where the answer goes (CLI: --format, --out, --png; HTTP: a page of
the runs), which registry (CLI --db; Python headsweep.sweep(db=...)), which sweep (every surface)."""
LENIENT = {"submit", "sweep", "figures", "figure"}
"""Operations whose surfaces share some parameters only (submit's --dry-run, --rerun-failed are the
command's; figures' kinds and formats are drawn per kind): only their shared parameters' defaults must
agree. Every other operation has one parameter list."""


def _empty(value):
    """None, '' and () are one default: nothing given (no axes, the default map or metric)."""
    return None if value in (None, "", (), []) else value


def cli_commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def writer_commands() -> set[str]:
    names = set()
    for group in WRITERS:
        parser = argparse.ArgumentParser()
        group.register(parser.add_subparsers())
        names |= set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)
    return names


def cli_params(parser: argparse.ArgumentParser) -> dict[str, object]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in OUTPUT_ONLY["cli"]:
            continue
        out[action.dest] = REQUIRED if action.required or (not action.option_strings and action.nargs != "?") \
            else _empty(action.default)
    return out


@functools.cache
def http_routes() -> dict[str, object]:
    """The service's routes by path, of an app over an empty registry (a temporary folder's)."""
    from orchestrator.registry import Registry

    url = f"sqlite:///{tempfile.mkdtemp(prefix='hs-vocabulary-')}/registry.db"
    Registry(url).close()
    return {route.path: route for route in build_app(url).routes if hasattr(route, "dependant")}


def http_params(route) -> dict[str, object]:
    out = {}
    for param in route.dependant.query_params + [p for d in route.dependant.dependencies for p in d.query_params]:
        name = param.alias
        if name in OUTPUT_ONLY["http"]:
            continue
        if param.name.startswith("axis_") or name == "where":  # the axis filters and --where: one `where`
            out["where"] = None
            continue
        out[name] = REQUIRED if param.field_info.is_required() else _empty(param.field_info.default)
    return out


def python_call(name: str):
    owner, _, attr = name.rpartition(".")
    return getattr(headsweep.Sweep, attr) if owner == "Sweep" else getattr(headsweep, attr)


def python_params(call) -> dict[str, object]:
    out = {}
    for name, param in inspect.signature(call).parameters.items():
        if name in OUTPUT_ONLY["python"] or name in ("db", "tracking_uri", "sweep_id", "grid"):
            continue
        out[name] = REQUIRED if param.default is inspect.Parameter.empty else _empty(param.default)
    return out


def surfaces(operation: str) -> dict[str, dict[str, object]]:
    cli, paths, python = VOCABULARY[operation]
    found = {}
    if cli is not None:
        found["cli"] = cli_params(cli_commands()[cli])
    if paths is not None:
        found["http"] = http_params(http_routes()[paths[0]])
    if python is not None:
        found["python"] = python_params(python_call(python))
    return found


def test_every_operation_has_each_surface_or_a_stated_reason():
    for operation, (cli, paths, python) in VOCABULARY.items():
        for surface, name in (("cli", cli), ("http", paths), ("python", python)):
            assert (name is None) == ((operation, surface) in WHY_NOT), (operation, surface)
        assert cli is None or cli in cli_commands(), (operation, cli)
        assert paths is None or all(path in http_routes() for path in paths), (operation, paths)
        assert python is None or callable(python_call(python)), (operation, python)
    assert set(WHY_NOT) <= {(op, s) for op in VOCABULARY for s in ("cli", "http", "python")}


def test_every_command_route_and_call_is_in_the_vocabulary():
    """A new command, endpoint or API call is placed in the vocabulary (or is a writer's command)."""
    named_cli = {cli for cli, _, _ in VOCABULARY.values() if cli}
    assert set(cli_commands()) - named_cli - writer_commands() == set()
    named_http = {path for _, paths, _ in VOCABULARY.values() for path in paths or ()}
    service = {path for path in http_routes() if not path.startswith(("/docs", "/redoc", "/openapi"))}
    assert service == named_http
    public = {f"Sweep.{name}" for name, value in vars(headsweep.Sweep).items()
              if callable(value) and not name.startswith("_")} | {"sweep", "submit"}
    assert public == {python for _, _, python in VOCABULARY.values() if python}


@pytest.mark.parametrize("operation", sorted(VOCABULARY))
def test_an_operation_has_the_same_parameters_and_defaults_everywhere(operation):
    found = surfaces(operation)
    if operation in LENIENT:
        shared = set.intersection(*(set(params) for params in found.values())) if len(found) > 1 else set()
        for name in shared:
            assert len({repr(params[name]) for params in found.values()}) == 1, (operation, name, found)
        return
    first, *others = found.items()
    for surface, params in others:
        assert params == first[1], f"{operation}: {first[0]} {first[1]} vs {surface} {params}"


def test_the_old_paths_answer_as_the_new_ones():
    routes = http_routes()
    for old, new in (("/sweeps/{sweep_id}/aggregate", "/sweeps/{sweep_id}/results"),
                     ("/sweeps/{sweep_id}/mask-iou", "/sweeps/{sweep_id}/iou"),
                     ("/sweeps/{sweep_id}/figures/{kind}.png", "/sweeps/{sweep_id}/figures/{kind}")):
        assert routes[old].endpoint is routes[new].endpoint and not routes[old].include_in_schema


def test_the_figure_endpoints_take_the_cli_figures_format_and_dpi():
    """`figures --format png|pdf|svg --dpi N` and the service's `format` and `dpi` on the list and on each
    figure: the same names, the same choices, the same defaults (LENIENT compares only shared names, and
    --format is an output flag of the other commands)."""
    import typing

    flags = {action.dest: action for action in cli_commands()["figures"]._actions}
    assert flags["format"].choices and flags["dpi"].default
    for path in ("/sweeps/{sweep_id}/figures", "/sweeps/{sweep_id}/figures/{kind}",
                 "/sweeps/{sweep_id}/figures/{kind}.png"):
        params = {p.alias: p for p in http_routes()[path].dependant.query_params}
        assert set(typing.get_args(params["format"].field_info.annotation)) == set(flags["format"].choices), path
        assert params["format"].field_info.default == flags["format"].default == "png", path
        assert params["dpi"].field_info.default == flags["dpi"].default, path


def test_the_reference_has_the_vocabulary_table():
    """docs/reference.md's table: one row per operation with its command, its path and its call (or a dash)."""
    text = (ROOT / "docs" / "reference.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| (\S+) \|.*$", text, re.MULTILINE)}
    for operation, (cli, paths, python) in VOCABULARY.items():
        row = rows.get(operation)
        assert row is not None, f"docs/reference.md's vocabulary table has no row '{operation}'"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert (cli is None and cells[1] == "-") or f"headsweep {cli}" in cells[1], (operation, cells[1])
        for path in paths or ():
            assert path.replace("{sweep_id}", "{id}") in cells[2], (operation, path, cells[2])
        assert (paths is None and cells[2].startswith("-")) or paths, (operation, cells[2])
        assert (python is None and cells[3].startswith("-")) or (python and python.split(".")[-1] in cells[3])


def test_the_check_sees_a_default_that_differs():
    """The comparison on the mismatches this table ended: agreement's --across required and --map
    heads.gate on the command line, seed and the map most runs have elsewhere."""
    old = argparse.ArgumentParser()
    old.add_argument("sweep")
    old.add_argument("--across", required=True)
    old.add_argument("--map", default="heads.gate")
    http = surfaces("agreement")["http"]
    assert {k: http[k] for k in ("across", "map")} == {"across": "seed", "map": None}
    assert cli_params(old) == {"across": REQUIRED, "map": "heads.gate"}
