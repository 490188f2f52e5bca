"""What the runs say: pure functions over a loaded :class:`SweepData`.

The CLI and the HTTP service both call these; they translate their input
into these arguments and the answers into tables, JSON or PNG. No I/O, no
global RNG: every random answer (bootstrap CIs, permutation nulls) comes
from ``np.random.default_rng(seed)`` with a fixed default ``seed``, so the
same question on the same data always gets the same answer.

Filters are ``{axis: [values]}`` (a run matches when it has one of the
values on every axis named); values may be strings as they come from a
command line or a URL. A bad axis, metric or value raises
:class:`QueryError`, naming it and the nearest valid one.
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis import figures, stats
from analysis.loading import AXES, STRING_AXES, SweepData

ACROSS = ("seed", "task", "pipeline", "model", "run")
FIGURE_KINDS = ("rgb", "grey", "agreement", "curves")
CURVE_X = ("sparsity", "lambda", "open_heads")
SCORES = ("gates", "scores")
_NOT_CURVE_METRICS = ("loss", "train_loss", "open_heads")

Filters = Mapping[str, Sequence[Any]]


class QueryError(ValueError):
    """A question the data cannot answer as asked: one line, naming the bad value."""


# --------------------------------------------------------------------------- naming


def _nearest(word: str, choices: Sequence[str]) -> str:
    """'; did you mean 'x'?' for the closest choice (always one when there are choices)."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.0)
    return f"; did you mean '{match[0]}'?" if match else ""


def _choices(values: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def check_axis(name: str) -> str:
    if name not in AXES:
        raise QueryError(f"unknown axis '{name}'{_nearest(name, AXES)} (axes: {', '.join(AXES)})")
    return name


def check_metric(data: SweepData, name: str) -> np.ndarray:
    """The ``(N,)`` metric column, or QueryError naming the nearest metric of this sweep."""
    if name not in data.metrics:
        known = sorted(data.metrics)
        if not known:
            raise QueryError(f"unknown metric '{name}': no run of this selection has metrics yet")
        raise QueryError(f"unknown metric '{name}'{_nearest(name, known)} (metrics: {_choices(known)})")
    return data.metrics[name]


def _label(value: Any) -> str:
    """An axis value as text: 'none' for unset numbers, integers without '.0'."""
    if value is None:
        return "none"
    if isinstance(value, float | np.floating):
        return "none" if math.isnan(value) else f"{float(value):g}"
    return str(value)


def py(value: Any) -> Any:
    """numpy scalar -> Python; NaN -> None (for JSON and tables)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def axis_values(data: SweepData, axis: str) -> list[Any]:
    """Distinct values of ``axis`` in the data, sorted (numbers numerically, unset last)."""
    column = data.axis(check_axis(axis))
    if axis in STRING_AXES:
        return sorted(set(column.tolist()))
    values = np.unique(column)  # NaNs collapse to one, sorted last
    return [py(v) for v in values]


# --------------------------------------------------------------------------- filters


def parse_filter(text: str) -> dict[str, list[str]]:
    """``"task:sst2,seed:0|1"`` -> ``{"task": ["sst2"], "seed": ["0", "1"]}`` ("" -> ``{}``)."""
    filters: dict[str, list[str]] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        axis, sep, values = part.partition(":")
        if not sep or not axis.strip() or not values.strip():
            raise QueryError(f"expected axis:value[|value...], got '{part}' (e.g. task:sst2,seed:0|1)")
        filters.setdefault(check_axis(axis.strip()), []).extend(
            v.strip() for v in values.split("|") if v.strip())
    return filters


def _match(data: SweepData, axis: str, raw: Any) -> np.ndarray:
    """``(N,)`` bool: runs whose ``axis`` equals ``raw`` (a value or its text)."""
    column = data.axis(axis)
    text = str(raw).strip()
    if axis in STRING_AXES:
        mask = column == text
        if not mask.any():
            known = axis_values(data, axis)
            raise QueryError(f"no run with {axis} '{text}'{_nearest(text, known)} ({axis}: {_choices(known)})")
        return mask
    try:
        value = math.nan if text.lower() in ("none", "null", "nan", "") else float(text)
    except ValueError:
        raise QueryError(f"{axis}: expected a number, got '{text}'") from None
    if axis == "seed" and math.isfinite(value) and value != int(value):
        raise QueryError(f"seed: expected an integer, got '{text}'")
    mask = np.isnan(column) if math.isnan(value) else np.isclose(column, value, rtol=1e-9, atol=0.0)
    if not mask.any():
        known = [v for v in axis_values(data, axis) if v is not None]
        finite = np.isfinite(value) and known
        hint = f"; did you mean {known[int(np.argmin([abs(k - value) for k in known]))]}?" if finite else ""
        raise QueryError(f"no run with {axis} {text}{hint} ({axis}: "
                         f"{_choices([_label(v) for v in axis_values(data, axis)])})")
    return mask


def select(data: SweepData, filters: Filters | None = None) -> SweepData:
    """The runs matching every axis of ``filters`` (any of its values); all runs when empty."""
    if not filters:
        return data
    keep = np.ones(len(data), dtype=bool)
    for axis, values in filters.items():
        check_axis(axis)
        values = [values] if isinstance(values, str | int | float) else list(values)
        if not values:
            continue
        keep &= np.logical_or.reduce([_match(data, axis, v) for v in values])
    return data.subset(keep)


def runs(data: SweepData, filters: Filters | None = None, offset: int = 0,
         limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
    """(number of matching runs, one page of them as dicts with their metrics)."""
    sel = select(data, filters)
    page = range(len(sel))[offset:offset + limit]
    rows = []
    for i in page:
        row = {axis: py(sel.axis(axis)[i]) for axis in AXES}
        row["metrics"] = {name: py(col[i]) for name, col in sel.metrics.items() if not np.isnan(col[i])}
        row["has_gates"] = bool(sel.has_gates[i])
        rows.append(row)
    return len(sel), rows


# --------------------------------------------------------------------------- aggregate


def _groups(data: SweepData, by: Sequence[str]) -> list[np.ndarray]:
    """Index arrays of the runs sharing every ``by`` value, groups in sorted value order."""
    if len(data) == 0:
        return []
    codes = np.stack([np.unique(data.axis(axis), return_inverse=True)[1].ravel() for axis in by], axis=1)
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(inverse[order])) + 1)


def aggregate(data: SweepData, group_by: Sequence[str], metric: str, filters: Filters | None = None,
              n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Mean, std, n and 95 % bootstrap CI of ``metric`` per group (``stats.aggregate``).

    ``group_by`` = [] groups by cell (``group_key``: the spread is over seeds)
    and each row also names the cell's axes. Runs without the metric (not
    finished) are left out of n; a group with none has n = 0 and NaN stats.
    """
    by = [check_axis(a) for a in group_by] or ["group_key"]
    sel = select(data, filters)
    values = check_metric(sel, metric)
    shown = by if group_by else ["group_key", "task", "model", "method", "pipeline", "sparsity", "lambda"]
    rng = np.random.default_rng(seed)
    groups = _groups(sel, by) if group_by else _groups_in_cell_order(sel)
    rows = []
    for idx in groups:
        agg = stats.aggregate(values[idx], rng, n_boot=n_boot, nan_policy="omit")
        row = {axis: py(sel.axis(axis)[idx[0]]) for axis in shown}
        row.update(metric=metric, mean=py(agg.mean), std=py(agg.std), n=agg.n,
                   ci_lo=py(agg.ci_lo), ci_hi=py(agg.ci_hi), runs=len(idx))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class Agreement:
    """Gate agreement of a selection: a matrix over labels, and two tested statistics."""

    across: str
    labels: list[str]
    matrix: np.ndarray
    """``(K, K)`` Pearson r between the labels' gate vectors (see ``agreement``)."""
    n_runs: list[int]
    """Runs behind each label."""
    mean_offdiag: stats.NullResult | float
    """Mean off-diagonal entry of ``matrix``, with its permutation null (a float when n_perm = 0)."""
    stem_cell: stats.NullResult | float
    """He & Choi's statistic: mean over cells of ``stats.mean_multiple_correlation`` of
    the cell's seeds, with its permutation null (a float when n_perm = 0; NaN when
    not asked for, when no cell has 2 seeds, or when a cell has as many seeds as
    there are heads: the adjusted R^2 is then undefined)."""
    n_groups: int
    """Cells (group keys) with at least 2 seeds behind ``stem_cell``."""


def _gate_runs(data: SweepData, score: str = "gates") -> tuple[SweepData, np.ndarray]:
    """(the runs with a gate/score vector, their ``(n, L, H)`` float64 stack)."""
    sel = data.subset(data.has_gates)
    if score == "scores":
        if sel.scores is None:
            raise QueryError("this sweep's runs have no per-head scores in the registry; use score=gates")
        ok = ~np.isnan(sel.scores).reshape(len(sel), -1).any(axis=1)
        sel = sel.subset(ok)
        return sel, np.asarray(sel.scores, dtype=np.float64)
    x = np.asarray(sel.gates, dtype=np.float64)
    if np.isnan(x).any():
        raise QueryError(f"runs of different sizes in the selection (models: "
                         f"{', '.join(axis_values(sel, 'model'))}); filter by model")
    return sel, x


def _offdiag_mean(matrix: np.ndarray) -> float:
    """Mean of the off-diagonal entries, NaN entries left out (no copy when there are none)."""
    k = len(matrix)
    if k < 2:
        return math.nan
    total = matrix.sum(dtype=np.float64)  # 10,000 x 10,000: summed in place, not copied
    if math.isfinite(total):
        return float((total - np.trace(matrix, dtype=np.float64)) / (k * (k - 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(matrix[~np.eye(k, dtype=bool)]))


def _nanmean(values: Sequence[float]) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(values)) if len(values) else math.nan


def _stem_cell(x: np.ndarray, cells: list[np.ndarray]) -> float:
    return _nanmean([stats.mean_multiple_correlation(x[idx]) for idx in cells])


def _seed_matrix(x: np.ndarray, seeds: np.ndarray, labels: list[int], cells: list[np.ndarray]) -> np.ndarray:
    """Seed x seed: mean over cells of Pearson(run of seed i, run of seed j) in the same cell."""
    pos = {s: i for i, s in enumerate(labels)}
    total = np.zeros((len(labels), len(labels)))
    count = np.zeros_like(total)
    for idx in cells:
        r = stats.pearson_matrix(x[idx], dtype=np.float64)  # (n, n)
        at = np.array([pos[s] for s in seeds[idx]])
        ok = ~np.isnan(r)
        np.add.at(total, np.ix_(at, at), np.where(ok, r, 0.0))
        np.add.at(count, np.ix_(at, at), ok)
    with np.errstate(invalid="ignore"):
        return total / count


def _tested(stat_fn: Callable[[np.ndarray], float], x: np.ndarray, n_perm: int,
            rng: np.random.Generator) -> stats.NullResult | float:
    return stats.permutation_null(stat_fn, x, n_perm, rng) if n_perm > 0 else float(stat_fn(x))


def agreement(data: SweepData, across: str, filters: Filters | None = None, n_perm: int = 200,
              seed: int = 0, stem_cell: bool = True, max_fits: int | None = None) -> Agreement:
    """How much the selected runs agree on which heads to keep.

    ``across``:
      - ``seed``: seed x seed, mean over cells of the Pearson r between two seeds'
        runs of the same cell;
      - ``task`` / ``pipeline`` / ``model``: Pearson r between the mean gate
        vectors of each value's runs (He & Choi's task-to-task agreement);
      - ``run``: run x run Pearson r (``stats.pearson_matrix``, float32).

    Nulls: heads shuffled within layers (``stats.permutation_null``) of every
    run (seed, run, stem cell) or of every label's mean vector (task,
    pipeline, model); ``n_perm = 0`` skips them. ``stem_cell=False`` skips the
    stem cell statistic (NaN): it costs one least-squares fit per run of every
    cell with 2+ seeds, times ``n_perm + 1`` (~50 us per fit with 3 seeds, ~300 us
    with 50); above ``max_fits`` fits the question is refused (QueryError).
    """
    if across not in ACROSS:
        raise QueryError(f"unknown across '{across}'{_nearest(across, ACROSS)} (one of {', '.join(ACROSS)})")
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    sel, x = _gate_runs(select(data, filters))
    if len(sel) == 0:
        raise QueryError("no finished run with gates in the selection")
    cells = [idx for idx in _groups(sel, ["group_key"]) if len(idx) >= 2]
    # the adjusted R^2 needs more heads than seeds in every cell (e.g. tiny models, many seeds)
    stem_cell = stem_cell and bool(cells) and max(len(idx) for idx in cells) < x[0].size
    fits = sum(len(idx) for idx in cells) * (n_perm + 1) if stem_cell else 0
    if max_fits is not None and fits > max_fits:
        runs = sum(len(idx) for idx in cells)
        raise QueryError(f"the stem cell statistic of {runs} runs with {n_perm} permutations needs {fits:,} "
                         f"least-squares fits (at most {max_fits:,} here): lower n_perm (to "
                         f"{max(max_fits // max(runs, 1) - 1, 0)} or less) or filter the runs")
    rng_matrix, rng_stem = (np.random.default_rng([seed, k]) for k in (0, 1))

    if across == "seed":
        if not cells:
            raise QueryError("agreement across seed needs a cell with at least 2 finished seeds")
        labels = sorted(set(sel.seed[np.concatenate(cells)].tolist()))
        order = np.concatenate(cells)  # the cells' runs, cell after cell
        xs, seeds = x[order], sel.seed[order]
        bounds = np.cumsum([0] + [len(idx) for idx in cells])
        sub_cells = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        def matrix_of(z: np.ndarray) -> np.ndarray:
            return _seed_matrix(z, seeds, labels, sub_cells)

        matrix = matrix_of(xs)
        n_runs = [int((seeds == s).sum()) for s in labels]
        mean_offdiag = _tested(lambda z: _offdiag_mean(matrix_of(z)), xs, n_perm, rng_matrix)
    elif across == "run":
        # float32 (~1e-7 error): 10,000 runs give a 400 MB matrix instead of 800 MB
        x32 = x.astype(np.float32)
        labels, matrix = sel.run_key.tolist(), stats.pearson_matrix(x32)
        n_runs = [1] * len(labels)
        mean_offdiag = _tested(lambda z: _offdiag_mean(stats.pearson_matrix(z)), x32, n_perm, rng_matrix)
    else:
        labels = axis_values(sel, across)
        if len(labels) < 2:
            raise QueryError(f"agreement across {across} needs at least 2 values of {across} in the "
                             f"selection, found {len(labels)}: {_choices(labels)}")
        column = sel.axis(across)
        means = np.stack([x[column == v].mean(axis=0) for v in labels])  # (K, L, H)
        matrix = stats.task_correlation(means)
        n_runs = [int((column == v).sum()) for v in labels]
        mean_offdiag = _tested(lambda z: _offdiag_mean(stats.task_correlation(z)), means, n_perm, rng_matrix)

    stem = _tested(lambda z: _stem_cell(z, cells), x, n_perm, rng_stem) if stem_cell else math.nan
    return Agreement(across, [_label(v) for v in labels], matrix, n_runs, mean_offdiag, stem, len(cells))


# --------------------------------------------------------------------------- spearman


def spearman_overlap(data: SweepData, a: Filters, b: Filters, score: str = "gates", k_frac: float = 0.2,
                     filters: Filters | None = None, n_perm: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Do two groups of runs rank the heads alike?

    ``spearman``: Spearman rho between the groups' mean score vectors
    (``stats.spearman_groups``), with a permutation p-value and 95 % band
    (each mean vector's heads shuffled within layers); ``mean_pairwise``:
    mean rho over every (run of a, run of b) pair (``stats.spearman_between``,
    lower: it also counts single-run noise); ``jaccard`` / ``overlap`` / ``k``:
    agreement of the two mean vectors' top ``k_frac`` heads (``stats.topk_overlap``).
    """
    if score not in SCORES:
        raise QueryError(f"unknown score '{score}'{_nearest(score, SCORES)} (one of {', '.join(SCORES)})")
    if not (isinstance(k_frac, int | float) and 0.0 < k_frac <= 1.0):
        raise QueryError(f"k must be a fraction in (0, 1], got {k_frac}")
    if n_perm < 0:
        raise QueryError(f"n_perm must be >= 0, got {n_perm}")
    base = select(data, filters)
    stacks = []
    for name, group in (("a", a), ("b", b)):
        sel, x = _gate_runs(select(base, group), score)
        if len(sel) == 0:
            raise QueryError(f"group {name} ({_describe(group)}) has no finished run with {score}")
        stacks.append(x)
    xa, xb = stacks
    if xa.shape[1:] != xb.shape[1:]:
        raise QueryError(f"groups a and b have different gate shapes: {xa.shape[1:]} vs {xb.shape[1:]}")
    means = np.stack([xa.mean(axis=0), xb.mean(axis=0)])  # (2, L, H)
    rho = _tested(lambda m: stats.spearman_groups(m[:1], m[1:]), means, n_perm, np.random.default_rng(seed))
    pairwise = stats.spearman_between(xa, xb)  # (Na, Nb)
    top = stats.topk_overlap(means[0], means[1], float(k_frac))
    return {"score": score, "n_a": len(xa), "n_b": len(xb), **_null_fields(rho),
            "mean_pairwise": py(_nanmean(pairwise.ravel())), "k_frac": float(k_frac), **top}


def _describe(filters: Filters | None) -> str:
    return ",".join(f"{k}:{'|'.join(map(str, v))}" for k, v in (filters or {}).items()) or "all runs"


def _null_fields(result: stats.NullResult | float, name: str = "spearman") -> dict[str, Any]:
    if isinstance(result, stats.NullResult):
        return {name: py(result.observed), "p_value": py(result.p_value),
                "band_lo": py(result.band_lo), "band_hi": py(result.band_hi)}
    return {name: py(result), "p_value": None, "band_lo": None, "band_hi": None}


def null_summary(result: stats.NullResult | float) -> dict[str, Any]:
    """``{observed, p_value, band_lo, band_hi}`` (None for what was not computed)."""
    return _null_fields(result, "observed")


# --------------------------------------------------------------------------- figures


def default_metric(data: SweepData) -> str:
    """``accuracy`` when there is one, else the first metric that is not a loss or a head count."""
    names = sorted(data.metrics)
    if "accuracy" in names:
        return "accuracy"
    useful = [n for n in names if n not in _NOT_CURVE_METRICS]
    if not (useful or names):
        raise QueryError("no run of this selection has metrics yet")
    return (useful or names)[0]


def _title(data: SweepData, filters: Filters | None) -> str:
    return f"{data.sweep_id}: {_describe(filters)}"


def _rgb(data: SweepData, filters: Filters | None) -> bytes:
    sel, x = _gate_runs(select(data, filters))
    for idx in _groups_in_cell_order(sel):
        if len(idx) >= 3:
            idx = idx[np.argsort(sel.seed[idx], kind="stable")][:3]
            seeds = ", ".join(str(s) for s in sel.seed[idx])
            title = (f"{sel.task[idx[0]]} / {sel.pipeline[idx[0]] or sel.method[idx[0]]} / "
                     f"{sel.model[idx[0]]}: seeds {seeds}")
            return figures.rgb_seed_map(x[idx[0]], x[idx[1]], x[idx[2]], title)
    raise QueryError(f"the rgb map needs a cell with 3 finished seeds; none in {_describe(filters)}")


def _groups_in_cell_order(sel: SweepData) -> list[np.ndarray]:
    groups = _groups(sel, ["group_key"])
    return sorted(groups, key=lambda idx: idx[0])


def _grey(data: SweepData, filters: Filters | None) -> bytes:
    sel, x = _gate_runs(select(data, filters))
    if len(sel) == 0:
        raise QueryError(f"no finished run with gates in {_describe(filters)}")
    return figures.grey_map(x, f"mean gate\n{_title(sel, filters)}")


def agreement_png(result: Agreement, filters: Filters | None = None) -> bytes:
    """``result`` as an annotated heat map; the title gives the stem cell statistic and its null."""
    stem = null_summary(result.stem_cell)
    text = f"gate r across {result.across}\n{_describe(filters)}"
    if stem["observed"] is not None:  # short lines: the heat map of 2 labels is ~4 inches wide
        text += f"\nstem cell r = {stem['observed']:.2f}"
        if stem["p_value"] is not None:
            text += f", p = {stem['p_value']:.2g}\nnull 95%: [{stem['band_lo']:.2f}, {stem['band_hi']:.2f}]"
    return figures.agreement_heatmap(result.matrix, result.labels, text)


def _open_heads(data: SweepData) -> np.ndarray:
    if "open_heads" in data.metrics:
        return data.metrics["open_heads"]
    flat = np.asarray(data.gates, dtype=np.float64).reshape(len(data), -1)
    with np.errstate(invalid="ignore"):
        return np.where(data.has_gates, (flat > 0.5).sum(axis=1), np.nan)


def curve_points(data: SweepData, metric: str, x: str, filters: Filters | None = None
                 ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{pipeline: (x, mean, std)}`` of ``metric``, over runs that have it.

    ``x = sparsity | lambda``: runs pooled per x value; ``x = open_heads``: one
    point per cell at its seeds' mean number of open heads.
    """
    if x not in CURVE_X:
        raise QueryError(f"unknown x '{x}'{_nearest(x, CURVE_X)} (one of {', '.join(CURVE_X)})")
    sel = select(data, filters)
    y = check_metric(sel, metric)
    xs = _open_heads(sel) if x == "open_heads" else sel.axis(x)
    ok = ~np.isnan(y) & ~np.isnan(xs)
    if not ok.any():
        raise QueryError(f"no finished run has both {metric} and {x} in {_describe(filters)}")
    sel, y, xs = sel.subset(ok), y[ok], xs[ok]
    curves = {}
    for pipeline in axis_values(sel, "pipeline"):
        in_p = sel.pipeline == pipeline
        part = sel.subset(in_p)
        points = []
        for idx in _groups(part, ["group_key" if x == "open_heads" else x]):
            vals = y[in_p][idx]
            std = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
            points.append((float(xs[in_p][idx].mean()), float(vals.mean()), std))
        points.sort()
        curves[pipeline or "(none)"] = tuple(np.array(col) for col in zip(*points, strict=True))
    return curves


def _curves(data: SweepData, filters: Filters | None, metric: str | None, x: str | None) -> bytes:
    sel = select(data, filters)
    metric = metric or default_metric(sel)
    x = x or _default_x(sel)
    curves = curve_points(data, metric, x, filters)
    xlabel = {"open_heads": "open heads", "lambda": "lambda (L0 penalty)"}.get(x, x)
    return figures.metric_curves(curves, xlabel, metric, f"{metric} vs {xlabel}\n{_title(sel, filters)}")


def _default_x(sel: SweepData) -> str:
    for axis in ("sparsity", "lambda"):
        if np.unique(sel.axis(axis)[~np.isnan(sel.axis(axis))]).size >= 2:
            return axis
    return "open_heads"


def figure(data: SweepData, kind: str, filters: Filters | None = None, across: str = "seed",
           metric: str | None = None, x: str | None = None, n_perm: int = 200,
           max_fits: int | None = None) -> bytes:
    """One figure of the selection as PNG bytes.

    ``rgb``: He & Choi's map of the first cell with 3 finished seeds (its 3
    lowest seeds); ``grey``: mean gate over every selected run;
    ``agreement``: ``agreement(across)`` as an annotated heat map (title: the
    stem cell statistic and its null band); ``curves``: ``metric`` vs ``x``
    (default: sparsity, else lambda, else open heads), mean line and std
    band per pipeline. ``max_fits``: see ``agreement``.
    """
    if kind == "rgb":
        return _rgb(data, filters)
    if kind == "grey":
        return _grey(data, filters)
    if kind == "agreement":
        return agreement_png(agreement(data, across, filters, n_perm=n_perm, max_fits=max_fits), filters)
    if kind == "curves":
        return _curves(data, filters, metric, x)
    raise QueryError(f"unknown figure '{kind}'{_nearest(kind, FIGURE_KINDS)} (one of {', '.join(FIGURE_KINDS)})")


def figure_plan(data: SweepData, max_rgb: int = 24) -> list[tuple[str, str, dict[str, Any]]]:
    """Every figure worth drawing for a sweep: ``[(file name, kind, figure() kwargs)]``.

    An rgb map per cell with 3 finished seeds (the first ``max_rgb`` cells), a
    grey map of all runs and of each task, an agreement heat map across each
    axis that has 2 values (seed: a cell with 2 seeds), and per task the
    curves of each metric (not losses or head counts) vs each x that varies.
    """
    sel = data.subset(data.has_gates)
    plan: list[tuple[str, str, dict[str, Any]]] = []
    cells = [idx for idx in _groups_in_cell_order(sel) if len(idx) >= 3][:max_rgb]
    for idx in cells:
        i = idx[0]
        name = f"rgb_{sel.task[i]}_{sel.pipeline[i] or sel.method[i]}_{sel.group_key[i][:8]}"
        plan.append((name, "rgb", {"filters": {"group_key": [str(sel.group_key[i])]}}))
    if len(sel):
        plan.append(("grey_all", "grey", {}))
        tasks = axis_values(sel, "task")
        if len(tasks) > 1:
            plan += [(f"grey_task-{t}", "grey", {"filters": {"task": [t]}}) for t in tasks]
        if any(len(idx) >= 2 for idx in _groups(sel, ["group_key"])):
            plan.append(("agreement_seed", "agreement", {"across": "seed"}))
        for across in ("task", "pipeline", "model"):
            if len(axis_values(sel, across)) >= 2:
                plan.append((f"agreement_{across}", "agreement", {"across": across}))
    done = data.subset(~np.isnan(_open_heads(data)) | (data.status == "finished"))
    for task in axis_values(done, "task") if len(done) else []:
        part = select(done, {"task": [task]})
        xs = [a for a in ("sparsity", "lambda") if np.unique(part.axis(a)[~np.isnan(part.axis(a))]).size >= 2]
        xs.append("open_heads")
        for metric in sorted(m for m in part.metrics if m not in _NOT_CURVE_METRICS):
            if np.isnan(part.metrics[metric]).all():
                continue
            for x in xs:
                plan.append((f"curves_{task}_{metric}_vs_{x}", "curves",
                             {"filters": {"task": [task]}, "metric": metric, "x": x}))
    return [(_safe_name(name) + ".png", kind, params) for name, kind, params in plan]


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
