"""prompt_transfer: the overlap maths by hand, its stages (a grid shares each task's prompt), its
checks, and the method end to end on a tiny random model through real stages."""

import copy
import math

import pytest
import torch

from base.sections import ConfigError
from experiments import RunContext, parse_config, run
from experiments.harness.config import apply_overrides
from experiments.maths.transfer import chance_overlap, overlap
from experiments.training.tracking import MemoryTracker
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry.stages import with_upstreams

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 48, "num_eval": 32, "max_length": 16},
    "train": {"max_steps": 3, "batch_size": 16, "eval_every": 3},
}
PROMPTS = {"prompt_length": 2, "prune_fraction": None, "perturb_fractions": [0.1]}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(source_task=None, **keys):
    section = {"source_task": source_task, "skill_neurons": PROMPTS, "perturb_fractions": [0.1], **keys}
    return parse_config({**copy.deepcopy(TINY), "method": "prompt_transfer", "prompt_transfer": section})


# ------------------------------------------------------------------------------ maths


def test_overlap_is_the_shared_fraction_of_equal_sets_and_a_cosine_otherwise():
    a = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)  # 3 units
    b = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)  # 3 units, 1 shared
    assert overlap(a, b) == pytest.approx(1 / 3) and overlap(a, a) == 1.0
    c = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)  # 1 unit, shared with a
    assert overlap(a, c) == pytest.approx(1 / math.sqrt(3))
    assert math.isnan(overlap(a, torch.zeros_like(a)))
    # chance, B shuffled within rows of 4: row 0 holds 2 of A and 2 of B -> 2 * 2 / 4 shared, row 1: 1 * 1 / 4
    assert chance_overlap(a, b) == pytest.approx((2 * 2 + 1 * 1) / 4 / 3)
    assert chance_overlap(a, c) == pytest.approx((2 * 1 + 1 * 0) / 4 / math.sqrt(3))
    # (P, L, I): rows are (position, layer)
    p = torch.stack([a, b])
    q = torch.stack([b, a])
    assert overlap(p, q) == pytest.approx(2 / 6) and chance_overlap(p, q) == pytest.approx((4 + 1 + 4 + 1) / 4 / 6)
    with pytest.raises(ValueError, match="bool masks of one shape"):
        overlap(a, b.float())


# ------------------------------------------------------------------------------ stages and checks


def test_a_grid_over_task_and_source_task_trains_each_prompt_once_per_seed():
    spec = parse_grid({"name": "transfer", "base": {"method": "prompt_transfer", "model": "tiny-bert"},
                       "axes": {"seed": [0, 1], "task": ["synthetic-cls", "synthetic-shortcut"],
                                "source_task": ["synthetic-cls", "synthetic-shortcut"]}})
    cells = expand(spec)
    keyed, edges = with_upstreams(cells)
    upstream = {up for _, _, up in edges}
    assert len(cells) == 8 and len(keyed) == 8 + 4 and len(upstream) == 4  # 2 tasks x 2 seeds
    assert all(keyed[key].method == "skill_neurons" for key in upstream)
    by_cell = {(c.seed, c.task.name, c.section.source_task): c for c in cells}
    cell = by_cell[(1, "synthetic-shortcut", "synthetic-cls")]
    assert cell.upstreams["init_from"].task.name == "synthetic-shortcut"
    assert cell.upstreams["source"].run_key == by_cell[(1, "synthetic-cls", "synthetic-cls")].upstreams["init_from"].run_key
    diagonal = by_cell[(0, "synthetic-cls", "synthetic-cls")]
    assert diagonal.upstreams["source"].run_key == diagonal.upstreams["init_from"].run_key  # one run, two roles
    default = parse_config({"method": "prompt_transfer", "model": "tiny-bert"})  # no source_task: its own task
    assert default.source == {"method": "skill_neurons"} == default.init_from
    assert default.upstreams["source"].run_key == diagonal.upstreams["init_from"].run_key
    # the prompts' keys reach both stages (--set and grids address them as any key)
    words = parse_config(apply_overrides({"method": "prompt_transfer", "model": "tiny-bert"},
                                         ["source_task=sst2", "prompt_transfer.skill_neurons.verbalizer=label_words"]))
    assert words.init_from == {"method": "skill_neurons", "skill_neurons": {"verbalizer": "label_words"}}
    assert {up.section.verbalizer for up in words.upstreams.values()} == {"label_words"}


def test_the_example_grid_shares_nine_prompts(shared_data):
    from pathlib import Path

    from orchestrator.driving.grid import load_grid

    spec = load_grid(Path(__file__).resolve().parents[2] / "examples" / "grid_skill_transfer.yaml")
    cells = expand(spec)
    keyed, edges = with_upstreams(cells)
    assert len(cells) == 27 + 9 and len(keyed) == 27 + 9 + 9  # the includes: the diagonal at noise 0.5
    assert sorted({(keyed[up].task.name, keyed[up].seed) for _, _, up in edges}) == [
        (task, seed) for task in ("sst2", "synthetic-cls", "synthetic-shortcut") for seed in (0, 1, 2)]


def test_a_file_task_s_keys_stay_with_the_target():
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "examples" / "data"
    cfg = parse_config({"method": "prompt_transfer", "model": "tiny-bert", "prompt_transfer": {"source_task": "synthetic-cls"},
                        "task": {"name": "classification", "data_dir": str(data), "train": "feedback_train.csv",
                                 "dev": "feedback_dev.csv"}})
    source = cfg.upstreams["source"].task
    assert source.name == "synthetic-cls" and source.train is None and source.dev is None
    assert cfg.upstreams["init_from"].task == cfg.task


@pytest.mark.parametrize(("change", "message"), [
    ({"prompt_transfer": {"source_task": "sst"}}, r"^prompt_transfer.source_task: unknown task 'sst'; did you mean 'sst2'"),
    ({"prompt_transfer": {"source_task": "synthetic-tag"}}, r"^source.task.name: skill_neurons needs a sentence classification"),
    ({"init_from": {"method": "finetune"}}, r"^init_from.method: prompt_transfer reads the prompt of a skill_neurons run, "
                                            "not finetune"),
    ({"source": {"method": "skill_neurons", "task": {"name": "synthetic-shortcut"}}, "prompt_transfer": {"source_task": "sst2"}},
     r"^source.task.name: the source stage is on 'synthetic-shortcut', source_task says 'sst2'"),
    ({"source": {"method": "skill_neurons", "skill_neurons": {"prompt_length": 4}}},
     r"^source.skill_neurons: the prompts' runs take prompt_transfer.skill_neurons, this stage differs in prompt_length$"),
    ({"prompt_transfer": {"skill_neurons": {"verbalizer": "label_words"}}, "init_from": {"method": "skill_neurons"}},
     r"^init_from.skill_neurons: the prompts' runs take prompt_transfer.skill_neurons, this stage differs in verbalizer$"),
    ({"source": {"method": "skill_neurons", "train": {"epochs": 3}}},
     r"^source.train: the two prompts must be trained alike, the stages differ in train.epochs$"),
    ({"init_from": {"method": "skill_neurons", "task": {"name": "synthetic-shortcut"}}},
     r"^init_from.task: the target prompt must be trained on this run's task 'synthetic-cls'"),
    ({"source": {"method": "skill_neurons", "model": "tiny-roberta"}}, r"^source.model: the prompts must be of this run's model"),
    ({"model": "random:tiny-bert", "source": {"method": "skill_neurons", "seed": 1}},
     r"^source.seed: a random-init model \(random:tiny-bert\) is another network for each seed"),
])
def test_what_cannot_be_compared_fails_at_validation(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"method": "prompt_transfer", "model": "tiny-bert", **change})
    parse_config({"method": "prompt_transfer", "model": "tiny-bert", "source": {"method": "skill_neurons", "seed": 1}})


# ------------------------------------------------------------------------------ the run


def test_a_pair_and_the_diagonal_end_to_end():
    """Two skill_neurons runs (synthetic-cls, synthetic-shortcut), then three transfers from one store:
    shortcut -> cls, and cls -> cls (its stages one run) at noise 0.1 and 0.5 (no prompt trained again)."""
    diagonal, pair, louder = _cfg(), _cfg(source_task="synthetic-shortcut"), _cfg(noise_std=0.5)
    chain, edges = with_upstreams([diagonal, pair, louder])
    assert len(chain) == 2 + 3 and diagonal.upstreams["source"].run_key == diagonal.upstreams["init_from"].run_key
    assert louder.upstreams["init_from"].run_key == diagonal.upstreams["init_from"].run_key
    store, results, trackers = {}, {}, {}
    for key, step in chain.items():
        trackers[key] = MemoryTracker()
        ctx = RunContext(tracker=trackers[key], load_upstream=lambda role, step=step: store[step.upstreams[role].run_key],
                         save_weights=lambda weights, key=key: store.__setitem__(key, weights))
        results[key] = run(step, ctx)
    target = results[diagonal.upstreams["init_from"].run_key].metrics

    same = results[diagonal.run_key].metrics
    assert same["transfer_relative"] == 1.0 and same["transfer_accuracy"] == same["own_accuracy"]
    assert same["overlap_top20"] == 1.0 and same["overlap_active"] == 1.0
    assert same["active_fraction"] == same["active_fraction_source"]
    assert 0 < same["overlap_top20_chance"] < 1 and 0 < same["overlap_active_chance"] < 1
    # the target as trained, and the diagonal repeats the target run's own perturbation check
    assert same["accuracy"] == target["accuracy"]
    assert same["accuracy_noise_source_top_0.1"] == target["accuracy_noise_top_0.1"]
    assert same["accuracy_noise_source_random_0.1"] == target["accuracy_noise_random_0.1"]

    loud = results[louder.run_key].metrics
    assert loud["accuracy"] == same["accuracy"] and loud["overlap_top20"] == 1.0
    assert 0 <= loud["accuracy_noise_source_top_0.1"] <= 1

    moved = results[pair.run_key].metrics
    assert moved["accuracy"] == target["accuracy"]
    assert moved["transfer_relative"] == pytest.approx(moved["transfer_accuracy"] / moved["own_accuracy"])
    assert moved["own_accuracy"] == same["own_accuracy"]
    assert moved["active_fraction"] == same["active_fraction"]  # the target prompt's set, in eval mode both times
    for name in ("transfer_accuracy", "overlap_top20", "overlap_active", "accuracy_noise_source_top_0.1",
                 "accuracy_noise_source_random_0.1"):
        assert 0 <= moved[name] <= 1, name
    assert moved["overlap_top20"] < 1 and moved["overlap_active"] < 1  # two prompts, two tasks
    assert trackers[pair.run_key].metrics["overlap_top20"] == [(0, moved["overlap_top20"])]
