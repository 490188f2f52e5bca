"""``compare-maps``: Spearman, top-k overlap and relabelling nulls between maps (methods) and across
an axis (tasks), on synthetic SweepData with planted maps and on real SQLite registries, through the
query, the CLI and the HTTP app."""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import replace
from types import MappingProxyType

import matplotlib.image
import numpy as np
import pytest
from scipy.stats import spearmanr

from analysis.data import select
from analysis.data.loading import load_sweep
from analysis.data.select import QueryError
from analysis.data.sweep import from_runs
from analysis.questions.agreement import compare, maps, relabel
from analysis.views import answers, compare_figure, figure_plan
from base.sections import ConfigError
from headsweep.cli import common, questions
from orchestrator.registry import Registry

L, K = 6, 12
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLS, TAG = "synthetic-cls", "synthetic-tag"


def synthetic(configs: list[dict], maps: dict[str, tuple[np.ndarray, np.ndarray]]) -> object:
    """A SweepData of finished runs with these stored configs and maps (``name: (values, has)``)."""
    n = len(configs)
    runs = {
        "sweep_id": "sw-synthetic", "run_key": [f"{i:016x}" for i in range(n)],
        "group_key": [json.dumps({k: v for k, v in c.items() if k != "seed"}, sort_keys=True) for c in configs],
        "status": ["finished"] * n, "metrics": [{}] * n,
        "labels": [{"task": c["task"]["name"], "model": "minilm-l6", "method": c["method"], "seed": c["seed"]}
                   for c in configs],
        "config": [{"model": "minilm-l6", **c} for c in configs], "maps": [], "updated_at": None,
        "run_maps": [tuple(name for name, (_, has) in maps.items() if has[i]) for i in range(n)],
    }
    data = from_runs(runs, None)
    return replace(data, _overrides=MappingProxyType({k: (np.asarray(v, np.float32), np.asarray(h, bool))
                                                      for k, (v, h) in maps.items()}))


def one_method(n_runs: int, rng: np.random.Generator, **maps) -> object:
    """n_runs head_gates runs (tasks a/b, seeds 0..), each with every map given (callables of rng)."""
    configs = [{"method": "head_gates", "seed": i // 2, "task": {"name": "ab"[i % 2]}} for i in range(n_runs)]
    has = np.ones(n_runs, bool)
    return synthetic(configs, {name: (values, has) for name, values in maps.items()})


# --------------------------------------------------------------------------- the statistic


def test_identical_maps_agree_fully_beyond_both_nulls():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(12, L, K))
    data = one_method(12, rng, **{"heads.a": a, "heads.b": a.copy()})
    result = compare.compare_maps(data, ["heads.a", "heads.b"], n_perm=200)
    (pair,) = result.pairs
    assert pair.rho.observed == pytest.approx(1.0) and pair.n_pairs == pair.n_same_run == 12
    assert pair.overlap == pytest.approx(1.0) and pair.jaccard == pytest.approx(1.0)
    assert result.k == 8 and result.chance_overlap == pytest.approx(8 / 72)  # ceil(0.1 * 72)
    assert set(pair.rho.nulls) == {"within_layers", "all_units"}
    for null in pair.rho.nulls.values():
        assert null.p_text == "p < 0.005" and null.band_hi < 0.3
    # relabelling within layers keeps each layer's mean rank, whose spread is about (L - 1) / (P - 1)
    # of the variance of a map with no layer structure: chance is ~0.07 there, ~0 across all units
    assert 0.0 < pair.rho.nulls["within_layers"].null_mean < 0.15
    assert abs(pair.rho.nulls["all_units"].null_mean) < 0.03
    np.testing.assert_allclose(result.matrix, np.ones((2, 2)))
    assert compare.compare_maps(data, ["heads.a", "heads.b"], n_perm=200).pairs[0].rho.nulls[
        "all_units"].band_lo == pair.rho.nulls["all_units"].band_lo  # seeded: the same answer twice


def test_a_map_and_its_negation_and_the_minus_flip():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(8, L, K))
    data = one_method(8, rng, **{"heads.a": a, "heads.neg": -a})
    result = compare.compare_maps(data, ["heads.a", "heads.neg", "-heads.neg"], n_perm=100)
    rho = {(p.a, p.b): p for p in result.pairs}
    assert rho[("heads.a", "heads.neg")].rho.observed == pytest.approx(-1.0)
    assert rho[("heads.a", "heads.neg")].overlap == 0.0
    assert rho[("heads.a", "heads.neg")].rho.nulls["all_units"].p_value == pytest.approx(1.0)  # one-sided
    assert rho[("heads.a", "-heads.neg")].rho.observed == pytest.approx(1.0)
    assert rho[("heads.a", "-heads.neg")].overlap == pytest.approx(1.0)
    assert rho[("heads.neg", "-heads.neg")].rho.observed == pytest.approx(-1.0)
    assert result.labels == ["heads.a", "heads.neg", "-heads.neg"]
    assert result.matrix[0, 1] == pytest.approx(-1.0) and result.matrix[2, 0] == pytest.approx(1.0)
    assert any("heads.a and heads.neg rank the units in opposite orders" in n and "leading '-'" in n
               for n in result.notes)


@pytest.mark.parametrize("seed", range(5))
def test_independent_maps_are_chance(seed):
    rng = np.random.default_rng(100 + seed)
    data = one_method(24, rng, **{"heads.a": rng.normal(size=(24, L, K)), "heads.b": rng.normal(size=(24, L, K))})
    (pair,) = compare.compare_maps(data, ["heads.a", "heads.b"], n_perm=300).pairs
    # 24 pairs of 72 independent units: rho's sd is about 1 / sqrt(71 * 24) = 0.024
    assert abs(pair.rho.observed) < 0.1 and pair.overlap < 0.35
    for null in pair.rho.nulls.values():
        assert abs(null.null_mean) < 0.02 and null.band_lo < 0 < null.band_hi
        assert null.p_value > 0.005  # the data are seeded: this is fixed, not flaky


def test_the_null_keeps_each_maps_agreement_across_runs():
    """Every run of a shares one profile, every run of b another, unrelated: independent shuffles
    of each run would give a band ~sqrt(24) too narrow; one relabelling per map keeps the band of
    one pair of maps, and the chance agreement of the two profiles stays inside it."""
    rng = np.random.default_rng(7)
    pa, pb = rng.normal(size=(L, K)), rng.normal(size=(L, K))
    a = pa + 0.05 * rng.normal(size=(24, L, K))
    b = pb + 0.05 * rng.normal(size=(24, L, K))
    data = one_method(24, rng, **{"heads.a": a, "heads.b": b})
    (pair,) = compare.compare_maps(data, ["heads.a", "heads.b"], n_perm=500).pairs
    single = spearmanr(pa.ravel(), pb.ravel())[0]
    assert pair.rho.observed == pytest.approx(single, abs=0.03)
    band = pair.rho.nulls["all_units"]
    assert band.band_hi - band.band_lo > 0.35  # ~ 4 / sqrt(71), the band of ONE pair of maps
    assert band.band_lo < pair.rho.observed < band.band_hi


@pytest.mark.parametrize("gather", [False, True])
def test_each_null_value_is_the_statistic_of_relabelled_maps(monkeypatch, gather):
    """The shortcut (sum_j M[j, sigma(j)], or the gathered rows for large maps) gives, for every
    draw, the mean Spearman of the maps relabelled by that draw: one permutation per map, shared
    by its runs (map 0's is the identity), within layers or across all units."""
    if gather:
        monkeypatch.setattr(relabel, "CROSS_ELEMENTS", 0)
    rng = np.random.default_rng(9)
    maps = {f"heads.m{i}": rng.normal(size=(5, L, K)) for i in range(3)}
    data = one_method(5, rng, **maps)
    result = compare.compare_maps(data, list(maps), n_perm=6, seed=3)
    draws = np.random.default_rng(3)
    for null in ("within_layers", "all_units"):
        perms = relabel._null_perms(draws, 6, 3, L, K, null)  # (6, 3, 72), drawn as compare_maps does
        assert (perms[:, 0] == np.arange(L * K)).all()
        if null == "within_layers":
            assert (np.sort(perms.reshape(6, 3, L, K), axis=-1) == np.arange(L * K).reshape(L, K)).all()
        for pair in result.pairs:
            a, b = (int(name[-1]) for name in (pair.a, pair.b))
            flat_a, flat_b = maps[pair.a].reshape(5, -1), maps[pair.b].reshape(5, -1)
            expected = [np.mean([spearmanr(flat_a[q][perms[c, a]], flat_b[q][perms[c, b]])[0] for q in range(5)])
                        for c in range(6)]
            np.testing.assert_allclose(pair.rho.nulls[null].null, expected, atol=1e-6)


def test_ties_are_broken_at_random_in_the_top_k():
    """Binary maps tie most units: two unrelated ones overlap by chance, not by unit index."""
    rng = np.random.default_rng(10)
    a, b = (rng.random((40, L, K)) < 0.5) * 1.0, (rng.random((40, L, K)) < 0.5) * 1.0
    data = one_method(40, rng, **{"heads.a": a, "heads.b": b})
    result = compare.compare_maps(data, ["heads.a", "heads.b"], n_perm=0, top=0.2)
    assert result.pairs[0].overlap == pytest.approx(result.chance_overlap, abs=0.06)


# --------------------------------------------------------------------------- matching runs


def _two_methods(rng: np.random.Generator):
    """head_gates (2 lambdas) and head_importance runs of tasks a/b x seeds 0-2 (the same fine-tune):
    log_alpha and importance share a per-(task, seed) profile, unrelated across tasks and seeds."""
    configs, alpha, importance, profiles = [], [], [], {}
    for task in "ab":
        for seed in range(3):
            profiles[(task, seed)] = rng.normal(size=(L, K))
            for lam in (0.01, 0.1):
                configs.append({"method": "head_gates", "seed": seed, "task": {"name": task},
                                "head_gates": {"lambda": lam}, "init_from": {"method": "finetune"}})
            configs.append({"method": "head_importance", "seed": seed, "task": {"name": task},
                            "head_importance": {"n_examples": 100}, "init_from": {"method": "finetune"}})
    for c in configs:
        noise = rng.normal(scale=0.2, size=(L, K))
        values = profiles[(c["task"]["name"], c["seed"])] + noise
        gates, imp = c["method"] == "head_gates", c["method"] == "head_importance"
        alpha.append(values if gates else np.full((L, K), np.nan))
        importance.append(values if imp else np.full((L, K), np.nan))
    methods = np.array([c["method"] for c in configs])
    return synthetic(configs, {"heads.log_alpha": (np.stack(alpha), methods == "head_gates"),
                               "heads.importance": (np.stack(importance), methods == "head_importance")})


def test_matched_runs_are_the_same_task_and_seed_of_another_method():
    data = _two_methods(np.random.default_rng(3))
    keys = maps.matching_keys(data)
    assert keys == ["seed", "task.name"]  # not method, not head_gates.lambda, not head_importance.n_examples
    has_a, has_b = data.map("heads.log_alpha")[1], data.map("heads.importance")[1]
    pairs = maps.matched_pairs(data, has_a, has_b, keys)
    assert len(pairs) == 12  # 6 (task, seed) x 2 lambdas, each with the one importance run
    for i, j in pairs:
        assert data.method[i] == "head_gates" and data.method[j] == "head_importance"
        assert (data.task[i], data.seed[i]) == (data.task[j], data.seed[j])
    result = compare.compare_maps(data, ["heads.log_alpha", "heads.importance"], n_perm=200)
    (pair,) = result.pairs
    assert pair.n_pairs == 12 and pair.n_same_run == 0 and result.matched_on == ["seed", "task.name"]
    assert pair.rho.observed > 0.9 and pair.rho.nulls["within_layers"].p_text == "p < 0.005"
    assert result.n_runs == [12, 6] and "12 pairs of matched runs" in pair.rho.pooled


def test_a_run_with_both_maps_is_compared_with_itself():
    rng = np.random.default_rng(4)
    data = _two_methods(rng)
    alpha, has = data.map("heads.log_alpha")
    both = replace(data, _overrides=MappingProxyType({**data._overrides, "heads.gate": ((alpha > 0) * 1.0, has)}))
    (pair,) = compare.compare_maps(both, ["heads.gate", "heads.log_alpha"], n_perm=0).pairs
    assert pair.n_pairs == pair.n_same_run == 12 and pair.rho.nulls == {}
    expected = np.mean([spearmanr((alpha[i] > 0).ravel(), alpha[i].ravel())[0] for i in np.flatnonzero(has)])
    assert pair.rho.observed == pytest.approx(expected)


def test_maps_with_no_matched_runs_say_why():
    rng = np.random.default_rng(5)
    configs = [{"method": m, "seed": s, "task": {"name": t}} for m, t in (("x", "a"), ("y", "b")) for s in range(3)]
    first = np.arange(6) < 3
    data = synthetic(configs, {"heads.x": (rng.normal(size=(6, L, K)), first),
                               "heads.y": (rng.normal(size=(6, L, K)), ~first)})
    with pytest.raises(QueryError, match=r"no pair of maps has matched runs .*heads.x and heads.y: no matched "
                                         r"runs \(their runs never share a value of task.name\)"):
        compare.compare_maps(data, ["heads.x", "heads.y"])


@pytest.mark.parametrize(("maps", "kwargs", "message"), [
    (["heads.a", "heads.importanc"], {}, r"unknown map 'heads.importanc'; did you mean 'heads.importance'\? "
                                         r"\(maps: heads.a, heads.importance, neurons.p\)"),
    (["heads.a", "neurons.p"], {}, r"maps of different kinds: heads.a \(heads\), neurons.p \(neurons\)"),
    (["heads.a"], {}, "give two or more maps"),
    (["heads.a", "heads.importance"], {"across": "task"}, "across compares one map"),
    (["heads.a", "-"], {}, "empty map name"),
    (["heads.a", "heads.a"], {}, "named twice"),
    (["heads.a", "heads.importance"], {"top": 0.0}, r"top must be a fraction of the units in \(0, 1\]"),
    (["heads.a", "heads.importance"], {"top": 10}, r"got 10 \(e.g. 0.1"),
    (["heads.a"], {"across": "tsk"}, "unknown across 'tsk'; did you mean 'task'"),
    (["heads.a"], {"across": "model"}, "needs at least 2 values of model"),
])
def test_bad_questions_are_one_line(maps, kwargs, message):
    rng = np.random.default_rng(6)
    data = one_method(4, rng, **{"heads.a": rng.normal(size=(4, L, K)), "heads.importance": rng.normal(size=(4, L, K)),
                                 "neurons.p": rng.normal(size=(4, L, 30))})
    with pytest.raises(QueryError, match=message):
        compare.compare_maps(data, maps, **kwargs)


def test_maps_of_different_shapes_are_refused():
    rng = np.random.default_rng(8)
    big = np.full((4, L, K), np.nan)
    big[:2] = rng.normal(size=(2, L, K))
    big[2:, :2, :4] = rng.normal(size=(2, 2, 4))  # two runs of a 2 x 4 model
    data = one_method(4, rng, **{"heads.a": big, "heads.b": big.copy()})
    with pytest.raises(QueryError, match="heads.a: runs of different sizes in the selection"):
        compare.compare_maps(data, ["heads.a", "heads.b"])
    small = one_method(2, rng, **{"heads.a": rng.normal(size=(2, L, K)), "heads.b": rng.normal(size=(2, 2, 4))})
    with pytest.raises(QueryError, match=r"maps of different shapes: heads.a \(6, 12\), heads.b \(2, 4\)"):
        compare.compare_maps(small, ["heads.a", "heads.b"])


# --------------------------------------------------------------------------- across an axis (real registry)


def test_across_task_on_the_registry_sweep(data):
    """conftest's sweep: two tasks with unrelated head profiles, in 4 settings of lambda x pipeline."""
    result = compare.compare_maps(data, ["heads.log_alpha"], across="task", n_perm=200)
    assert result.labels == [CLS, TAG] and result.matrix.shape == (2, 2) and result.n_runs == [12, 12]
    np.testing.assert_allclose(np.diag(result.matrix), 1.0)
    assert set(result.matched_on) == {"head_gates.lambda", "head_gates.pipeline", "init_from.method"}
    values, has = data.map("heads.log_alpha")
    expected = []
    for pipeline in ("dp", "sp"):
        for lam in (0.01, 0.1):
            means = [values[has & (data.task == t) & (data.axis("pipeline") == pipeline) & np.isclose(data.axis("lambda"), lam)]
                     .mean(axis=0) for t in (CLS, TAG)]
            expected.append(spearmanr(means[0].ravel(), means[1].ravel())[0])
    (pair,) = result.pairs
    assert pair.n_pairs == 4 and pair.rho.observed == pytest.approx(np.mean(expected), abs=1e-9)
    assert result.matrix[0, 1] == result.matrix[1, 0] == pytest.approx(pair.rho.observed)
    within = pair.rho.nulls["within_layers"]
    assert within.band_lo < pair.rho.observed < within.band_hi and within.p_value > 0.05  # unrelated tasks


def test_across_seed_has_a_seed_by_seed_matrix(data):
    result = compare.compare_maps(data, ["-heads.log_alpha"], across="seed", n_perm=100)
    assert result.labels == ["0", "1", "2"] and result.matrix.shape == (3, 3) and len(result.pairs) == 3
    np.testing.assert_allclose(np.diag(result.matrix), 1.0)
    # seeds of one cell keep the same heads (log_alpha: 2 levels + noise, so rho ~0.6); the flip changes nothing
    assert (result.matrix > 0.5).all()
    assert all(p.rho.nulls["all_units"].p_text == "p < 0.01" for p in result.pairs)
    assert result.mean_offdiag.observed == pytest.approx(np.mean([p.rho.observed for p in result.pairs]))


# --------------------------------------------------------------------------- CLI, service, figures (real registry)


@pytest.fixture(scope="module")
def methods_sweep(tmp_path_factory):
    """A registry sweep of head_gates SP and imp runs that start from the same fine-tunes (2 tasks x
    3 seeds): log_alpha (head_gates) and importance (imp) share a per-(task, seed) profile, and the
    ablation delta is its negation; imp runs also store a layers map."""
    from experiments.harness.config import parse_config

    rng = np.random.default_rng(11)
    url = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'registry.db'}"
    base = {"model": "minilm-l6", "train": {"max_steps": 10}}
    cells = [(t, s) for t in (CLS, TAG) for s in range(3)]
    gates = {(t, s, lam): parse_config({**base, "method": "head_gates", "seed": s, "task": {"name": t},
                                        "head_gates": {"pipeline": "sp", "lambda": lam}})
             for t, s in cells for lam in (0.01, 0.1)}
    imps = {(t, s): parse_config({**base, "method": "imp", "seed": s, "task": {"name": t}}) for t, s in cells}
    with Registry(url) as registry:
        sweep_id, _ = registry.create_sweep("compare", "name: compare\n", [*gates.values(), *imps.values()],
                                            {"cpus": 1.0}, None, 1)
        upstreams = {cfg.upstreams["init_from"].run_key for cfg in [*gates.values(), *imps.values()]}
        assert len(upstreams) == 6  # one fine-tune per task and seed, shared by both methods
        for key in upstreams:
            assert registry.claim(key, "w") is not None and registry.finish(key, {"accuracy": 0.8})
        profiles = {cell: rng.normal(size=(L, K)) for cell in cells}
        for (t, s, _), cfg in gates.items():
            alpha = profiles[(t, s)] + rng.normal(scale=0.3, size=(L, K))
            assert registry.claim(cfg.run_key, "w") is not None
            assert registry.finish(cfg.run_key, {"accuracy": 0.7},
                                   maps={"heads.gate": (alpha > 0).astype(np.float32), "heads.log_alpha": alpha})
        for (t, s), cfg in imps.items():
            importance = profiles[(t, s)] + rng.normal(scale=0.3, size=(L, K))
            assert registry.claim(cfg.run_key, "w") is not None
            assert registry.finish(cfg.run_key, {"accuracy": 0.7}, maps={
                "heads.importance": importance, "heads.ablation_delta": -importance,
                "layers.ablation_delta": rng.normal(size=(L, 1))})
    return url, sweep_id


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="headsweep")
    questions.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(common.out, "_width", 250)


def test_cli_table_with_a_flipped_map_and_the_figure(methods_sweep, tmp_path, capsys):
    url, sweep_id = methods_sweep
    png = tmp_path / "methods.png"
    assert _run("compare-maps", sweep_id, "heads.log_alpha", "heads.importance", "-heads.ablation_delta",
                "--n-perm", "200", "--png", str(png), "--db", url) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "maps: Spearman rho and top 8 of 72 units" in text and "200 permutations per null" in text
    assert "compared only runs equal on: seed, task.name" in text
    # log_alpha vs importance: 12 pairs of matched runs; importance vs -ablation_delta: the same 6 runs
    assert "heads.log_alpha heads.importance 12 0." in text and "heads.importance -heads.ablation_delta 6 1.000" in text
    rho_table, rest = text.split("mean rho over the 3 pairs")  # rho's table, then its mean and other statistics'
    assert rho_table.count("p < 0.005") == 3 * 2 and rest.split("maps:")[0].count("p < 0.005") == 2  # the mean's
    assert "in layers" in text and "all units" in text
    image = matplotlib.image.imread(png)
    assert png.read_bytes()[:8] == PNG_MAGIC and image.shape[0] > 400 and image.shape[1] > 500


def test_cli_json_and_csv(methods_sweep, capsys):
    url, sweep_id = methods_sweep
    argv = ("compare-maps", sweep_id, "heads.log_alpha", "heads.importance", "--n-perm", "50", "--top", "0.2",
            "--db", url)
    assert _run(*argv, "--format", "json") == 0
    answer = json.loads(capsys.readouterr().out)
    assert {"sweep", "maps", "labels", "matrix", "pairs", "mean_offdiag", "k", "chance_overlap", "matched_on",
            "notes", "models", "tasks", "shape", "top"} <= set(answer)
    (pair,) = answer["pairs"]
    assert answer["k"] == 15 and answer["shape"] == [6, 12] and answer["tasks"] == [CLS, TAG]
    assert pair["n_pairs"] == 12 and pair["rho"] > 0.8 and [n["null"] for n in pair["nulls"]] == ["within_layers", "all_units"]
    assert pair["nulls"][0]["p_text"] == "p < 0.02" and pair["overlap"] > 3 * answer["chance_overlap"]
    assert _run(*argv, "--format", "csv") == 0
    (row,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert row["a"] == "heads.log_alpha" and float(row["rho"]) == pytest.approx(pair["rho"])
    assert float(row["p_value_all_units"]) == pytest.approx(pair["nulls"][1]["p_value"])
    assert int(row["top_k"]) == 15 and float(row["chance_overlap"]) == pytest.approx(15 / 72)


def test_cli_across_task_and_bad_input(methods_sweep, capsys):
    url, sweep_id = methods_sweep
    assert _run("compare-maps", sweep_id, "heads.importance", "--across", "task", "--n-perm", "20",
                "--db", url) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "heads.importance across task" in text and f"{CLS} {TAG} 1" in text  # seed-mean maps: 1 setting
    with pytest.raises(ConfigError, match=r"unknown map 'heads.importanc'; did you mean 'heads.importance'\? "
                                          r"\(maps: heads.ablation_delta, heads.gate, heads.importance"):
        _run("compare-maps", sweep_id, "heads.log_alpha", "heads.importanc", "--db", url)
    with pytest.raises(ConfigError, match=r"maps of different kinds: heads.importance \(heads\), "
                                          r"layers.ablation_delta \(layers\)"):
        _run("compare-maps", sweep_id, "heads.importance", "-layers.ablation_delta", "--db", url)


def test_headsweep_main_takes_a_flipped_map_as_a_map(methods_sweep, capsys):
    """Through the real top-level parser: '-heads.ablation_delta' is a map, not an unknown option."""
    from headsweep.cli import main

    url, sweep_id = methods_sweep
    assert main(["compare-maps", "last", "heads.importance", "-heads.ablation_delta", "--n-perm", "0",
                 "--format", "json", "--db", url]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["labels"] == ["heads.importance", "-heads.ablation_delta"] and answer["pairs"][0]["rho"] == 1.0
    assert main(["compare-maps", "last", "heads.importance", "--db", url]) == 2
    assert "give two or more maps" in capsys.readouterr().err


def test_service_endpoint_equals_the_query(methods_sweep):
    from fastapi.testclient import TestClient

    from analysis.views.service.app import build_app

    url, sweep_id = methods_sweep
    params = {"maps": "heads.log_alpha,heads.importance,-heads.ablation_delta", "n_perm": 50}
    with TestClient(build_app(url)) as client, Registry(url) as registry:
        body = client.get(f"/sweeps/{sweep_id}/compare-maps", params=params)
        assert body.status_code == 200, body.text
        expected = answers.compare_json(compare.compare_maps(
            load_sweep(registry, sweep_id), params["maps"].split(","), n_perm=50))
        assert body.json() == json.loads(json.dumps(expected))
        across = client.get("/sweeps/last/compare-maps", params={"maps": "heads.importance", "across": "task",
                                                                   "n_perm": 10, "task": f"{CLS},{TAG}"})
        assert across.status_code == 200 and across.json()["labels"] == [CLS, TAG]
        for query, status, detail in [
            ({"maps": "heads.log_alpha,heads.importanc"}, 400, "did you mean 'heads.importance'? (maps: "),
            ({"maps": "heads.importance,layers.ablation_delta"}, 400, "maps of different kinds"),
            ({"maps": "heads.importance"}, 400, "give two or more maps"),
            ({"maps": "heads.importance", "across": "tsk"}, 400, "unknown across 'tsk'"),
            ({"maps": "heads.log_alpha,heads.importance", "top": 2}, 422, "query parameter 'top'"),
            ({"maps": "heads.log_alpha,heads.importance", "mpas": "x"}, 400, "unknown query parameter 'mpas'"),
            ({}, 422, "query parameter 'maps'"),
        ]:
            response = client.get(f"/sweeps/{sweep_id}/compare-maps", params=query)
            assert response.status_code == status, (query, response.text)
            assert detail in response.json()["detail"] and isinstance(response.json()["detail"], str)


def test_figures_include_the_method_matrix(methods_sweep, tmp_path):
    url, sweep_id = methods_sweep
    with Registry(url) as registry:
        data = load_sweep(registry, sweep_id)
    plan = {name: (kind, params) for name, kind, params in figure_plan.figure_plan(data)}
    # heads.gate goes with its continuous companion heads.log_alpha: not drawn twice; one layers map: none
    assert plan["compare_maps_heads.png"] == (
        "compare_maps", {"maps": ["heads.ablation_delta", "heads.importance", "heads.log_alpha"]})
    assert not any(name.startswith("compare_maps_layers") for name in plan)
    png = figure_plan.figure(data, "compare_maps", maps=plan["compare_maps_heads.png"][1]["maps"], n_perm=50)
    (tmp_path / "compare.png").write_bytes(png)
    image = matplotlib.image.imread(tmp_path / "compare.png")
    assert image.shape[0] > 400 and image.shape[1] > 600
    title = compare_figure.title(compare.compare_maps(data, plan["compare_maps_heads.png"][1]["maps"], n_perm=50))
    assert title.startswith(f"{sweep_id}: minilm-l6; {CLS}, {TAG}") and "Spearman rho (null mean" in title


def test_select_module_is_reused_for_names(methods_sweep):
    """The map suggestion is the one every analysis question gives (analysis.data.loading / select)."""
    url, sweep_id = methods_sweep
    with Registry(url) as registry:
        data = load_sweep(registry, sweep_id)
    with pytest.raises(QueryError) as compared:
        compare.compare_maps(data, ["heads.importanc", "heads.log_alpha"])
    with pytest.raises(QueryError) as stacked:
        select.map_stack(data, "heads.importanc")
    assert str(compared.value) == str(stacked.value)
