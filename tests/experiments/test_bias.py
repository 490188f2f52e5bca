"""Bias features on tasks, the bias-only method (bias_only), bias_probs for dependants, and the
validation that stops a bias model on a task without bias features."""

import copy
import json
import zlib

import numpy as np
import pytest
import torch

from base.sections import ConfigError, TaskConfig
from experiments import RunContext, run
from experiments.components.bias import PREFIX, BiasModel, bias_probs, probs_of
from experiments.harness.config import parse_config
from experiments.methods import METHODS
from experiments.tasks import TASKS, bias_feature_names, classification
from experiments.training.tracking import MemoryTracker
from orchestrator.driving.grid import expand, parse_grid

SHORTCUT = {"name": "synthetic-shortcut", "num_train": 400, "num_eval": 200, "max_length": 24}
BIAS_ONLY = {"method": "bias_only", "model": "tiny-bert", "task": SHORTCUT, "train": {"eval_every": 100}}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def pairs(tmp_path):
    """A text-pair JSONL task (premise, hypothesis) with an ood set; the raw task section."""
    rows = [("a man rides a bike", "a man rides", "entailment"), ("a dog runs home", "the cat does not sleep", "neutral"),
            ("two kids play", "nobody plays", "contradiction")]  # fmt: skip
    for name in ("train", "dev", "ood"):
        lines = [json.dumps({"premise": p, "hypothesis": h, "label": y}) for p, h, y in rows * 2]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return {"name": "classification", "data_dir": str(tmp_path), "train": "train.jsonl", "dev": "dev.jsonl",
            "eval_sets": {"ood": "ood.jsonl"}, "text": ["premise", "hypothesis"]}  # fmt: skip


# --------------------------------------------------------------------------- bias features on tasks


def test_tasks_say_which_bias_features_they_define(tmp_path):
    assert bias_feature_names(TaskConfig(name="synthetic-shortcut")) == ("marker:london", "marker:paris")
    names = bias_feature_names(TaskConfig.model_validate(pairs(tmp_path)))
    assert names[:5] == classification.PAIR_FEATURES and len(names) == 5 + classification.HYPOTHESIS_BUCKETS
    for name in ("synthetic-cls", "synthetic-tag", "sst2", "ud-pos", "tagging"):
        with pytest.raises(ValueError, match=f"^task.name: task '{name}' defines no bias features .tasks that do: "
                                             "synthetic-shortcut, classification.$"):
            bias_feature_names(TaskConfig(name=name))
    with pytest.raises(ValueError, match="^task.text: task 'classification' defines bias features only for text pairs"):
        bias_feature_names(TaskConfig.model_validate(pairs(tmp_path) | {"text": "premise"}))


def test_pair_features_by_hand():
    rows = classification.pair_features([("A man rides a bike.", "a man rides"),
                                         ("A dog runs home", "the cat does not sleep"),
                                         ("two kids play", "kids don't play")])  # fmt: skip
    assert rows.shape == (3, 5 + classification.HYPOTHESIS_BUCKETS) and rows.dtype == torch.float32
    all_in, subsequence, overlap, negation, log_ratio = rows[:, :5].T
    assert all_in.tolist() == [1, 0, 0] and subsequence.tolist() == [1, 0, 0] and negation.tolist() == [0, 1, 1]
    assert overlap.tolist() == pytest.approx([1.0, 0.0, 2 / 3])
    assert log_ratio[0].item() == pytest.approx(np.log(4 / 6))
    bag = rows[:, 5:]
    hashed = [{zlib.crc32(w.encode()) % classification.HYPOTHESIS_BUCKETS for w in h.split()}
              for h in ("a man rides", "the cat does not sleep", "kids don't play")]
    assert [sorted(torch.nonzero(row).flatten().tolist()) for row in bag] == [sorted(b) for b in hashed]
    assert torch.equal(classification.pair_features([("x", "a man rides")])[0, 5:], bag[0])  # hypothesis only


def test_file_tasks_carry_features_for_pairs_only(tmp_path, minilm_tokenizer):
    data = classification.load(TaskConfig.model_validate(pairs(tmp_path)), minilm_tokenizer)
    for split in (data.train, data.dev, data.eval_sets["ood"]):
        assert split.features.shape == (6, 5 + classification.HYPOTHESIS_BUCKETS)
    single = classification.load(TaskConfig.model_validate(pairs(tmp_path) | {"text": "premise"}), minilm_tokenizer)
    assert single.train.features is None and single.eval_sets["ood"].features is None
    assert TASKS["synthetic-cls"].load(TaskConfig(num_train=4, num_eval=2), minilm_tokenizer).dev.features is None


# --------------------------------------------------------------------------- the bias-only method


def test_bias_only_learns_the_shortcut_rate_in_and_out_of_distribution():
    cfg = parse_config(BIAS_ONLY)
    assert "bias_only" in METHODS and cfg.section.steps == 300 and cfg.labels()["pipeline"] is None
    tracker, handed = MemoryTracker(), []
    result = run(cfg, RunContext(tracker=tracker, save_weights=handed.append))
    metrics = result.metrics
    assert metrics["accuracy"] == pytest.approx(0.9) and metrics["train_accuracy"] == pytest.approx(0.9)
    assert metrics["accuracy/ood"] == pytest.approx(0.5)  # chance: the marker says nothing there
    assert metrics["loss/ood"] > metrics["loss"]
    assert metrics["train_loss"] == pytest.approx(0.325, abs=0.01)  # H(0.9): the best a bias-only model can do
    assert result.steps == 300 and result.eval_steps.tolist() == [100, 200, 300] and result.maps == {}
    assert [step for step, _ in tracker.metrics["accuracy/ood"]] == [100, 200, 300]
    assert tracker.tags["method"] == "bias_only" and tracker.params["bias_only.steps"] == 300
    (weights,) = handed
    assert sorted(weights) == [PREFIX + name for name in ("bias", "mean", "scale", "weight")]
    assert weights[PREFIX + "weight"].shape == (2, 2)
    again = run(cfg, RunContext(save_weights=handed.append))
    assert again.metrics == metrics and all(torch.equal(handed[1][k], weights[k]) for k in weights)


def test_a_dependant_reads_p_b_from_its_bias_model_stage(minilm_tokenizer):
    cfg = parse_config({"method": "finetune", "model": "tiny-bert", "task": SHORTCUT,
                        "train": {"max_steps": 2}, "bias_model": {"method": "bias_only"}})
    upstream = cfg.upstreams["bias_model"]
    assert (upstream.method, upstream.task, upstream.seed) == ("bias_only", cfg.task, cfg.seed)
    saved = {}
    run(upstream, RunContext(save_weights=saved.update))
    roles = []
    ctx = RunContext(load_upstream=lambda role: roles.append(role) or saved)
    data = TASKS["synthetic-shortcut"].load(cfg.task, minilm_tokenizer)
    p_b = bias_probs(cfg, ctx, data.train)
    assert roles == ["bias_model"] and p_b.shape == (400, 2) and p_b.dtype == torch.float32
    torch.testing.assert_close(p_b.sum(dim=1), torch.ones(400))
    p_y = p_b.gather(1, data.train.labels[:, None]).squeeze(1)  # p_b(y_i)
    agrees = data.train.features.argmax(dim=1) == data.train.labels
    assert p_y[agrees].min() > 0.8 and p_y[~agrees].max() < 0.2  # ~0.9 / ~0.1: the shortcut's odds
    assert bias_probs(cfg, ctx, data.eval_sets["ood"]).shape == (200, 2)
    run(cfg, RunContext(load_upstream=lambda role: saved))  # the dependant itself runs as before


def test_bias_probs_says_what_is_missing(minilm_tokenizer):
    data = TASKS["synthetic-shortcut"].load(TaskConfig(**SHORTCUT), minilm_tokenizer)
    plain = parse_config({"method": "finetune", "model": "tiny-bert", "task": SHORTCUT})
    with pytest.raises(ValueError, match="no bias_model stage"):
        bias_probs(plain, RunContext(), data.train)
    cfg = parse_config({"method": "finetune", "model": "tiny-bert", "task": SHORTCUT, "bias_model": {"method": "bias_only"}})
    with pytest.raises(RuntimeError, match="starts from another run .bias_model: bias_only"):
        bias_probs(cfg, RunContext(), data.train)  # nobody to hand it the weights
    with pytest.raises(ValueError, match="handed on no bias model .no decoders.bias.weight; its weights hold encoder"):
        bias_probs(cfg, RunContext(load_upstream=lambda role: {"encoder.x": torch.zeros(1)}), data.train)
    model = BiasModel.for_features(torch.randn(5, 3), 2)
    with pytest.raises(ValueError, match="reads 3 features, the split has 2"):
        probs_of(model.weights(), data.train.features)
    round_trip = BiasModel.from_weights(model.weights())
    x = torch.randn(4, 3)
    torch.testing.assert_close(round_trip(x), model(x))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("raw, message", [
    (BIAS_ONLY | {"task": {"name": "synthetic-cls"}},
     r"^task.name: task 'synthetic-cls' defines no bias features \(tasks that do: synthetic-shortcut, "
     r"classification\); method bias_only trains on them$"),
    ({"method": "finetune", "task": {"name": "synthetic-cls"}, "bias_model": {"method": "bias_only"}},
     r"^task.name: task 'synthetic-cls' defines no bias features .*; a run with a bias_model stage reads its p_b"),
    ({"method": "finetune", "task": SHORTCUT, "bias_model": {"method": "bias_only", "task": {"name": "synthetic-cls"}}},
     r"^bias_model.task.name: task 'synthetic-cls' defines no bias features"),
    ({"method": "finetune", "task": SHORTCUT, "bias_model": {"method": "finetune"}},
     r"^bias_model.method: method 'finetune' hands on no bias model \(methods that do: bias_only\)$"),
    ({"method": "finetune", "task": SHORTCUT, "bias_model": {"method": "bias_onyl"}},
     r"^bias_model.method: unknown method 'bias_onyl'; did you mean 'bias_only'"),
    (BIAS_ONLY | {"bias_only": {"stepz": 3}}, r"^unknown key 'bias_only.stepz'; did you mean 'bias_only.steps'"),
])  # fmt: skip
def test_a_bias_model_on_a_task_without_bias_features_fails_at_validation(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(copy.deepcopy(raw))


def test_a_single_text_file_task_fails_naming_task_text(tmp_path):
    with pytest.raises(ConfigError, match="^task.text: task 'classification' defines bias features only for text pairs"):
        parse_config(BIAS_ONLY | {"task": pairs(tmp_path) | {"text": "premise"}})
    assert parse_config(BIAS_ONLY | {"task": pairs(tmp_path)}).method == "bias_only"


def test_a_grid_cell_with_a_bias_model_on_the_wrong_task_fails_at_expansion():
    spec = parse_grid({"name": "debias", "base": {"method": "finetune", "bias_model": {"method": "bias_only"}},
                       "axes": {"task": ["synthetic-shortcut", "synthetic-cls"]}})
    with pytest.raises(ConfigError, match=r"^cell 1 \(task.name=synthetic-cls\): task.name: task 'synthetic-cls' "
                                          "defines no bias features"):
        expand(spec)
    ok = expand(parse_grid({"name": "debias", "base": {"method": "finetune", "bias_model": {"method": "bias_only"}},
                            "axes": {"task": ["synthetic-shortcut"], "seed": [0, 1]}}))
    assert [c.upstreams["bias_model"].method for c in ok] == ["bias_only", "bias_only"]
