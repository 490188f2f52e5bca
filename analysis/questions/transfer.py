"""Prompt transferability across tasks: ``prompt_transfer`` runs as task x task tables (pure).

Each finished ``prompt_transfer`` run (experiments/methods/prompt_transfer.py) measured one
ordered pair of tasks, source -> target: its ``task`` is the target, its source stage's task
(config ``source.task.name``, else the target's) the source. :func:`transfer_tables` averages
each metric over the pair's seeds into a ``(T, T)`` table, rows = source, columns = target:

- ``transfer_relative``: the source prompt on the target task / the target prompt's own accuracy
  (zero-shot, read-out statistics re-estimated without labels), ``transfer_accuracy`` the same
  unscaled;
- ``overlap_top20``: the shared fraction of the two prompts' top 20 % skill neurons;
- ``overlap_active``: the overlap (cosine) of the neurons the two prompts activate;
- ``drop_top`` / ``drop_random``: the target prompt's accuracy minus its accuracy with Gaussian
  noise on the source's top ``f`` of the neurons / on as many random neurons in the same layers
  (the task x task perturbation table; ``f`` = ``fraction``, default the largest reported, at the
  noise std ``noise_std``, default the one most runs have: a grid may add cells at other noise
  levels, evaluation only, and each level is a table of its own).

Wang et al. (2022) report that the overlap of top skill neurons predicts transferability better
than the overlap of activated neurons (Spearman 0.71 vs 0.53 across task pairs).
:func:`transfer_tables` computes Spearman rho between each overlap table and
``transfer_relative`` over the ordered pairs of different tasks (the diagonal is 1 by
construction), each against a permutation null: the transfer values shuffled among the pairs
(``n_perm`` times), p one-sided (a positive relation), as ``nulls.null_result`` reports it. The
overlaps are symmetric, so each value stands for both directions of a pair, whose transfers differ.
What was pooled is said: the number of pairs and of seeds averaged per pair. Runs must agree on every
other config key (model, training, ...): select them with ``--where`` otherwise.

File tasks are labelled by their ``task.name`` (``classification``), so two of them in one
sweep would share a label: compare one at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import rankdata

from analysis.data.select import (
    Filters,
    QueryError,
    as_codes,
    config_columns,
    describe,
    list_choices,
    select,
    value_label,
    varying_config,
)
from analysis.data.sweep import SweepData
from analysis.statistics import nulls
from base import outputs

METHOD = "prompt_transfer"
MEASURED = (outputs.TRANSFER_RELATIVE, outputs.TRANSFER_ACCURACY, outputs.OVERLAP_TOP20, outputs.OVERLAP_ACTIVE)
"""The run's metrics shown as tables, under their own names."""
TRANSFER, _, OVERLAP_TOP20, OVERLAP_ACTIVE = (metric.name for metric in MEASURED)
TABLES = {
    **{metric.name: metric.meaning for metric in MEASURED},
    "drop_top": "target accuracy lost to noise on the source's top skill neurons",
    "drop_random": "target accuracy lost to noise on as many random neurons (same layers)",
}
"""The tables, by name, and what each shows (rows: source task, columns: target task)."""
TABLES_DRAWN = (TRANSFER, OVERLAP_TOP20, OVERLAP_ACTIVE, "drop_top", "drop_random")
OVERLAPS = (OVERLAP_TOP20, OVERLAP_ACTIVE)
ACCURACY = outputs.ACCURACY.name
_NOISE_STD = f"{METHOD}.noise_std"
_SOURCE_TASK = "source.task."
"""Config keys of the source stage's task: they follow ``source_task``, never another axis."""


@dataclass(frozen=True)
class Correlation:
    """Spearman rho of one overlap with ``transfer_relative`` across ordered pairs of tasks."""

    overlap: str
    n_pairs: int
    rho: float
    tested: nulls.NullResult | None
    """rho against the transfer values shuffled among the pairs; None without permutations."""


@dataclass(frozen=True)
class Transfer:
    """The task x task tables of a sweep's prompt_transfer runs, and the correlations."""

    sweep_id: str
    tasks: list[str]
    """Row (source) and column (target) labels, in this order."""
    tables: dict[str, np.ndarray]
    """Name (``TABLES``) -> ``(T, T)`` seed means; NaN where no finished run has the pair."""
    seeds: np.ndarray
    """``(T, T)`` int: finished runs (seeds) averaged in each cell."""
    fraction: float
    """The perturbed fraction of the ``drop_*`` tables."""
    noise_std: float
    """The runs' ``prompt_transfer.noise_std``: the noise of the ``drop_*`` tables."""
    correlations: list[Correlation]
    model: str
    runs: int
    notes: list[str] = field(default_factory=list)

    @property
    def pooled(self) -> str:
        """What each correlation pooled, in words."""
        off = ~np.eye(len(self.tasks), dtype=bool) & (self.seeds > 0)
        counts = self.seeds[off]
        per = f"{counts.min()}" if counts.size and counts.min() == counts.max() else (
            f"{counts.min()}-{counts.max()}" if counts.size else "0")
        return (f"{int(off.sum())} ordered pairs of different tasks, each the mean of {per} seeds "
                f"({self.runs} runs)")


def _standard_ranks(x: np.ndarray) -> np.ndarray | None:
    """Average ranks (ties share theirs) scaled to mean 0 and mean square 1; None when constant."""
    ranks = rankdata(np.asarray(x, dtype=np.float64))
    spread = ranks.std()
    return (ranks - ranks.mean()) / spread if spread > 0 else None


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rho of two ``(n,)`` arrays (Pearson r of their average ranks); NaN when either is
    constant or ``n < 3``."""
    if len(x) < 3:
        return math.nan
    rx, ry = _standard_ranks(x), _standard_ranks(y)
    return math.nan if rx is None or ry is None else float(np.mean(rx * ry))


def spearman_test(x: np.ndarray, y: np.ndarray, n_perm: int, rng: np.random.Generator) -> nulls.NullResult:
    """Spearman rho of ``x`` and ``y`` against ``n_perm`` (>= 1) shuffles of ``y`` among the pairs."""
    observed = spearman(x, y)
    if math.isnan(observed):
        return nulls.null_result(observed, np.full(n_perm, np.nan), "pairs")
    rx, ry = _standard_ranks(x), _standard_ranks(y)
    shuffled = rng.permuted(np.broadcast_to(ry, (n_perm, len(ry))), axis=1)  # (n_perm, n)
    return nulls.null_result(observed, shuffled @ rx / len(rx), "pairs")


def perturbed_fractions(names) -> list[float]:
    """The fractions ``f`` of the ``accuracy_noise_source_top_<f>`` metrics among ``names``."""
    found = (outputs.SOURCE_NOISE.parse(name) for name in names)
    return sorted(float(f["fraction"]) for f in found if f and f["metric"] == ACCURACY and f["which"] == "top")


def transfer_tables(data: SweepData, filters: Filters | None = None, fraction: float | None = None,
                    noise_std: float | None = None, n_perm: int = 1000, seed: int = 0) -> Transfer:
    """The task x task tables and the overlap-transfer correlations of the prompt_transfer runs."""
    sel = select(data, filters)
    sel = sel.subset(sel.method == METHOD)
    if TRANSFER in sel.metrics:
        sel = sel.subset(np.isfinite(sel.metrics[TRANSFER]))
    if len(sel) == 0:
        raise QueryError(f"no finished {METHOD} run in {describe(filters)} (examples/grid_skill_transfer.yaml "
                         "runs them)")
    sel, noise_std = _at_noise(sel, noise_std)
    _check_one_setting(sel)
    fractions = perturbed_fractions(sel.metrics)
    fraction = max(fractions) if fraction is None else fraction
    if not any(math.isclose(fraction, f) for f in fractions):
        raise QueryError(f"no perturbation of {fraction:g} of the neurons (fractions: "
                         f"{', '.join(f'{f:g}' for f in fractions)})")
    fraction = next(f for f in fractions if math.isclose(fraction, f))

    targets = np.array([str(t) for t in sel.task])
    sources = source_tasks(sel)
    tasks = sorted(set(targets) | set(sources))
    row = np.array([tasks.index(s) for s in sources])
    col = np.array([tasks.index(t) for t in targets])
    accuracy = sel.metrics[ACCURACY]
    noise = {which: outputs.SOURCE_NOISE.name(metric=ACCURACY, which=which, fraction=fraction) for which in ("top", "random")}
    values = {
        **{metric.name: sel.metrics[metric.name] for metric in MEASURED},
        "drop_top": accuracy - sel.metrics[noise["top"]],
        "drop_random": accuracy - sel.metrics[noise["random"]],
    }
    seeds = np.zeros((len(tasks), len(tasks)), dtype=np.int64)
    np.add.at(seeds, (row, col), 1)
    tables = {name: cell_means(v, row, col, len(tasks)) for name, v in values.items()}

    rng = np.random.default_rng(seed)
    off = ~np.eye(len(tasks), dtype=bool) & (seeds > 0)
    correlations, notes = [], []
    for name in OVERLAPS:
        x, y = tables[name][off], tables[TRANSFER][off]
        tested = spearman_test(x, y, n_perm, rng) if n_perm > 0 else None
        correlations.append(Correlation(name, int(off.sum()), spearman(x, y), tested))
    if off.sum() < 3:
        notes.append(f"{int(off.sum())} ordered pairs of different tasks: a rank correlation needs 3 or more")
    models = sorted({str(m) for m in sel.model})
    return Transfer(data.sweep_id, tasks, tables, seeds, fraction, noise_std, correlations, ", ".join(models),
                    len(sel), notes)


def cell_means(values: np.ndarray, row: np.ndarray, col: np.ndarray, size: int) -> np.ndarray:
    """``(size, size)``: the mean of ``values`` over the runs of each (row, col) cell; NaN where none."""
    total = np.zeros((size, size))
    count = np.zeros((size, size))
    np.add.at(total, (row, col), values)
    np.add.at(count, (row, col), 1)
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def source_tasks(sel: SweepData) -> np.ndarray:
    """``(N,)`` str: each run's source task, its source stage's ``task.name`` (else its own task)."""
    stage = config_columns(sel).get("source.task.name")
    if stage is None:
        return np.array([str(t) for t in sel.task])
    return np.array([str(t) if value_label(s) == "none" else str(s) for s, t in zip(stage, sel.task, strict=True)])


def _at_noise(sel: SweepData, noise_std: float | None) -> tuple[SweepData, float]:
    """The runs at ``noise_std`` (default: the value most runs have), and that value."""
    column = np.asarray(config_columns(sel)[_NOISE_STD], dtype=np.float64)
    values, counts = np.unique(column, return_counts=True)
    chosen = float(values[np.argmax(counts)]) if noise_std is None else noise_std
    at = np.isclose(column, chosen)
    if not at.any():
        raise QueryError(f"no run with {_NOISE_STD} {chosen:g} ({_NOISE_STD}: {', '.join(f'{v:g}' for v in values)})")
    return sel.subset(at), chosen


def _check_one_setting(sel: SweepData) -> None:
    """QueryError naming the config keys (other than seed, task and the source) the runs differ in."""
    ignored = ("seed", "task.name", f"{METHOD}.source_task", _NOISE_STD)
    differ = {key: col for key, col in varying_config(sel).items()
              if key not in ignored and not key.startswith(_SOURCE_TASK)}
    if differ:
        keys = sorted(differ, key=lambda k: (k.split(".", 1)[0] in ("init_from", "source"), k))  # stages last
        choices = sorted(set(as_codes(differ[keys[0]]).tolist()))
        raise QueryError(f"the {METHOD} runs differ in {', '.join(keys)}: compare one setting at a time, "
                         f"e.g. --where {keys[0]}:{choices[0]} ({keys[0]}: {list_choices(choices)})")


# --------------------------------------------------------------------------- output


