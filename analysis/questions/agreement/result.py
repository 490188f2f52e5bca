"""The one answer of the agreement engine: :class:`AgreementMatrix` (a matrix over labels and its tested
statistics) with :class:`PairResult` (compare-maps' pairs of labels) and :class:`Tested` (a statistic
against its permutation nulls).

``agreement`` (runs across seeds, tasks, ...: Pearson r) and ``compare_maps`` (maps, or one map
across an axis: Spearman rho) answer with the same type; ``matrix_statistic`` names the matrix's
statistic (``r`` or ``rho``) and the fields a question does not fill keep their defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.statistics import nulls

R, RHO = "r", "rho"
"""The matrix's statistic (``statistics.STATISTICS``): agreement's Pearson r, compare-maps' Spearman rho."""


@dataclass(frozen=True)
class Tested:
    """A statistic with its permutation nulls (``nulls.NULLS``; empty when n_perm = 0)."""

    observed: float
    nulls: Mapping[str, nulls.NullResult]
    pooled: str
    """What was pooled into the number, in words (e.g. "mean over 8 cells of 3 seeds")."""


@dataclass(frozen=True)
class PairResult:
    """One pair of labels of compare-maps (maps, or values of the ``across`` axis)."""

    a: str
    b: str
    n_pairs: int
    """Pairs of runs compared (several maps), or settings of the other axes (``across``)."""
    n_same_run: int
    """Of those, pairs that are one run with both maps."""
    statistics: dict[str, Tested]
    """Each pairwise statistic of ``statistics.asked("compare_maps")`` by name (``rho``: Spearman,
    the matrix's): its mean over the pairs, against the nulls (empty when n_perm = 0)."""
    top_k: dict[str, float]
    """Each top-k statistic by name (``overlap``: |top-k of a & top-k of b| / k, ``jaccard``): its
    mean over the pairs (NaN without pairs)."""

    @property
    def rho(self) -> Tested:
        """Mean Spearman rho over the pairs, against the nulls."""
        return self.statistics[RHO]

    def __getattr__(self, name: str) -> Any:
        """``pair.overlap``, ``pair.rbo``: the statistic of that name."""
        for table in (self.__dict__.get("statistics", {}), self.__dict__.get("top_k", {})):
            if name in table:
                return table[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or statistic {name!r}")


@dataclass(frozen=True)
class AgreementMatrix:
    """Agreement of unit maps: a matrix over labels, and its statistics tested against permutation nulls.

    ``agreement`` (do runs keep the same units? ``matrix_statistic`` r) fills ``map_name`` and
    ``n_cells``; ``compare_maps`` (do maps rank the units alike? rho) fills ``maps``, ``pairs``,
    the top-k fields and what the runs were (``sweep_id``, ``kind``, ``shape``, ``models``, ``tasks``).
    """

    matrix_statistic: str
    """The statistic of ``matrix`` (``R`` or ``RHO``); ``statistics[matrix_statistic]`` is its
    mean off-diagonal entry, tested (``mean_offdiag``)."""
    across: str | None
    """The axis compared across; None: several maps compared with each other (compare-maps)."""
    labels: list[str]
    matrix: np.ndarray
    """``(K, K)`` between the labels' maps; compare-maps: diagonal 1, NaN where no pair was compared."""
    n_runs: list[int]
    """Runs behind each label."""
    statistics: dict[str, Tested]
    """Every statistic the question asks (``statistics.asked(question)``) by name, tested; also
    ``result.<name>``. agreement: the matrix's (r) is the mean off-diagonal entry of ``matrix``; a
    pairwise one the same mean of its own matrix; a cells one (``stem_cell``: He & Choi's multiple
    correlation, ``stem_cell_paper``: their single fit, the triple's last seed as response) the
    mean over the cells with enough seeds. compare-maps: each pairwise statistic's mean over the
    compared pairs of labels, against the same relabellings. Not computed (not asked for, no cell
    with enough seeds, too many pairs): NaN, and ``pooled`` says why."""
    matched_on: list[str] = field(default_factory=list)
    """Axes (config keys) on which every compared pair of runs agrees: labels are compared
    only within runs equal on all of them."""
    pooled_axes: list[str] = field(default_factory=list)
    """Axes that vary in the selection but were pooled (averaged over) on request."""
    notes: list[str] = field(default_factory=list)
    """One-line remarks a reader must see (a map switched, runs or pairs left out)."""
    maps: list[str] = field(default_factory=list)
    """The maps compared as named (``-heads.ablation_delta`` flipped); agreement: the one map used
    (``map_name``)."""
    n_cells: int = 0
    """agreement: cells (group keys) with at least 3 seeds behind ``stem_cell``."""
    sweep_id: str = ""
    kind: str = ""
    """The unit kind of the maps (``heads``, ``neurons``)."""
    shape: tuple[int, int] = (0, 0)
    pairs: list[PairResult] = field(default_factory=list)
    """compare-maps: each compared pair of labels."""
    top: float = 0.0
    """compare-maps: the fraction of the units in the top-k sets."""
    k: int = 0
    chance: dict[str, float] = field(default_factory=dict)
    """Each top-k statistic's value for two independent random top-k sets (``overlap``: k / P, the
    hypergeometric mean); also ``result.chance_<name>``."""
    models: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    @property
    def map_name(self) -> str:
        """The unit map compared (e.g. ``heads.gate``); may be the continuous companion of the map
        asked for, when that one is constant in some run (see ``notes``)."""
        return self.maps[0]

    @property
    def mean_offdiag(self) -> Tested:
        """The matrix's statistic: the mean off-diagonal entry of ``matrix``, tested."""
        return self.statistics[self.matrix_statistic]

    def __getattr__(self, name: str) -> Any:
        """``result.stem_cell``, ``result.rbo``: the statistic of that name; ``result.chance_overlap``:
        a top-k statistic's chance."""
        tested, chance = self.__dict__.get("statistics", {}), self.__dict__.get("chance", {})
        if name in tested:
            return tested[name]
        if name.startswith("chance_") and name[len("chance_"):] in chance:
            return chance[name[len("chance_"):]]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or statistic {name!r}")
