"""Mask IoU across seeds and pipelines from stored masks, against chance (a real SQLite registry)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.data.loading import load_sweep
from analysis.data.select import QueryError
from analysis.questions.masks import flip_iou, mask_iou
from base.mask_format import pack_masks
from experiments.harness.config import parse_config
from orchestrator.registry import Registry

LAYERS, HEADS, HIDDEN = 2, 4, 8
NAMES = [f"layer.{layer}.{role}" for layer in range(LAYERS) for role in ("query", "key", "value", "attn_out")]


def _masks(rng: np.random.Generator, base: dict[str, np.ndarray], keep_same: float) -> dict[str, np.ndarray]:
    """Half the weights kept; each entry copied from ``base`` with probability ``keep_same``."""
    out = {}
    for name in NAMES:
        fresh = rng.random((HIDDEN, HIDDEN)) < 0.5
        out[name] = np.where(rng.random((HIDDEN, HIDDEN)) < keep_same, base[name], fresh)
    return out


@pytest.fixture
def sweep(tmp_path):
    """mask_train runs: 2 pipelines x 3 seeds; seeds of a pipeline share most of their mask."""
    rng = np.random.default_rng(0)
    configs, stored = [], {}
    base = {p: {n: rng.random((HIDDEN, HIDDEN)) < 0.5 for n in NAMES} for p in ("prune_only", "ft_then_prune")}
    for pipeline in ("prune_only", "ft_then_prune"):
        for seed in range(3):
            cfg = parse_config({"model": "tiny-bert", "method": "mask_train", "seed": seed,
                                "mask_train": {"pipeline": pipeline}}, check_files=False)
            configs.append(cfg)
            stored[cfg.run_key] = pack_masks(_masks(rng, base[pipeline], keep_same=0.8))
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    yield _finished_sweep(registry, "masks", configs, rng), stored
    registry.close()


def _finished_sweep(registry: Registry, name: str, configs: list, rng: np.random.Generator):
    """A sweep of ``configs`` in ``registry``, every run finished with a random density map; loaded."""
    sweep_id, _ = registry.create_sweep(name, "", configs, {"cpus": 1}, None, 1)
    for cfg in configs:
        registry.claim(cfg.run_key, "w")
        registry.finish(cfg.run_key, {"accuracy": 0.9}, worker="w",
                        maps={"heads.mask_density": rng.random((LAYERS, HEADS))})
    return load_sweep(registry, sweep_id)


def test_seeds_share_their_masks_beyond_chance(sweep):
    data, stored = sweep
    result = mask_iou(data, "seed", stored.get)
    assert result["pairs"] == 2 * 3 and result["runs"] == 6  # 3 seed pairs in each of 2 cells
    assert result["chance"] == pytest.approx(1 / 3, abs=0.05)  # two random halves: .25 / .75
    # 80 % copied from the cell's base mask: IoU of two such runs is ~ (.64 + .36 * 1/4 ...) well above chance
    assert result["iou"] > result["chance"] + 0.3 and result["excess"] == pytest.approx(result["iou"] - result["chance"])
    assert set(result["per_role"]) == {"query", "key", "value", "attn_out"} and len(result["per_role"]["key"]) == LAYERS
    assert result["labels"] == ["0", "1", "2"] and result["matrix"][0][0] is None


def test_pipelines_share_only_what_chance_gives(sweep):
    data, stored = sweep
    result = mask_iou(data, "pipeline", stored.get)
    assert result["pairs"] == 3 and "seed" in result["matched_on"]  # one pair per seed
    assert abs(result["iou"] - result["chance"]) < 0.08  # independent base masks


def test_runs_without_a_stored_mask_are_named_and_left_out(sweep):
    data, stored = sweep
    missing = dict(list(stored.items())[1:])
    result = mask_iou(data, "seed", missing.get)
    assert result["runs"] == 5 and "1 runs have no stored masks.npz" in result["notes"][0]
    with pytest.raises(QueryError, match="no pair of runs"):
        mask_iou(data, "seed", lambda key: None)
    with pytest.raises(QueryError, match="more than this answers"):
        mask_iou(data, "seed", stored.get, max_runs=2)


def test_the_cli_and_the_service_answer_from_the_store(sweep, tmp_path, monkeypatch, capsys):
    """``headsweep iou`` and ``/sweeps/{id}/mask-iou`` read the masks kept in the checkpoint store."""
    import json

    from fastapi.testclient import TestClient

    from analysis.views.service.app import build_app
    from headsweep.cli import main
    from orchestrator.checkpoints import CheckpointStore

    data, stored = sweep
    root = tmp_path / "store"
    monkeypatch.setenv("HEADSWEEP_CHECKPOINTS", root.as_uri())
    for key, packed in stored.items():
        CheckpointStore().put(key, "masks.npz", packed)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    expected = mask_iou(data, "seed", stored.get)
    answer = TestClient(build_app(url)).get("/sweeps/last/mask-iou", params={"across": "seed"})
    assert answer.status_code == 200 and answer.json()["iou"] == pytest.approx(expected["iou"])
    capsys.readouterr()
    assert main(["iou", "last", "--across", "seed", "--format", "json", "--db", url]) == 0
    assert json.loads(capsys.readouterr().out)["iou"] == pytest.approx(expected["iou"])


def test_a_mask_sweep_plans_its_density_agreement_and_no_open_heads_curves(sweep):
    from analysis.views import figure_plan

    data, _ = sweep
    plan = {name: (kind, params) for name, kind, params in figure_plan.figure_plan(data)}
    assert plan["agreement_seed_mask_density.png"] == ("agreement", {"across": "seed", "map": "heads.mask_density"})
    assert not any("open_heads" in name for name in plan)
    assert figure_plan.figure(data, "agreement", map="heads.mask_density", n_perm=20)[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- what training changed


def _flipped(rng, init: dict[str, np.ndarray], fraction: float, chosen: dict[str, np.ndarray] | None = None):
    """``init`` with ``fraction`` of each matrix's kept entries removed and as many removed ones kept
    (the density held, as mask training does); from ``chosen`` (entries in a fixed order) when given."""
    out = {}
    for name, mask in init.items():
        flat = mask.flatten().copy()
        kept, removed = np.flatnonzero(flat), np.flatnonzero(~flat)
        k = max(1, round(fraction * len(kept)))
        order_kept = chosen[name][0] if chosen else rng.permutation(kept)
        order_removed = chosen[name][1] if chosen else rng.permutation(removed)
        flat[order_kept[:k]], flat[order_removed[:k]] = False, True
        out[name] = flat.reshape(mask.shape)
    return out


def test_flip_iou_counts_the_same_flips_the_same_way():
    init = {"m": np.array([[True, True, False, False]])}
    a = {"m": np.array([[False, True, True, False]])}  # loses 0, gains 2
    b = {"m": np.array([[False, True, False, True]])}  # loses 0, gains 3
    result = flip_iou(a, b, init, init)
    assert result["iou"] == pytest.approx(1 / 3)  # shared: the loss of 0; union: 0, 2, 3
    assert result["chance"] == pytest.approx((1 * 1 / 2 + 1 * 1 / 2) / (2 + 2 - 1))  # g_a g_b / n0 + l_a l_b / n1
    assert result["flipped"] == (0.5, 0.5)
    assert np.isnan(flip_iou(init, init, init, init)["iou"])  # nothing changed: undefined


def test_flip_chance_is_the_mean_of_random_flips_of_the_same_counts():
    rng = np.random.default_rng(3)
    init = {n: rng.random((HIDDEN, HIDDEN)) < 0.5 for n in NAMES}
    draws = [flip_iou(_flipped(rng, init, 0.3), _flipped(rng, init, 0.3), init, init) for _ in range(400)]
    ratio = np.mean([d["iou"] for d in draws])
    assert draws[0]["chance"] == pytest.approx(ratio, abs=0.02)


@pytest.fixture
def seeds_from_one_start(tmp_path):
    """prune_only runs, 2 cells (sparsity) x 3 seeds, every seed starting from its cell's initial mask and
    changing a tenth of its kept entries: in cell 0.5 each seed flips entries of its own, in cell 0.7 the seeds flip
    the same entries."""
    rng = np.random.default_rng(1)
    configs, finals, initials = [], {}, {}
    for sparsity, agree in ((0.5, False), (0.7, True)):
        init = {n: rng.random((HIDDEN, HIDDEN)) < 0.5 for n in NAMES}
        shared = {n: (rng.permutation(np.flatnonzero(m)), rng.permutation(np.flatnonzero(~m))) for n, m in init.items()}
        for seed in range(3):
            cfg = parse_config({"model": "tiny-bert", "method": "mask_train", "seed": seed,
                                "mask_train": {"sparsity": sparsity}}, check_files=False)
            configs.append(cfg)
            initials[cfg.run_key] = pack_masks(init)
            finals[cfg.run_key] = pack_masks(_flipped(rng, init, 0.1, shared if agree else None))
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    yield _finished_sweep(registry, "flips", configs, rng), finals, initials
    registry.close()


def test_flips_tell_shared_initialisation_from_shared_training(seeds_from_one_start):
    """Both cells' kept weights agree far beyond the density chance (they share their start); only the
    cell whose seeds flip the same entries agrees beyond the flips' chance."""
    data, finals, initials = seeds_from_one_start
    for sparsity, agree in ((0.5, False), (0.7, True)):
        result = mask_iou(data, "seed", finals.get, {"mask_train.sparsity": sparsity}, load_initial=initials.get)
        assert result["iou"] > result["chance"] + 0.3 and result["chance"] == pytest.approx(1 / 3, abs=0.05)
        flips = result["flips"]
        assert flips["pairs"] == 3 and flips["flipped"] == pytest.approx(2 * 0.1 * 0.5, abs=0.03)
        if agree:
            assert flips["iou"] == 1.0 and flips["excess"] > 0.5
        else:
            assert abs(flips["excess"]) < 0.1 and flips["iou"] < 0.2
    no_initial = mask_iou(data, "seed", finals.get)
    assert no_initial["flips"] is None
    partial = mask_iou(data, "seed", finals.get, load_initial=lambda key: None)
    assert partial["flips"] is None and any("initial_masks.npz" in note for note in partial["notes"])
