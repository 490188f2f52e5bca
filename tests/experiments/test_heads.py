"""Head gating and physical pruning: parity on every tiny architecture."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModel

from experiments.interventions.gates import HeadGates
from experiments.interventions.heads import attach_head_gates, kept_heads, prune_heads
from experiments.models import ARCHITECTURES, MODELS, architecture_of, head_layout, load_backbone

TINY = {MODELS[name].config["model_type"]: name for name in MODELS if name.startswith("tiny-")}
SENTENCES = ["the quick brown fox jumps over the lazy dog", "heads can be pruned", "a"]

# Layer 0 keeps heads 0 and 2; layer 1 loses every head (He & Choi often close whole layers).
KEEP = torch.tensor([[True, False, True, False], [False, False, False, False]])


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, minilm_tokenizer):
    model, _ = load_backbone(TINY[request.param], 0)
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    return model, batch


def _run(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state


def _num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _gated(model, batch, gates) -> torch.Tensor:
    handle = attach_head_gates(model, lambda: gates)
    try:
        return _run(model, batch)
    finally:
        handle.remove()


def test_every_architecture_has_a_tiny_model():
    assert set(TINY) == set(ARCHITECTURES)


def test_all_gates_one_equals_plain_model(tiny):
    model, batch = tiny
    plain = _run(model, batch)
    torch.testing.assert_close(_gated(model, batch, torch.ones(2, 4)), plain, atol=1e-6, rtol=0)
    # removing the hooks restores the plain model
    torch.testing.assert_close(_run(model, batch), plain, atol=0, rtol=0)


def test_gate_zero_equals_zeroing_the_head_by_hand(tiny):
    model, batch = tiny
    arch = architecture_of(model)
    _, _, head_dim = head_layout(model)
    gates = torch.ones(2, 4)
    gates[0, 1] = 0.0
    gates[1, 3] = 0.0
    gated = _gated(model, batch, gates)

    # Independent route: zero the head's input columns of the output projection.
    by_hand = copy.deepcopy(model)
    layers = by_hand.get_submodule(arch.layers)
    with torch.no_grad():
        for layer, head in ((0, 1), (1, 3)):
            weight = layers[layer].get_submodule(arch.attn_out).weight
            weight[:, head * head_dim : (head + 1) * head_dim] = 0.0
    torch.testing.assert_close(gated, _run(by_hand, batch), atol=1e-6, rtol=0)
    assert not torch.allclose(gated, _run(model, batch), atol=1e-4)


def test_fractional_gates_scale_the_head(tiny):
    model, batch = tiny
    arch = architecture_of(model)
    _, _, head_dim = head_layout(model)
    gates = torch.ones(2, 4)
    gates[1, 2] = 0.25

    by_hand = copy.deepcopy(model)
    with torch.no_grad():
        weight = by_hand.get_submodule(arch.layers)[1].get_submodule(arch.attn_out).weight
        weight[:, 2 * head_dim : 3 * head_dim] *= 0.25
    torch.testing.assert_close(_gated(model, batch, gates), _run(by_hand, batch), atol=1e-5, rtol=0)


def test_pruned_model_equals_gated_model(tiny):
    model, batch = tiny
    gated = _gated(model, batch, KEEP.float())
    pruned = prune_heads(copy.deepcopy(model), KEEP)
    torch.testing.assert_close(_run(pruned, batch), gated, atol=1e-5, rtol=0)
    assert _num_params(pruned) < _num_params(model)
    assert torch.equal(kept_heads(pruned), KEEP)
    assert head_layout(pruned) == head_layout(model)  # masks keep indexing the original heads

    arch = architecture_of(pruned)
    first = pruned.get_submodule(arch.layers)[0]
    assert first.get_submodule(arch.query).out_features == 2 * 8
    assert first.get_submodule(arch.attn_out).in_features == 2 * 8
    assert first.get_submodule(arch.attention).num_attention_heads == 2


def test_pruning_in_two_steps_equals_pruning_once(tiny):
    model, batch = tiny
    step = torch.tensor([[True, True, True, False], [True, False, True, True]])
    twice = prune_heads(prune_heads(copy.deepcopy(model), step), KEEP)
    once = prune_heads(copy.deepcopy(model), KEEP)
    torch.testing.assert_close(_run(twice, batch), _run(once, batch), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="already pruned"):
        prune_heads(twice, step)


def test_gates_on_pruned_model_index_original_heads(tiny):
    model, batch = tiny
    step = torch.tensor([[True, False, True, True], [False, True, True, False]])
    gates = torch.linspace(0.1, 0.9, 8).reshape(2, 4)
    expected = _gated(model, batch, gates * step)
    pruned = prune_heads(copy.deepcopy(model), step)
    torch.testing.assert_close(_gated(pruned, batch, gates), expected, atol=1e-5, rtol=0)


def test_training_gates_one_sample_per_forward_and_gradients(tiny):
    model, batch = tiny
    head_gates = HeadGates(2, 4, torch.Generator().manual_seed(0)).train()
    calls = []

    def source():
        calls.append(1)
        return head_gates()

    handle = attach_head_gates(model, source)
    try:
        out = model(**batch).last_hidden_state
        assert len(calls) == 1
        assert handle.gates.shape == (2, 4)
        out.pow(2).mean().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    assert head_gates.log_alpha.grad is not None
    assert head_gates.log_alpha.grad.abs().sum() > 0


def test_wrong_gate_shape_is_a_clear_error(tiny):
    model, batch = tiny
    with pytest.raises(ValueError, match=r"\(layers, heads\) = \(2, 4\)"):
        _gated(model, batch, torch.ones(4, 2))
    with pytest.raises(ValueError, match="keep must be"):
        prune_heads(copy.deepcopy(model), torch.ones(3, 4, dtype=torch.bool))


def test_deberta_with_shared_attention_keys(minilm_tokenizer):
    """DeBERTa-v3 checkpoints set share_att_key: the position path reuses q/k projections."""
    config = AutoConfig.for_model(**{**MODELS["tiny-deberta-v2"].config, "share_att_key": True})
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    pruned = prune_heads(copy.deepcopy(model), KEEP)
    torch.testing.assert_close(
        _run(pruned, batch), _gated(model, batch, KEEP.float()), atol=1e-5, rtol=0
    )


def test_eager_attention_bert(minilm_tokenizer):
    """The hooks sit on attn_out, so eager and sdpa attention give the same gated model."""
    sdpa, _ = load_backbone("tiny-bert", 0)
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    gates = torch.linspace(0.0, 1.0, 8).reshape(2, 4)
    torch.testing.assert_close(
        _gated(eager, batch, gates), _gated(sdpa, batch, gates), atol=1e-5, rtol=0
    )
    pruned = prune_heads(eager, KEEP)
    torch.testing.assert_close(
        _run(pruned, batch), _gated(sdpa, batch, KEEP.float()), atol=1e-5, rtol=0
    )
