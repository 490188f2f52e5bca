"""Every question the command line, the HTTP service and ``headsweep.api`` answer, declared once.

A ``Question`` is the question's name (the command ``headsweep <name>``, the route
``/sweeps/{id}/<name>``, the method ``Sweep.<name>`` with '_' for '-'), its parameters with their
types, defaults, bounds and meaning (``Param``), how it is asked of a loaded sweep, its limits on
the service and its JSON form. ``headsweep.cli.questions`` builds each command's arguments from it,
``service.routes`` each route's query parameters; ``headsweep.api.Sweep``'s methods take the same
names and defaults and answer through ``Question.answer`` (tests/test_vocabulary.py compares the
three). Every question also takes ``where`` (which runs). A default that depends on the sweep (the
map most runs have, the metric) is the question's own: the declaration leaves it None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.data.select import QueryError, Where, as_where, select
from analysis.data.sweep import SweepData
from analysis.questions import masks, results, run_table
from analysis.questions.agreement import across_runs, compare
from analysis.questions.transfer import transfer_tables
from analysis.views import answers, figure_plan
from analysis.views.figure_kinds import DPI, DPI_RANGE, FIGURE_KINDS
from analysis.views.transfer import transfer_json
from base.png import FORMATS as FIGURE_FORMATS

MAX_PERM = 2000
"""Permutations per null the service computes at most (the CLI and Python compute what they are asked)."""
MAX_RUN_MATRIX = 500
"""Runs an agreement across=run answers on the service (an N x N matrix): larger selections must be filtered."""
MAX_RUN_PERMS = 2_500_000
"""Runs x permutations of one agreement answer on the service (and pairs x permutations of a
compare-maps one that must gather its relabelled maps). Agreement across seed of 2,004 runs (668
cells x 3 seeds) at 1,000 permutations measured 3.5 s on MiniLM's 6 x 12 head maps and 1.2 s on
tiny-bert's 2 x 4 (2-core VM, load ~1, 2026-11-27; 8-13 s before the nulls were batched), so ~4.4 s
at this bound on head maps. Time grows with units per run, and with seeds per cell (10 seeds: ~2x per run)."""


def names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"task, lambda"`` or ``["task", "lambda"]`` -> ``("task", "lambda")``: the one reading of a list
    given as comma-separated text (the command line, a query) or as a list (Python); empty parts dropped."""
    if not value:
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    return tuple(part.strip() for part in parts if part.strip())


@dataclass(frozen=True)
class Param:
    """One parameter of a question: ``name`` in Python and over HTTP, ``--name-with-dashes`` on the
    command line (a ``positional`` one: words after the sweep)."""

    name: str
    help: str
    type: type = str
    """str, int or float (of each item when ``many``)."""
    default: Any = None
    """None: nothing given (the question's own choice, said in ``help``)."""
    required: bool = False
    many: bool = False
    """A list: comma-separated text on the command line and over HTTP, a list or that text in Python."""
    positional: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    """Bounds, on every surface."""
    cap: float | None = None
    """The most the service computes (a limit of its own, above ``le``)."""
    unit: str = ""
    choices: tuple[str, ...] | None = None
    """Checked before asking (a question that checks a value itself names the nearest one instead)."""

    def out_of_bounds(self, value: float) -> str | None:
        """Why ``value`` is outside the bounds ('5000 is outside 10 to 600 dots per inch'), or None."""
        low_ok = (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        if low_ok and (self.le is None or value <= self.le):
            return None
        unit = f" {self.unit}" if self.unit else ""
        if self.le is None:
            return f"{value:g} is below {self.ge:g}{unit}" if self.ge is not None else f"{value:g} is not above {self.gt:g}{unit}"
        span = f"{self.ge:g} to {self.le:g}" if self.gt is None else f"({self.gt:g}, {self.le:g}]"
        return f"{value:g} is outside {span}{unit}"

    def read(self, value: Any) -> Any:
        """A given value as the question takes it: a list's names as a tuple, bounds and choices checked."""
        if self.many:
            value = names(value)
        if self.required and value in (None, (), ""):
            raise QueryError(f"{self.name}: give {'one or more' if self.many else 'a value'}")
        if value is None or self.many:
            return value
        if self.type is not str and (why := self.out_of_bounds(value)):
            raise QueryError(f"{self.name}: {why}")
        if self.choices and value not in self.choices:
            raise QueryError(f"{self.name}: '{value}' is not one of {', '.join(self.choices)}")
        return value


@dataclass(frozen=True)
class Context:
    """What a question reads besides the sweep: the registry's reader (the sweep's grid, for the run
    table), the runs' MLflow artifact URIs, and whether the service's limits apply (``limited``)."""

    registry: Any = None
    artifact_uris: run_table.ArtifactUris | None = None
    limited: bool = False

    def limits(self) -> dict[str, int | None]:
        """``max_run_perms`` for the agreement engine: MAX_RUN_PERMS on the service, none elsewhere."""
        return {"max_run_perms": MAX_RUN_PERMS if self.limited else None}


def _as_is(answer: Any) -> Any:
    return answer


@dataclass(frozen=True)
class Question:
    """One question: its name, parameters and summary, how it is asked of a sweep (``ask(data,
    filters, context, **values)``) and its answer as plain JSON values (``json``)."""

    name: str
    summary: str
    params: tuple[Param, ...]
    ask: Callable[..., Any]
    json: Callable[[Any], Any] = _as_is

    def values(self, given: dict[str, Any]) -> dict[str, Any]:
        """Each parameter's value as the question takes it (``Param.read``), its default where not given."""
        unknown = sorted(set(given) - {p.name for p in self.params})
        if unknown:
            raise QueryError(f"{self.name} takes no {', '.join(unknown)} (it takes: "
                             f"{', '.join(p.name for p in self.params) or 'where only'})")
        return {p.name: p.read(given.get(p.name, p.default)) for p in self.params}

    def answer(self, data: SweepData, filters: Where, context: Context, **given: Any) -> Any:
        """The question asked of ``data``'s runs that ``filters`` select, with ``given`` parameters."""
        return self.ask(data, filters, context, **self.values(given))


def _n_perm(help: str) -> Param:
    return Param("n_perm", help + "; default 1000, 0 = no test", int, 1000, ge=0, cap=MAX_PERM)


MAP = Param("map", "the unit map, e.g. heads.gate, heads.log_alpha (default: the map most runs of the sweep have)")
POOL = Param("pool", "axes to average over instead of matching on them, e.g. lambda,pipeline", many=True)
TOP = Param("top", f"top-k overlap of this fraction of the units (default {compare.DEFAULT_TOP}: the top 10 %)",
            float, compare.DEFAULT_TOP, gt=0, le=1)


def _runs(data: SweepData, filters: Where, context: Context) -> run_table.RunTable:
    grid = context.registry.get_sweep(data.sweep_id)["grid"] if context.registry is not None else None
    return run_table.run_table(data, filters, grid, context.artifact_uris)


RUNS = Question("runs", "the run table: labels, status, times, MLflow run, params.*, metrics.*", (), _runs,
                lambda table: table.rows)

RESULTS = Question(
    "results", "a metric's mean, std, n and 95 % CI per group", (
        Param("group_by", "axes to group by, e.g. task,sparsity,pipeline (default: per cell, over seeds)", many=True),
        Param("metric", "the metric (default: accuracy, else the first metric)")),
    lambda data, filters, context, group_by, metric: results.results(data, list(group_by), metric, filters),
    lambda answer: answer[1])


def _agreement(data, filters, context, across, map, pool, n_perm):
    return across_runs.agreement(data, across, filters, n_perm=n_perm, map_name=map, pool=pool, **context.limits(),
                                 max_runs=MAX_RUN_MATRIX if context.limited else None)


AGREEMENT = Question(
    "agreement", "do runs keep the same units? (across seeds, tasks, pipelines, ...)", (
        Param("across", "seed (default), run, a label (task, model, method, pipeline, a method's short "
                        "name) or any config key", default="seed"), MAP, POOL,
        _n_perm("permutations of each null (units shuffled within layers, and across all units)")),
    _agreement, answers.agreement_json)

COMPARE_MAPS = Question(
    "compare-maps", "do methods or tasks rank the units alike? Spearman, top-k, nulls", (
        Param("maps", "unit maps of one kind, e.g. heads.log_alpha,heads.importance; a leading '-' flips a map "
                      "(-heads.ablation_delta: larger = more important); one map with across",
              required=True, many=True, positional=True),
        Param("across", "compare one map across this axis's values (task, model, pipeline, seed, method or a "
                        "config key); default: map x map"),
        TOP, _n_perm("relabellings of each null (units within layers, and across all units)"), POOL),
    lambda data, filters, context, maps, across, top, n_perm, pool: compare.compare_maps(
        data, list(maps), filters, across=across, top=top, n_perm=n_perm, pool=pool, **context.limits()),
    answers.compare_json)

SPEARMAN = Question(
    "spearman", "do two groups of runs rank a map's units alike? rho, top-k, nulls", (
        Param("a", "group a, as where: e.g. task:sst2,pipeline:dp", required=True),
        Param("b", "group b, e.g. task:ud-pos", required=True),
        MAP, TOP, _n_perm("relabellings of each null")),
    lambda data, filters, context, a, b, map, top, n_perm: {"a": a, "b": b, **answers.spearman_json(
        compare.spearman(data, as_where(a), as_where(b), map, top, filters, n_perm))})

IOU = Question(
    "iou", "do runs keep the same weights? mask IoU across seeds, pipelines, losses, ...", (
        Param("across", "seed (default), or any axis (pipeline, loss, method, task, a config key): pairs of runs "
                        "that differ in it only", default="seed"), POOL),
    lambda data, filters, context, across, pool: masks.mask_iou(
        data, across, masks.stored_masks(), filters, pool, load_initial=masks.stored_masks(name=masks.INITIAL_FILE)))

TRANSFER = Question(
    "transfer", "prompt transfer between tasks: task x task tables, overlap vs transfer", (
        Param("fraction", "the perturbed fraction of the neurons in the drop tables (default: the largest "
                          "reported)", float, gt=0, le=1),
        Param("noise_std", "the runs at this prompt_transfer.noise_std (default: the value most runs have)",
              float, ge=0),
        _n_perm("shuffles of the transfer values among the pairs")),
    lambda data, filters, context, fraction, noise_std, n_perm: transfer_tables(
        data, filters, fraction=fraction, noise_std=noise_std, n_perm=n_perm),
    transfer_json)

FIGURE_FORMAT = Param("format", "file format: png (default), pdf or svg (vector, for a paper)", default="png",
                      choices=FIGURE_FORMATS)
FIGURE_DPI = Param("dpi", f"resolution, {DPI_RANGE[0]} to {DPI_RANGE[1]} (default: {DPI}; e.g. 300 for print; in "
                          "a PDF or SVG only its raster images, such as heat maps, use it)",
                   float, DPI, ge=DPI_RANGE[0], le=DPI_RANGE[1], unit="dots per inch")
"""How a figure is written (the CLI's files, the service's answers): Python returns matplotlib Figures."""


def _plan(data: SweepData, filters: Where, context: Context, kind: str | None) -> list[tuple[str, str, dict]]:
    """The figures of the selection (``figure_plan``), of ``kind`` only when given (a kind the plan leaves
    out: drawn once with its defaults)."""
    if kind:
        figure_plan.check_kind(kind)
    plan = [entry for entry in figure_plan.figure_plan(select(data, filters)) if kind in (None, entry[1])]
    return plan or ([(f"{kind}.png", kind, {})] if kind else [])


FIGURES = Question(
    "figures", "the figures of a sweep as PNG, PDF or SVG files", (
        Param("kind", f"only figures of this kind: {', '.join(FIGURE_KINDS)} (default: every figure worth drawing "
                      "for the sweep)"),),
    _plan)
"""The plan: [(file name, kind, the figure's parameters)], drawn of the selection (``FIGURE``)."""

FIGURE = Question(
    "figure", "a figure of the selection (every kind `headsweep figures --kind` draws)", (
        Param("kind", f"the figure's kind: {', '.join(FIGURE_KINDS)}", required=True),
        Param("across", "agreement: across this (seed, task, ...)", default="seed"),
        Param("metric", "curves and pruning: the metric (default: accuracy, else the first)"),
        Param("x", "curves: the x axis (default: the first label on a scale that varies, else open heads)",
              choices=figure_plan.CURVE_X),
        Param("map", "rgb, grey, agreement and layers: the unit map (default: the map most runs have)"),
        Param("maps", "compare_maps: maps of one kind ('-' before a name flips it)", many=True),
        _n_perm("agreement and compare_maps: permutations of each null")),
    lambda data, filters, context, kind, maps, **params: figure_plan.figure_of(
        data, kind, filters, maps=list(maps), **params, **context.limits()))
"""A matplotlib Figure (the service writes it in ``FIGURE_FORMAT`` at ``FIGURE_DPI``)."""



def drawn(data: SweepData, filters: Where, context: Context, kind: str | None = None) -> Iterator[tuple[str, Any]]:
    """Each figure of ``FIGURES``' plan of the selection drawn (``FIGURE``): (its file name, the Figure)."""
    plan = FIGURES.answer(data, filters, context, kind=kind)
    data = select(data, filters)
    for name, planned, params in plan:
        own = {key: value for key, value in params.items() if key != "filters"}
        yield name, FIGURE.answer(data, as_where(params.get("filters")), context, kind=planned, **own)


QUESTIONS = {q.name: q for q in (RUNS, RESULTS, AGREEMENT, COMPARE_MAPS, SPEARMAN, IOU, TRANSFER, FIGURES, FIGURE)}
"""Every question by name, in the order the command line lists them."""
