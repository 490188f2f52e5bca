"""The answers of the agreement engine as plain JSON values and flat rows: what the CLI's --format
json / csv, the HTTP service and the Python API share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis import statistics
from analysis.data.select import py
from analysis.questions.agreement.result import AgreementMatrix, PairResult, Tested
from analysis.statistics.nulls import NULLS


def null_summaries(tested: Tested) -> list[dict[str, Any]]:
    """One dict per null: what it asks, chance (null mean), excess, 95 % band, p and its text."""
    return [{"null": name, "question": NULLS[name], "observed": py(r.observed),
             "null_mean": py(r.null_mean), "excess": py(r.excess), "band_lo": py(r.band_lo),
             "band_hi": py(r.band_hi), "p_value": py(r.p_value), "p_text": r.p_text, "n_perm": r.n_perm}
            for name, r in tested.nulls.items()]


def tested_rows(tested: Mapping[str, Tested]) -> list[dict[str, Any]]:
    """Tested statistics by name (``AgreementMatrix.statistics``) as flat rows,
    one per statistic and null (one with empty null fields when it was not tested): its name,
    label, observed value, what was pooled, then ``null_summaries``' fields."""
    blank = dict.fromkeys(("null", "null_mean", "band_lo", "band_hi", "excess", "p_value", "p_text", "n_perm"))
    rows = []
    for name, t in tested.items():
        stat = statistics.STATISTICS[name]
        head = {"statistic": name, "label": stat.label, "observed": py(t.observed), "pooled": t.pooled}
        nulls = [{key: null[key] for key in blank} for null in null_summaries(t)] or [blank]
        rows += [head | null for null in nulls]
    return rows


def tested_json(tested: Tested) -> dict[str, Any]:
    """A ``Tested`` as plain JSON values: observed, what was pooled, each null (``null_summaries``)."""
    return {"observed": py(tested.observed), "pooled": tested.pooled, "nulls": null_summaries(tested)}


def agreement_json(result: AgreementMatrix) -> dict[str, Any]:
    """An ``AgreementMatrix`` as plain JSON values (the CLI's --format json and the service share it): the
    matrix's statistic as ``mean_offdiag``, every other one under its name."""
    tested = {("mean_offdiag" if name == result.matrix_statistic else name): tested_json(t) for name, t in result.statistics.items()}
    return {"across": result.across, "map": result.map_name, "labels": result.labels,
            "matrix": [[py(v) for v in row] for row in result.matrix], "n_runs": result.n_runs, **tested,
            "n_cells": result.n_cells, "matched_on": result.matched_on, "pooled_axes": result.pooled_axes,
            "notes": result.notes}


def compare_json(result: AgreementMatrix) -> dict[str, Any]:
    """compare-maps' ``AgreementMatrix`` as plain JSON values (the CLI's --format json and the service share it): per
    pair the matrix's rho (with ``pooled`` and ``nulls``), every other pairwise statistic tested
    under its name and every top-k one's value; overall ``mean_offdiag`` (rho's), the other pairwise
    statistics' means under their names and each top-k one's ``chance_<name>``."""
    others = [name for name in result.statistics if name != result.matrix_statistic]

    def pair_json(p: PairResult) -> dict[str, Any]:
        return {"a": p.a, "b": p.b, "n_pairs": p.n_pairs, "n_same_run": p.n_same_run, "rho": py(p.rho.observed),
                "pooled": p.rho.pooled, "nulls": null_summaries(p.rho),
                **{name: py(value) for name, value in p.top_k.items()},
                **{name: tested_json(p.statistics[name]) for name in others}}

    return {
        "sweep": result.sweep_id, "maps": result.maps, "across": result.across, "kind": result.kind,
        "shape": list(result.shape), "labels": result.labels,
        "matrix": [[py(v) for v in row] for row in result.matrix], "n_runs": result.n_runs,
        "pairs": [pair_json(p) for p in result.pairs], "mean_offdiag": tested_json(result.mean_offdiag),
        **{name: tested_json(result.statistics[name]) for name in others},
        "top": result.top, "k": result.k, **{f"chance_{name}": value for name, value in result.chance.items()},
        "models": result.models, "tasks": result.tasks,
        "matched_on": result.matched_on, "pooled_axes": result.pooled_axes, "notes": result.notes,
    }


def compare_rows(result: AgreementMatrix) -> list[dict[str, Any]]:
    """One flat row per pair of labels (the CLI's --format csv): each pairwise statistic and its
    nulls (rho's unprefixed), then top-k and each top-k statistic beside its chance."""
    rows = []
    for p in result.pairs:
        row = {"a": p.a, "b": p.b, "n_pairs": p.n_pairs}
        for name, tested in p.statistics.items():
            prefix = "" if name == result.matrix_statistic else f"{name}_"
            row[name] = py(tested.observed)
            for null in null_summaries(tested):
                row.update({f"{prefix}{key}_{null['null']}": null[key]
                            for key in ("null_mean", "band_lo", "band_hi", "excess", "p_value")})
        row["top_k"] = result.k
        for name, value in p.top_k.items():
            row.update({name: py(value), f"chance_{name}": result.chance[name]})
        rows.append(row)
    return rows


def spearman_json(answer: dict[str, Any]) -> dict[str, Any]:
    """``compare.spearman``'s answer as plain JSON values: its rho (``spearman``) observed, with ``nulls``."""
    rho = answer["spearman"]
    return answer | {"spearman": py(rho.observed), "nulls": null_summaries(rho), "mean_pairwise": py(answer["mean_pairwise"])}
