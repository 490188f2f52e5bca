"""The one handle type: every intervention comes off the model by ``remove()`` or its ``with``, once."""

import pytest
import torch

from experiments.interventions.attention import disable_heads
from experiments.interventions.ffn_prune import mask_ffn
from experiments.interventions.handles import Handle
from experiments.interventions.heads import attach_head_gates, attach_token_gates
from experiments.interventions.masks import attach_masks, maskable_weights, read_pooler
from experiments.interventions.neurons import perturb_neurons
from experiments.models import load_backbone

# tiny-bert: 2 layers, 4 heads, 64 FFN neurons; each attach changes its output
ATTACHES = {
    "head gates": lambda m: attach_head_gates(m, lambda: torch.zeros(2, 4)),
    "token gates": lambda m: attach_token_gates(m, torch.zeros(2, 4)),
    "uniform attention": lambda m: disable_heads(m, torch.ones(2, 4, dtype=torch.bool)),
    "weight masks": lambda m: attach_masks(maskable_weights(m), lambda name: torch.tensor(False)),
    "neuron noise": lambda m: perturb_neurons(m, {0: torch.arange(64)}, 1.0, torch.Generator().manual_seed(0)),
    "ffn mask": lambda m: mask_ffn(m, {0: torch.tensor([0])}, {0: torch.ones(64), 1: torch.ones(64)}),
    "pooler read": read_pooler,
}


def test_remove_undoes_last_first_and_only_once():
    done = []
    handle = Handle([lambda: done.append("first"), lambda: done.append("second")])
    handle.remove()
    handle.remove()
    assert done == ["second", "first"]


def test_with_removes_also_on_an_error():
    done = []
    with pytest.raises(RuntimeError), Handle([lambda: done.append("undone")]):
        raise RuntimeError("inside the block")
    assert done == ["undone"]


@pytest.mark.parametrize("name", sorted(ATTACHES))
def test_every_attach_returns_a_handle_that_gives_the_plain_model_back(name, minilm_tokenizer):
    model, _ = load_backbone("tiny-bert", 0)
    batch = minilm_tokenizer(["handles come off", "a"], padding=True, return_tensors="pt")
    keys = list(model.state_dict())

    def hidden() -> torch.Tensor:
        return model(**batch).last_hidden_state.detach()

    plain = hidden()
    with ATTACHES[name](model) as handle:
        assert isinstance(handle, Handle)
        assert not torch.allclose(hidden(), plain)
    assert torch.equal(hidden(), plain)
    assert list(model.state_dict()) == keys
    handle.remove()  # again: harmless
    assert torch.equal(hidden(), plain)
