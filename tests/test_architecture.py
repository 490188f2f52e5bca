"""The structure as tests: the layer rule of DESIGN.md (experiments/ never imports ray, mlflow or
sqlalchemy; analysis no training code and no MLflow), no import circle between the project's
modules, and the floors: experiments <- orchestrator <- analysis, the rooms of experiments/."""

import ast
import subprocess
import sys
from pathlib import Path

CODE = """
import sys
import experiments, experiments.core.runner, experiments.methods, experiments.models, experiments.interventions.heads
bad = sorted(m for m in ("ray", "mlflow", "sqlalchemy") if m in sys.modules)
print(",".join(bad))
"""


def test_experiments_imports_no_orchestration_library():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


ANALYSIS = """
import sys
import analysis.views.cli.commands, analysis.views.figure_plan, analysis.data.loading, analysis.data.select
import analysis.questions.agreement.across_runs, analysis.views.service.app, analysis.statistics.nulls
bad = sorted(m for m in ("torch", "mlflow", "experiments.methods", "experiments.core.runner", "experiments.models")
             if m in sys.modules)
print(",".join(bad))
"""


def test_analysis_imports_no_training_code_and_no_mlflow():
    """analysis reads the registry and draws; training code and MLflow writes are the others' layers."""
    out = subprocess.run([sys.executable, "-c", ANALYSIS], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------- the import graph
#
# Every import of the project's own modules, read from the source with ast: at the top, inside
# functions and under ``if TYPE_CHECKING`` alike (a function-local import hides a circle from the
# interpreter, not from the design). Self-contained on purpose: CI has ../shared/tools, this test
# does not need it.

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("experiments", "orchestrator", "analysis", "headsweep")

ANALYSIS_READS = {
    "orchestrator.registry.reader": "RegistryReader (the reads only, never migrating), NotFound, LAST",
    "orchestrator.registry.results": "the read model's types (MapInfo, MapStack, Version)",
    "orchestrator.registry.schema": "the label names (LABELS, NUMBER_LABELS): table definitions, no methods",
    "orchestrator.registry.history": "a sweep's recorded history, as lines",
    "orchestrator.status": "the run and sweep status enums",
    "orchestrator.settings": "where the registry and the checkpoint store are",
    "orchestrator.checkpoints": "the stored weight masks (read)",
}
"""What analysis may import from the orchestrator: the registry's reader and where things are. The
writable Registry (orchestrator.registry), driver liveness, sweeps, the supervisor, MLflow: never
(analysis reads what they recorded). history is admitted for its pure ``history()``."""
ANALYSIS_VOCABULARY = ("experiments.common", "experiments.core.sections")
"""What analysis may import from experiments: the plain vocabulary (naming, units, the mask and PNG
formats, ConfigError), never training code."""
UPWARD = {"orchestrator.cli": ("analysis.views.cli", "analysis.views.report")}
"""The one sanctioned arrow up: the CLI registers the analysis commands and hands the driver's
report (orchestrator/report.py logs it to MLflow) analysis's renderer."""

EXPERIMENT_FLOORS = (
    ("common",),
    ("maths", "models", "tasks", "core.sections", "core.result"),  # pure maths, the model table, tasks, plain shapes
    ("interventions",),  # what a method does to a model
    ("core",),  # the run: state, loop, context, probing, debiasing, ...
    ("methods",),
    ("keyed",),  # core.config, config_keys, run_keys, runner: the keyed config and the runner
)
"""Rooms of experiments/, lowest first: an import points to a lower floor or stays in its room."""
_KEYED = ("core.config", "core.config_keys", "core.run_keys", "core.runner")


def module_graph(root: Path, tops: tuple[str, ...] = TOPS) -> dict[str, set[str]]:
    """module -> the project modules it imports (packages by their ``__init__``), migrations aside."""
    files = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[module] = {found for found in map(known, targets) if found and found != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected sets of two or more modules (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found, key=lambda component: (-len(component), component))


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _room(module: str) -> tuple[int, str] | None:
    """(floor, room) of an experiments module; None for the package itself (lazy names only)."""
    rest = module.split(".", 1)[1] if "." in module else ""
    if not rest:
        return None
    room = ("keyed" if _under(rest, _KEYED) else
            next((r for r in ("core.sections", "core.result") if _under(rest, (r,))), rest.split(".")[0]))
    return next(level for level, rooms in enumerate(EXPERIMENT_FLOORS) if room in rooms), room


def floor_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a floor, as 'importer -> imported (why)'."""
    breaks = []
    for module, imported in sorted(graph.items()):
        top = module.split(".")[0]
        for target in sorted(imported):
            to = target.split(".")[0]
            if to == "headsweep" and top != "headsweep":
                breaks.append(f"{module} -> {target} (headsweep, the Python API, is the top floor: nothing imports it)")
            elif top == "experiments" and to != "experiments":
                breaks.append(f"{module} -> {target} (experiments imports nothing from {to})")
            elif top == "orchestrator" and to == "analysis" and not _under(target, UPWARD.get(module, ())):
                breaks.append(f"{module} -> {target} (only orchestrator.cli reaches analysis: {UPWARD})")
            elif top == "analysis" and to == "orchestrator" and target not in ANALYSIS_READS:
                breaks.append(f"{module} -> {target} (analysis reads only {sorted(ANALYSIS_READS)})")
            elif top == "analysis" and to == "experiments" and not _under(target, ANALYSIS_VOCABULARY):
                breaks.append(f"{module} -> {target} (analysis reads only {ANALYSIS_VOCABULARY} of experiments)")
            elif top == to == "experiments" and _room(module) and _room(target):
                (floor, room), (floor_to, room_to) = _room(module), _room(target)
                if floor_to > floor or (floor_to == floor and room_to != room):
                    breaks.append(f"{module} -> {target} (room {room} may not import {room_to}: "
                                  f"floors {EXPERIMENT_FLOORS})")
    return breaks


def test_no_import_circle_between_the_projects_modules():
    graph = module_graph(ROOT)
    assert len(graph) > 100  # the walk found the project (a wrong root would find nothing and pass)
    assert circles(graph) == []


def test_every_import_respects_the_floors():
    """experiments <- orchestrator <- analysis <- headsweep, the CLI's one arrow up aside; analysis reads
    only the registry's read side; experiments' rooms import downwards."""
    graph = module_graph(ROOT)
    assert "orchestrator.registry.history" in graph["analysis.views.service.app"]
    assert "orchestrator.registry.reader" in graph["analysis.views.service.cache"]
    assert "analysis.questions.agreement.across_runs" in graph["headsweep.api"]
    assert floor_breaks(graph) == []


def _fake_project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_catch_a_circle_and_a_broken_floor(tmp_path):
    """The checkers on a tiny fake project with faults put in on purpose: a circle hidden by a
    function-local import (and a relative one), and imports through the floors."""
    root = _fake_project(tmp_path, {
        "experiments/__init__.py": "",
        "experiments/common/__init__.py": "",
        "experiments/common/naming.py": "from experiments.methods import a  # up a floor\n",
        "experiments/methods/__init__.py": "",
        "experiments/methods/a.py": "from experiments.methods.b import f\n",
        "experiments/methods/b.py": "def f():\n    from . import a\n",
        "orchestrator/__init__.py": "",
        "orchestrator/sweeps.py": "import analysis.service\n",
        "orchestrator/cli.py": "from analysis.views.cli import register\n",
        "analysis/__init__.py": "",
        "analysis/views/__init__.py": "",
        "analysis/views/cli.py": "",
        "analysis/service.py": "from orchestrator import sweeps\n",
        "analysis/select.py": "import headsweep\n",
        "headsweep/__init__.py": "from analysis import service\n",
    })
    graph = module_graph(root)
    assert graph["experiments.methods.b"] == {"experiments.methods.a"}
    assert circles(graph) == [["analysis.service", "orchestrator.sweeps"],
                              ["experiments.methods.a", "experiments.methods.b"]]
    breaks = [line.split(" (")[0] for line in floor_breaks(graph)]
    assert breaks == [
        "analysis.select -> headsweep",
        "analysis.service -> orchestrator.sweeps",
        "experiments.common.naming -> experiments.methods.a",
        "orchestrator.sweeps -> analysis.service",
    ]  # orchestrator.cli -> analysis.views.cli is the sanctioned one
