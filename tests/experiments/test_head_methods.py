"""head_importance (Michel et al. 2019) and head_ablation (Kovaleva et al. 2019) on tiny random models."""

import copy

import numpy as np
import pytest
import torch

from base.sections import ConfigError
from experiments import RunContext, parse_config
from experiments.interventions.attention import disable_heads
from experiments.interventions.heads import attach_head_gates
from experiments.maths.head_importance import (
    abs_token_sum,
    least_important,
    normalize_per_layer,
    per_token,
    pruning_counts,
)
from experiments.maths.losses import task_loss
from experiments.methods.head_ablation import first_examples, metrics_with
from experiments.methods.head_importance import token_gradients
from experiments.models import load_backbone
from experiments.tasks import TASKS
from experiments.training.loop import evaluate, evaluate_all, forward_logits
from experiments.training.state import RunState, build_decoder, set_up
from experiments.training.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 6, "batch_size": 8, "eval_every": 6, "lr": 1e-3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(method: str, model: str = "tiny-bert", **section):
    return parse_config({**copy.deepcopy(TINY), "model": model, "method": method, method: section})


def _fine_tuned(cfg, store) -> RunState:
    """The run's fine-tuned model, loaded independently from the weights its upstream handed on."""
    upstream = cfg.upstreams["init_from"].run_key
    state = set_up(cfg, RunContext(load_upstream=lambda role: store[upstream]))
    state.train(False)
    return state


# ----------------------------------------------------------------------------- importance maths


def test_token_gradients_sum_to_finite_differences_of_one_gate_per_head():
    """Summed over a padded batch's tokens, ``dL/dxi_{h,t}`` is the derivative of the batch loss in
    one gate per head (``attach_head_gates``), by central differences; at a pruned head (gate 0)
    too. The per-token check of one example, and the parity with the reference's computation, are
    in test_head_importance_parity.py."""
    encoder, tokenizer = load_backbone("tiny-bert", 0)
    task = TASKS["synthetic-cls"]
    decoder = build_decoder(task, encoder.config.hidden_size, 3, seed=0)
    encoder.double().eval(), decoder.double().eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (6, 12), generator=gen)
    mask = torch.ones(6, 12, dtype=torch.long)
    mask[2, 7:] = mask[4, 3:] = 0
    labels = torch.randint(0, 3, (6,), generator=gen)

    def loss_at(xi: torch.Tensor) -> float:
        handle = attach_head_gates(encoder, lambda: xi)
        try:
            with torch.no_grad():
                return task_loss(forward_logits(encoder, decoder, ids, mask), labels).item()
        finally:
            handle.remove()

    xi = torch.ones(2, 4, dtype=torch.float64)
    xi[1, 2] = 0.0
    grads = token_gradients(encoder, decoder, ids, mask, labels, xi)  # (L, B, T, H)
    assert grads.shape == (2, 6, 12, 4)
    assert (grads[:, 4, 3:] == 0).all() and (grads[:, 2, 7:] == 0).all()  # padding reaches no loss
    eps, fd = 1e-4, torch.zeros_like(xi)
    for layer in range(2):
        for head in range(4):
            step = torch.zeros_like(xi)
            step[layer, head] = eps
            fd[layer, head] = (loss_at(xi + step) - loss_at(xi - step)) / (2 * eps)
    assert fd.abs().max() > 1e-4  # a real signal to match, not zeros
    summed = grads.sum(dim=(1, 2)).double()
    assert (summed - fd).abs().max() < 1e-3 * fd.abs().max()  # within 1e-3, relative to the largest
    assert fd[1, 2] != 0 and summed[1, 2] != 0  # at a pruned head (xi = 0) the derivative is still defined


def test_importance_maths():
    grads = torch.tensor([[[1.0, -2.0], [-3.0, 0.5], [7.0, 7.0]]])  # (B=1, T=3, H=2), the last token padding
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(abs_token_sum(grads, mask), torch.tensor([4.0, 2.5]))  # |.| per token, then sum
    totals = torch.tensor([[4.0, 2.0], [6.0, 8.0]])
    torch.testing.assert_close(per_token(totals, 4, 2, last_layer_per_example=False), totals / 4)
    torch.testing.assert_close(per_token(totals, 4, 2, last_layer_per_example=True), torch.tensor([[1.0, 0.5], [3.0, 4.0]]))
    torch.testing.assert_close(normalize_per_layer(torch.tensor([[3.0, 4.0], [0.0, 0.0]])),
                               torch.tensor([[0.6, 0.8], [0.0, 0.0]]))  # a layer of zeros stays zero


def test_pruning_schedule_and_choice():
    assert pruning_counts(72, 0.1) == [0, 7, 14, 21, 28, 36, 43, 50, 57, 64, 72]  # floor, as the reference
    assert pruning_counts(8, 0.25) == [0, 2, 4, 6, 8]
    assert pruning_counts(8, 0.3) == [0, 2, 4, 7, 8]  # 30, 60, 90 % and the last step capped at 100 %
    importance = torch.tensor([[0.5, 0.1, 0.9], [0.1, 0.0, 0.7]])
    keep = torch.tensor([[True, True, True], [True, False, True]])  # (1, 1) is already gone
    chosen = least_important(importance, keep, 2)
    assert chosen.tolist() == [[False, True, False], [True, False, False]]  # tie at 0.1: lower index first
    with pytest.raises(ValueError, match="only 5 are left"):
        least_important(importance, keep, 6)


# ----------------------------------------------------------------------------- head_importance runs


def test_the_pruning_curve_starts_at_the_fine_tuned_metric_and_removes_ever_more_heads(run_chain):
    tracker = MemoryTracker()
    cfg = _cfg("head_importance", examples=24, step=0.25, recompute=False)
    assert cfg.upstreams["init_from"].method == "finetune"
    result, store = run_chain(cfg, tracker)

    pcts = (0, 25, 50, 75, 100)
    assert {f"accuracy_pruned_{p}" for p in pcts} <= set(result.metrics)
    assert not any(name.startswith("loss_pruned") for name in result.metrics)
    state = _fine_tuned(cfg, store)  # the upstream's weights, evaluated without any hook
    unpruned = evaluate_all(state)
    assert result.metrics["accuracy_pruned_0"] == result.metrics["accuracy"] == unpruned["accuracy"]
    assert result.metrics["loss"] == pytest.approx(unpruned["loss"], abs=1e-6)
    # the tracker has the curve against step = percent pruned, heads removed strictly increasing
    assert tracker.metrics["heads_pruned"] == [(p, float(n)) for p, n in zip(pcts, (0, 2, 4, 6, 8), strict=True)]
    assert [step for step, _ in tracker.metrics["accuracy_pruned"]] == list(pcts)
    assert [v for _, v in tracker.metrics["accuracy_pruned"]] == [result.metrics[f"accuracy_pruned_{p}"] for p in pcts]

    importance = result.maps["heads.importance"].values
    pruned_at = result.maps["heads.pruned_at"].values
    assert importance.shape == pruned_at.shape == (2, 4)
    np.testing.assert_allclose(np.linalg.norm(importance, axis=1), 1.0, rtol=1e-5)
    # nested: after each step exactly the scheduled number of heads is gone; all are gone at 100 %
    assert [int((pruned_at <= p / 100 + 1e-6).sum()) for p in (25, 50, 75, 100)] == [2, 4, 6, 8]
    # a fixed ranking removes heads in order of importance: more important = removed later
    order = np.argsort(importance.ravel(), kind="stable")
    assert np.all(np.diff(pruned_at.ravel()[order]) >= 0)
    # the last point is the model with every head gated to 0
    handle = attach_head_gates(state.encoder, lambda: torch.zeros(2, 4))
    assert result.metrics["accuracy_pruned_100"] == evaluate_all(state)["accuracy"]
    handle.remove()
    assert {"heads.importance.png", "heads.pruned_at.png"} <= set(tracker.artifacts)


def test_recomputing_importance_follows_the_pruned_model(run_chain):
    fixed, _ = run_chain(_cfg("head_importance", examples=24, step=0.25, recompute=False))
    greedy, _ = run_chain(_cfg("head_importance", examples=24, step=0.25, recompute=True))
    # same fine-tune, same first ranking, so the same first step
    np.testing.assert_array_equal(fixed.maps["heads.importance"].values, greedy.maps["heads.importance"].values)
    first = lambda r: r.maps["heads.pruned_at"].values <= 0.25  # noqa: E731
    np.testing.assert_array_equal(first(fixed), first(greedy))
    assert greedy.metrics["accuracy_pruned_0"] == fixed.metrics["accuracy_pruned_0"]


@pytest.mark.parametrize("model", ["tiny-deberta-v2", "random:tiny-roberta"])
def test_head_importance_runs_on_other_families(run_chain, model):
    result, _ = run_chain(_cfg("head_importance", model=model, examples=16, step=0.5))
    assert np.isfinite(result.maps["heads.importance"].values).all()
    assert {"accuracy_pruned_0", "accuracy_pruned_50", "accuracy_pruned_100"} <= set(result.metrics)


def test_head_importance_keys_are_checked():
    with pytest.raises(ConfigError, match=r"head_importance.step: .*whole percent"):
        _cfg("head_importance", step=0.125)
    with pytest.raises(ConfigError, match=r"head_importance.examples"):
        _cfg("head_importance", examples=0)


# ----------------------------------------------------------------------------- head_ablation


def test_ablation_maps_and_their_meaning(run_chain):
    tracker = MemoryTracker()
    cfg = _cfg("head_ablation", examples=24)
    assert cfg.upstreams["init_from"].method == "finetune"
    result, store = run_chain(cfg, tracker)
    heads, layers = result.maps["heads.ablation_delta"], result.maps["layers.ablation_delta"]
    assert heads.values.shape == (2, 4) and layers.values.shape == (2, 1)
    assert (heads.kind, layers.kind) == ("heads", "layers") and "minus full" in heads.meaning

    state = _fine_tuned(cfg, store)
    dev = first_examples(state.data.dev, 24)
    assert len(dev) == 24
    plain = evaluate(state.encoder, state.decoder, dev, state.task, 8, "cpu")  # no hook at all
    assert result.metrics["accuracy"] == plain["accuracy"]
    # disabling nothing: delta 0 (the attention patch leaves the metric as it was)
    nothing = metrics_with(state, dev, torch.zeros(2, 4, dtype=torch.bool))
    assert nothing["accuracy"] - plain["accuracy"] == 0
    assert nothing["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    # a layer's delta is the metric with each of its heads disabled (one handle per head)
    for layer in range(2):
        handles = []
        for head in range(4):
            one = torch.zeros(2, 4, dtype=torch.bool)
            one[layer, head] = True
            handles.append(disable_heads(state.encoder, one))
        all_heads = evaluate(state.encoder, state.decoder, dev, state.task, 8, "cpu")
        for handle in handles:
            handle.remove()
        assert layers.values[layer, 0] == pytest.approx(all_heads["accuracy"] - plain["accuracy"], abs=1e-6)
    # each head's delta is the metric with that head disabled
    one = torch.zeros(2, 4, dtype=torch.bool)
    one[1, 2] = True
    assert heads.values[1, 2] == pytest.approx(metrics_with(state, dev, one)["accuracy"] - plain["accuracy"], abs=1e-6)
    assert result.metrics["ablation_delta_min"] == pytest.approx(float(heads.values.min()))
    assert "heads.ablation_delta.png" in tracker.artifacts


@pytest.mark.parametrize("model", ["tiny-deberta-v2", "random:tiny-electra"])
def test_head_ablation_runs_on_other_families(run_chain, model):
    result, _ = run_chain(_cfg("head_ablation", model=model, examples=16))
    assert result.maps["heads.ablation_delta"].values.shape == (2, 4)
    assert np.isfinite(result.maps["layers.ablation_delta"].values).all()
