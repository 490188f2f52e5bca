"""Weight masks: which matrices, the parametrisation, mask training, IMP, maps and storage."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from base.mask_format import mask_iou, pack_masks
from experiments.interventions.masks import (
    ROLES,
    TAU,
    MaskScores,
    attach_masks,
    head_density,
    imp_prune,
    imp_round_sparsity,
    kth_threshold,
    magnitude_mask,
    maskable_weights,
    neuron_density,
    next_imp_mask,
    raw_weight,
    realised_sparsity,
    rewind,
    role_density,
    ste_mask,
    unpack_masks,
    weight_snapshot,
)
from experiments.models import ARCHITECTURES, MODELS, architecture_of, load_backbone
from experiments.tasks.parts import ClassificationDecoder

TINY = {MODELS[name].config["model_type"]: name for name in MODELS if name.startswith("tiny-")}
SENTENCES = ["the quick brown fox jumps over the lazy dog", "masks keep weights", "a"]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, minilm_tokenizer):
    model, _ = load_backbone(TINY[request.param], 0)
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    return model, batch


@pytest.fixture
def bert(minilm_tokenizer):
    """A fresh tiny BERT (it gets trained), its decoder and a batch with labels."""
    model, _ = load_backbone("tiny-bert", 0)
    torch.manual_seed(1)
    decoder = ClassificationDecoder(32, 3, dropout=0.0)
    batch = minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    return model.train(), decoder, batch, torch.tensor([0, 2, 1])


def _logits(encoder, decoder, batch):
    return decoder(encoder(**batch).last_hidden_state, batch["attention_mask"])


def _loss(encoder, decoder, batch, labels):
    return nn.functional.cross_entropy(_logits(encoder, decoder, batch), labels)


# --------------------------------------------------------------------------- which matrices


def test_maskable_weights_on_every_architecture(tiny):
    model, _ = tiny
    arch = architecture_of(model)
    decoder = ClassificationDecoder(32, 3)
    linears = maskable_weights(model, decoder)
    has_pooler = getattr(model, "pooler", None) is not None
    expected = [f"layer.{i}.{role}" for i in range(2) for role in ROLES]
    expected += ["pooler"] * has_pooler + ["decoder.classifier"]
    assert list(linears) == expected
    assert has_pooler == (model.config.model_type in ("bert", "roberta"))
    layer1 = model.get_submodule(arch.layers)[1]
    assert linears["layer.1.query"] is layer1.get_submodule(arch.query)
    assert linears["layer.1.attn_out"] is layer1.get_submodule(arch.attn_out)
    assert linears["layer.1.ffn_out"] is layer1.get_submodule(arch.ffn_out)
    shapes = {role: tuple(linears[f"layer.0.{role}"].weight.shape) for role in ROLES}
    assert shapes == {"query": (32, 32), "key": (32, 32), "value": (32, 32), "attn_out": (32, 32),
                      "ffn_in": (64, 32), "ffn_out": (32, 64)}
    assert linears["decoder.classifier"] is decoder.classifier
    assert "pooler" not in maskable_weights(model, pooler=False)


# --------------------------------------------------------------------------- attaching


def test_masked_model_equals_zeroing_by_hand_and_remove_restores_it(tiny):
    model, batch = tiny
    linears = maskable_weights(model)
    plain = model(**batch).last_hidden_state.detach()
    before = {n: (raw_weight(lin), raw_weight(lin).detach().clone()) for n, lin in linears.items()}
    keys_before = list(model.state_dict())
    masks = {n: magnitude_mask(lin.weight, 0.5) for n, lin in linears.items()}

    by_hand = copy.deepcopy(model)
    with torch.no_grad():
        for name, lin in maskable_weights(by_hand).items():
            lin.weight.mul_(masks[name])

    handle = attach_masks(linears, masks.__getitem__)
    with torch.no_grad():
        masked = model(**batch).last_hidden_state
    torch.testing.assert_close(masked, by_hand(**batch).last_hidden_state, atol=1e-6, rtol=0)
    assert not torch.allclose(masked, plain, atol=1e-3)
    with pytest.raises(ValueError, match="already"):
        attach_masks(linears, masks.__getitem__)

    handle.remove()
    for name, lin in linears.items():
        assert type(lin) is nn.Linear and not hasattr(lin, "parametrizations")
        assert lin.weight is before[name][0]  # the same Parameter object ...
        assert torch.equal(lin.weight, before[name][1])  # ... untouched
    assert list(model.state_dict()) == keys_before
    torch.testing.assert_close(model(**batch).last_hidden_state, plain, atol=0, rtol=0)


def test_remove_with_bake_writes_the_masked_weights():
    linear = nn.Linear(4, 3)
    mask = torch.rand(3, 4, generator=_gen()) > 0.5
    expected = linear.weight.detach() * mask
    attach_masks({"m": linear}, {"m": mask}.__getitem__).remove(bake=True)
    assert type(linear) is nn.Linear and torch.equal(linear.weight.detach(), expected)


def test_fixed_mask_fine_tuning_gives_no_gradient_to_removed_weights(bert):
    encoder, decoder, batch, labels = bert
    linears = maskable_weights(encoder, decoder, pooler=False)  # the pooler is not in the loss
    masks = {n: magnitude_mask(lin.weight, 0.6) for n, lin in linears.items()}
    handle = attach_masks(linears, masks.__getitem__)
    _loss(encoder, decoder, batch, labels).backward()
    for name, lin in linears.items():
        grad = raw_weight(lin).grad
        assert grad is not None and grad.abs().sum() > 0
        assert torch.equal(grad[~masks[name]], torch.zeros(int((~masks[name]).sum())))
    handle.remove()


# --------------------------------------------------------------------------- mask training


def test_ste_forward_is_binary_and_gradient_passes_straight_through():
    scores = torch.tensor([[0.0, 0.02], [0.011, -0.5]], requires_grad=True)
    mask = ste_mask(scores, TAU)
    assert torch.equal(mask, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    (mask * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert torch.equal(scores.grad, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # identity, masked or not


def test_ste_gradient_reaches_the_scores_as_dL_dWmasked_times_W():
    torch.manual_seed(0)
    linear = nn.Linear(5, 3).requires_grad_(False)
    x = torch.randn(7, 5)
    scores = MaskScores({"m": linear.weight}, sparsity=0.4)
    handle = attach_masks({"m": linear}, scores.mask)
    linear(x).pow(2).sum().backward()
    handle.remove()
    # Independent route: the gradient of the same loss w.r.t. the masked weight W~ = W * m.
    masked = (linear.weight * magnitude_mask(linear.weight, 0.4)).requires_grad_()
    nn.functional.linear(x, masked, linear.bias).pow(2).sum().backward()
    torch.testing.assert_close(scores.scores[0].grad, masked.grad * linear.weight, atol=1e-6, rtol=0)
    assert linear.weight.grad is None


def test_magnitude_initialisation():
    weight = torch.tensor([[0.5, -0.1, 0.3], [-0.9, 0.05, 0.2]])
    scores = MaskScores({"w": weight}, sparsity=0.5, tau=TAU)
    assert torch.equal(scores.scores[0].detach(), torch.tensor([[0.02, 0.0, 0.02], [0.02, 0.0, 0.0]]))
    assert torch.equal(scores.thresholds, torch.tensor([TAU]))
    assert torch.equal(scores.binary_masks()["w"], magnitude_mask(weight, 0.5))


def test_threshold_reset_hits_the_target_sparsity_per_matrix(bert):
    encoder, decoder, _, _ = bert
    linears = maskable_weights(encoder, decoder)
    scores = MaskScores({n: lin.weight for n, lin in linears.items()}, sparsity=0.5)
    generator = _gen(3)
    with torch.no_grad():  # scores after some training: continuous, different scale per matrix
        for index, s in enumerate(scores.scores):
            s.add_(torch.randn(s.shape, generator=generator) * 0.01 * (index + 1))
    for target in (0.7, 0.9, 0.0):
        scores.reset_thresholds(target)
        per_matrix, overall = realised_sparsity(scores.binary_masks())
        assert all(abs(s - target) <= 0.005 for s in per_matrix.values()), per_matrix
        assert abs(overall - target) <= 0.005


def test_kth_threshold():
    scores = torch.tensor([0.3, -0.1, 0.7, 0.2])
    assert kth_threshold(scores, 0.5, 0.01).item() == pytest.approx(0.2)  # 2nd smallest; S > 0.2 keeps 2
    assert kth_threshold(scores, 0.0, 0.01).item() == float("-inf")
    # the guard: a k-th score that is the largest would remove every weight, the threshold stays
    assert kth_threshold(torch.full((4,), 0.02), 0.5, 0.01).item() == pytest.approx(0.01)


def test_training_the_scores_leaves_the_frozen_weights_unchanged(bert):
    encoder, decoder, batch, labels = bert
    encoder.requires_grad_(False), decoder.requires_grad_(False)
    linears = maskable_weights(encoder, decoder)
    frozen = {k: v.clone() for k, v in encoder.state_dict().items()} | {
        f"decoder.{k}": v.clone() for k, v in decoder.state_dict().items()}
    scores = MaskScores({n: lin.weight for n, lin in linears.items()}, sparsity=0.5)
    initial = [s.detach().clone() for s in scores.scores]
    handle = attach_masks(linears, scores.mask)
    optimizer = torch.optim.AdamW(scores.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        _loss(encoder, decoder, batch, labels).backward()
        optimizer.step()
    changed = sum(not torch.equal(s.detach(), i) for s, i in zip(scores.scores, initial, strict=True))
    assert changed >= len(initial) - 1  # every matrix's scores moved (the pooler's get no gradient)
    assert any(not torch.equal(m, magnitude_mask(linears[n].weight, 0.5))
               for n, m in scores.binary_masks().items())  # and some mask changed
    handle.remove()
    after = encoder.state_dict() | {f"decoder.{k}": v for k, v in decoder.state_dict().items()}
    assert after.keys() == frozen.keys()
    assert all(torch.equal(after[k], frozen[k]) for k in frozen)


def test_scores_state_dict_round_trips():
    weights = {"a": torch.randn(4, 3, generator=_gen()), "b": torch.randn(2, 5, generator=_gen(1))}
    scores = MaskScores(weights, sparsity=0.5)
    with torch.no_grad():
        scores.scores[1].add_(torch.randn(2, 5, generator=_gen(2)))
    scores.reset_thresholds(0.3)
    again = MaskScores(weights, sparsity=0.9)
    again.load_state_dict(scores.state_dict())
    assert {n: m.tolist() for n, m in again.binary_masks().items()} == {
        n: m.tolist() for n, m in scores.binary_masks().items()}


# --------------------------------------------------------------------------- magnitude and IMP


def test_magnitude_mask_removes_the_smallest_exactly():
    weight = torch.tensor([[0.5, -0.1, 0.3], [-0.9, 0.05, 0.2]])
    assert magnitude_mask(weight, 0.5).tolist() == [[True, False, True], [True, False, False]]
    assert magnitude_mask(weight, 0.0).all() and not magnitude_mask(weight, 1.0).any()
    ties = torch.ones(10)
    assert int((~magnitude_mask(ties, 0.3)).sum()) == 3  # exact count even with ties
    # with a previous mask: removed weights stay removed, whatever their magnitude
    previous = torch.tensor([[False, True, True], [True, True, True]])  # 0.5 removed before
    assert magnitude_mask(weight, 0.5, previous).tolist() == [[False, False, True], [True, False, True]]
    with pytest.raises(ValueError, match="already removes"):
        magnitude_mask(weight, 0.0, previous)


def test_imp_round_sparsity():
    assert [imp_round_sparsity(k) for k in range(9)] == pytest.approx([0.1 * (k + 1) for k in range(9)])
    assert imp_round_sparsity(1, rounds=5) == pytest.approx(0.4)
    for k in (-1, 9):
        with pytest.raises(ValueError):
            imp_round_sparsity(k)


def test_imp_rounds_prune_a_tenth_of_the_original_each_and_nest():
    weight = torch.randn(50, 40, generator=_gen())  # 2,000 weights
    mask = None
    for k in range(9):
        remaining = weight.numel() if mask is None else int(mask.sum())
        new = next_imp_mask(weight, mask, k)
        assert int((~new).sum()) == 200 * (k + 1)  # sparsity (k + 1) / 10 of the original
        assert (remaining - int(new.sum())) / remaining == pytest.approx(1 / (10 - k))  # of the remaining
        if mask is not None:
            assert not (new & ~mask).any()  # nothing comes back
        mask = new


def test_imp_prune_keeps_largest_of_the_trained_weights():
    weights = {"a": torch.tensor([[1.0, -2.0, 3.0, 0.5, -0.1]] * 2).T}  # (5, 2)
    masks = imp_prune(weights, None, 1, rounds=5)  # sparsity 0.4: 4 of 10 go
    assert masks["a"].T.tolist() == [[True, True, True, False, False]] * 2  # |-0.1|, |0.5| twice go
    again = imp_prune(weights, masks, 2, rounds=5)  # 0.6: the two 1.0s go too
    assert again["a"].T.tolist() == [[False, True, True, False, False]] * 2


def test_rewind_restores_pretrained_values_bit_for_bit(bert):
    encoder, decoder, batch, labels = bert
    linears = maskable_weights(encoder, decoder)
    pretrained = weight_snapshot(linears)
    masks = imp_prune({n: raw_weight(lin) for n, lin in linears.items()}, None, 2)
    handle = attach_masks(linears, masks.__getitem__)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *decoder.parameters()], lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        _loss(encoder, decoder, batch, labels).backward()
        optimizer.step()
    assert not torch.equal(raw_weight(linears["layer.0.query"]).detach(), pretrained["layer.0.query"])
    rewind(linears, pretrained, masks)  # while attached: writes the raw weight
    handle.remove()
    for name, lin in linears.items():
        kept = masks[name]
        assert torch.equal(lin.weight.detach()[kept], pretrained[name][kept])
        assert not lin.weight.detach()[~kept].any()


# --------------------------------------------------------------------------- maps and statistics


def _one_layer_masks() -> dict[str, torch.Tensor]:
    """1 layer, H = 2 heads of D = 1, hidden 2, intermediate 3."""
    return {
        "layer.0.query": torch.tensor([[1, 1], [0, 0]], dtype=torch.bool),  # head 0 row kept, head 1 row gone
        "layer.0.key": torch.tensor([[1, 0], [1, 1]], dtype=torch.bool),
        "layer.0.value": torch.tensor([[0, 0], [0, 1]], dtype=torch.bool),
        "layer.0.attn_out": torch.tensor([[1, 0], [1, 0]], dtype=torch.bool),  # (hidden, H*D): head 0's column
        "layer.0.ffn_in": torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool),  # (I, hidden)
        "layer.0.ffn_out": torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.bool),  # (hidden, I)
        "pooler": torch.zeros(2, 2, dtype=torch.bool),
    }


def test_head_density_by_hand():
    # head 0: q row 2 + k row 1 + v row 0 + attn_out column 2 = 5 of 8; head 1: 0 + 2 + 1 + 0 = 3 of 8
    np.testing.assert_allclose(head_density(_one_layer_masks(), 1, 2), [[5 / 8, 3 / 8]])


def test_neuron_density_by_hand():
    # neuron i: row i of ffn_in (2) + column i of ffn_out (2)
    np.testing.assert_allclose(neuron_density(_one_layer_masks()), [[3 / 4, 1 / 4, 2 / 4]])


def test_role_density_and_realised_sparsity_by_hand():
    masks = _one_layer_masks()
    np.testing.assert_allclose(role_density(masks), [[2 / 4, 3 / 4, 1 / 4, 2 / 4, 3 / 6, 3 / 6]])
    per_matrix, overall = realised_sparsity(masks)
    assert per_matrix["pooler"] == 1.0 and per_matrix["layer.0.key"] == 0.25
    assert overall == pytest.approx(1 - 14 / 32)


def test_head_density_of_a_real_layout_matches_the_per_head_slices(bert):
    encoder, _, _, _ = bert
    linears = maskable_weights(encoder)
    generator = _gen(5)
    masks = {n: torch.rand(lin.weight.shape, generator=generator) > 0.3 for n, lin in linears.items()}
    density = head_density(masks, 2, 4)  # D = 8, hidden 32
    layer, head = 1, 2
    rows = slice(head * 8, (head + 1) * 8)
    kept = sum(int(masks[f"layer.{layer}.{r}"][rows].sum()) for r in ("query", "key", "value"))
    kept += int(masks[f"layer.{layer}.attn_out"][:, rows].sum())
    assert density[layer, head] == pytest.approx(kept / (4 * 8 * 32))
    assert density.shape == (2, 4) and neuron_density(masks).shape == (2, 64)


def test_mask_iou_by_hand():
    a = {"x": torch.tensor([1, 1, 0, 0], dtype=torch.bool), "y": torch.tensor([1, 0], dtype=torch.bool)}
    b = {"x": torch.tensor([1, 0, 1, 0], dtype=torch.bool), "y": torch.tensor([1, 0], dtype=torch.bool)}
    per_matrix, overall = mask_iou(a, b)
    assert per_matrix == {"x": pytest.approx(1 / 3), "y": 1.0}
    assert overall == pytest.approx(2 / 4)  # (1 + 1) / (3 + 1)
    none = {"x": torch.zeros(4, dtype=torch.bool)}
    assert mask_iou(none, none) == ({"x": 1.0}, 1.0)
    with pytest.raises(ValueError, match="different"):
        mask_iou(a, none)


# --------------------------------------------------------------------------- storage


def _minilm_shaped_masks(density: float) -> dict[str, torch.Tensor]:
    """Random masks with MiniLM-L6's shapes (hidden 384, intermediate 1536, 6 layers + pooler)."""
    shapes = {"query": (384, 384), "key": (384, 384), "value": (384, 384), "attn_out": (384, 384),
              "ffn_in": (1536, 384), "ffn_out": (384, 1536)}
    generator = _gen(7)
    masks = {f"layer.{i}.{r}": torch.rand(s, generator=generator) < density
             for i in range(6) for r, s in shapes.items()}
    masks["pooler"] = torch.rand(384, 384, generator=generator) < density
    return masks


def test_pack_round_trip():
    masks = _one_layer_masks() | {"decoder.classifier": torch.tensor([[True, False, True]]),
                                  "odd": torch.rand(3, 5, 7, generator=_gen()) > 0.5}
    back = unpack_masks(pack_masks(masks))
    assert list(back) == list(masks)
    for name, mask in masks.items():
        assert back[name].dtype == torch.bool and torch.equal(back[name], mask)


def test_packed_random_masks_at_half_sparsity_fit_in_a_thirtieth_of_the_weights():
    masks = _minilm_shaped_masks(0.5)  # random: the incompressible worst case
    packed = pack_masks(masks)
    fp32_bytes = 4 * sum(m.numel() for m in masks.values())
    assert len(packed) / fp32_bytes <= 1 / 30  # 1 bit per 32: ~1/32 plus the zip headers
    assert len(packed) / fp32_bytes == pytest.approx(1 / 32, rel=0.01)
    assert all(torch.equal(a, b) for a, b in zip(unpack_masks(packed).values(), masks.values(), strict=True))
