"""One vocabulary: every operation has one name and the same parameters and defaults on the command
line, over HTTP and in Python, read from the CLI's parser, the service's routes and the API's
signatures (no sweep needed); the questions' are their declarations' (analysis/views/vocabulary.py).

docs/reference.md's vocabulary section is the one place that says where they differ: its first table
names each operation's command, path and call, or why a surface has none; its second says why an
option is not on every surface of its operation, or why its default differs. This test reads both
tables and checks them against the surfaces, both ways; it keeps no list of its own.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import tempfile
import typing
from pathlib import Path

import pytest

import headsweep
from analysis.views.service.app import build_app
from analysis.views.vocabulary import FIGURE_DPI, FIGURE_FORMAT, QUESTIONS
from headsweep.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = "<required>"
SURFACES = ("cli", "http", "python")
SUBJECT = {"sweep_id": "sweep", "self": "sweep"}
"""The sweep an operation acts on has one name here: the CLI's SWEEP, the path's {sweep_id}, Python's
sweep_id argument or the Sweep a method is called on."""


# --------------------------------------------------------------------------- the docs' tables


def _section() -> str:
    text = (ROOT / "docs" / "reference.md").read_text()
    start = text.index("## One vocabulary")
    return text[start:text.index("\n## ", start + 1)]


def _rows(header: str) -> list[list[str]]:
    """The cells of each row of the section's table whose header row starts with ``header``."""
    lines = _section().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@functools.cache
def operations() -> dict[str, dict[str, object]]:
    """operation -> {surface: its name there (CLI command, HTTP paths, Python call) or the reason it has
    none}, and its parameters cell, from the first table."""
    found = {}
    for operation, cli, http, python, params in _rows("| operation |"):
        names = {}
        for surface, cell in (("cli", cli), ("http", http), ("python", python)):
            missing = re.fullmatch(r"- \((.+)\)", cell)
            if missing:
                names[surface] = ("-", missing.group(1))
            elif surface == "cli":
                names[surface] = _ticked(cell)[0].split()[1]
            elif surface == "http":
                names[surface] = tuple(p.replace("{id}", "{sweep_id}") for p in _ticked(cell) if p.startswith("/"))
            else:
                names[surface] = _ticked(cell)[0].removeprefix("headsweep.").split("(")[0]
        found[operation] = names | {"params": params}
    return found


def offered(operation: str) -> dict[str, object]:
    """{surface: its name} of the surfaces that offer ``operation``."""
    return {s: name for s, name in operations()[operation].items() if s in SURFACES and not _missing(name)}


def _missing(name: object) -> bool:
    return isinstance(name, tuple) and name[:1] == ("-",)


@functools.cache
def differences() -> dict[tuple[str, str], str]:
    """(operation, option) -> why the option is not on every surface of the operation or not alike, from
    the second table (a row names several operations and options)."""
    found = {}
    for ops, options, why in _rows("| operations |"):
        assert why, (ops, options)
        for operation in (o.strip() for o in ops.split(",")):
            for option in _ticked(options):
                found[(operation, option)] = why
    return found


# --------------------------------------------------------------------------- the surfaces


def _empty(value):
    """None, '' and () are one default: nothing given (no axes, the default map or metric)."""
    return None if value in (None, "", (), []) else value


@functools.cache
def cli_commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def cli_params(parser: argparse.ArgumentParser) -> dict[str, object]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
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
    dependant = route.dependant
    for param in dependant.path_params + dependant.query_params + [
            p for d in dependant.dependencies for p in d.path_params + d.query_params]:
        name = SUBJECT.get(param.alias, param.alias)
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
        required = param.default is inspect.Parameter.empty or param.kind is inspect.Parameter.VAR_POSITIONAL
        out[SUBJECT.get(name, name)] = REQUIRED if required else _empty(param.default)
    return out


def surfaces(operation: str) -> dict[str, dict[str, object]]:
    """{surface: {option: its default, or REQUIRED}} of each surface that offers ``operation``."""
    found = {}
    for surface, name in offered(operation).items():
        if surface == "cli":
            found[surface] = cli_params(cli_commands()[name])
        elif surface == "http":
            found[surface] = http_params(http_routes()[name[0]])
        else:
            found[surface] = python_params(python_call(name))
    return found


def python_calls() -> set[str]:
    """Every public call of ``import headsweep``: its functions and the Sweep's methods."""
    functions = {name for name in headsweep.__all__ if inspect.isfunction(getattr(headsweep, name))}
    methods = {f"Sweep.{name}" for name, value in vars(headsweep.Sweep).items()
               if callable(value) and not name.startswith("_")}
    return functions | methods


# --------------------------------------------------------------------------- the checks


def test_the_tables_are_read():
    """The walk found the tables (a broken parse would pass the checks below on nothing)."""
    assert len(operations()) >= 20 and {"agreement", "submit", "figure"} <= set(operations())
    assert len(differences()) >= 20


def test_every_command_route_and_call_is_an_operation_of_the_table():
    """Each surface's every command, endpoint and public call is named by one row, and each name a row
    gives is there; a surface a row gives none says why (the table's '- (why)')."""
    named = {surface: [offered(op)[surface] for op in operations() if surface in offered(op)] for surface in SURFACES}
    assert sorted(named["cli"]) == sorted(cli_commands())
    paths = [path for paths in named["http"] for path in paths]
    service = {path for path in http_routes() if not path.startswith(("/docs", "/redoc", "/openapi"))}
    assert sorted(paths) == sorted(service)
    assert sorted(named["python"]) == sorted(python_calls())
    for operation, cells in operations().items():
        assert offered(operation), f"{operation}: on no surface"
        for surface in SURFACES:
            assert not _missing(cells[surface]) or len(cells[surface][1]) > 10, (operation, surface, cells[surface])


def test_old_paths_answer_as_the_new_ones_hidden():
    """A row's further paths (`old: ...`) are the old paths: the same endpoint, left out of the OpenAPI document."""
    routes = http_routes()
    for operation in operations():
        if "http" not in offered(operation):
            continue
        first, *old = offered(operation)["http"]
        assert routes[first].include_in_schema, first
        for path in old:
            assert routes[path].endpoint is routes[first].endpoint and not routes[path].include_in_schema, path


@pytest.mark.parametrize("operation", sorted(operations()))
def test_an_operation_has_the_same_options_and_defaults_everywhere_or_says_why(operation):
    """Every option of an operation is on each of its surfaces with the same default (REQUIRED alike),
    or the second table says why; and each of its rows names a real difference."""
    found = surfaces(operation)
    options = set().union(*(set(params) for params in found.values()))
    for option in sorted(options):
        values = {surface: params.get(option, "<absent>") for surface, params in found.items()}
        alike = len({repr(v) for v in values.values()}) == 1
        listed = (operation, option) in differences()
        assert alike or listed, f"{operation}: {option} is {values}: alike, or docs/reference.md says why"
        assert not (alike and listed), f"{operation}: {option} is {values} everywhere: drop its row"
    stale = {option for (op, option) in differences() if op == operation} - options
    assert not stale, f"{operation}: the differences table names {stale}, which no surface has"


@pytest.mark.parametrize("operation", sorted(operations()))
def test_the_parameters_cell_names_every_shared_option(operation):
    found = surfaces(operation)
    shared = set.intersection(*(set(params) for params in found.values())) - {"sweep"}
    cell = operations()[operation]["params"]
    for option in shared:
        assert re.search(rf"`-*{option.replace('_', '[_-]')}\b", cell), (operation, option, cell)


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_a_question_is_asked_as_declared_on_every_surface(name):
    """Each declared question's command, route and call take its parameters with its defaults, and
    `where`; what else a surface takes is in the differences table (the test above)."""
    question = QUESTIONS[name]
    declared = {p.name: REQUIRED if p.required else _empty(p.default) for p in question.params}
    found = surfaces(name)
    assert set(found) == set(offered(name)) and len(found) >= 2, name
    for surface, params in found.items():
        assert {option: params.get(option, "<absent>") for option in declared} == declared, (name, surface, params)
        assert "where" in params or (name, "where") in differences(), (name, surface)


def test_the_figure_endpoints_take_the_cli_figures_format_and_dpi():
    """`figures --format png|pdf|svg --dpi N` and the service's `format` and `dpi` on the list and on each
    figure: the declarations' (FIGURE_FORMAT, FIGURE_DPI), the same choices and bounds."""
    flags = {action.dest: action for action in cli_commands()["figures"]._actions}
    assert set(flags["format"].choices) == set(FIGURE_FORMAT.choices)
    assert (flags["format"].default, flags["dpi"].default) == (FIGURE_FORMAT.default, FIGURE_DPI.default)
    for path in ("/sweeps/{sweep_id}/figures", "/sweeps/{sweep_id}/figures/{kind}",
                 "/sweeps/{sweep_id}/figures/{kind}.png"):
        params = {p.alias: p for p in http_routes()[path].dependant.query_params}
        assert set(typing.get_args(params["format"].field_info.annotation)) == set(FIGURE_FORMAT.choices), path
        assert params["format"].field_info.default == "png" and params["dpi"].field_info.default == FIGURE_DPI.default
        bounds = {type(m).__name__: m for m in params["dpi"].field_info.metadata}
        assert (bounds["Ge"].ge, bounds["Le"].le) == (FIGURE_DPI.ge, FIGURE_DPI.le), path


def test_the_writers_say_no_track_as_track():
    """`--no-track` and `--no-auto-resume` are the options track and auto_resume (default True), as
    Python's submit and resume name them; `--set` is sets."""
    for command, option in (("submit", "track"), ("submit", "auto_resume"), ("resume", "track"), ("submit", "sets")):
        assert option in cli_params(cli_commands()[command]), (command, option)
    args = build_parser().parse_args(["submit", "grid.yaml", "--no-track", "--set", "seed=0,1", "--set", "lr=1"])
    assert (args.track, args.auto_resume, args.sets) == (False, True, ["seed=0,1", "lr=1"])


def test_the_check_sees_a_default_that_differs():
    """The comparison on the mismatches this table ended: agreement's --across required and --map
    heads.gate on the command line, seed and the map most runs have elsewhere."""
    old = argparse.ArgumentParser()
    old.add_argument("sweep")
    old.add_argument("--across", required=True)
    old.add_argument("--map", default="heads.gate")
    http = surfaces("agreement")["http"]
    assert {k: http[k] for k in ("across", "map")} == {"across": "seed", "map": None}
    assert cli_params(old) == {"sweep": REQUIRED, "across": REQUIRED, "map": "heads.gate"}
    assert python_params(lambda track=True, *maps: None) == {"track": True, "maps": REQUIRED}
