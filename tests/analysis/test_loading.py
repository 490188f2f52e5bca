"""analysis.data.loading on a real SQLite registry: maps by name, loaded lazily with one query each,
stored configs as columns, subsets, and the gates/has_gates/scores names of the head maps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from analysis.data.loading import clear_cache, load_sweep
from analysis.data.select import QueryError
from base.result import UnitMap
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry

GATES = np.arange(72, dtype=np.float32).reshape(6, 12) / 72


@pytest.fixture
def mixed(tmp_path):
    """6 runs: head_gates seeds 0-2 (finished with gate, log_alpha; seed 2 also a neuron map)
    and finetune seeds 0-2 (two finished with no map, one pending)."""
    clear_cache()
    configs = expand(parse_grid({"name": "t", "axes": {"seed": [0, 1, 2], "method": ["head_gates", "finetune"]}}))
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    sweep_id, _ = registry.create_sweep("t", "name: t\n", configs, {"cpus": 1.0}, None, 1)
    for cfg in configs:
        if cfg.method == "finetune" and cfg.seed == 2:
            continue  # stays pending
        registry.claim(cfg.run_key, "w")
        maps = {}
        if cfg.method == "head_gates":
            maps = {"heads.gate": UnitMap(GATES * cfg.seed, "heads", "gate"),
                    "heads.log_alpha": UnitMap(GATES - cfg.seed, "heads", "log_alpha")}
            if cfg.seed == 2:
                maps["neurons.predictivity"] = UnitMap(np.full((6, 1536), 0.5), "neurons", "probe accuracy")
        assert registry.finish(cfg.run_key, {"accuracy": 0.5 + cfg.seed / 10, "accuracy/ood": 0.4}, maps=maps)
    yield registry, sweep_id, configs
    registry.close()
    clear_cache()


def test_maps_load_by_name_on_first_use_with_one_query_each(mixed, count_selects):
    registry, sweep_id, _ = mixed
    data, selects = count_selects(registry, lambda: load_sweep(registry, sweep_id))
    assert not any("run_maps.data" in s for s in selects)  # no map read while loading the runs
    assert data.maps == ["heads.gate", "heads.log_alpha", "neurons.predictivity"]
    info = data.map_info["neurons.predictivity"]
    assert (info.kind, info.count, info.rows, info.cols) == ("neurons", 1, 6, 1536)

    (values, has), selects = count_selects(registry, lambda: data.map("neurons.predictivity"))
    assert len(selects) == 1 and values.shape == (6, 6, 1536)
    assert has.tolist() == [False, False, False, False, True, False] and (values[4] == 0.5).all()
    assert np.isnan(values[~has]).all() and not values.flags.writeable
    again, selects = count_selects(registry, lambda: data.map("neurons.predictivity"))
    assert selects == [] and again[0] is values  # kept with the cached sweep
    assert load_sweep(registry, sweep_id).map("neurons.predictivity")[0] is values


def test_gates_has_gates_and_scores_are_the_head_maps(mixed):
    registry, sweep_id, configs = mixed
    data = load_sweep(registry, sweep_id)
    assert data.method.tolist() == [c.method for c in configs]
    assert data.has_gates.tolist() == [True, False, True, False, True, False]  # finetune learns no gates
    np.testing.assert_array_equal(data.gates[2], GATES)
    np.testing.assert_array_equal(data.scores[4], GATES - 2)
    assert np.isnan(data.gates[1]).all() and data.gates is data.map("heads.gate")[0]
    lam, pipeline = data.axis("lambda"), data.axis("pipeline")  # label columns, by name
    assert np.isnan(lam[1]) and pipeline[1] == "" and lam[0] == 0.01
    gated = ("heads.gate", "heads.log_alpha")  # each run's stored maps, read without their data
    assert data.run_maps.tolist() == [gated, (), gated, (), (*gated, "neurons.predictivity"), ()]
    ood = data.metrics["accuracy/ood"]  # a metric with an evaluation-set suffix is a metric like any other
    assert ood[:5].tolist() == [0.4] * 5 and np.isnan(ood[5])


def test_a_sweep_without_gate_maps_still_answers_gates(tmp_path):
    clear_cache()
    configs = expand(parse_grid({"name": "t", "axes": {"seed": [0, 1], "method": ["finetune"]}}))
    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as registry:
        sweep_id, _ = registry.create_sweep("t", "", configs, {"cpus": 1.0}, None, 1)
        registry.claim(configs[0].run_key, "w")
        registry.finish(configs[0].run_key, {"accuracy": 0.9})
        data = load_sweep(registry, sweep_id)
        assert data.maps == [] and data.gates.shape == (2, 0, 0) and not data.has_gates.any()
        assert data.scores is None
        with pytest.raises(QueryError, match="unknown map 'heads.gate': no run of this sweep has stored a map"):
            data.map("heads.gate")
    clear_cache()


def test_unknown_map_names_the_nearest(mixed):
    registry, sweep_id, _ = mixed
    with pytest.raises(QueryError, match="unknown map 'heads.gates'; did you mean 'heads.gate'"):
        load_sweep(registry, sweep_id).map("heads.gates")


def test_stored_configs_are_flattened_columns(mixed):
    registry, sweep_id, configs = mixed
    data = load_sweep(registry, sweep_id)
    assert data.config["seed"].tolist() == [0, 0, 1, 1, 2, 2] and data.config["seed"].dtype == np.float64
    assert data.config["method"].tolist() == [c.method for c in configs] and data.config["method"].dtype == object
    assert data.config["train.lr"].tolist() == [c.train.lr for c in configs]
    lam = data.config["head_gates.lambda"]  # a key only head_gates runs have: NaN elsewhere
    assert lam[[0, 2, 4]].tolist() == [0.01] * 3 and np.isnan(lam[[1, 3, 5]]).all()


def test_subsets_keep_maps_lazy_and_aligned(mixed, count_selects):
    registry, sweep_id, _ = mixed
    data = load_sweep(registry, sweep_id)
    sel = data.subset(np.array([4, 0]))  # before any map was loaded
    (values, has), selects = count_selects(registry, lambda: sel.map("heads.gate"))
    assert len(selects) == 1 and has.tolist() == [True, True]
    np.testing.assert_array_equal(values, np.stack([GATES * 2, GATES * 0]))
    assert sel.config["seed"].tolist() == [2, 0] and sel.seed.tolist() == [2, 0]
    deeper = sel.subset(np.array([False, True]))
    np.testing.assert_array_equal(deeper.gates[0], GATES * 0)
    assert deeper.map("neurons.predictivity")[1].tolist() == [False]
    _, selects = count_selects(registry, lambda: data.map("heads.gate"))
    assert selects == []  # the subset's load is the sweep's


def test_replace_gates_overrides_the_head_gate_map(mixed):
    registry, sweep_id, _ = mixed
    data = load_sweep(registry, sweep_id)
    closed = np.zeros_like(data.gates)
    changed = replace(data, gates=closed)
    assert (changed.map("heads.gate")[0] == 0).all() and changed.has_gates.tolist() == data.has_gates.tolist()
    assert changed.subset(changed.has_gates).gates.shape == (3, 6, 12)
    assert (changed.subset(changed.has_gates).gates == 0).all()
    np.testing.assert_array_equal(changed.scores, data.scores)  # other maps untouched
    assert data.gates[2].max() > 0  # the original is unchanged


def test_a_map_read_after_the_runs_agrees_with_their_statuses(mixed):
    registry, sweep_id, configs = mixed
    data = load_sweep(registry, sweep_id)
    pending = configs[5].run_key
    registry.claim(pending, "w")
    registry.finish(pending, {}, maps={"heads.gate": UnitMap(GATES, "heads", "gate")})
    values, has = data.map("heads.gate")  # loaded now, after that finish
    assert data.status[5] == "pending" and not has[5] and np.isnan(values[5]).all()
    fresh = load_sweep(registry, sweep_id)
    assert fresh is not data and fresh.has_gates[5]
