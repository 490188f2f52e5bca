"""FFN neuron pruning with bias folding: the sliced model equals the masked one on tiny models."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from experiments.interventions.ffn_prune import (
    ffn_layout,
    kept_neurons,
    mask_ffn,
    mean_ffn_activations,
    prune_ffn,
    pruned_layers,
    pruned_metrics,
    upper_layer_keep,
)
from experiments.models import ARCHITECTURES, MODELS, architecture_of, load_backbone

TINY = {MODELS[name].config["model_type"]: name for name in MODELS if name.startswith("tiny-")}
SENTENCES = ["the quick brown fox jumps over the lazy dog", "neurons can be pruned", "a"]
INNER = 64  # tiny models' intermediate size


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, minilm_tokenizer):
    model, _ = load_backbone(TINY[request.param], 0)
    batch = dict(minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    baseline = mean_ffn_activations(model, [batch])
    return model, batch, baseline


def _run(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state


def _num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _keep(seed: int = 0) -> dict[int, torch.Tensor]:
    """Layer 0 keeps 5 random neurons; layer 1 keeps none (every neuron folded)."""
    generator = torch.Generator().manual_seed(seed)
    return {0: torch.randperm(INNER, generator=generator)[:5], 1: torch.tensor([], dtype=torch.long)}


def _masked(model, batch, keep, baseline) -> torch.Tensor:
    handle = mask_ffn(model, keep, baseline)
    try:
        return _run(model, batch)
    finally:
        handle.remove()


def test_architecture_names_the_ffn_input_projection(tiny):
    model, _, _ = tiny
    arch = architecture_of(model)
    for layer in model.get_submodule(arch.layers):
        ffn_in = layer.get_submodule(arch.ffn_in)
        assert isinstance(ffn_in, nn.Linear) and ffn_in.out_features == INNER
        assert layer.get_submodule(arch.ffn_out).in_features == INNER


def test_sliced_equals_masked(tiny):
    model, batch, baseline = tiny
    keep = _keep()
    masked = _masked(model, batch, keep, baseline)
    plain = _run(model, batch)
    assert (masked - plain).abs().max() > 1e-3  # the mask does change the outputs
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline)
    torch.testing.assert_close(_run(pruned, batch), masked, atol=1e-5, rtol=0)


def test_sliced_equals_masked_when_every_layer_keeps_some(tiny):
    """Each listed layer folds its own removed neurons (a second layer that keeps some must not fold
    its kept ones too: the bug a reused variable once caused, invisible when a layer keeps none)."""
    model, batch, baseline = tiny
    generator = torch.Generator().manual_seed(3)
    keep = {layer: torch.randperm(INNER, generator=generator)[:4] for layer in (0, 1)}
    masked = _masked(model, batch, keep, baseline)
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline)
    torch.testing.assert_close(_run(pruned, batch), masked, atol=1e-5, rtol=0)


def test_folding_every_neuron_would_differ(tiny):
    """The reference code's fold (all neurons' means) double-counts the kept ones."""
    model, batch, baseline = tiny
    keep = {0: _keep()[0]}
    masked = _masked(model, batch, keep, baseline)
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline)
    torch.testing.assert_close(_run(pruned, batch), masked, atol=1e-5, rtol=0)
    arch = architecture_of(pruned)
    ffn_out = pruned.get_submodule(arch.layers)[0].get_submodule(arch.ffn_out)
    with torch.no_grad():  # add the kept neurons' share too: the fold-all bias
        ffn_out.bias += ffn_out.weight @ baseline[0][keep[0].sort().values]
    assert (_run(pruned, batch) - masked).abs().max() > 1e-3


def test_keeping_every_neuron_changes_nothing(tiny):
    model, batch, baseline = tiny
    everything = {layer: torch.arange(INNER) for layer in range(2)}
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, everything, baseline)
    torch.testing.assert_close(_run(pruned, batch), _run(model, batch), atol=0, rtol=0)
    assert _num_params(pruned) == _num_params(model)
    assert kept_neurons(pruned).all()


def test_parameters_drop_and_unlisted_layers_are_untouched(tiny):
    model, _, baseline = tiny
    keep = {1: torch.tensor([3, 7, 11])}
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline)
    hidden = model.config.hidden_size
    # each removed neuron: its row + bias of ffn_in, its column of ffn_out
    assert _num_params(model) - _num_params(pruned) == (INNER - 3) * (2 * hidden + 1)
    arch = architecture_of(model)
    before, after = model.get_submodule(arch.layers), pruned.get_submodule(arch.layers)
    for (name, p_before), (_, p_after) in zip(before[0].named_parameters(), after[0].named_parameters(),
                                              strict=True):
        assert torch.equal(p_before, p_after), name
    assert after[1].get_submodule(arch.ffn_in).weight.shape == (3, hidden)
    assert torch.equal(after[1].get_submodule(arch.ffn_in).weight, before[1].get_submodule(arch.ffn_in).weight[[3, 7, 11]])
    assert after[1].get_submodule(arch.ffn_out).weight.shape == (hidden, 3)
    kept = kept_neurons(pruned)
    assert kept[0].all() and kept[1].nonzero().squeeze(-1).tolist() == [3, 7, 11]
    assert ffn_layout(pruned) == (2, INNER)  # the config still describes the original neurons


def test_pruning_twice_indexes_original_neurons(tiny):
    model, batch, baseline = tiny
    first = {0: torch.arange(0, INNER, 2)}  # even neurons
    second = {0: torch.tensor([4, 10, 62])}
    twice = copy.deepcopy(model)
    prune_ffn(twice, first, baseline)
    # the mask works on the pruned model in original indices too
    torch.testing.assert_close(_masked(twice, batch, second, baseline), _masked(model, batch, second, baseline),
                               atol=1e-5, rtol=0)
    prune_ffn(twice, second, baseline)
    once = copy.deepcopy(model)
    prune_ffn(once, second, baseline)
    torch.testing.assert_close(_run(twice, batch), _run(once, batch), atol=1e-5, rtol=0)
    assert kept_neurons(twice)[0].nonzero().squeeze(-1).tolist() == [4, 10, 62]
    with pytest.raises(ValueError, match="already pruned"):
        prune_ffn(twice, {0: torch.tensor([5])}, baseline)


def test_random_init_model_prunes_exactly(minilm_tokenizer):
    model, _ = load_backbone("random:tiny-bert", 3)
    batch = dict(minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    baseline = mean_ffn_activations(model, [batch])
    keep = _keep(1)
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline)
    torch.testing.assert_close(_run(pruned, batch), _masked(model, batch, keep, baseline), atol=1e-5, rtol=0)


def test_mean_activations_skip_padding(tiny):
    model, batch, baseline = tiny
    arch = architecture_of(model)
    seen = []
    hook = model.get_submodule(arch.layers)[1].get_submodule(arch.ffn_act).register_forward_hook(
        lambda _m, _a, out: seen.append(out))
    _run(model, batch)
    hook.remove()
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(baseline[1], seen[0][real].mean(dim=0), atol=1e-6, rtol=0)


def test_mean_activations_through_a_prompt_wrapper_count_the_prompt(tiny):
    """A wrapper that prepends 2 soft-prompt vectors and extends the mask: the mean uses the
    mask the encoder receives, so prompt positions count and padding does not."""
    model, batch, _ = tiny
    prompt = torch.randn(2, model.get_input_embeddings().embedding_dim, generator=torch.Generator().manual_seed(4))

    def prompted(ids, mask):
        embeds = model.get_input_embeddings()(ids)  # (B, T, E)
        embeds = torch.cat([prompt.expand(len(ids), -1, -1), embeds], dim=1)
        return model(inputs_embeds=embeds, attention_mask=torch.cat([mask.new_ones(len(ids), 2), mask], dim=1))

    ids, mask = batch["input_ids"], batch["attention_mask"]
    means = mean_ffn_activations(model, [(ids[:2], mask[:2]), (ids[2:], mask[2:])], layers=[0],
                                 forward=lambda b: prompted(*b))
    arch = architecture_of(model)
    seen = []
    hook = model.get_submodule(arch.layers)[0].get_submodule(arch.ffn_act).register_forward_hook(
        lambda _m, _a, out: seen.append(out))
    with torch.no_grad():
        prompted(ids, mask)
    hook.remove()
    real = torch.cat([mask.new_ones(len(ids), 2), mask], dim=1).bool()
    assert list(means) == [0]
    torch.testing.assert_close(means[0], seen[0][real].mean(dim=0), atol=1e-6, rtol=0)


def test_upper_layer_keep_picks_top_scores_per_layer():
    rng = np.random.default_rng(0)
    scores = rng.random((6, 100))
    keep = upper_layer_keep(scores, fraction=0.05)
    assert sorted(keep) == [2, 3, 4, 5]  # the upper three quarters of 6 layers: l >= ceil(6 / 4)
    for layer, index in keep.items():
        assert index.tolist() == sorted(np.argsort(-scores[layer])[:5].tolist())
    assert upper_layer_keep(scores, 0.001, layers=[0])[0].numel() == 1  # at least one neuron per layer
    # across layers: the top 2 % of the chosen layers together
    scores[4, :] += 10.0  # layer 4 holds every top neuron
    joint = upper_layer_keep(torch.tensor(scores), fraction=0.02, layers=[3, 4, 5], per_layer=False)
    assert [joint[layer].numel() for layer in (3, 4, 5)] == [0, 6, 0]


def test_upper_layer_keep_rejects_bad_input():
    with pytest.raises(ValueError, match="fraction"):
        upper_layer_keep(np.zeros((2, 4)), fraction=0.0)
    with pytest.raises(ValueError, match="layers"):
        upper_layer_keep(np.zeros((2, 4)), layers=[2])
    with pytest.raises(ValueError, match="scores"):
        upper_layer_keep(np.zeros(4))


def test_pruned_metrics_evaluates_a_pruned_copy(tiny):
    model, batch, baseline = tiny
    before = {name: p.clone() for name, p in model.named_parameters()}
    scores = np.random.default_rng(1).random((2, INNER))
    keep = upper_layer_keep(scores, fraction=0.1)
    reference = _masked(model, batch, keep, baseline)

    def evaluate(encoder):
        return {"distance": (_run(encoder, batch) - reference).abs().max().item()}

    metrics = pruned_metrics(model, evaluate, keep, baseline)
    assert metrics["pruned_distance"] < 1e-5  # evaluate saw the pruned copy
    assert metrics["pruned_kept_fraction"] == pytest.approx(6 / INNER)  # int(0.1 * 64) in layer 1
    hidden = model.config.hidden_size
    assert metrics["pruned_params_full"] - metrics["pruned_params"] == (INNER - 6) * (2 * hidden + 1)
    for name, p in model.named_parameters():  # the original is untouched
        assert torch.equal(p, before[name]), name


# ------------------------------------------------------------------------------ parity with the reference code


def test_parity_pruned_layers_are_the_upper_three_quarters():
    """THU-KEG/Skill-Neuron src/prune.py:49 prunes ``range(3, 12)`` of RoBERTa-base's 12 layers, keeping
    ``int(3072 * 0.02)`` neurons each (prune.py:61). MiniLM's 6 layers: 2-5 (the layers wholly above
    the lowest quarter of the depth). 7da99f0 pruned the upper half (6-11; MiniLM 3-5) and kept
    ``round(0.02 * I)`` (31 of MiniLM's 1536, not 30)."""
    assert pruned_layers(12) == list(range(3, 12))
    assert pruned_layers(6) == [2, 3, 4, 5] and pruned_layers(2) == [1] and pruned_layers(24) == list(range(6, 24))
    scores = np.random.default_rng(3).random((12, 3072))
    keep = upper_layer_keep(scores, 0.02)
    assert sorted(keep) == list(range(3, 12)) and {len(v) for v in keep.values()} == {61}
    assert {len(v) for v in upper_layer_keep(np.zeros((6, 1536)), 0.02).values()} == {30}


def _reference_prune(state_dict, mask, ths, layers, fraction):
    """prune.py:44-72 on a BERT state dict (``roberta.`` -> ``encoder.``): ``ths`` (L, P, I) averaged
    over the positions, then for each pruned layer the skill neurons' rows / columns kept (padded to
    ``int(I * fraction)`` with others in index order) and EVERY neuron's mean folded:
    ``outputbias + outputweight @ pbias``."""
    sd = {k: v.clone() for k, v in state_dict.items()}
    if len(ths.shape) == 3:
        ths = ths.mean(axis=1)
    width = mask.shape[1]
    for k in layers:
        pbias, pmask = ths[k], mask[k]
        prefix = f"encoder.layer.{k}."
        inputweight = sd[prefix + "intermediate.dense.weight"]
        inputbias = sd[prefix + "intermediate.dense.bias"]
        outputweight = sd[prefix + "output.dense.weight"]
        outputbias = sd[prefix + "output.dense.bias"]
        idx = [i for i in range(width) if pmask[i]]
        for i in range(width):
            if len(idx) < int(width * fraction) and not pmask[i]:
                idx.append(i)
        inputweight = inputweight[idx, :]
        inputbias = inputbias[idx]
        diffbias = torch.matmul(outputweight, pbias.float())
        outputbias = outputbias + diffbias
        outputweight = outputweight[:, idx]
        sd[prefix + "intermediate.dense.weight"] = inputweight
        sd[prefix + "intermediate.dense.bias"] = inputbias
        sd[prefix + "output.dense.weight"] = outputweight
        sd[prefix + "output.dense.bias"] = outputbias
    return sd


def test_parity_fold_all_is_the_reference_prune_and_equals_its_mask(minilm_tokenizer):
    """``prune_ffn(fold="all")`` with the prompt-position means gives prune.py's weights (tiny-bert,
    2 layers, layer 1 pruned, 6 of 64 kept); ``mask_ffn(fold="all")`` is its masked equivalent. The
    default ``fold="removed"`` differs from it exactly by the kept neurons' folded means. (7da99f0's
    ``prune_ffn`` takes no ``fold``: it folded the removed neurons' means only.)"""
    model, _ = load_backbone("tiny-bert", 0)
    batch = dict(minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    g = torch.Generator().manual_seed(5)
    ths = torch.rand(2, 4, INNER, generator=g, dtype=torch.float64)  # (L, P, I), a train_avg
    mask = torch.zeros(2, INNER, dtype=torch.bool)
    mask[1, torch.randperm(INNER, generator=g)[:6]] = True
    reference = _reference_prune(model.state_dict(), mask, ths, [1], 6 / INNER)
    pbias = ths.mean(dim=1).float()
    keep = {1: mask[1].nonzero().flatten()}
    baseline = {1: pbias[1]}
    pruned = copy.deepcopy(model)
    prune_ffn(pruned, keep, baseline, fold="all")
    ours = pruned.state_dict()
    assert ours.keys() == reference.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], reference[key], rtol=0, atol=1e-6, msg=key)
    handle = mask_ffn(model, keep, baseline, fold="all")
    masked = _run(model, batch)
    handle.remove()
    torch.testing.assert_close(_run(pruned, batch), masked, atol=1e-5, rtol=0)
    removed_only = copy.deepcopy(model)
    prune_ffn(removed_only, keep, baseline)
    w_out = model.state_dict()["encoder.layer.1.output.dense.weight"]
    extra = w_out[:, keep[1]] @ pbias[1][keep[1]]
    torch.testing.assert_close(ours["encoder.layer.1.output.dense.bias"],
                               removed_only.state_dict()["encoder.layer.1.output.dense.bias"] + extra, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="fold 'all'"):
        prune_ffn(pruned, {1: keep[1][:2]}, baseline, fold="all")
