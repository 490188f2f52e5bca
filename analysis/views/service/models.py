"""The service's response models (pydantic): the JSON of every endpoint, their fields described in the
OpenAPI document. The statistics' fields come from the registry (``analysis.statistics``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, create_model

from analysis import statistics
from analysis.questions.agreement.result import RHO, R


class ErrorOut(BaseModel):
    detail: str


class SweepOut(BaseModel):
    id: str
    name: str
    status: str
    created_at: datetime
    updated_at: datetime
    counts: dict[str, int] = Field(description="Runs per status.")
    total: int
    progress: float = Field(description="Fraction of runs that are finished, failed or cancelled.")
    mlflow_experiment_id: str | None = None
    mlflow_parent_run_id: str | None = None


class SweepDetailOut(SweepOut):
    history: list[str] = Field(description="What happened to its driver and workers, oldest first, as "
                               "`headsweep status` prints it: lost drivers with their orphaned runs, "
                               "resumes, workers that died.")
    grid: str = Field(description="The grid YAML as submitted.")
    axes: dict[str, list[str | float | int | None]] = Field(description="Distinct values of each axis.")
    metrics: list[str]


class RunsPage(BaseModel):
    """A page of the run table (``analysis.questions.run_table``): the same columns as ``headsweep runs``
    and ``headsweep.sweep(...).runs()``."""

    sweep: str
    total: int = Field(description="Runs matching the filters.")
    offset: int
    limit: int
    columns: list[str] = Field(description="Every column, in order: run_key, group_key, the labels, status, "
                               "started_at, finished_at, duration_s, mlflow_run_id, artifact_uri, "
                               "params.<key> (each config key the grid sets or varies), maps, metrics.<name>.")
    runs: list[dict[str, Any]] = Field(description="One object per run with every column (null where none).")


class AggregateRow(BaseModel):
    group: dict[str, str | float | int | None] = Field(description="The group's axis values.")
    mean: float | None
    std: float | None
    n: int = Field(description="Runs with the metric (finished).")
    ci_lo: float | None = Field(description="Lower end of the 95 % CI of the mean.")
    ci_hi: float | None
    ci_method: str = Field(description="t (a t interval, below 10 runs), bootstrap (from 10) or none (n < 2).")
    runs: int = Field(description="Runs in the group, finished or not.")
    expected_open: float | None = Field(None, description="With metric open_heads: the group's mean expected "
                                        "open heads (sum over heads of P(gate > 0) in training).")


class AggregateOut(BaseModel):
    metric: str
    group_by: list[str]
    rows: list[AggregateRow]


class NullOut(BaseModel):
    null: str = Field(description="within_layers: units shuffled within each layer (the same units beyond "
                                  "the per-layer profile?); all_units: shuffled across all units (at all?).")
    question: str = Field(description="What this null asks, in words.")
    observed: float | None
    null_mean: float | None = Field(description="What chance gives: the mean of the null distribution.")
    excess: float | None = Field(description="observed - null_mean.")
    band_lo: float | None = Field(description="2.5th percentile of the null.")
    band_hi: float | None = Field(description="97.5th percentile of the null.")
    p_value: float | None = Field(description="One-sided permutation p; never below 1 / (n_perm + 1).")
    p_text: str = Field(description="'p = 0.03', or 'p < 0.001' when no permutation reached the observed value.")
    n_perm: int


class TestedOut(BaseModel):
    observed: float | None
    pooled: str = Field(description="What was pooled into the number.")
    nulls: list[NullOut] = Field(description="The statistic against each permutation null (empty: n_perm = 0).")


def _described(stat: statistics.Statistic) -> str:
    return f"{stat.label}: {stat.computes}; chance: {stat.null}."


def _tested_fields(question: str, matrix: str) -> dict[str, Any]:
    """A ``TestedOut`` field per statistic of ``question`` (``statistics.asked``) but its matrix's
    (and the top-k ones): the answers' fields come from the registry."""
    return {stat.name: (TestedOut, Field(description=_described(stat))) for stat in statistics.asked(question)
            if stat.name != matrix and stat.shape != "top_k"}


def _top_k_fields(prefix: str = "") -> dict[str, Any]:
    """A float field per top-k statistic of compare-maps (``prefix`` + its name)."""
    return {prefix + stat.name: (float if prefix else float | None,
                                 Field(description=("Chance of " if prefix else "") + _described(stat)))
            for stat in statistics.asked("compare_maps") if stat.shape == "top_k"}


AgreementOut = create_model(
    "AgreementOut",
    across=(str, ...),
    map=(str, Field(description="The unit map compared (the continuous companion when the asked map is "
                                "constant in some run: see notes).")),
    labels=(list[str], ...),
    matrix=(list[list[float | None]], ...),
    n_runs=(list[int], ...),
    mean_offdiag=(TestedOut, Field(description="Mean off-diagonal entry of the matrix: "
                                               f"{_described(statistics.STATISTICS[R])}")),
    **_tested_fields("agreement", R),
    n_cells=(int, Field(description="Cells with 3+ finished seeds behind stem_cell.")),
    matched_on=(list[str], Field(description="Axes every compared pair of runs agrees on.")),
    pooled_axes=(list[str], Field(description="Axes averaged over on request.")),
    notes=(list[str], ...),
)


class SpearmanOut(BaseModel):
    a: str
    b: str
    map: str
    n_a: int
    n_b: int
    spearman: float | None = Field(description="Spearman rho of the two groups' mean maps.")
    nulls: list[NullOut]
    mean_pairwise: float | None = Field(description="Mean rho over every (run of a, run of b) pair.")
    k_frac: float
    k: int
    jaccard: float
    overlap: float
    chance_jaccard: float = Field(description="Expected Jaccard of two independent random top-k sets.")
    chance_overlap: float = Field(description="Expected overlap of two independent random top-k sets (k / P).")
    notes: list[str]


ComparedPairOut = create_model(
    "ComparedPairOut",
    a=(str, ...),
    b=(str, ...),
    n_pairs=(int, Field(description="Pairs of runs compared (one run when it has both maps), or settings of the "
                                    "other axes (across).")),
    n_same_run=(int, ...),
    rho=(float | None, Field(description="Mean Spearman rho over the pairs (signs as named: '-map' is flipped).")),
    pooled=(str, ...),
    nulls=(list[NullOut], Field(description="Units relabelled at random, one relabelling per map (or value) "
                                            "shared by its runs: within layers, and across all units.")),
    **_top_k_fields(),
    **_tested_fields("compare_maps", RHO),
)


CompareMapsOut = create_model(
    "CompareMapsOut",
    sweep=(str, ...),
    maps=(list[str], ...),
    across=(str | None, ...),
    kind=(str, ...),
    shape=(list[int], ...),
    labels=(list[str], ...),
    matrix=(list[list[float | None]], Field(description="Mean Spearman rho between labels (maps or across values).")),
    n_runs=(list[int], ...),
    pairs=(list[ComparedPairOut], ...),
    mean_offdiag=(TestedOut, ...),
    **{name: (TestedOut, Field(description=f"Mean over the pairs of labels of {field.description}"))
       for name, (_, field) in _tested_fields("compare_maps", RHO).items()},
    top=(float, ...),
    k=(int, ...),
    **_top_k_fields("chance_"),
    models=(list[str], ...),
    tasks=(list[str], ...),
    matched_on=(list[str], Field(description="Config keys every compared pair of runs agrees on.")),
    pooled_axes=(list[str], ...),
    notes=(list[str], ...),
)


class TransferOut(BaseModel):
    """``headsweep transfer --format json``: task x task tables and overlap vs transfer (``views.transfer``)."""

    sweep: str
    model: str
    tasks: list[str]
    runs: int
    fraction: float | None
    noise_std: float | None
    meaning: dict[str, str]
    tables: dict[str, list[list[float | None]]]
    seeds: list[list[int]] = Field(description="Finished runs (seeds) averaged in each cell.")
    correlations: list[dict[str, Any]]
    pooled: str
    notes: list[str]


class MaskIouOut(BaseModel):
    across: str
    labels: list[str]
    pairs: int = Field(description="Pairs of runs compared: they differ in `across` only.")
    runs: int = Field(description="Runs whose stored masks were read.")
    iou: float = Field(description="Mean IoU of the kept weights over the pairs, pooled over every matrix.")
    chance: float = Field(description="Mean IoU of random masks with the same density per matrix.")
    excess: float
    matrix: list[list[float | None]] = Field(description="Mean IoU between each two values of `across`.")
    per_matrix: dict[str, float] = Field(description="Mean IoU per matrix (layer.<l>.<role>).")
    per_role: dict[str, list[float]] = Field(description="Mean IoU per matrix role, one value per layer.")
    matched_on: list[str]
    notes: list[str]
    pooled: str
    flips: dict[str, float | int | str] | None = Field(
        None, description="What training changed: IoU of the entries each run flipped from its initial mask "
        "(iou, chance: random flips of the same counts, excess, pairs, flipped: fraction flipped a run, pooled); "
        "null when no pair has stored initial masks. `iou` above counts the shared initialisation too.")


class FigureOut(BaseModel):
    name: str = Field(description="The file `headsweep figures` writes it to.")
    kind: str
    url: str = Field(description="The figure: this service's figures/{kind} with the plan's parameters "
                                 "(and the list's format and dpi).")


class FiguresOut(BaseModel):
    sweep: str
    figures: list[FigureOut] = Field(description="Every figure worth drawing for the sweep (analysis.views.figure_plan), "
                                                 "the ones `headsweep figures` writes.")
