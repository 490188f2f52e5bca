"""Naming and selecting runs: axes, config keys, filters, groups and unit maps of a SweepData.

Everything the questions (``analysis.questions``) and the views (``analysis.views``)
share. Filters are the conditions of a ``--where`` expression (``where.parse_where``:
``metrics.accuracy > 0.8 and seed:0|1``) or ``{axis: [values]}`` (a run matches when it has one
of the values on every axis named); an axis is a label (``AXES``: task, model, pipeline, seed,
...) or any dotted key of the stored configs (``head_gates.lr``), ``params.<key>`` its MLflow
name, ``metrics.<name>`` a metric; values may be strings as they come from a command line or a URL. A bad axis, metric, map or value raises :class:`QueryError`,
naming it and the nearest valid one.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from analysis.data.errors import QueryError, did_you_mean, list_choices
from analysis.data.sweep import AXES, SweepData
from analysis.data.where import Condition, Where, from_mapping, parse_where  # noqa: F401 (Where: the type callers name)
from analysis.data.where import describe as describe_where
from base import outputs
from base.sections import resolve_key

DEFAULT_MAP = outputs.DEFAULT_MAP.name
"""The map agreement compares when none is named (the methods' declarations, ``base.outputs``).
A binarised map's continuous companion (``outputs.companion``) is used where the binarised map is constant in
a run (every gate closed: Pearson is undefined there, the continuous scores still rank the units); a map
derived from another of the same run (``outputs.DERIVED``: head_importance's ``heads.pruned_at`` is the order
its ``heads.importance`` ranks the heads in) gives rho near 1 by construction against it, so default
comparisons (``plan_maps``) leave it out."""

Filters = Mapping[str, Sequence[Any]] | Where
"""Which runs: parsed ``--where`` conditions, or ``{axis: [values]}``."""
METRIC_PREFIX, PARAM_PREFIX = "metrics.", "params."
"""MLflow's names of a run's metrics and config keys (``metrics.accuracy``, ``params.train.lr``)."""


def config_columns(data: SweepData) -> Mapping[str, np.ndarray]:
    """Every dotted config key of the runs as an ``(N,)`` column, from the stored configs."""
    return data.config


def varying_config(data: SweepData) -> dict[str, np.ndarray]:
    """The config columns with more than one value in ``data``."""
    return {key: col for key, col in config_columns(data).items() if len(set(as_codes(col).tolist())) > 1}


def config_keys_of(data: SweepData, axis: str) -> set[str]:
    """The config keys an axis name stands for: itself, or what it resolves to in each method's
    runs (:func:`own_keys`: ``lambda`` -> ``head_gates.lambda``, ``task`` -> ``task.name``)."""
    if axis in config_columns(data):
        return {axis}
    return set(own_keys(data, axis).values())


def own_keys(data: SweepData, name: str) -> dict[str, str]:
    """{method: the stored config key ``name`` stands for in its runs}, by the one short-name
    resolver (``base.sections.resolve_key``) with the keys each method's stored section
    has: ``lambda`` -> ``head_gates.lambda``, ``loss`` -> ``finetune.loss`` and ``mask_train.loss``."""
    config = config_columns(data)
    found = {}
    for method in (str(m) for m in np.unique(data.method)):
        names = {key[len(method) + 1:] for key in config if key.startswith(method + ".")}
        key = resolve_key(name, method, names)
        if key in config:
            found[method] = key
    return found


def check_axis(name: str, data: SweepData | None = None) -> str:
    """``name`` if it is a label axis (``AXES``) or, given ``data``, a config key of its runs or a
    key of their methods' own sections (``loss`` for ``finetune.loss`` and ``mask_train.loss``)."""
    known = list(AXES) + ([*sorted(set(data.labels) - set(AXES)), *sorted(config_columns(data))]
                          if data is not None else [])
    if name not in known and (data is None or _section_column(data, name) is None):
        raise QueryError(f"unknown axis '{name}'{did_you_mean(name, known)} (axes: {list_choices(known, 12)})")
    return name


def column(data: SweepData, name: str) -> np.ndarray:
    """The ``(N,)`` column of a label axis, of a config key, or of a key of the runs' own method
    sections (each run's value from its own method's section; unset where its method lacks it)."""
    if name in AXES or name in data.labels:
        return data.axis(name)
    config = config_columns(data)
    if name in config:
        return config[name]
    found = _section_column(data, name)
    return found if found is not None else config[check_axis(name, data)]


def _section_column(data: SweepData, name: str) -> np.ndarray | None:
    """What ``name`` stands for in each run's own method (:func:`own_keys`), or None when it
    stands for no stored key."""
    config = config_columns(data)
    keys = own_keys(data, name)
    if not keys:
        return None
    numeric = all(not _is_text(config[k]) for k in keys.values())
    out = np.full(len(data), np.nan) if numeric else np.full(len(data), None, dtype=object)
    for method, key in keys.items():
        rows = data.method == method
        out[rows] = config[key][rows]
    return out


def _is_text(col: np.ndarray) -> bool:
    return not np.issubdtype(col.dtype, np.number)


def check_metric(data: SweepData, name: str) -> np.ndarray:
    """The ``(N,)`` metric column, or QueryError naming the nearest metric of this sweep."""
    if name not in data.metrics:
        known = sorted(data.metrics)
        if not known:
            raise QueryError(f"unknown metric '{name}': no run of this selection has metrics yet")
        raise QueryError(f"unknown metric '{name}'{did_you_mean(name, known)} (metrics: {list_choices(known)})")
    return data.metrics[name]


def value_label(value: Any) -> str:
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
    col = column(data, check_axis(axis, data))
    if _is_text(col):
        return sorted(set(col.tolist()), key=value_label)
    values = np.unique(col)  # NaNs collapse to one, sorted last
    return [py(v) for v in values]


def parse_filter(text: str | None) -> Where:
    """``--where`` text -> its conditions (``where.parse_where``, the one parser of every surface)."""
    return parse_where(text)


def as_where(filters: Filters | str | None) -> Where:
    """Any form of filters (text, ``{axis: [values]}``, conditions) as conditions."""
    if isinstance(filters, str):
        return parse_where(filters)
    if isinstance(filters, Mapping):
        return from_mapping(dict(filters))
    return tuple(filters or ())


def _match(data: SweepData, axis: str, raw: Any) -> np.ndarray:
    """``(N,)`` bool: runs whose ``axis`` equals ``raw`` (a value or its text)."""
    col = column(data, axis)
    text = str(raw).strip()
    if _is_text(col):
        mask = as_codes(col) == text
        if not mask.any():
            known = axis_values(data, axis)
            raise QueryError(f"no run with {axis} '{text}'{did_you_mean(text, known)} ({axis}: {list_choices(known)})")
        return mask
    try:
        value = math.nan if text.lower() in ("none", "null", "nan", "") else float(text)
    except ValueError:
        raise QueryError(f"{axis}: expected a number, got '{text}'") from None
    if axis == "seed" and math.isfinite(value) and value != int(value):
        raise QueryError(f"seed: expected an integer, got '{text}'")
    mask = np.isnan(col) if math.isnan(value) else np.isclose(col, value, rtol=1e-9, atol=0.0)
    if not mask.any():
        known = [v for v in axis_values(data, axis) if v is not None]
        finite = np.isfinite(value) and known
        hint = f"; did you mean {known[int(np.argmin([abs(k - value) for k in known]))]}?" if finite else ""
        raise QueryError(f"no run with {axis} {text}{hint} ({axis}: "
                         f"{list_choices([value_label(v) for v in axis_values(data, axis)])})")
    return mask


def select(data: SweepData, filters: Filters | str | None = None) -> SweepData:
    """The runs that meet every condition of ``filters`` (all runs when none)."""
    where = as_where(filters)
    if not where:
        return data
    keep = np.ones(len(data), dtype=bool)
    for condition in where:
        keep &= _meets(data, condition)
    return data.subset(keep)


_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _meets(data: SweepData, condition: Condition) -> np.ndarray:
    """``(N,)`` bool: the runs that meet ``condition``. ``=`` and ``!=`` name values some run has
    (a typo is an error naming the nearest), metrics aside; ``<``... compare numbers. As in MLflow,
    a run without the value (unset, no such metric yet) meets no comparison but ``= none``."""
    key, op = condition.key, condition.op
    if key.startswith(METRIC_PREFIX):
        col = check_metric(data, key[len(METRIC_PREFIX):])
        numbers = [_number(key, op, v) for v in condition.values]
        if op in ("=", "!="):
            equal = np.logical_or.reduce([np.isclose(col, v, rtol=1e-9, atol=0.0) for v in numbers])
            return equal if op == "=" else ~equal & ~np.isnan(col)
        return _COMPARE[op](np.nan_to_num(col, nan=-np.inf if op in (">", ">=") else np.inf), numbers[0])
    axis = check_axis(key[len(PARAM_PREFIX):] if key.startswith(PARAM_PREFIX) else key, data)
    col = column(data, axis)
    if op in ("=", "!="):
        equal = np.logical_or.reduce([_match(data, axis, v) for v in condition.values])
        present = np.isin(as_codes(col), ("", "none"), invert=True)
        return equal if op == "=" else ~equal & present
    if _is_text(col):
        raise QueryError(f"{key} is text ({list_choices(axis_values(data, axis))}): compare it with = or !=, "
                         f"not '{op}'")
    value = _number(key, op, condition.values[0])
    return _COMPARE[op](np.nan_to_num(col.astype(np.float64), nan=-np.inf if op in (">", ">=") else np.inf), value)


def _number(key: str, op: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise QueryError(f"{key} {op} {text}: {key} is a number, '{text}' is not") from None


def group_indices(data: SweepData, by: Sequence[str]) -> list[np.ndarray]:
    """Index arrays of the runs sharing every ``by`` value, groups in sorted value order."""
    if len(data) == 0:
        return []
    codes = np.stack([np.unique(as_codes(column(data, axis)), return_inverse=True)[1].ravel() for axis in by], axis=1)
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(inverse[order])) + 1)


def groups_in_cell_order(sel: SweepData) -> list[np.ndarray]:
    groups = group_indices(sel, ["group_key"])
    return sorted(groups, key=lambda idx: idx[0])


def as_codes(column: np.ndarray) -> np.ndarray:
    """A column of mixed values (str, numbers, None, NaN) as comparable strings."""
    return np.array([value_label(v) for v in column.tolist()], dtype=str)


def describe(filters: Filters | None) -> str:
    """The filters as one line, as ``--where`` writes them (``all runs`` when none)."""
    return describe_where(as_where(filters))


def map_stack(data: SweepData, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(``(N, L, K)`` values of map ``name``, ``(N,)`` bool: the run has it)."""
    return data.map(name)


def default_map(data: SweepData) -> str:
    """The unit map a question uses when none is named: the one most runs of the sweep have stored
    (ties by name: ``heads.gate`` before its ``heads.log_alpha``)."""
    if not data.map_info:
        raise QueryError("no run of this sweep has stored a map yet")
    return min(data.map_info.values(), key=lambda info: (-info.count, info.name)).name


def map_runs(data: SweepData, name: str = DEFAULT_MAP, switch: bool = True
             ) -> tuple[SweepData, np.ndarray, list[str], str]:
    """The runs that have map ``name``, their ``(n, L, K)`` float64 stack, notes, and the map used.

    Runs without the map (not finished, or a method that learns none, such as
    ``finetune`` for gates) are left out. When the map is constant in some run
    (a binarised gate map with every gate closed: Pearson is undefined) and
    ``switch``, the continuous companion map (``outputs.companion``) is used for every
    run instead, and a note says so; without a companion those runs are left out,
    with a note.
    """
    values, has = map_stack(data, name)
    sel = data.subset(has)
    x = np.asarray(values[has], dtype=np.float64)
    if np.isnan(x).any():
        raise QueryError(f"runs of different sizes in the selection (models: "
                         f"{', '.join(axis_values(sel, 'model'))}); filter by model")
    notes: list[str] = []
    if len(x) == 0:
        return sel, x, notes, name
    flat = x.reshape(len(x), -1)
    constant = flat.max(axis=1) == flat.min(axis=1)
    if switch and constant.any():
        what = f"{int(constant.sum())} of {len(x)} runs have a constant {name} (every unit at {flat[constant][0, 0]:g})"
        companion = outputs.companion(name)
        if companion is not None:
            c_values, c_has = map_stack(sel, companion)
            if c_has.all():
                notes.append(f"{what}: its correlation is undefined, so these statistics use the "
                             f"continuous {companion} of every run instead")
                return sel, np.asarray(c_values, dtype=np.float64), notes, companion
        notes.append(f"{what}: its correlation is undefined; those runs are left out")
        sel, x = sel.subset(~constant), x[~constant]
    return sel, x, notes, name


def is_not_score(metric: str) -> bool:
    """A metric (on any evaluation set: ``loss/ood``) that is no figure's y: a loss, the L0 penalty, a head
    count (the x already), the realised sparsity, the collapse check's measures and flag."""
    return metric.partition("/")[0] in outputs.NOT_SCORES


def default_metric(data: SweepData) -> str:
    """``accuracy`` when there is one, else the first metric a figure plots as a result (not a loss, a
    head count or a flag: ``outputs.NOT_SCORES``)."""
    names = sorted(data.metrics)
    if outputs.ACCURACY.name in names:
        return outputs.ACCURACY.name
    useful = [n for n in names if not is_not_score(n)]
    if not (useful or names):
        raise QueryError("no run of this selection has metrics yet")
    return (useful or names)[0]
