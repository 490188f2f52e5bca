"""experiments.interventions.attention on every tiny architecture: recording, Kovaleva disabling, head contexts."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModel

from experiments.interventions.attention import disable_heads, head_contexts, record_attention
from experiments.interventions.heads import prune_heads
from experiments.models import ARCHITECTURES, MODELS, architecture_of, head_layout, load_backbone

TINY = {MODELS[name].config["model_type"]: name for name in MODELS if name.startswith("tiny-")}
# Different lengths, so rows 1 and 2 have padding keys.
SENTENCES = ["the quick brown fox jumps over the lazy dog", "heads can be disabled", "a"]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, minilm_tokenizer):
    torch.set_num_threads(1)
    model, _ = load_backbone(TINY[request.param], 0)
    arch = architecture_of(model)
    with torch.no_grad():  # random models attend almost uniformly: sharpen, so disabling shows
        for layer in model.get_submodule(arch.layers):
            layer.get_submodule(arch.query).weight.mul_(10)
            layer.get_submodule(arch.key).weight.mul_(10)
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()
    return model, batch


def _run(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state


def _values(model, batch) -> list[torch.Tensor]:
    """Each layer's value vectors (B, T, H, D), from the value projection applied to its input."""
    arch = architecture_of(model)
    _, num_heads, head_dim = head_layout(model)
    inputs, hooks = [], []
    for layer in model.get_submodule(arch.layers):
        value = layer.get_submodule(arch.value)
        hooks.append(value.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])))
    _run(model, batch)
    for hook in hooks:
        hook.remove()
    values = []
    with torch.no_grad():
        for layer, x in zip(model.get_submodule(arch.layers), inputs, strict=True):
            v = layer.get_submodule(arch.value)(x)  # (B, T, H * D)
            values.append(v.reshape(*v.shape[:-1], num_heads, head_dim))
    return values


def test_disabled_head_outputs_the_mean_of_its_values(tiny):
    model, batch = tiny
    disabled = torch.zeros(2, 4, dtype=torch.bool)
    disabled[0, 1] = disabled[1, 2] = disabled[1, 3] = True
    with disable_heads(model, disabled), head_contexts(model) as contexts:
        values = _values(model, batch)  # the disabled model's own value vectors (layer 1's input changed)
        contexts.clear()
        _run(model, batch)
    real = batch["attention_mask"].bool()  # (B, T)
    for layer, head in disabled.nonzero().tolist():
        v = values[layer][:, :, head]  # (B, T, D)
        mean = (v * real[..., None]).sum(dim=1) / real.sum(dim=1, keepdim=True)  # (B, D) over real tokens
        out = contexts[layer][:, :, head]  # (B, T, D): every query gets the same mean
        torch.testing.assert_close(out, mean[:, None].expand_as(out), atol=1e-5, rtol=1e-5)
    # an enabled head is not constant over queries
    out = contexts[1][0, :, 0]
    assert (out - out.mean(dim=0, keepdim=True)).abs().max() > 0.05 * out.abs().max()


def test_disabling_a_layer_equals_disabling_each_of_its_heads(tiny):
    model, batch = tiny
    whole = torch.zeros(2, 4, dtype=torch.bool)
    whole[0] = True
    with disable_heads(model, whole):
        layer_off = _run(model, batch)
    handles = []
    for head in range(4):  # one handle per head: handles stack
        one = torch.zeros(2, 4, dtype=torch.bool)
        one[0, head] = True
        handles.append(disable_heads(model, one))
    heads_off = _run(model, batch)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(layer_off, heads_off, atol=0, rtol=0)
    assert not torch.allclose(layer_off, _run(model, batch), atol=1e-4)


def test_nothing_disabled_and_recording_leave_outputs_unchanged(tiny):
    model, batch = tiny
    plain = _run(model, batch)
    with record_attention(model) as probs, disable_heads(model, torch.zeros(2, 4, dtype=torch.bool)):
        hooked = _run(model, batch)
    assert len(probs) == 2
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=1e-5)
    with head_contexts(model) as contexts:
        torch.testing.assert_close(_run(model, batch), plain, atol=0, rtol=0)
    assert [tuple(c.shape) for c in contexts] == [(3, plain.shape[1], 4, 8)] * 2


def test_recorded_probabilities_are_the_models_attention(tiny):
    model, batch = tiny
    with record_attention(model) as probs:
        _run(model, batch)
        assert len(probs) == 2
        _run(model, batch)  # appends per forward pass
    assert len(probs) == 4
    real = batch["attention_mask"].bool()  # (B, T)
    B, T = real.shape
    # Independent reference: the model's own attentions with the eager implementation.
    reference = copy.deepcopy(model)
    if hasattr(reference, "set_attn_implementation") and model.config.model_type != "deberta-v2":
        reference.set_attn_implementation("eager")
    with torch.no_grad():
        expected = reference(**batch, output_attentions=True).attentions
    for p, e in zip(probs[:2], expected, strict=True):
        assert tuple(p.shape) == (B, 4, T, T)
        torch.testing.assert_close(p, e, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(p.sum(dim=-1), torch.ones(B, 4, T), atol=1e-5, rtol=0)
        on_padding = p.masked_select(real[:, None, :, None] & ~real[:, None, None, :])  # real queries, padding keys
        assert on_padding.numel() > 0 and on_padding.abs().max() == 0


def test_disabled_probabilities_are_uniform_over_real_tokens(tiny):
    model, batch = tiny
    disabled = torch.zeros(2, 4, dtype=torch.bool)
    disabled[1, 0] = True
    with disable_heads(model, disabled), record_attention(model) as probs:
        _run(model, batch)
    real = batch["attention_mask"].bool()
    uniform = real.float() / real.sum(dim=1, keepdim=True)  # (B, T)
    torch.testing.assert_close(probs[1][:, 0], uniform[:, None, :].expand(-1, real.shape[1], -1))


def test_the_original_implementation_is_restored(tiny):
    model, batch = tiny
    arch = architecture_of(model)
    implementation = model.config._attn_implementation
    plain = _run(model, batch)
    with pytest.raises(RuntimeError, match="inside"):
        with record_attention(model), head_contexts(model):
            handle = disable_heads(model, torch.ones(2, 4, dtype=torch.bool))
            raise RuntimeError("inside")
    assert not torch.allclose(_run(model, batch), plain, atol=1e-4)  # the handle is still active
    handle.remove()
    handle.remove()  # twice is harmless
    assert model.config._attn_implementation == implementation
    assert not any(hasattr(m, "_headsweep_attention_site") for m in model.modules())
    assert not hasattr(model, "_headsweep_attention_patch")
    for layer in model.get_submodule(arch.layers):
        for module in layer.modules():
            assert not module._forward_pre_hooks and not module._forward_hooks
    torch.testing.assert_close(_run(model, batch), plain, atol=0, rtol=0)


def test_bad_input_is_refused(tiny, minilm_tokenizer):
    model, _ = tiny
    with pytest.raises(ValueError, match=r"\(layers, heads\) = \(2, 4\)"):
        disable_heads(model, torch.zeros(4, 2, dtype=torch.bool))
    pruned = prune_heads(copy.deepcopy(model), torch.tensor([[True, False, True, True], [True] * 4]))
    with pytest.raises(ValueError, match="pruned"):
        disable_heads(pruned, torch.zeros(2, 4, dtype=torch.bool))


def test_an_unsupported_family_is_named():
    config = AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=8)
    model = AutoModel.from_config(config)
    with pytest.raises(ValueError, match="gpt2"):
        with record_attention(model):
            pass
