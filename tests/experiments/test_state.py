"""RunState: checkpoints (state_dict) and weights (what a dependant run starts from) round trip."""

import copy

import pytest
import torch

from experiments import RunContext, parse_config
from experiments.training.loop import forward_logits
from experiments.training.state import RunState, set_up

TINY = {
    "model": "tiny-bert",
    "method": "finetune",
    "task": {"name": "synthetic-cls", "num_train": 16, "num_eval": 8, "max_length": 16},
}


def _state(seed: int = 0) -> RunState:
    return set_up(parse_config(TINY | {"seed": seed}), RunContext())


def _logits(state: RunState) -> torch.Tensor:
    state.train(False)
    split = state.data.dev
    with torch.no_grad():
        return forward_logits(state.encoder, state.decoder, split.input_ids, split.attention_mask)


def test_set_up_is_seeded_and_builds_one_task_decoder():
    a, b, c = _state(0), _state(0), _state(1)
    assert list(a.decoders) == ["task"] and a.step == 0 and a.values == {"eval_steps": []}
    assert (a.num_layers, a.num_heads) == (2, 4)
    assert torch.equal(_logits(a), _logits(b))
    assert not torch.equal(_logits(a), _logits(c))


def test_evaluating_puts_every_module_in_eval_mode_and_back_in_its_own_also_on_an_error():
    state = _state()
    state.train(True)
    state.decoder.train(False)  # modes differ: each comes back to its own
    with pytest.raises(RuntimeError), state.evaluating():
        assert not any(module.training for module in state.modules().values())
        raise RuntimeError("inside the block")
    assert state.encoder.training and not state.decoder.training


def test_weights_round_trip_into_another_run():
    source, target = _state(0), _state(1)
    weights = source.weights()
    assert {key.split(".")[0] for key in weights} == {"encoder", "decoders"}
    assert any(key.startswith("decoders.task.") for key in weights)
    target.load_weights(weights)
    assert torch.equal(_logits(source), _logits(target))
    for key, value in target.weights().items():
        assert torch.equal(value, weights[key])


def test_weights_are_copies_not_views_of_the_live_model():
    state = _state()
    weights = state.weights()
    before = {k: v.clone() for k, v in weights.items()}
    with torch.no_grad():
        for p in state.encoder.parameters():
            p.add_(1.0)
    assert all(torch.equal(weights[k], before[k]) for k in weights)


def test_load_weights_without_decoders_keeps_the_runs_own_decoder():
    source, target = _state(0), _state(1)
    own = copy.deepcopy(target.decoder.state_dict())
    target.load_weights(source.weights(), decoders=False)
    assert all(torch.equal(a, b) for a, b in zip(target.encoder.state_dict().values(), source.encoder.state_dict().values(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(target.decoder.state_dict().values(), own.values(), strict=True))
    encoder_only = {k: v for k, v in source.weights().items() if k.startswith("encoder.")}
    with pytest.raises(KeyError, match="decoders.task"):
        target.load_weights(encoder_only)


def test_state_dict_round_trip_restores_modules_optimisers_generators_rng_and_values():
    def build(seed):
        state = _state(seed)
        params = list(state.encoder.parameters()) + list(state.decoder.parameters())
        state.optimizers["model"] = torch.optim.AdamW(params, lr=1e-2)
        state.schedulers["model"] = torch.optim.lr_scheduler.LambdaLR(state.optimizers["model"], lambda s: 1 / (s + 1))
        state.generators["noise"] = torch.Generator().manual_seed(seed)
        return state

    def train_one_step(state):
        state.train()
        split = state.data.train
        loss = forward_logits(state.encoder, state.decoder, split.input_ids[:4], split.attention_mask[:4]).sum()
        state.optimizers["model"].zero_grad()
        loss.backward()
        state.optimizers["model"].step(), state.schedulers["model"].step()
        state.step += 1
        return torch.rand(3, generator=state.generators["noise"]), torch.rand(3)

    a = build(0)
    train_one_step(a)
    a.values["trajectory"] = [1.0]
    saved = copy.deepcopy(a.state_dict())
    a.values["trajectory"].append(2.0)  # the checkpoint holds a copy of values
    assert saved["values"] == {"eval_steps": [], "trajectory": [1.0]} and saved["step"] == 1

    b = build(1)  # seeds the global RNG from its own dropout stream ...
    b.load_state_dict(saved)  # ... which the checkpoint's replaces
    next_b = train_one_step(b)
    a.values["trajectory"].pop()
    torch.set_rng_state(saved["rng"])  # a goes on as if nothing had run in between
    next_a = train_one_step(a)
    assert b.step == a.step == 2 and b.values == a.values
    assert all(torch.equal(x, y) for x, y in zip(next_a, next_b, strict=True))  # generator and global RNG
    assert torch.equal(_logits(a), _logits(b))  # same weights and optimiser moments after one more step


def test_load_state_dict_refuses_a_checkpoint_of_other_objects():
    a, b = _state(), _state()
    a.optimizers["model"] = torch.optim.SGD(a.encoder.parameters(), lr=0.1)
    with pytest.raises(KeyError, match="optimizers"):
        b.load_state_dict(a.state_dict())


def test_weights_of_a_masked_run_are_the_plain_weights_and_its_interventions():
    """A masked Linear hands on its plain weight under its plain name; interventions go along."""
    from experiments.interventions.masks import MaskScores, attach_masks, maskable_weights

    state = _state(0)
    plain = state.weights()
    linears = maskable_weights(state.encoder)
    scores = MaskScores({name: lin.weight for name, lin in linears.items()}, sparsity=0.5)
    handle = attach_masks(linears, scores.mask)
    state.interventions["masks"] = scores
    weights = state.weights()
    handle.remove()
    assert {k: v for k, v in weights.items() if not k.startswith("interventions.")}.keys() == plain.keys()
    assert all(torch.equal(weights[k], plain[k]) for k in plain)  # unmasked values, plain names
    assert any(k.startswith("interventions.masks.scores.") for k in weights)
