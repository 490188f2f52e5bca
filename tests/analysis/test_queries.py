"""analysis.data.loading, analysis.questions (results, the agreement engine) and analysis.views on a real SQLite registry with known gates (conftest.py)."""

from __future__ import annotations

import io
import math

import matplotlib.image
import numpy as np
import pytest

from analysis.data import select
from analysis.data.loading import load_sweep
from analysis.data.select import QueryError
from analysis.data.where import Condition
from analysis.questions import results, run_table
from analysis.questions.agreement import across_runs, compare
from analysis.statistics import intervals, pearson, spearman, stem_cell
from analysis.views import answers, figure_plan, figures
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
    # 24 gate runs + 1 pending + the SP cells' 6 fine-tunes (finished, no gates)
    assert len(data) == 31 and data.gates.shape == (31, 6, 12)
    assert data.sweep_id == sweep.sweep_id
    assert data.has_gates.sum() == 24 and data.status.tolist().count("pending") == 1
    pending = data.run_key.tolist().index(sweep.pending_key)
    assert not data.has_gates[pending] and np.isnan(data.gates[pending]).all()
    assert np.isnan(data.metrics["accuracy"][pending])
    np.testing.assert_array_equal(data.gates[0], sweep.gates[(CLS, "dp", 0.01, 0)])
    assert sorted(data.metrics) == ["accuracy", "loss", "open_heads"]
    assert data.axis("lambda").dtype == np.float64 and np.isnan(data.axis("sparsity")).all()
    assert not data.gates.flags.writeable  # shared between callers: read only


def test_every_label_is_read_from_the_runs_stored_labels(tmp_path):
    """A method's own labels (skill_neurons' verbalizer, prompt_length) are columns like the common ones,
    read from the one place a run's labels are stored; the common ones are there where no run has them."""
    from experiments import parse_config

    base = {"model": "tiny-bert", "task": {"name": CLS}, "method": "skill_neurons"}
    configs = [parse_config(base | {"seed": seed, "skill_neurons": {"verbalizer": verbalizer, "prompt_length": length}})
               for seed in (0, 1) for verbalizer, length in (("learned", 4), ("random_words", 8))]
    with Registry(f"sqlite:///{tmp_path / 'labels.db'}") as registry:
        sweep_id, _ = registry.create_sweep("labels", "name: labels\n", configs, {"cpus": 1.0, "gpus": 0.0}, None, 1)
        data = load_sweep(registry, sweep_id)
    assert data.labels["verbalizer"].tolist() == ["learned", "random_words"] * 2
    assert data.labels["prompt_length"].tolist() == [4.0, 8.0] * 2  # a number: a column of floats
    assert data.labels["seed"].dtype == np.int64 and data.labels["method"].tolist() == ["skill_neurons"] * 4
    assert data.labels["pipeline"].tolist() == [""] * 4 and np.isnan(data.labels["lambda"]).all()  # none has them
    assert select.column(data, "verbalizer") is data.labels["verbalizer"]
    assert select.select(data, {"verbalizer": ["random_words"]}).seed.tolist() == [0, 1]
    with pytest.raises(QueryError, match="did you mean 'verbalizer'"):
        select.check_axis("verbaliser", data)


def test_cache_hit_is_at_most_one_query_and_the_same_object(fresh_sweep, count_selects):
    with Registry(fresh_sweep.url) as registry:
        first = load_sweep(registry, fresh_sweep.sweep_id)
        # nothing committed since: PRAGMA data_version says so, no query on the registry at all
        second, selects = count_selects(registry, lambda: load_sweep(registry, fresh_sweep.sweep_id))
        assert second is first and selects == []
        # a commit that touches no run of the sweep: one version query, still the same object
        registry.set_sweep(fresh_sweep.sweep_id, status="finished")
        third, selects = count_selects(registry, lambda: load_sweep(registry, fresh_sweep.sweep_id))
        assert third is first and len(selects) == 1 and "max(hs_runs.updated_at)" in selects[0]


def test_finishing_a_run_invalidates_the_cache(fresh_sweep):
    with Registry(fresh_sweep.url) as registry:
        before = load_sweep(registry, fresh_sweep.sweep_id)
        assert load_sweep(registry, fresh_sweep.sweep_id) is before
        assert registry.claim(fresh_sweep.pending_key, "w") is not None
        claimed = load_sweep(registry, fresh_sweep.sweep_id)
        assert claimed is not before and "running" in claimed.status.tolist()
        registry.finish(fresh_sweep.pending_key, {"accuracy": 0.5}, maps={"heads.gate": np.ones((6, 12))})
        after = load_sweep(registry, fresh_sweep.sweep_id)
        assert after is not claimed and after.has_gates.sum() == 25  # the fine-tunes learn no gates
        assert load_sweep(registry, fresh_sweep.sweep_id) is after


def test_unknown_sweep_is_not_found(registry):
    with pytest.raises(NotFound):
        load_sweep(registry, "sw-nope")


# --------------------------------------------------------------------------- filters and runs


def test_select_by_any_axis(data):
    assert len(select.select(data, {"task": [CLS]})) == 16  # 12 gate runs, 1 pending, 3 fine-tunes
    assert len(select.select(data, {"task": [CLS], "seed": ["0", "1"]})) == 10
    assert len(select.select(data, {"lambda": ["0.1"], "pipeline": ["sp"]})) == 6
    assert len(select.select(data, {"sparsity": ["none"]})) == 31
    assert len(select.select(data, {"method": ["finetune"]})) == 6
    assert len(select.select(data, {"status": ["pending"]})) == 1
    assert len(select.select(data, select.parse_filter("task:synthetic-tag,seed:0|2"))) == 10


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
        select.select(data, filters)


def test_parse_filter_rejects_malformed_text():
    assert select.parse_filter("") == ()
    with pytest.raises(QueryError, match="at its end: expected an operator"):
        select.parse_filter("task")
    assert select.parse_filter("pipelin:dp") == (Condition("pipelin", "=", ("dp",)),)  # checked by select


def test_select_names_a_misspelt_axis_against_the_data(data):
    with pytest.raises(QueryError, match="did you mean 'pipeline'"):
        select.select(data, select.parse_filter("pipelin:dp"))


def test_the_run_table_has_every_column_and_its_rows_in_cell_order(data):
    table = run_table.run_table(data, {"task": [CLS]}, "base: {train: {max_steps: 10}}\naxes: {lambda: [0.01, 0.1]}")
    assert table.columns[:len(run_table.FIRST_COLUMNS)] == list(run_table.FIRST_COLUMNS)
    assert {"params.train.max_steps", "params.head_gates.lambda", "metrics.accuracy", "maps"} <= set(table.columns)
    assert len(table.rows) == 16 and all(list(row) == table.columns for row in table.rows)
    row, = [r for r in table.rows if (r["pipeline"], r["seed"], r["lambda"]) == ("dp", 2, 0.01)]
    assert (row["seed"], row["lambda"], row["sparsity"], row["params.head_gates.lambda"]) == (2, 0.01, None, 0.01)
    assert row["params.train.max_steps"] == 10 and row["maps"] == "heads.gate,heads.log_alpha"
    assert row["metrics.accuracy"] == pytest.approx(0.7 + 0.02 - 0.005)
    assert row["duration_s"] >= 0 and row["started_at"] < row["finished_at"] and row["mlflow_run_id"] is None
    assert run_table.run_table(data, "metrics.accuracy > 5").rows == []


# --------------------------------------------------------------------------- aggregate


def test_aggregate_by_axes_matches_the_formula(data):
    rows = results.aggregate(data, ["task", "pipeline"], "accuracy")
    # methods are never pooled: the fine-tunes (no pipeline) are rows of their own, the accuracy
    # before any head is pruned
    assert [(r["task"], r["pipeline"], r["method"]) for r in rows] == [
        (CLS, "", "finetune"), (CLS, "dp", "head_gates"), (CLS, "sp", "head_gates"),
        (TAG, "", "finetune"), (TAG, "dp", "head_gates"), (TAG, "sp", "head_gates")]
    pooled = results.aggregate(data, ["task"], "accuracy", {"method": ["head_gates"]})
    assert [r["task"] for r in pooled] == [CLS, TAG] and "method" not in pooled[0]
    assert rows[0]["mean"] == pytest.approx(0.8) and rows[0]["n"] == 3
    first = rows[1]  # 0.7 + 0.01 * seed - 0.5 * lambda over seeds 0..2 and lambdas 0.01, 0.1
    values = [0.7 + 0.01 * s - 0.5 * lam for s in (0, 1, 2) for lam in (0.01, 0.1)]
    assert first["mean"] == pytest.approx(np.mean(values))
    assert first["std"] == pytest.approx(np.std(values, ddof=1))
    assert (first["n"], first["runs"]) == (6, 7)  # the pending run has no accuracy yet
    assert first["ci_lo"] < first["mean"] < first["ci_hi"]
    assert rows[2]["mean"] == pytest.approx(first["mean"] + 0.05)
    assert results.aggregate(data, ["task", "pipeline"], "accuracy") == rows  # fixed seed: reproducible


def test_aggregate_per_cell_is_over_seeds(data):
    rows = results.aggregate(data, [], "accuracy")
    assert len(rows) == 10 and sum(r["method"] == "finetune" for r in rows) == 2
    first = rows[0]  # cells in submission order
    assert (first["task"], first["pipeline"], first["lambda"]) == (CLS, "dp", 0.01)
    assert first["mean"] == pytest.approx(0.705) and first["std"] == pytest.approx(0.01) and first["n"] == 3
    ci = intervals.aggregate(np.array([0.695, 0.705, 0.715]), np.random.default_rng(0), nan_policy="omit")
    assert (first["ci_lo"], first["ci_hi"]) == pytest.approx((ci.ci_lo, ci.ci_hi))


def test_confidence_intervals_do_not_depend_on_the_order_of_group_by(data, monkeypatch):
    """One generator per group, seeded by the group's own runs: a group's bootstrap CI is the same
    whichever order the groups come in (task-major or pipeline-major), and when asked for alone."""
    monkeypatch.setattr(intervals, "T_INTERVAL_BELOW", 2)  # the cells' 6 runs get a bootstrap (random) CI
    gates = {"method": ["head_gates"]}

    def by_group(group_by, filters=gates):
        rows = results.aggregate(data, group_by, "accuracy", filters)
        assert {r["ci_method"] for r in rows} == {"bootstrap"}
        return {(r["task"], r["pipeline"]): (r["ci_lo"], r["ci_hi"]) for r in rows}

    forward, backward = by_group(["task", "pipeline"]), by_group(["pipeline", "task"])
    assert list(forward) != list(backward) and forward == backward and len(forward) == 4
    alone = by_group(["task", "pipeline"], gates | {"task": [TAG], "pipeline": ["sp"]})
    assert alone[(TAG, "sp")] == forward[(TAG, "sp")]


def test_aggregate_rejects_unknown_metric_and_axis(data):
    with pytest.raises(QueryError, match="unknown metric 'acc'; did you mean 'accuracy'"):
        results.aggregate(data, ["task"], "acc")
    with pytest.raises(QueryError, match="unknown axis 'pipelines'; did you mean 'pipeline'"):
        results.aggregate(data, ["pipelines"], "accuracy")


# --------------------------------------------------------------------------- agreement


def test_seeds_of_a_cell_agree_beyond_chance_under_both_nulls(data, sweep):
    result = across_runs.agreement(data, "seed", n_perm=200)
    assert result.labels == ["0", "1", "2"] and result.n_runs == [8, 8, 8] and result.n_cells == 8
    np.testing.assert_allclose(np.diag(result.matrix), 1.0)
    assert (result.matrix > 0.6).all() and result.map_name == "heads.gate"
    stem, offdiag = result.stem_cell, result.mean_offdiag
    expected = np.mean([stem_cell.stem_cell(_cell_runs(sweep, t, p, lam))
                        for t in (CLS, TAG) for p in ("dp", "sp") for lam in (0.01, 0.1)])
    assert stem.observed == pytest.approx(expected) and stem.observed > 0.7
    assert set(stem.nulls) == {"within_layers", "all_units"}
    for null in (*stem.nulls.values(), *offdiag.nulls.values()):
        assert null.observed > null.band_hi and null.p_value == pytest.approx(1 / 201)
        assert null.p_text == "p < 0.005" and null.excess == pytest.approx(null.observed - null.null_mean)
    again = across_runs.agreement(data, "seed", n_perm=200)
    assert again.stem_cell.nulls["within_layers"].band_lo == stem.nulls["within_layers"].band_lo  # fixed seed
    paper = np.mean([stem_cell.stem_cell(_cell_runs(sweep, t, p, lam), response="last")  # seed 2 on seeds 0 and 1
                     for t in (CLS, TAG) for p in ("dp", "sp") for lam in (0.01, 0.1)])
    assert result.stem_cell_paper.observed == pytest.approx(paper) and paper != pytest.approx(expected)
    assert set(result.stem_cell_paper.nulls) == {"within_layers", "all_units"}
    assert "the paper's" in result.stem_cell_paper.pooled


def test_independent_tasks_are_near_zero_and_inside_the_band(data, sweep):
    result = across_runs.agreement(data, "task", n_perm=200)
    assert result.labels == [CLS, TAG] and result.n_runs == [12, 12]
    null = result.mean_offdiag.nulls["within_layers"]
    assert abs(null.observed) < 0.15 and null.band_lo < null.observed < null.band_hi and null.p_value > 0.05


def test_tasks_are_compared_only_within_equal_settings_of_the_other_axes(data, sweep):
    """Defect 5: the cells of one task that differ in lambda or pipeline are not pooled."""
    result = across_runs.agreement(data, "task", n_perm=0)
    # init_from.method (finetune for SP, none for DP) splits the runs as the pipeline does
    assert set(result.matched_on) == {"head_gates.lambda", "head_gates.pipeline", "init_from.method"}
    assert result.pooled_axes == []
    per_setting = []
    for p in ("dp", "sp"):
        for lam in (0.01, 0.1):
            means = [_cell_runs(sweep, t, p, lam).mean(axis=0) for t in (CLS, TAG)]
            per_setting.append(pearson.pearson_matrix(np.stack(means), dtype=np.float64)[0, 1])
    assert result.matrix[0, 1] == pytest.approx(np.mean(per_setting), abs=1e-6)
    assert "mean over 4 settings of head_gates.lambda, head_gates.pipeline" in result.mean_offdiag.pooled
    pooled = across_runs.agreement(data, "task", n_perm=0, pool=["lambda", "pipeline"])
    assert pooled.matched_on == []
    assert set(pooled.pooled_axes) == {"head_gates.lambda", "head_gates.pipeline", "init_from.method"}
    means = [np.mean([z for (t, *_), z in sweep.gates.items() if t == task], axis=0) for task in (CLS, TAG)]
    assert pooled.matrix[0, 1] == pytest.approx(pearson.pearson_matrix(np.stack(means), dtype=np.float64)[0, 1], abs=1e-6)
    with pytest.raises(QueryError, match="pool: 'lamda' is not an axis that varies here; did you mean 'head_gates.lambda'"):
        across_runs.agreement(data, "task", n_perm=0, pool=["lamda"])


def test_pipelines_of_the_same_tasks_agree(data):
    result = across_runs.agreement(data, "pipeline", n_perm=0)
    assert result.labels == ["dp", "sp"] and result.matrix[0, 1] > 0.9
    assert set(result.matched_on) == {"head_gates.lambda", "task.name"}
    assert result.mean_offdiag.nulls == {} and result.stem_cell.nulls == {}


def test_agreement_across_runs_and_with_filters(data):
    result = across_runs.agreement(data, "run", {"task": [CLS], "pipeline": ["dp"]}, n_perm=20)
    assert result.matrix.shape == (6, 6) and len(result.labels) == 6
    expected = pearson.pearson_matrix(
        select.select(data, {"task": [CLS], "pipeline": ["dp"], "status": ["finished"]}).gates, dtype=np.float64)
    np.testing.assert_allclose(result.matrix, expected, atol=1e-6)  # float32 matrix


@pytest.mark.parametrize("across", ["seed", "task", "lambda", "run"])
def test_the_nulls_of_many_copies_at_once_are_those_of_one_copy_at_a_time(data, monkeypatch, across):
    """Agreement's nulls from every statistic's ``rows`` (shuffled once, many copies at once) equal
    the plain ones: each copy's shuffled maps through the statistic (what a statistic without
    rows gets), from the same draws; observed values and matrices do not change at all."""
    from dataclasses import replace

    from analysis import statistics

    fast = across_runs.agreement(data, across, n_perm=30, seed=3)
    for stat in statistics.asked("agreement"):
        monkeypatch.setitem(statistics.STATISTICS, stat.name, replace(stat, rows=None, between=None, copies=None))
    plain = across_runs.agreement(data, across, n_perm=30, seed=3)
    assert list(fast.statistics) == list(plain.statistics)
    np.testing.assert_array_equal(fast.matrix, plain.matrix)
    for name, tested in plain.statistics.items():
        assert fast.statistics[name].observed == tested.observed or math.isnan(tested.observed)
        assert list(fast.statistics[name].nulls) == list(tested.nulls)
        for null, result in tested.nulls.items():
            np.testing.assert_allclose(fast.statistics[name].nulls[null].null, result.null, rtol=0, atol=1e-12)
            assert fast.statistics[name].nulls[null].p_value == result.p_value
    assert sum(len(t.nulls) for t in plain.statistics.values()) >= 6


def test_the_label_matrix_of_many_copies_averages_as_the_label_matrix():
    """``_offdiag_mean`` of ``_label_matrix`` of each copy, from the pairs' values of many copies at
    once (``_label_pairs``: blocks of several sizes, labels repeated within and across blocks, NaN
    pairs, a label never compared: 3)."""
    rng = np.random.default_rng(4)
    at = np.array([0, 1, 2, 0, 1, 2, 2, 0, 1, 3])
    blocks = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([6, 7]), np.array([8, 0]), np.array([1, 6, 3])]
    copies = rng.random((6, 10, 2, 4))
    copies[2, 4] = np.nan  # row 4's pairs in copy 2 are NaN
    copies[5, [0, 2, 4, 5, 6, 7, 8]] = np.nan  # copy 5: one pair left, rows 3 and 1 (labels 0 and 1)
    stat = pearson.STATISTICS[0]
    expected = [across_runs._offdiag_mean(across_runs._label_matrix(stat, z, at, blocks, 4)) for z in copies]
    rows = np.stack([stat.rows(z.reshape(10, -1)) for z in copies])
    got = across_runs._pairs_of_copies(stat, rows, across_runs._label_pairs(at, blocks, 4))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert not np.isnan(got).any()
    nothing = across_runs._label_pairs(at, [np.array([0, 3])], 4)  # rows of one label: no off-diagonal pair
    assert np.isnan(across_runs._pairs_of_copies(stat, rows, nothing)).all()
    assert np.isnan(across_runs._offdiag_mean(across_runs._label_matrix(stat, copies[0], at, [np.array([0, 3])], 4)))


def test_agreement_refuses_more_work_than_allowed(data):
    with pytest.raises(QueryError, match=r"24 runs with 200 permutations .* lower n_perm \(to 41"):
        across_runs.agreement(data, "seed", n_perm=200, max_run_perms=1000)
    assert across_runs.agreement(data, "seed", n_perm=40, max_run_perms=1000).n_cells == 8


@pytest.mark.parametrize(("across", "filters", "message"), [
    ("model", None, "needs at least 2 values of model"),
    ("seeds", None, "unknown across 'seeds'; did you mean 'seed'"),
    ("seed", {"seed": ["0"]}, "needs a cell with at least 2 finished seeds"),
    ("task", {"status": ["pending"]}, "no finished run with map heads.gate"),
])
def test_agreement_bad_questions(data, across, filters, message):
    with pytest.raises(QueryError, match=message):
        across_runs.agreement(data, across, filters, n_perm=5)


def test_agreement_on_the_continuous_map(data):
    result = across_runs.agreement(data, "seed", n_perm=0, map_name="heads.log_alpha")
    assert result.map_name == "heads.log_alpha" and result.stem_cell.observed > 0.7


def test_a_constant_binarised_map_switches_to_its_continuous_companion(fresh_sweep):
    """Every gate closed in one run (the random-init control does this): say so, use log_alpha."""
    from dataclasses import replace

    from analysis.data.loading import load_sweep
    from orchestrator.registry import Registry

    with Registry(fresh_sweep.url) as registry:
        data = load_sweep(registry, fresh_sweep.sweep_id)
    gates = np.array(data.gates)
    gates[0] = 0.0
    closed = replace(data, gates=gates)
    result = across_runs.agreement(closed, "seed", n_perm=0)
    assert result.map_name == "heads.log_alpha" and math.isfinite(result.stem_cell.observed)
    assert result.notes == ["1 of 24 runs have a constant heads.gate (every unit at 0): its correlation is "
                            "undefined, so these statistics use the continuous heads.log_alpha of every run instead"]


# --------------------------------------------------------------------------- spearman


def test_spearman_of_independent_tasks_is_chance(data):
    result = answers.spearman_json(compare.spearman(data, {"task": [CLS]}, {"task": [TAG]}, k_frac=0.2))
    assert (result["n_a"], result["n_b"]) == (12, 12)
    within = next(n for n in result["nulls"] if n["null"] == "within_layers")
    assert within["band_lo"] < result["spearman"] < within["band_hi"] and within["p_value"] > 0.05
    assert result["k"] == 15 and result["chance_overlap"] == pytest.approx(15 / 72)  # ceil(0.2 * 72)


def test_spearman_of_pipelines_is_high_with_full_top_k_overlap(data, sweep):
    result = answers.spearman_json(compare.spearman(data, {"pipeline": ["dp"]}, {"pipeline": ["sp"]}, k_frac=0.2))
    a = np.stack([z for (_, p, *_), z in sweep.gates.items() if p == "dp"])
    b = np.stack([z for (_, p, *_), z in sweep.gates.items() if p == "sp"])
    assert result["spearman"] == pytest.approx(spearman.spearman_rows(a.mean(axis=0)[None], b.mean(axis=0)[None])[0])
    assert result["mean_pairwise"] == pytest.approx(float(spearman.spearman_between(a, b).mean()))
    assert result["spearman"] > 0.8 and all(n["p_text"] == "p < 0.001" for n in result["nulls"])
    assert result["overlap"] > 3 * result["chance_overlap"]


def test_spearman_on_the_continuous_map(data):
    result = answers.spearman_json(compare.spearman(data, {"pipeline": ["dp"]}, {"pipeline": ["sp"]}, map_name="heads.log_alpha"))
    assert result["map"] == "heads.log_alpha" and result["spearman"] > 0.8


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k_frac": 0.0}, "top must be a fraction"),
    ({"k_frac": float("nan")}, "top must be a fraction"),
    ({"map_name": "heads.gates"}, "did you mean 'heads.gate'"),
    ({"a": {"task": [CLS], "status": ["pending"]}}, "group a .* has no finished run"),
])
def test_spearman_bad_questions(data, kwargs, message):
    args = {"a": {"task": [CLS]}, "b": {"task": [TAG]}} | kwargs
    with pytest.raises(QueryError, match=message):
        answers.spearman_json(compare.spearman(data, **args))


# --------------------------------------------------------------------------- figures


def test_rgb_figure_colours_follow_the_three_seeds(data, sweep):
    png = figure_plan.figure(data, "rgb", {"task": [TAG], "pipeline": ["sp"], "lambda": ["0.1"]})
    z = _cell_runs(sweep, TAG, "sp", 0.1)
    # the same figure built directly gives the layout (where each cell is) of the PNG
    counts = ", ".join(str(int(n)) for n in z.reshape(3, -1).sum(axis=1))  # binary gates: open = 1
    fig = figures.rgb_seed_map_figure(z[0], z[1], z[2], f"{TAG} / sp / minilm-l6: seeds 0, 1, 2\n"
                                                         f"heads open (test-time gate > 0.001): {counts}")
    reference = _decode(figures._png(fig))
    image = _decode(png)
    assert image.shape == reference.shape
    ax = fig.axes[0]
    for layer in range(6):
        for head in range(12):
            x, y = ax.transData.transform((head, layer))
            pixel = image[int(round(image.shape[0] - y)), int(round(x)), :3]
            np.testing.assert_allclose(pixel, 1.0 - z[:, layer, head], atol=0.02, err_msg=f"{layer}, {head}")


def test_rgb_and_grey_figures_draw_open_heads_as_the_counts_do(data, sweep):
    """A gate of 0.01 is open (test-time gate > 1e-3, the one definition): black on the rgb map of
    the three runs that have it and in the grey map's mean, as every count says, never nearly white."""
    from dataclasses import replace

    filters = {"task": [TAG], "pipeline": ["sp"], "lambda": ["0.1"]}
    gates = np.array(data.gates)
    gates[:, 0, :] = 0.01  # layer 1: barely open in every run
    expected = np.full(len(data), 9.87)
    barely = replace(data, gates=gates, metrics={**data.metrics, "expected_open_heads": expected})
    z = (_cell_runs(sweep, TAG, "sp", 0.1) > 0).astype(float)
    z[:, 0, :] = 1.0
    counts = ", ".join(str(int(n)) for n in z.reshape(3, -1).sum(axis=1))
    title = (f"{TAG} / minilm-l6 / head_gates / sp / lambda 0.1: seeds 0, 1, 2\n"
             f"heads open (test-time gate > 0.001): {counts}; expected open 9.9, 9.9, 9.9")
    assert figure_plan.figure(barely, "rgb", filters) == figures.rgb_seed_map(z[0], z[1], z[2], title)
    title = (f"heads open (test-time gate > 0.001) in 3 runs: mean {z.reshape(3, -1).sum(axis=1).mean():.1f}, "
             f"expected open 9.9\n{data.sweep_id}: {select.describe(filters)}")
    assert figure_plan.figure(barely, "grey", filters) == figures.grey_map(
        z, title, label="fraction of 3 runs with the head open")  # layer 1 black: open in all 3 runs


def test_every_figure_kind_is_a_png(data):
    for kind, kwargs in [("grey", {}), ("agreement", {"across": "task"}), ("curves", {"metric": "accuracy"}),
                         ("curves", {"x": "open_heads", "filters": {"task": [CLS]}})]:
        image = _decode(figure_plan.figure(data, kind, **kwargs))
        assert image.shape[0] > 200 and image.shape[1] > 300, kind


def test_grey_figure_is_the_mean_over_the_selection(data, sweep):
    png = figure_plan.figure(data, "grey", {"task": [CLS]})
    runs = np.stack([z for (t, *_), z in sweep.gates.items() if t == CLS])
    mean_open = runs.reshape(12, -1).sum(axis=1).mean()  # binary gates: open = 1
    title = f"heads open (test-time gate > 0.001) in 12 runs: mean {mean_open:.1f}\n{data.sweep_id}: task:{CLS}"
    expected = figures.grey_map(runs, title, label="fraction of 12 runs with the head open")
    assert png == expected  # exactly the figure of those 12 runs


def test_curves_points_per_pipeline(data):
    curves = figure_plan.curve_points(data, "accuracy", "lambda", {"task": [CLS]})
    x, mean, std = curves["sp"]
    np.testing.assert_allclose(x, [0.01, 0.1])
    np.testing.assert_allclose(mean, [0.75 + 0.01 - 0.005, 0.75 + 0.01 - 0.05])
    np.testing.assert_allclose(std, [0.01, 0.01])


@pytest.mark.parametrize(("kind", "kwargs", "message"), [
    ("rbg", {}, "unknown figure kind 'rbg'; did you mean 'rgb'"),
    ("curves", {"metric": "f1"}, "unknown metric 'f1'"),
    ("curves", {"x": "sparsity"}, "no finished run has both accuracy and sparsity"),
    ("curves", {"x": "heads"}, "unknown x 'heads'"),
    ("rgb", {"filters": {"seed": ["0", "1"]}}, "needs a cell with 3 finished seeds"),
    # several cells match: an error naming them by the values that tell them apart, never the first
    ("rgb", {"filters": {"task": [TAG], "pipeline": ["sp"]}},
     f"2 cells with 3 finished seeds match task:{TAG},pipeline:sp, and the rgb map draws one: "
     r"they differ in lambda; add one cell's values to the filters \(lambda:0.01; lambda:0.1\)"),
    ("rgb", {}, "8 cells .* they differ in task, pipeline, lambda; .*task:synthetic-cls,pipeline:dp,lambda:0.01; "
                r".*\.\.\. \(8 in all\)"),
])
def test_figure_bad_questions(data, kind, kwargs, message):
    with pytest.raises(QueryError, match=message):
        figure_plan.figure(data, kind, **kwargs)


def test_figure_plan_covers_every_kind(data):
    plan = figure_plan.figure_plan(data)
    names = [name for name, _, _ in plan]
    assert len(names) == len(set(names)) == 8 + 3 + 3 + 4
    assert sum(kind == "rgb" for _, kind, _ in plan) == 8
    # each rgb file names its cell by its labels, no hash: task, model, method, pipeline, lambda
    assert f"rgb_{CLS}_minilm-l6_head_gates_dp_lambda-0.1.png" in names, names
    assert {"grey_all.png", "agreement_seed.png", "agreement_task.png", "agreement_pipeline.png",
            f"curves_{CLS}_accuracy_vs_lambda.png", f"curves_{TAG}_accuracy_vs_open_heads.png"} <= set(names)


@pytest.mark.postgres
def test_load_and_cache_on_postgresql(fresh_pg_database, count_selects):
    """No commit counter on PostgreSQL: every load runs the version query, and a finish shows."""
    from experiments.harness.config import parse_config

    configs = [parse_config({"model": "minilm-l6", "seed": s, "task": {"name": t}})
               for t in (CLS, TAG) for s in (0, 1, 2)]
    with Registry(fresh_pg_database) as registry:
        sweep_id, _ = registry.create_sweep("pg", "name: pg\n", configs, {"cpus": 1.0}, None, 1)
        for cfg in configs[:5]:
            registry.claim(cfg.run_key, "w")
            registry.finish(cfg.run_key, {"accuracy": 0.5}, maps={"heads.gate": np.eye(6, 12)})
        first = load_sweep(registry, sweep_id)
        again, selects = count_selects(registry, lambda: load_sweep(registry, sweep_id))
        assert again is first and len(selects) == 1 and first.has_gates.sum() == 5
        registry.claim(configs[5].run_key, "w")
        registry.finish(configs[5].run_key, {"accuracy": 1.0}, maps={"heads.gate": np.eye(6, 12)})
        after = load_sweep(registry, sweep_id)
        assert after is not first and after.has_gates.all()
        assert results.aggregate(after, ["task"], "accuracy")[1]["mean"] == pytest.approx(2 / 3)


def test_open_heads_without_the_metric_counts_gates_above_the_one_threshold(data):
    """Defect 7: the fallback counted gates > 0.5; open means test-time gate > 1e-3 everywhere."""
    from dataclasses import replace

    from base.units import OPEN_THRESHOLD

    gates = np.array(data.gates)
    gates[:, 0, :] = 0.01  # barely open: open by the papers' definition
    without = replace(data, gates=gates, metrics={k: v for k, v in data.metrics.items() if k != "open_heads"})
    counted = figure_plan._open_heads(without)
    finished = without.has_gates
    np.testing.assert_array_equal(counted[finished], (gates[finished] > OPEN_THRESHOLD).sum(axis=(1, 2)))
    assert (counted[finished] >= 12).all()


def test_a_key_of_the_methods_own_sections_is_an_axis(data):
    """``lr`` is head_gates.lr for head_gates runs and unset for finetune runs (which have no such
    key): what ``--group-by loss`` needs when finetune.loss and mask_train.loss are both in a sweep."""
    lr = select.column(data, "lr")
    gates = data.method == "head_gates"
    assert gates.any() and (~gates).any()
    np.testing.assert_array_equal(lr[gates], select.config_columns(data)["head_gates.lr"][gates])
    assert np.isnan(lr[~gates].astype(float)).all()
    assert select.check_axis("lr", data) == "lr"
    with pytest.raises(QueryError, match="unknown axis 'lrr'"):
        select.column(data, "lrr")


def test_the_label_matrix_averages_each_label_pair_over_blocks():
    """``_label_matrix`` (blocks of rows of several sizes, labels repeated within and across blocks,
    a NaN pair left out of its cell's mean) equals the average written out pair by pair."""
    rng = np.random.default_rng(3)
    z = rng.random((9, 2, 4))
    z[4] = np.nan  # row 4's pairs are NaN: they count nowhere
    at = np.array([0, 1, 2, 0, 1, 2, 2, 0, 1])
    blocks = [np.array([0, 1, 2]), np.array([3, 4, 5]), np.array([6, 7]), np.array([8, 0]), np.array([1, 6, 3])]
    sums, counts = np.zeros((3, 3)), np.zeros((3, 3))
    for block in blocks:
        for i in block:
            for j in block:
                r = np.corrcoef(z[i].ravel(), z[j].ravel())[0, 1]
                if not np.isnan(r):
                    sums[at[i], at[j]] += r
                    counts[at[i], at[j]] += 1
    got = across_runs._label_matrix(pearson.STATISTICS[0], z, at, blocks, 3)
    np.testing.assert_allclose(got, sums / counts, atol=1e-12)
    assert counts.min() >= 2  # every cell pooled more than one pair: the averaging is what is tested
