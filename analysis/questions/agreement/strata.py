"""Which runs may be compared across an axis: ``check_across`` and ``strata`` (runs equal on every
other axis), shared by ``agreement``, ``compare_maps`` and ``mask_iou``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.data.select import (
    QueryError,
    as_codes,
    column,
    config_columns,
    config_keys_of,
    did_you_mean,
    list_choices,
    varying_config,
)
from analysis.data.sweep import AXES, SweepData

ACROSS = ("seed", "task", "pipeline", "model", "run")


def check_across(across: str, data: SweepData) -> str:
    choices = [*ACROSS, *(a for a in AXES if a not in ACROSS and a not in ("status", "run_key", "group_key")),
               *sorted(config_columns(data))]
    if across not in choices:
        raise QueryError(f"unknown across '{across}'{did_you_mean(across, choices)} (one of {list_choices(choices)})")
    return across


def strata(data: SweepData, across: str, pool: Sequence[str] = ()) -> tuple[list[np.ndarray], dict[str, list[str]]]:
    """Groups of runs that may be compared across ``across``: equal on every other axis.

    The axes are the dotted config keys that vary in ``data`` (from the stored
    configs, so any hyper-parameter counts, not a fixed list), less ``seed``,
    less the keys tied to ``across`` (constant within each of its values, so they
    cannot be matched: e.g. ``task.name`` for tasks, or a method's own keys for
    methods), less the axes in ``pool`` (averaged over on request) and the keys they
    decide (pooling ``pipeline`` pools ``init_from.method`` too, which only SP runs set).

    Returns:
        (the strata as index arrays, ``{"matched": [...], "tied": [...], "pooled": [...]}``).
    """
    across_col = column(data, across)
    varying = {key: col for key, col in varying_config(data).items() if key != "seed"}
    varying = {key: col for key, col in varying.items() if key not in config_keys_of(data, across)}
    unknown = [a for a in pool if not config_keys_of(data, a) & set(varying)]
    if unknown:
        raise QueryError(f"pool: '{unknown[0]}' is not an axis that varies here"
                         f"{did_you_mean(unknown[0], list(varying))} (varying: {list_choices(sorted(varying))})")
    pool_keys = set().union(*(config_keys_of(data, a) for a in pool)) if pool else set()
    pool_keys = {k for k in pool_keys if k in varying}
    if pool_keys:  # a key that the pooled axes decide (init_from.method for pipeline) is pooled with them
        pooled_codes = joint_codes([varying[k] for k in sorted(pool_keys)])
        pool_keys |= {k for k, col in varying.items() if _decided_by(as_codes(col), pooled_codes)}
    _, across_codes = np.unique(as_codes(across_col), return_inverse=True)
    tied, matched = [], []
    for key, col in sorted(varying.items()):
        if key in pool_keys:
            continue
        if _decided_by(as_codes(col), across_codes):
            tied.append(key)
        else:
            matched.append(key)
    if matched:
        inverse = joint_codes([varying[k] for k in matched])
        order = np.argsort(inverse, kind="stable")
        blocks = np.split(order, np.flatnonzero(np.diff(inverse[order])) + 1)
    else:
        blocks = [np.arange(len(data))]
    return blocks, {"matched": matched, "tied": tied, "pooled": sorted(pool_keys & set(varying))}


def joint_codes(columns: list[np.ndarray]) -> np.ndarray:
    """``(N,)`` int: one code per distinct combination of the columns' values."""
    keys = np.stack([np.unique(as_codes(col), return_inverse=True)[1].ravel() for col in columns], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel()


def _decided_by(codes: np.ndarray, by: np.ndarray) -> bool:
    """Each value of ``by`` goes with one value of ``codes``."""
    return all(len(np.unique(codes[by == b])) == 1 for b in np.unique(by))


@dataclass(frozen=True)
class SettingMeans:
    """The seed-mean map of each value of ``across`` in each setting of the other axes (``strata``)
    that has two values or more: what agreement and compare-maps compare across an axis."""

    means: np.ndarray
    """``(M, L, K)``: one mean map per (setting, value)."""
    label: np.ndarray
    """``(M,)`` int: each mean's value (an index into the labels)."""
    groups: list[np.ndarray]
    """The rows of ``means`` of each setting kept (they are compared with each other)."""
    n_runs: list[int]
    """Runs behind each label."""
    matched: list[str]
    pooled: list[str]


def setting_means(sel: SweepData, x: np.ndarray, across: str, label_codes: list[str], pool: Sequence[str],
                  notes: list[str]) -> SettingMeans:
    """``SettingMeans`` of the runs ``sel`` with maps ``x`` ``(N, L, K)``; ``label_codes``: the values of
    ``across`` as text (``value_label``), in label order. A setting with one value only is left
    out (a note says how many); QueryError when none is left."""
    blocks, axes = strata(sel, across, pool)
    codes = as_codes(column(sel, across))
    means, label, groups = [], [], []
    for block in blocks:
        present = [i for i, c in enumerate(label_codes) if (codes[block] == c).any()]
        if len(present) < 2:
            continue
        groups.append(np.arange(len(means), len(means) + len(present)))
        for i in present:
            means.append(x[block[codes[block] == label_codes[i]]].mean(axis=0))
            label.append(i)
    matched = axes["matched"]
    if not groups:
        raise QueryError(f"no two values of {across} share a setting of the other axes "
                         f"({', '.join(matched)}); pool some with pool=...")
    if len(groups) < len(blocks):
        notes.append(f"{len(blocks) - len(groups)} of {len(blocks)} settings of {', '.join(matched)} have only one "
                     f"value of {across} and were left out")
    return SettingMeans(np.stack(means), np.array(label), groups, [int((codes == c).sum()) for c in label_codes],
                        matched, axes["pooled"])
