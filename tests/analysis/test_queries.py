"""analysis.loading and analysis.queries on a real SQLite registry with known gates (conftest.py)."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np
import pytest
from sqlalchemy import event

from analysis import figures, queries, stats
from analysis.loading import load_sweep
from analysis.queries import QueryError
from orchestrator.registry import NotFound, Registry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLS, TAG = "synthetic-cls", "synthetic-tag"


def _cell_runs(sweep, task, pipeline, lam):
    return np.stack([sweep.gates[(task, pipeline, lam, seed)] for seed in (0, 1, 2)])  # (3, L, H)


def _decode(png: bytes) -> np.ndarray:
    assert png[:8] == PNG_MAGIC
    return matplotlib.image.imread(io.BytesIO(png), format="png")  # (rows, cols, 4)


# --------------------------------------------------------------------------- loading


def test_load_gives_every_run_in_cell_order(data, sweep):
    assert len(data) == 25 and data.gates.shape == (25, 6, 12)
    assert data.sweep_id == sweep.sweep_id
    assert data.has_gates.sum() == 24 and data.status.tolist().count("pending") == 1
    pending = data.run_key.tolist().index(sweep.pending_key)
    assert not data.has_gates[pending] and np.isnan(data.gates[pending]).all()
    assert np.isnan(data.metrics["accuracy"][pending])
    np.testing.assert_array_equal(data.gates[0], sweep.gates[(CLS, "dp", 0.01, 0)])
    assert sorted(data.metrics) == ["accuracy", "loss", "open_heads"]
    assert data.lambda_.dtype == np.float64 and np.isnan(data.sparsity).all()
    assert not data.gates.flags.writeable  # shared between callers: read only


def _selects(registry, fn):
    """(fn(), the SELECT statements it ran on the registry's engine)."""
    statements = []

    def count(_conn, _cursor, statement, *_):
        statements.append(statement)

    event.listen(registry._engine, "before_cursor_execute", count)
    try:
        value = fn()
    finally:
        event.remove(registry._engine, "before_cursor_execute", count)
    return value, [s for s in statements if s.lstrip().upper().startswith("SELECT")]


def test_cache_hit_is_at_most_one_query_and_the_same_object(fresh_sweep):
    with Registry(fresh_sweep.url) as registry:
        first = load_sweep(registry, fresh_sweep.sweep_id)
        # nothing committed since: PRAGMA data_version says so, no query on the registry at all
        second, selects = _selects(registry, lambda: load_sweep(registry, fresh_sweep.sweep_id))
        assert second is first and selects == []
        # a commit that touches no run of the sweep: one version query, still the same object
        registry.set_sweep(fresh_sweep.sweep_id, status="finished")
        third, selects = _selects(registry, lambda: load_sweep(registry, fresh_sweep.sweep_id))
        assert third is first and len(selects) == 1 and "max(runs.updated_at)" in selects[0]


def test_finishing_a_run_invalidates_the_cache(fresh_sweep):
    with Registry(fresh_sweep.url) as registry:
        before = load_sweep(registry, fresh_sweep.sweep_id)
        assert load_sweep(registry, fresh_sweep.sweep_id) is before
        assert registry.claim(fresh_sweep.pending_key, "w") is not None
        claimed = load_sweep(registry, fresh_sweep.sweep_id)
        assert claimed is not before and "running" in claimed.status.tolist()
        registry.finish(fresh_sweep.pending_key, {"accuracy": 0.5}, np.ones((6, 12)))
        after = load_sweep(registry, fresh_sweep.sweep_id)
        assert after is not claimed and after.has_gates.all()
        assert load_sweep(registry, fresh_sweep.sweep_id) is after


def test_unknown_sweep_is_not_found(registry):
    with pytest.raises(NotFound):
        load_sweep(registry, "sw-nope")


# --------------------------------------------------------------------------- filters and runs


def test_select_by_any_axis(data):
    assert len(queries.select(data, {"task": [CLS]})) == 13
    assert len(queries.select(data, {"task": [CLS], "seed": ["0", "1"]})) == 8
    assert len(queries.select(data, {"lambda": ["0.1"], "pipeline": ["sp"]})) == 6
    assert len(queries.select(data, {"sparsity": ["none"]})) == 25
    assert len(queries.select(data, {"status": ["pending"]})) == 1
    assert len(queries.select(data, queries.parse_filter("task:synthetic-tag,seed:0|2"))) == 8


@pytest.mark.parametrize(("filters", "message"), [
    ({"tsk": ["x"]}, "unknown axis 'tsk'; did you mean 'task'?"),
    ({"task": ["synthetic-cl"]}, "no run with task 'synthetic-cl'; did you mean 'synthetic-cls'?"),
    ({"seed": ["7"]}, "no run with seed 7; did you mean 3?"),
    ({"lambda": ["0.2"]}, "no run with lambda 0.2; did you mean 0.1?"),
    ({"seed": ["x"]}, "seed: expected a number, got 'x'"),
    ({"seed": ["1.5"]}, "seed: expected an integer, got '1.5'"),
])
def test_bad_filters_name_the_value_and_the_nearest(data, filters, message):
    with pytest.raises(QueryError, match=message.replace("?", r"\?")):
        queries.select(data, filters)


def test_parse_filter_rejects_malformed_text():
    assert queries.parse_filter("") == {}
    with pytest.raises(QueryError, match="expected axis:value"):
        queries.parse_filter("task")
    with pytest.raises(QueryError, match="did you mean 'pipeline'"):
        queries.parse_filter("pipelin:dp")


def test_runs_paginates_and_carries_metrics(data):
    total, page = queries.runs(data, {"task": [CLS]}, offset=2, limit=3)
    assert total == 13 and len(page) == 3
    assert page[0]["seed"] == 2 and page[0]["lambda"] == 0.01 and page[0]["sparsity"] is None
    assert page[0]["metrics"]["accuracy"] == pytest.approx(0.7 + 0.02 - 0.005)
    assert queries.runs(data, None, offset=100, limit=5) == (25, [])


# --------------------------------------------------------------------------- aggregate


def test_aggregate_by_axes_matches_the_formula(data):
    rows = queries.aggregate(data, ["task", "pipeline"], "accuracy")
    assert [(r["task"], r["pipeline"]) for r in rows] == [(CLS, "dp"), (CLS, "sp"), (TAG, "dp"), (TAG, "sp")]
    first = rows[0]  # 0.7 + 0.01 * seed - 0.5 * lambda over seeds 0..2 and lambdas 0.01, 0.1
    values = [0.7 + 0.01 * s - 0.5 * lam for s in (0, 1, 2) for lam in (0.01, 0.1)]
    assert first["mean"] == pytest.approx(np.mean(values))
    assert first["std"] == pytest.approx(np.std(values, ddof=1))
    assert (first["n"], first["runs"]) == (6, 7)  # the pending run has no accuracy yet
    assert first["ci_lo"] < first["mean"] < first["ci_hi"]
    assert rows[1]["mean"] == pytest.approx(first["mean"] + 0.05)
    assert queries.aggregate(data, ["task", "pipeline"], "accuracy") == rows  # fixed seed: reproducible


def test_aggregate_per_cell_is_over_seeds(data):
    rows = queries.aggregate(data, [], "accuracy")
    assert len(rows) == 8
    first = rows[0]  # cells in submission order
    assert (first["task"], first["pipeline"], first["lambda"]) == (CLS, "dp", 0.01)
    assert first["mean"] == pytest.approx(0.705) and first["std"] == pytest.approx(0.01) and first["n"] == 3
    ci = stats.aggregate(np.array([0.695, 0.705, 0.715]), np.random.default_rng(0), nan_policy="omit")
    assert (first["ci_lo"], first["ci_hi"]) == pytest.approx((ci.ci_lo, ci.ci_hi))


def test_aggregate_rejects_unknown_metric_and_axis(data):
    with pytest.raises(QueryError, match="unknown metric 'acc'; did you mean 'accuracy'"):
        queries.aggregate(data, ["task"], "acc")
    with pytest.raises(QueryError, match="unknown axis 'pipelines'; did you mean 'pipeline'"):
        queries.aggregate(data, ["pipelines"], "accuracy")


# --------------------------------------------------------------------------- agreement


def test_seeds_of_a_cell_agree_beyond_chance(data, sweep):
    result = queries.agreement(data, "seed")
    assert result.labels == ["0", "1", "2"] and result.n_runs == [8, 8, 8] and result.n_groups == 8
    np.testing.assert_allclose(np.diag(result.matrix), 1.0)
    assert (result.matrix > 0.6).all()
    stem, offdiag = result.stem_cell, result.mean_offdiag
    expected = np.mean([stats.mean_multiple_correlation(_cell_runs(sweep, t, p, lam))
                        for t in (CLS, TAG) for p in ("dp", "sp") for lam in (0.01, 0.1)])
    assert stem.observed == pytest.approx(expected)
    assert stem.observed > 0.7 and stem.observed > stem.band_hi and stem.p_value == pytest.approx(1 / 201)
    assert offdiag.observed > offdiag.band_hi and offdiag.p_value < 0.01
    again = queries.agreement(data, "seed")
    assert again.stem_cell.band_lo == stem.band_lo  # fixed rng seed: the same answer twice


def test_independent_tasks_are_near_zero_and_inside_the_band(data, sweep):
    result = queries.agreement(data, "task")
    assert result.labels == [CLS, TAG] and result.n_runs == [12, 12]
    means = [np.mean([z for (t, *_), z in sweep.gates.items() if t == task], axis=0) for task in (CLS, TAG)]
    np.testing.assert_allclose(result.matrix, stats.task_correlation(np.stack(means)), atol=1e-6)
    null = result.mean_offdiag
    assert abs(null.observed) < 0.15 and null.band_lo < null.observed < null.band_hi and null.p_value > 0.05


def test_pipelines_of_the_same_tasks_agree(data):
    result = queries.agreement(data, "pipeline", n_perm=0)
    assert result.labels == ["dp", "sp"] and result.matrix[0, 1] > 0.9
    assert isinstance(result.mean_offdiag, float) and isinstance(result.stem_cell, float)


def test_agreement_across_runs_and_with_filters(data):
    result = queries.agreement(data, "run", {"task": [CLS], "pipeline": ["dp"]}, n_perm=20)
    assert result.matrix.shape == (6, 6) and len(result.labels) == 6
    expected = stats.pearson_matrix(
        queries.select(data, {"task": [CLS], "pipeline": ["dp"], "status": ["finished"]}).gates, dtype=np.float64)
    np.testing.assert_allclose(result.matrix, expected, atol=1e-6)  # float32 matrix


def test_agreement_refuses_more_fits_than_allowed(data):
    with pytest.raises(QueryError, match=r"24 runs with 200 permutations needs 4,824 .* lower n_perm \(to 40"):
        queries.agreement(data, "seed", n_perm=200, max_fits=1000)
    assert queries.agreement(data, "seed", n_perm=40, max_fits=1000).n_groups == 8


@pytest.mark.parametrize(("across", "filters", "message"), [
    ("model", None, "needs at least 2 values of model"),
    ("seeds", None, "unknown across 'seeds'; did you mean 'seed'"),
    ("seed", {"seed": ["0"]}, "needs a cell with at least 2 finished seeds"),
    ("task", {"status": ["pending"]}, "no finished run with gates"),
])
def test_agreement_bad_questions(data, across, filters, message):
    with pytest.raises(QueryError, match=message):
        queries.agreement(data, across, filters, n_perm=5)


# --------------------------------------------------------------------------- spearman


def test_spearman_of_independent_tasks_is_chance(data):
    result = queries.spearman_overlap(data, {"task": [CLS]}, {"task": [TAG]}, k_frac=0.2)
    assert (result["n_a"], result["n_b"]) == (12, 12)
    assert result["band_lo"] < result["spearman"] < result["band_hi"] and result["p_value"] > 0.05
    assert result["k"] == 15  # ceil(0.2 * 72)


def test_spearman_of_pipelines_is_high_with_full_top_k_overlap(data, sweep):
    result = queries.spearman_overlap(data, {"pipeline": ["dp"]}, {"pipeline": ["sp"]}, k_frac=0.2)
    a = np.stack([z for (_, p, *_), z in sweep.gates.items() if p == "dp"])
    b = np.stack([z for (_, p, *_), z in sweep.gates.items() if p == "sp"])
    assert result["spearman"] == pytest.approx(stats.spearman_groups(a, b))
    assert result["mean_pairwise"] == pytest.approx(float(stats.spearman_between(a, b).mean()))
    top = stats.topk_overlap(a.mean(axis=0), b.mean(axis=0), 0.2)
    assert (result["jaccard"], result["overlap"]) == (top["jaccard"], top["overlap"])
    assert result["spearman"] > 0.8 and result["p_value"] < 0.01


def test_spearman_scores_or_a_clear_error(data):
    if data.scores is None:  # Registry.results does not return scores (yet)
        with pytest.raises(QueryError, match="no per-head scores"):
            queries.spearman_overlap(data, {"pipeline": ["dp"]}, {"pipeline": ["sp"]}, score="scores")
    else:
        result = queries.spearman_overlap(data, {"pipeline": ["dp"]}, {"pipeline": ["sp"]}, score="scores")
        assert result["spearman"] > 0.8


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k_frac": 0.0}, "k must be a fraction"),
    ({"k_frac": float("nan")}, "k must be a fraction"),
    ({"score": "gate"}, "did you mean 'gates'"),
    ({"a": {"task": [CLS], "status": ["pending"]}}, "group a .* has no finished run"),
])
def test_spearman_bad_questions(data, kwargs, message):
    args = {"a": {"task": [CLS]}, "b": {"task": [TAG]}} | kwargs
    with pytest.raises(QueryError, match=message):
        queries.spearman_overlap(data, **args)


# --------------------------------------------------------------------------- figures


def test_rgb_figure_colours_follow_the_three_seeds(data, sweep):
    png = queries.figure(data, "rgb", {"task": [TAG], "pipeline": ["sp"], "lambda": ["0.1"]})
    z = _cell_runs(sweep, TAG, "sp", 0.1)
    # the same figure built directly gives the layout (where each cell is) of the PNG
    fig = figures._rgb_seed_map_figure(z[0], z[1], z[2], f"{TAG} / sp / minilm-l6: seeds 0, 1, 2")
    reference = _decode(figures._png(fig))
    image = _decode(png)
    assert image.shape == reference.shape
    ax = fig.axes[0]
    for layer in range(6):
        for head in range(12):
            x, y = ax.transData.transform((head, layer))
            pixel = image[int(round(image.shape[0] - y)), int(round(x)), :3]
            np.testing.assert_allclose(pixel, 1.0 - z[:, layer, head], atol=0.02, err_msg=f"{layer}, {head}")


def test_every_figure_kind_is_a_png(data):
    for kind, kwargs in [("grey", {}), ("agreement", {"across": "task"}), ("curves", {"metric": "accuracy"}),
                         ("curves", {"x": "open_heads", "filters": {"task": [CLS]}})]:
        image = _decode(queries.figure(data, kind, **kwargs))
        assert image.shape[0] > 200 and image.shape[1] > 300, kind


def test_grey_figure_is_the_mean_over_the_selection(data, sweep):
    png = queries.figure(data, "grey", {"task": [CLS]})
    runs = np.stack([z for (t, *_), z in sweep.gates.items() if t == CLS])
    title = f"mean gate\n{data.sweep_id}: task:{CLS}"
    assert _decode(png).shape == _decode(figures.grey_map(runs, title)).shape
    assert png == figures.grey_map(runs, title)  # exactly the figure of those 12 runs


def test_curves_points_per_pipeline(data):
    curves = queries.curve_points(data, "accuracy", "lambda", {"task": [CLS]})
    x, mean, std = curves["sp"]
    np.testing.assert_allclose(x, [0.01, 0.1])
    np.testing.assert_allclose(mean, [0.75 + 0.01 - 0.005, 0.75 + 0.01 - 0.05])
    np.testing.assert_allclose(std, [0.01, 0.01])


@pytest.mark.parametrize(("kind", "kwargs", "message"), [
    ("rbg", {}, "unknown figure 'rbg'; did you mean 'rgb'"),
    ("curves", {"metric": "f1"}, "unknown metric 'f1'"),
    ("curves", {"x": "sparsity"}, "no finished run has both accuracy and sparsity"),
    ("curves", {"x": "heads"}, "unknown x 'heads'"),
    ("rgb", {"filters": {"seed": ["0", "1"]}}, "needs a cell with 3 finished seeds"),
])
def test_figure_bad_questions(data, kind, kwargs, message):
    with pytest.raises(QueryError, match=message):
        queries.figure(data, kind, **kwargs)


def test_figure_plan_covers_every_kind(data):
    plan = queries.figure_plan(data)
    names = [name for name, _, _ in plan]
    assert len(names) == len(set(names)) == 8 + 3 + 3 + 4
    assert sum(kind == "rgb" for _, kind, _ in plan) == 8
    assert {"grey_all.png", "agreement_seed.png", "agreement_task.png", "agreement_pipeline.png",
            f"curves_{CLS}_accuracy_vs_lambda.png", f"curves_{TAG}_accuracy_vs_open_heads.png"} <= set(names)


@pytest.mark.postgres
def test_load_and_cache_on_postgresql(fresh_pg_database):
    """No commit counter on PostgreSQL: every load runs the version query, and a finish shows."""
    from experiments.config import parse_config

    configs = [parse_config({"model": "minilm-l6", "seed": s, "task": {"name": t}})
               for t in (CLS, TAG) for s in (0, 1, 2)]
    with Registry(fresh_pg_database) as registry:
        sweep_id, _ = registry.create_sweep("pg", "name: pg\n", configs, {"cpus": 1.0}, None, 1)
        for cfg in configs[:5]:
            registry.claim(cfg.run_key, "w")
            registry.finish(cfg.run_key, {"accuracy": 0.5}, np.eye(6, 12))
        first = load_sweep(registry, sweep_id)
        again, selects = _selects(registry, lambda: load_sweep(registry, sweep_id))
        assert again is first and len(selects) == 1 and first.has_gates.sum() == 5
        registry.claim(configs[5].run_key, "w")
        registry.finish(configs[5].run_key, {"accuracy": 1.0}, np.eye(6, 12))
        after = load_sweep(registry, sweep_id)
        assert after is not first and after.has_gates.all()
        assert queries.aggregate(after, ["task"], "accuracy")[1]["mean"] == pytest.approx(2 / 3)


def test_stem_cell_is_nan_when_a_cell_has_as_many_seeds_as_heads(data):
    """6 x 12 heads here: restrict to 1 layer x 3 heads by slicing the data's gates."""
    from dataclasses import replace

    small = replace(data, gates=np.ascontiguousarray(data.gates[:, :1, :3]))  # 3 heads, 3 seeds per cell
    result = queries.agreement(small, "task", n_perm=0)
    assert np.isnan(result.stem_cell) and result.n_groups == 8 and result.matrix.shape == (2, 2)
