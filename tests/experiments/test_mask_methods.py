"""mask_train and imp end to end on a tiny random model: pipelines, stages, sparsity, maps, resume."""

import copy

import numpy as np
import pytest
import torch

from base.sections import ConfigError
from experiments import parse_config
from experiments.interventions.masks import unpack_masks
from experiments.training.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 4, "batch_size": 8, "eval_every": 2, "lr": 1e-3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(method: str, **section):
    raw = {**copy.deepcopy(TINY), "method": method, method: section}
    if method == "mask_train" and section.get("pipeline") != "prune_then_ft" and not section.get("train_classifier"):
        del raw["train"]["lr"]  # its masks learn at mask_train.lr: train.lr is not read, so refused (issue 43)
    return parse_config(raw)


def _densities(result):
    return result.maps["weights.mask_density"].values  # (L, 6): kept fraction per matrix


def test_mask_train_hits_the_sparsity_of_every_matrix_and_leaves_the_weights_alone(run_chain):
    tracker = MemoryTracker()
    cfg = _cfg("mask_train", sparsity=0.7, initial_sparsity=0.2, reset_every=2)
    result, store = run_chain(cfg, tracker)
    np.testing.assert_allclose(_densities(result), 0.3, atol=0.005)  # every matrix within 0.5 %
    assert result.metrics["sparsity"] == pytest.approx(0.7, abs=0.005)
    assert set(result.maps) == {"heads.mask_density", "neurons.mask_density", "weights.mask_density"}
    assert result.maps["heads.mask_density"].values.shape == (2, 4)
    masks = unpack_masks(result.artifacts["masks.npz"])
    assert tracker.artifacts["masks.npz"] == result.artifacts["masks.npz"]  # also in MLflow
    assert {"heads.mask_density.png", "weights.mask_density.png"} <= set(tracker.artifacts)
    # every layer's six, the pooler the classifier reads, and the classifier (reference: P and --mask_classifier)
    assert list(masks)[12:] == ["pooler", "decoder.classifier"]
    assert len(masks) == 2 * 6 + 2 and all(m.dtype == torch.bool for m in masks.values())
    # prune_only trains the scores only, never a weight: the encoder is the pretrained one, the
    # classifier its random initialisation (reference: --train_classifier false)
    from experiments.models import load_backbone
    from experiments.tasks import TASKS
    from experiments.training.seeding import derive_seed
    from experiments.training.state import build_decoder

    pretrained, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    after = store[cfg.run_key]
    assert all(torch.equal(after[f"encoder.{k}"], v) for k, v in pretrained.state_dict().items())
    initial = build_decoder(TASKS[cfg.task.name], pretrained.config.hidden_size, 2, cfg.seed)
    assert all(torch.equal(after[f"decoders.task.{k}"], v) for k, v in initial.state_dict().items())


def test_mask_train_pipelines_start_from_their_stages(run_chain):
    ft = _cfg("mask_train", pipeline="ft_then_prune", sparsity=0.5)
    assert ft.upstreams["init_from"].method == "finetune"
    b = _cfg("mask_train", pipeline="prune_then_ft", sparsity=0.5, lr=0.05)
    upstream = b.upstreams["init_from"]
    assert (upstream.method, upstream.section.pipeline, upstream.section.sparsity, upstream.section.lr) == (
        "mask_train", "prune_only", 0.5, 0.05)
    result, store = run_chain(b)
    saved = store[upstream.run_key]
    scores = {k: v for k, v in saved.items() if k.startswith("interventions.masks.")}
    assert scores, "a prune_only run hands its mask on"
    # prune_then_ft fine-tunes the subnetwork with the upstream's mask fixed: same densities
    upstream_result, _ = run_chain(upstream)
    np.testing.assert_array_equal(_densities(result), _densities(upstream_result))


def test_a_schedule_that_falls_or_a_sparsity_outside_0_1_fails_with_the_key():
    with pytest.raises(ConfigError, match=r"mask_train.*final sparsity \(0.3\) is below its initial sparsity \(0.5\)"):
        _cfg("mask_train", sparsity=0.3, initial_sparsity=0.5)
    with pytest.raises(ConfigError, match=r"mask_train.sparsity: .*less than 1"):
        _cfg("mask_train", sparsity=1.0)
    with pytest.raises(ConfigError, match=r"imp.sparsity: .*not a whole number of 10 % rounds"):
        _cfg("imp", sparsity=0.35)
    with pytest.raises(ConfigError, match=r"mask_train.loss: unknown loss 'pe'; did you mean 'poe'"):
        _cfg("mask_train", loss="pe")
    with pytest.raises(ConfigError, match=r"finetune.loss: poe needs a bias model, but .*synthetic-cls.* defines no bias"):
        _cfg("finetune", loss="poe")


@pytest.mark.parametrize("pipeline", ["ft_then_prune", "prune_then_ft"])
def test_imp_reaches_its_sparsity_in_rounds(pipeline, run_chain):
    cfg = _cfg("imp", pipeline=pipeline, sparsity=0.3)
    result, _ = run_chain(cfg)
    np.testing.assert_allclose(_densities(result), 0.7, atol=1e-3)  # three rounds of 10 % per matrix
    # round 0 prunes at step 0 (reference); rounds of a tenth of the 4 steps (1), rewinding retrains all 4
    assert result.steps == (3 if pipeline == "ft_then_prune" else 2 + 4)
