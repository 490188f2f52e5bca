"""Model registry, architecture table and offline loading."""

import pytest
import torch
from torch import nn

from experiments.models import (
    ARCHITECTURES,
    MODELS,
    architecture_of,
    check_model_name,
    head_layout,
    load_backbone,
)


@pytest.fixture(scope="module")
def minilm():
    return load_backbone("minilm-l6", 0)


def _first_weight(model) -> torch.Tensor:
    return model.encoder.layer[0].attention.self.query.weight


def test_real_minilm_loads_offline(minilm):
    model, tokenizer = minilm
    assert type(model).__name__ == "BertModel"
    assert not model.training
    assert head_layout(model) == (6, 12, 32)
    assert tokenizer.vocab_size == 30522
    batch = tokenizer(["the cat sat on the mat", "a dog"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**batch).last_hidden_state
    assert out.shape == (2, batch["input_ids"].shape[1], 384)
    assert torch.isfinite(out).all()


def test_random_minilm_same_shapes_other_weights_deterministic(minilm):
    pretrained, _ = minilm
    state = torch.get_rng_state()
    a, _ = load_backbone("random:minilm-l6", 1)
    assert torch.equal(state, torch.get_rng_state())  # global RNG untouched
    b, _ = load_backbone("random:minilm-l6", 1)
    c, _ = load_backbone("random:minilm-l6", 2)
    assert head_layout(a) == (6, 12, 32)
    assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in pretrained.parameters())
    assert not torch.equal(_first_weight(a), _first_weight(pretrained))
    assert torch.equal(_first_weight(a), _first_weight(b))
    assert not torch.equal(_first_weight(a), _first_weight(c))
    assert not a.training


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("tiny-")])
def test_tiny_models_are_tiny_seeded_and_use_minilm_vocab(name, minilm_tokenizer):
    model, tokenizer = load_backbone(name, 0)
    again, _ = load_backbone(name, 0)
    other, _ = load_backbone(name, 1)
    assert head_layout(model) == (2, 4, 8)
    assert model.config.vocab_size == tokenizer.vocab_size == minilm_tokenizer.vocab_size == 30522
    assert model.config.max_position_embeddings >= 128
    assert not model.training
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
    assert any(
        not torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters(), strict=True)
    )
    batch = tokenizer(["word " * 120], return_tensors="pt")
    assert batch["input_ids"].shape[1] >= 120
    with torch.inference_mode():
        assert model(**batch).last_hidden_state.shape[-1] == 32


def test_tiny_deberta_exercises_disentangled_attention():
    model, _ = load_backbone("tiny-deberta-v2", 0)
    attention = model.encoder.layer[0].attention.self
    assert attention.relative_attention
    assert set(attention.pos_att_type) == {"c2p", "p2c"}
    assert hasattr(attention, "pos_key_proj") and hasattr(attention, "pos_query_proj")


def test_every_tiny_model_has_a_table_row_with_exact_paths():
    assert set(ARCHITECTURES) >= {"bert", "roberta", "electra", "deberta-v2"}
    covered = set()
    for name in MODELS:
        if not name.startswith("tiny-"):
            continue
        model, _ = load_backbone(name, 0)
        arch = architecture_of(model)
        covered.add(model.config.model_type)
        layers = model.get_submodule(arch.layers)
        assert isinstance(layers, nn.ModuleList) and len(layers) == 2
        layer = layers[0]
        hidden, inner = model.config.hidden_size, model.config.intermediate_size
        for path in (arch.query, arch.key, arch.value):
            assert layer.get_submodule(path).out_features == 4 * 8
        assert layer.get_submodule(arch.attn_out).in_features == 4 * 8
        assert layer.get_submodule(arch.attn_out).out_features == hidden
        assert layer.get_submodule(arch.ffn_out).in_features == inner
        x = torch.randn(1, 3, hidden)
        assert layer.get_submodule(arch.ffn_act)(x).shape == (1, 3, inner)
        assert hasattr(layer.get_submodule(arch.attention), "num_attention_heads")
    assert covered == set(ARCHITECTURES)


def test_architecture_of_unknown_model_type_names_supported_ones():
    model = nn.Linear(2, 2)
    model.config = type("Config", (), {"model_type": "gpt2"})()
    with pytest.raises(ValueError, match="gpt2.*bert"):
        architecture_of(model)


@pytest.mark.parametrize(
    "name",
    [
        "minilm-l6",
        "random:minilm-l6",
        "tiny-deberta-v2",
        "sentence-transformers/all-MiniLM-L6-v2",
        "random:bert-base/uncased",
        "google/electra-small-discriminator",
    ],
)
def test_check_model_name_accepts(name):
    check_model_name(name)


def test_check_model_name_accepts_local_dir(tmp_path):
    check_model_name(str(tmp_path))


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("minlm-l6", "minilm-l6"),
        ("random:minlm-l6", "random:minilm-l6"),
        ("tiny-bret", "tiny-bert"),
    ],
)
def test_check_model_name_rejects_with_suggestion(name, suggestion):
    with pytest.raises(ValueError, match=f"did you mean '{suggestion}'") as info:
        check_model_name(name)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "moved"), [("bert-base-uncased", "google-bert/bert-base-uncased"),
                                             ("random:roberta-base", "random:FacebookAI/roberta-base")])
def test_a_hub_id_the_papers_print_is_refused_with_its_id_now(name, moved):
    """The single-word ids most papers print moved under organisations on the hub: refused at submit
    with the id to write, not as an unknown model."""
    with pytest.raises(ValueError, match=f"hub's old id for '{moved}': write '{moved}'"):
        check_model_name(name)


def test_check_model_name_rejects_nonsense_without_loading():
    with pytest.raises(ValueError, match="unknown model"):
        check_model_name("zzzz")


# --------------------------------------------------------------------------- the per-process cache


def test_pretrained_loads_are_equal_but_independent_and_leave_the_cache_alone(minilm):
    """Two runs of one worker get the same weights, never shared: a run that trains (or prunes its
    config) changes neither the other run nor what the next run loads."""
    kept, _ = minilm
    a, tokenizer_a = load_backbone("minilm-l6", 0)
    b, tokenizer_b = load_backbone("minilm-l6", 7)  # a pretrained model ignores the seed
    assert tokenizer_a is tokenizer_b  # loaded once
    for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()
    before = _first_weight(b).clone()
    with torch.no_grad():
        _first_weight(a).add_(1.0)
    a.config.num_attention_heads = 3
    assert torch.equal(_first_weight(b), before)
    c, _ = load_backbone("minilm-l6", 0)
    assert torch.equal(_first_weight(c), before) and torch.equal(_first_weight(kept), before)
    assert c.config.num_attention_heads == b.config.num_attention_heads == 12


@pytest.mark.parametrize("name", ["tiny-bert", "random:minilm-l6"])
def test_a_seeded_random_model_is_what_it_was_without_the_cache(name):
    """The cached config builds the same weights from the seed as a config read afresh."""
    from transformers import AutoConfig, AutoModel

    spec = MODELS[name.removeprefix("random:")]
    if spec.config is not None:
        config = AutoConfig.for_model(**spec.config)
    else:
        config = AutoConfig.from_pretrained(spec.path())
    with torch.random.fork_rng():
        torch.manual_seed(5)
        fresh = AutoModel.from_config(config, dtype=torch.float32)
    for _ in range(2):  # the second one from the cache
        cached, _ = load_backbone(name, 5)
        for (key, p), q in zip(cached.state_dict().items(), fresh.state_dict().values(), strict=True):
            assert torch.equal(p, q), key
