"""A sweep in a notebook: its runs, results, maps, agreement and figures as pandas DataFrames,
numpy arrays and matplotlib figures.

The same answers as ``headsweep results | agreement | compare-maps | ...`` and the HTTP service, through
the same declarations: the sweep is loaded by ``analysis.data.loading.open_sweep`` (cached, reloaded when
its runs change, from the registry's reader: never written, never migrated), and every ``Sweep`` method
asks its question as declared in ``analysis.views.vocabulary`` (the same names and defaults as the
command and the route, tests/test_vocabulary.py); this module only turns the answers into DataFrames.
``submit``, ``resume`` and ``cancel`` are ``orchestrator.driving.sweeps``' with the options of the
commands of those names. The registry is the CLI's:
``HEADSWEEP_DB``, else the SQLite file under ``HEADSWEEP_HOME`` (``orchestrator.settings``), read
at each call.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd
import yaml

from analysis.data import select
from analysis.data.loading import open_sweep
from analysis.data.sweep import AXES, SweepData
from analysis.questions import run_table
from analysis.questions.agreement import compare
from analysis.questions.agreement import result as agreement_result
from analysis.views import answers, compare_figure, figure_plan, vocabulary
from orchestrator import settings
from orchestrator.registry.reader import RegistryReader

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Where = str | Mapping[str, Any] | None
"""Which runs: the CLI's ``--where`` (``"metrics.accuracy > 0.8 and seed:0|1"``), or ``{"task": "sst2", "seed": [0, 1]}``."""


def sweep(sweep_id: str = "last", db: str | None = None, tracking_uri: str | None = None) -> Sweep:
    """The sweep ``sweep_id`` (``last``: the newest) of the registry ``db`` (default: the CLI's), its
    runs' artifact URIs from the MLflow store ``tracking_uri`` (default: the CLI's).

    ``analysis.QueryError`` (a ``ValueError``) names the nearest sweep for an unknown id."""
    registry = RegistryReader(db or settings.registry_url())
    data = open_sweep(registry, sweep_id)
    return Sweep(data.sweep_id, registry, MlflowArtifacts(tracking_uri))


@dataclass(frozen=True)
class MlflowArtifacts:
    """MLflow run ids -> their artifact URIs, from the MLflow store at ``tracking_uri`` (default:
    ``HEADSWEEP_TRACKING_URI``, as the CLI): the ``artifact_uri`` column of the run table
    (``analysis.questions.run_table``, which imports no MLflow). Picklable, for the service on Ray Serve.
    One search per 100 runs, over every experiment (a sweep may reuse runs another sweep logged)."""

    tracking_uri: str | None = None

    def __call__(self, run_ids: Sequence[str]) -> dict[str, str]:
        from orchestrator import tracking

        mlflow = tracking.client(self.tracking_uri)
        experiments = [e.experiment_id for e in mlflow.search_experiments()]
        found: dict[str, str] = {}
        for i in range(0, len(run_ids), 100):
            batch = list(run_ids[i:i + 100])
            quoted = ", ".join(f"'{run_id}'" for run_id in batch)
            for run in mlflow.search_runs(experiments, f"attributes.run_id IN ({quoted})", max_results=len(batch)):
                found[run.info.run_id] = run.info.artifact_uri
        return found


def submit(grid: str | Path | Mapping[str, Any], sets: Sequence[str] = (), wait: bool = False, force: bool = False,
           rerun_failed: bool = False, track: bool = True, auto_resume: bool = True) -> Sweep:
    """Submit a grid (a YAML file, or the same as a dict) as ``headsweep submit`` does, on the Ray
    cluster the CLI uses, with the same options: ``sets`` (``--set``: ``["seed=0,1,2"]``), ``wait``
    (return once the sweep is done; by default at once, as the command does), ``force``,
    ``rerun_failed``, ``track`` (``--no-track``: False) and ``auto_resume`` (``--no-auto-resume``: False).

    A dict is written to ``$HEADSWEEP_HOME/grids/<name>-<hash>.yaml`` first, so the sweep keeps
    its grid text as one submitted from a file does; relative paths in it are read from the
    current directory, as from a file."""
    from orchestrator.driving import sweeps

    path = _grid_file(grid) if isinstance(grid, Mapping) else str(grid)
    submitted = sweeps.submit(path, force=force, rerun_failed=rerun_failed, track=track, auto_resume=auto_resume,
                              sets=list(sets))
    if wait and submitted.driver is not None:
        sweeps.wait(submitted.sweep_id)
    return Sweep(submitted.sweep_id, RegistryReader(settings.registry_url()), MlflowArtifacts())


def resume(sweep_id: str, wait: bool = False, track: bool = True) -> Sweep:
    """Run what is not finished of the sweep ``sweep_id`` (``last``: the newest) after a crash, as
    ``headsweep resume`` does; ``wait``: return once it is done; ``track`` (``--no-track``: False)."""
    from orchestrator.driving import sweeps

    registry = RegistryReader(settings.registry_url())
    sweep_id = open_sweep(registry, sweep_id).sweep_id  # `last` resolved, an unknown id named as the nearest
    if sweeps.resume(sweep_id, track=track) is not None and wait:
        sweeps.wait(sweep_id)
    return Sweep(sweep_id, registry, MlflowArtifacts())


def cancel(sweep_id: str) -> dict[str, int]:
    """Stop the sweep ``sweep_id`` (``last``: the newest) as ``headsweep cancel`` does: no run is
    scheduled any more, running trials stop at their next check; its runs per status."""
    from orchestrator.driving import sweeps

    return sweeps.cancel(open_sweep(RegistryReader(settings.registry_url()), sweep_id).sweep_id)


def _show_figures_in_ipython() -> None:
    """In IPython (a notebook), a matplotlib Figure shows as its PNG (``base.png``, the
    one encoder): analysis draws Figures without pyplot (thread-safe), so IPython's inline backend,
    which pyplot switches on, never registered them. A display already registered is kept."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    from matplotlib.figure import Figure

    from analysis.views.figures import DPI
    from base.png import figure_png

    png = shell.display_formatter.formatters["image/png"]
    try:
        png.lookup_by_type(Figure)
    except KeyError:
        png.for_type(Figure, lambda fig: figure_png(fig, DPI))


def _grid_file(grid: Mapping[str, Any]) -> str:
    text = yaml.safe_dump(dict(grid), sort_keys=False)
    name = str(grid.get("name", "grid"))
    path = settings.home() / "grids" / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _filters(where: Where) -> select.Where:
    return select.as_where(where)


def _read_through(answer: Agreement | Comparison, name: str) -> Any:
    """``answer.<name>``: the field of its ``result`` (``notes``, ``labels``, ``pairs``, ...)."""
    result = answer.__dict__.get("result")
    if result is None:  # not built yet (copy, pickle)
        raise AttributeError(name)
    return getattr(result, name)


class RunMaps(NamedTuple):
    """A unit map of the runs that have it: ``values, runs = s.map("heads.gate")``."""

    values: np.ndarray
    """``(N, L, K)`` float64: layers x units (heads, neurons) of each run."""
    runs: pd.DataFrame
    """The N runs' keys, status and labels, row i for ``values[i]``."""


@dataclass(frozen=True)
class Agreement:
    """``across_runs.agreement``'s answer (``result``; its fields read through, e.g. ``.notes``)."""

    result: agreement_result.AgreementMatrix
    filters: select.Filters

    @property
    def value(self) -> float:
        """The mean off-diagonal r of the matrix: ``headsweep agreement``'s "<across> r" observed."""
        return float(self.result.mean_offdiag.observed)

    def table(self) -> pd.DataFrame:
        """Every statistic agreement asks against each permutation null (``answers.tested_rows``):
        observed, chance (``null_mean``), its 95 % band, the excess over chance and p."""
        return pd.DataFrame(answers.tested_rows(self.result.statistics))

    def matrix(self) -> pd.DataFrame:
        """The label x label Pearson matrix."""
        return pd.DataFrame(self.result.matrix, index=self.result.labels, columns=self.result.labels)

    def figure(self) -> Figure:
        """The heat map ``headsweep agreement --png`` writes (``figure_plan.agreement_figure``)."""
        return figure_plan.agreement_figure(self.result, self.filters)

    def __getattr__(self, name: str) -> Any:
        return _read_through(self, name)

    def __repr__(self) -> str:
        return (f"<Agreement of {self.result.map_name} across {self.result.across}: "
                f"r = {self.value:.3f} over {len(self.result.labels)} labels>")


@dataclass(frozen=True)
class Comparison:
    """``compare.compare_maps``' answer (``result``; its fields read through, e.g. ``.pairs``)."""

    result: agreement_result.AgreementMatrix
    filters: select.Filters

    def table(self) -> pd.DataFrame:
        """One row per pair of labels with each statistic and its nulls (``headsweep compare-maps
        --format csv``: ``answers.compare_rows``)."""
        return pd.DataFrame(answers.compare_rows(self.result))

    def matrix(self) -> pd.DataFrame:
        """The label x label matrix of mean Spearman rho."""
        return pd.DataFrame(self.result.matrix, index=self.result.labels, columns=self.result.labels)

    def figure(self) -> Figure:
        """The matrix ``headsweep compare-maps --out`` writes (``compare_figure.compare_figure``)."""
        return compare_figure.compare_figure(self.result, self.filters)

    def __getattr__(self, name: str) -> Any:
        return _read_through(self, name)


class Sweep:
    """One sweep of the registry. Every method reads it afresh (the cached copy while its runs are
    unchanged), so a running sweep's answers grow as its runs finish."""

    def __init__(self, sweep_id: str, registry: RegistryReader,
                 artifact_uris: run_table.ArtifactUris | None = None):
        self.id, self._registry, self._artifact_uris = sweep_id, registry, artifact_uris

    def _data(self) -> SweepData:
        return open_sweep(self._registry, self.id)

    def __repr__(self) -> str:
        row = self._registry.get_sweep(self.id)
        counts = ", ".join(f"{n} {status}" for status, n in sorted(row["counts"].items()))
        return f"<Sweep {self.id} ({row['name']}): {row['status']}, {counts or 'no runs'}>"

    def _answer(self, question: vocabulary.Question, where: Where, **given: Any) -> Any:
        """``question`` asked of this sweep's runs ``where`` selects (``vocabulary.Question.answer``)."""
        context = vocabulary.Context(self._registry, self._artifact_uris)
        return question.answer(self._data(), _filters(where), context, **given)

    def runs(self, where: Where = None) -> pd.DataFrame:
        """The run table, one row per run (``headsweep runs``, the service's ``/runs``): keys, labels,
        status, times, MLflow run id and artifact URI, ``params.<key>`` for each config key the grid
        sets or varies, maps and ``metrics.<name>`` (NaN where a run has none yet). ``where``: the CLI's
        ``--where`` (``"metrics.accuracy > 0.8 and seed != 1"``) or ``{"seed": [0, 1]}``."""
        table = self._answer(vocabulary.RUNS, where)
        return pd.DataFrame(table.rows, columns=table.columns)

    def results(self, group_by: str | Sequence[str] = (), metric: str | None = None,
                where: Where = None) -> pd.DataFrame:
        """Mean, std, n and 95 % CI of ``metric`` (default: accuracy, else the first metric) per
        group of ``group_by`` (default: per cell, over seeds): ``headsweep results``' rows."""
        _, rows = self._answer(vocabulary.RESULTS, where, group_by=group_by, metric=metric)
        return pd.DataFrame(rows)

    def map(self, name: str = select.DEFAULT_MAP, where: Where = None) -> RunMaps:
        """Map ``name`` of the (selected) runs that have it, with those runs' labels."""
        sel, values, _, _ = select.map_runs(select.select(self._data(), _filters(where)), name, switch=False)
        runs = pd.DataFrame(run_table.run_table(sel).rows, columns=run_table.FIRST_COLUMNS)[list(AXES)]
        return RunMaps(values, runs)

    def spearman(self, a: Where, b: Where, map: str | None = None, top: float = compare.DEFAULT_TOP,
                 n_perm: int = 1000, where: Where = None) -> dict[str, Any]:
        """Do two groups of runs (``a="task:sst2"``, ``b={"task": "ud-pos"}``) rank the units of ``map``
        alike? ``headsweep spearman``: rho of their mean maps against both nulls, the top-k overlap."""
        return self._answer(vocabulary.SPEARMAN, where, a=a, b=b, map=map, top=top, n_perm=n_perm)

    def iou(self, across: str = "seed", pool: str | Sequence[str] = (), where: Where = None) -> dict[str, Any]:
        """Do runs keep the same weights? ``headsweep iou``: mask IoU across ``across`` beside chance."""
        return self._answer(vocabulary.IOU, where, across=across, pool=pool)

    def transfer(self, fraction: float | None = None, noise_std: float | None = None, n_perm: int = 1000,
                 where: Where = None) -> dict[str, Any]:
        """Prompt transfer between tasks (``headsweep transfer --format json``): task x task tables and
        Spearman(overlap, transfer) against its null."""
        return vocabulary.TRANSFER.json(self._answer(vocabulary.TRANSFER, where, fraction=fraction,
                                                     noise_std=noise_std, n_perm=n_perm))

    def agreement(self, across: str = "seed", map: str | None = None, where: Where = None,
                  pool: str | Sequence[str] = (), n_perm: int = 1000) -> Agreement:
        """Do runs keep the same units across ``across`` (seed, run, a label or a config key)?
        ``headsweep agreement``: the matrix, every statistic and its permutation nulls. ``map``:
        default the one most runs have stored (``select.default_map``: heads.gate for head gates)."""
        result = self._answer(vocabulary.AGREEMENT, where, across=across, map=map, pool=pool, n_perm=n_perm)
        return Agreement(result, _filters(where))

    def compare_maps(self, *maps: str, across: str | None = None, top: float = compare.DEFAULT_TOP,
                     n_perm: int = 1000, pool: str | Sequence[str] = (), where: Where = None) -> Comparison:
        """Do maps (``"heads.log_alpha", "-heads.ablation_delta"``), or one map's values of ``across``,
        rank the units alike? ``headsweep compare-maps``: Spearman rho, top-k overlap, nulls."""
        result = self._answer(vocabulary.COMPARE_MAPS, where, maps=maps, across=across, top=top, n_perm=n_perm,
                              pool=pool)
        return Comparison(result, _filters(where))

    def figure(self, kind: str, where: Where = None, across: str = "seed", metric: str | None = None,
               x: str | None = None, map: str | None = None, maps: str | Sequence[str] = (),
               n_perm: int = 1000) -> Figure:
        """One figure of ``kind`` (``headsweep figures --kind``, the service's ``/figures/{kind}``: rgb,
        grey, agreement, curves, compare_maps, pruning, layers, perturbation, ffn_pruning, cost) as a
        matplotlib Figure, with the kind's own parameters (``across``, ``metric``, ``x``, ``map``,
        ``maps``, ``n_perm``); ``.savefig`` writes it in any format."""
        return self._answer(vocabulary.FIGURE, where, kind=kind, across=across, metric=metric, x=x, map=map,
                            maps=maps, n_perm=n_perm)

    def figures(self, kind: str | None = None, where: Where = None) -> dict[str, Figure]:
        """Every figure ``headsweep figures`` draws for the (selected) runs (``kind``: of that kind only),
        by the file name it writes: ``{"rgb_head_gates-dp-lambda-0.05.png": Figure, ...}``."""
        context = vocabulary.Context(self._registry, self._artifact_uris)
        return dict(vocabulary.drawn(self._data(), _filters(where), context, kind))
