"""The structure as tests: the layer rule of DESIGN.md (experiments/ never imports ray, mlflow or
sqlalchemy; analysis no training code and no MLflow), no import circle between the project's
modules, and folders as levels (LEVELS: every import goes down or stays in its room, no exceptions),
with analysis behind its read-only port (ANALYSIS_READS)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

CODE = """
import sys
import experiments, experiments.harness.runner, experiments.methods, experiments.models, experiments.interventions.heads
bad = sorted(m for m in ("ray", "mlflow", "sqlalchemy") if m in sys.modules)
print(",".join(bad))
"""


def test_experiments_imports_no_orchestration_library():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


ANALYSIS = """
import sys
import analysis.views.vocabulary, analysis.views.figure_plan, analysis.data.loading, analysis.data.select
import analysis.questions.agreement.across_runs, analysis.views.service.app, analysis.statistics.nulls
bad = sorted(m for m in ("torch", "mlflow", "experiments.methods", "experiments.harness.runner", "experiments.models")
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
TOPS = ("base", "experiments", "orchestrator", "analysis", "headsweep")

ANALYSIS_READS = {
    "orchestrator.registry.reader": "RegistryReader (the reads only, never migrating), NotFound, LAST",
    "orchestrator.registry.read_model": "the read model's types (MapInfo, MapStack, Version)",
    "orchestrator.registry.history": "a sweep's recorded history, as lines",
    "orchestrator.status": "the run and sweep status enums",
    "orchestrator.settings": "where the registry and the checkpoint store are",
    "orchestrator.checkpoints": "the stored weight masks (read)",
}
"""What analysis may import from the orchestrator: the registry's reader and where things are. The
writable Registry (orchestrator.registry), driver liveness, sweeps, the supervisor, MLflow: never
(analysis reads what they recorded). history is admitted for its pure ``history()``."""

LEVELS = (
    ("base",),  # what every package shares: naming, units, formats, config sections, result shapes, outputs
    ("experiments.maths", "experiments.models", "experiments.tasks"),
    ("experiments.interventions",),  # what a method does to a model
    ("experiments.training",),  # what every method uses: state, loop, optimisers, precision, seeding, context
    ("experiments.components",),  # what several methods share
    ("experiments.methods",),  # one recipe a file
    ("experiments.harness",),  # around the methods: the keyed config, run keys, the runner
    ("experiments",),  # the package: run() and the method registry, lazily
    ("orchestrator",),  # the packages' own __init__ (empty)
    ("orchestrator.settings", "orchestrator.status"),
    ("orchestrator.retry", "orchestrator.checkpoints", "orchestrator.hub", "orchestrator.filesystems"),
    ("orchestrator.registry", "orchestrator.tracking"),
    ("orchestrator.cluster", "orchestrator.report"),
    ("orchestrator.driving",),
    ("orchestrator.slurm",),
    ("analysis",),
    ("analysis.statistics",),
    ("analysis.data",),
    ("analysis.questions",),
    ("analysis.views",),
    ("headsweep.api",),
    ("headsweep.cli",),
    ("headsweep.sweep_job",),  # what a sweep's Ray Job runs: the driver, then the report (the CLI's)
    ("headsweep",),
)
"""The folders (and the few top-level modules) of the project as levels, lowest first. A module's
room is its folder (``experiments.methods``) or top-level module (``orchestrator.hub``); it imports
its own room or a lower level, never a room beside it or above it."""
INDEPENDENT = ("experiments.methods",)
"""Rooms whose modules never import each other (a method is a recipe over the levels below it, never
over another method); their package ``__init__`` may import them (the method registry)."""


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


WHOLE = ("base",)
"""Packages without folders that are one room: their modules import each other freely."""


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] in WHOLE else ".".join(parts[:2])


def level_of(room: str, levels=LEVELS) -> int | None:
    return next((i for i, rooms in enumerate(levels) if room in rooms), None)


def level_breaks(graph: dict[str, set[str]], levels=LEVELS) -> list[str]:
    """Every import that breaks a level or a port, as 'importer -> imported (why)'; every module in
    no level is named too (a new folder is placed on purpose)."""
    breaks = [f"{module} (in no level: add its room to LEVELS)" for module in sorted(graph)
              if level_of(room_of(module), levels) is None]
    for module, imported in sorted(graph.items()):
        room, top = room_of(module), module.split(".")[0]
        for target in sorted(imported):
            to_room, to = room_of(target), target.split(".")[0]
            level, to_level = level_of(room, levels), level_of(to_room, levels)
            if level is None or to_level is None:
                continue
            if to_level > level or (to_level == level and to_room != room):
                breaks.append(f"{module} -> {target} (level {level} {room} may import only its room or "
                              f"below, not level {to_level} {to_room})")
            elif room == to_room and room in INDEPENDENT and module != room and target != room:
                breaks.append(f"{module} -> {target} ({room}: its modules never import each other)")
            elif top == "analysis" and to == "orchestrator" and target not in ANALYSIS_READS:
                breaks.append(f"{module} -> {target} (analysis reads only {sorted(ANALYSIS_READS)})")
            elif top == "analysis" and to == "experiments":
                breaks.append(f"{module} -> {target} (analysis reads no code of experiments; base is below both)")
    return breaks


def test_no_import_circle_between_the_projects_modules():
    graph = module_graph(ROOT)
    assert len(graph) > 100  # the walk found the project (a wrong root would find nothing and pass)
    assert circles(graph) == []


def test_every_import_respects_the_levels():
    """Folders are levels: every import goes to its own room or a lower level (no exceptions), a
    method imports no other method, analysis reads only the registry's reader side and base (no code
    of experiments), and nothing imports headsweep."""
    graph = module_graph(ROOT)
    assert "analysis.views.service.app" in graph and "orchestrator.registry.reader" in graph["analysis.data.loading"]
    assert level_breaks(graph) == []


SPAWNED = re.compile(r"""-m["']?,?\s*["']?([a-z_]+(?:\.[a-z_]+)+)""")
"""A module a product process starts by name: ``python -m X`` in a Ray Job's entrypoint, or the
``"-m", "X"`` of a subprocess' argument list."""


def test_every_module_a_process_starts_by_name_exists():
    """A module named in a string is an import the graph cannot see: each one a product module starts
    (``-m X``) exists, so a move leaves no job starting a module that is gone; the sweep's Ray Job
    runs ``headsweep.sweep_job``, whose driver and report are imports below it (the levels check
    them), not a shell line calling the CLI from the orchestrator."""
    graph = module_graph(ROOT)
    started = {name: path for top in TOPS for path in sorted((ROOT / top).rglob("*.py"))
               for name in SPAWNED.findall(path.read_text()) if name.split(".")[0] in TOPS}
    assert "orchestrator.driving.supervisor" in started and "headsweep.sweep_job" in started
    assert {name: str(path) for name, path in started.items() if name not in graph} == {}
    assert {"orchestrator.driving.driver", "headsweep.cli"} <= graph["headsweep.sweep_job"]


def _fake_project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_catch_a_circle_an_upward_import_and_a_broken_port(tmp_path):
    """The checkers on a tiny fake project with faults put in on purpose: a circle hidden by a
    function-local import (and a relative one), imports up a level, beside it, between two methods,
    around the analysis port, and a folder placed in no level."""
    root = _fake_project(tmp_path, {
        "experiments/__init__.py": "",
        "base/__init__.py": "",
        "base/naming.py": "from experiments.methods import a  # up a level\n",
        "experiments/maths/__init__.py": "",
        "experiments/maths/hc.py": "from experiments.tasks import t  # beside it\n",
        "experiments/tasks/__init__.py": "",
        "experiments/tasks/t.py": "",
        "experiments/methods/__init__.py": "from experiments.methods import a, b  # the registry: allowed\n",
        "experiments/methods/a.py": "from experiments.methods.b import f  # another method\n",
        "experiments/methods/b.py": "def f():\n    from . import a\n",
        "experiments/stray/__init__.py": "",
        "orchestrator/__init__.py": "",
        "orchestrator/driving/__init__.py": "",
        "orchestrator/driving/sweeps.py": "import analysis.views.service\n",
        "orchestrator/registry/__init__.py": "",
        "orchestrator/registry/reader.py": "",
        "analysis/__init__.py": "",
        "analysis/views/__init__.py": "",
        "analysis/views/service.py": "from orchestrator.driving import sweeps\nfrom orchestrator.registry import reader\n",
        "analysis/data/__init__.py": "",
        "analysis/data/select.py": "import headsweep\nimport experiments.maths.hc\n",
        "headsweep/__init__.py": "from analysis.views import service\n",
    })
    graph = module_graph(root)
    assert graph["experiments.methods.b"] == {"experiments.methods.a"}
    assert circles(graph) == [["analysis.views.service", "orchestrator.driving.sweeps"],
                              ["experiments.methods.a", "experiments.methods.b"]]
    breaks = [line.split(" (")[0] for line in level_breaks(graph)]
    assert breaks == [
        "experiments.stray",
        "analysis.data.select -> experiments.maths.hc",
        "analysis.data.select -> headsweep",
        "analysis.views.service -> orchestrator.driving.sweeps",
        "base.naming -> experiments.methods.a",
        "experiments.maths.hc -> experiments.tasks.t",
        "experiments.methods.a -> experiments.methods.b",
        "experiments.methods.b -> experiments.methods.a",
        "orchestrator.driving.sweeps -> analysis.views.service",
    ]  # experiments.methods -> a, b (the registry) and analysis -> orchestrator.registry.reader pass
