"""skill_neurons end to end on tiny random models: prompt tuning with a frozen backbone, the
predictivity map, the perturbation check and its noise hook, binary subtasks, validation, and
parity with the reference code (THU-KEG/Skill-Neuron) for the noise and the pruning's means."""

import copy
import io

import numpy as np
import pytest
import torch

from base.sections import ConfigError
from experiments import RunContext, parse_config
from experiments.components import prompting
from experiments.interventions.neurons import capture_ffn, perturb_neurons
from experiments.maths.losses import task_loss
from experiments.methods import skill_neurons
from experiments.models import load_backbone
from experiments.training.loop import evaluate_all, forward_logits, update
from experiments.training.seeding import derive_seed
from experiments.training.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 48, "max_length": 24},
    "train": {"max_steps": 12, "batch_size": 16, "eval_every": 2},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(base=TINY, **section):
    raw = copy.deepcopy(base)
    return parse_config({**raw, "method": "skill_neurons", "skill_neurons": {"prompt_length": 4, **section}})


def _npz(result) -> dict:
    return dict(np.load(io.BytesIO(result.artifacts["skill_neurons.npz"])))


def test_the_prompt_alone_learns_through_the_frozen_backbone():
    """A frozen verbalizer (random words) and a fixed batch in eval mode: only the prompt trains,
    and the loss falls. (On a tiny random model the prompt finds the batch's label balance, not
    much more: its whole lever is where the prompt positions attend. Still, nothing else moves.)"""
    state, model, optimizer = prompting.build(_cfg(verbalizer="random_words", lr=0.01), RunContext())
    state.train(False)  # no dropout, the read-out's running statistics fixed: a deterministic loss
    ids, mask, labels = state.data.train.input_ids[:16], state.data.train.attention_mask[:16], state.data.train.labels[:16]
    assert not [name for name, p in state.encoder.named_parameters() if p.requires_grad]
    assert not list(state.decoder.parameters())  # the verbalizer's rows are a buffer
    before = {k: v.clone() for k, v in state.encoder.state_dict().items()}
    losses = []
    for _ in range(10):
        losses.append(update(task_loss(forward_logits(model, state.decoder, ids, mask), labels), optimizer))
    assert losses[-1] < losses[0] - 0.05, losses
    assert model.prompt.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in state.encoder.parameters())
    assert all(torch.equal(v, before[k]) for k, v in state.encoder.state_dict().items())


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-roberta"])
def test_a_run_leaves_the_backbone_and_maps_layers_by_neurons(run_chain, model):
    tracker = MemoryTracker()
    cfg = _cfg({**TINY, "model": model})
    result, store = run_chain(cfg, tracker)
    pretrained, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    weights = store[cfg.run_key]
    assert all(torch.equal(weights[f"encoder.{k}"], v) for k, v in pretrained.state_dict().items())
    start = pretrained.get_input_embeddings().weight
    prompt = weights["interventions.prompt.weight"]
    assert prompt.shape == (4, start.shape[1])
    distance = (prompt[:, None, :] - start[None]).abs().amax(dim=-1).min(dim=1).values  # (n,) to the nearest word
    assert (distance > 1e-4).all()  # each vector moved off the word it started from
    assert len(tracker.metrics["accuracy"]) == 6  # evaluated through the prompt every 2 steps

    values = result.maps["neurons.predictivity"].values
    assert values.shape == (2, 64)  # (layers, intermediate)
    assert (values >= 0.5).all() and (values <= 1.0).all()
    assert result.metrics["predictivity_top1"] == pytest.approx(values.max())
    saved = _npz(result)
    assert saved["baseline"].shape == (1, 4, 2, 64) and len(saved["label_words"]) == 0  # a learned read-out
    assert saved["selected"].shape == (4, 2, 64)
    for i, (f, per_layer) in enumerate(zip((0.01, 0.02, 0.05, 0.1), (1, 1, 3, 6), strict=True)):
        assert f"accuracy_noise_top_{f:g}" in result.metrics and f"accuracy_noise_random_{f:g}" in result.metrics
        assert saved["k"].tolist()[i] == 2 * per_layer  # max(1, int(f * 64)) in each of the 2 layers
        selected = saved["selected"][i]
        assert selected.sum(axis=1).tolist() == [per_layer, per_layer]
        for layer in range(2):  # each layer's best
            assert values[layer][selected[layer]].min() >= values[layer][~selected[layer]].max()
    assert {"skill_neurons.npz", "perturbation.png"} <= set(tracker.artifacts)


def test_noise_changes_only_the_chosen_neurons_and_no_neurons_change_nothing():
    cfg = _cfg(noise_std=0.5)
    state, model, _ = prompting.build(cfg, RunContext())
    state.train(False)
    ids, mask = state.data.dev.input_ids[:6], state.data.dev.attention_mask[:6]
    with torch.no_grad(), capture_ffn(state.encoder) as capture:
        model(ids, mask)
        clean = capture.take()  # (B, T, L, I)
        chosen = torch.tensor([3, 17, 40])
        handle = perturb_neurons(state.encoder, {1: chosen}, 0.5, torch.Generator().manual_seed(0))
        model(ids, mask)
        noisy = capture.take()
        handle.remove()
        model(ids, mask)
        again = capture.take()
    assert torch.equal(again, clean)  # removed
    assert torch.equal(noisy[:, :, 0], clean[:, :, 0])  # the layer before: untouched
    changed = (noisy[:, :, 1] != clean[:, :, 1]).flatten(0, 1).any(dim=0)  # (I,)
    assert changed.nonzero().flatten().tolist() == chosen.tolist()
    assert (noisy[:, :, 1, chosen] != clean[:, :, 1, chosen]).all()  # at every position
    # one draw per sequence: layer 0's input is the clean one, so its shift is the same at every token
    handle = perturb_neurons(state.encoder, {0: chosen}, 0.5, torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_ffn(state.encoder) as capture:
        model(ids, mask)
        shift = capture.take()[:, :, 0, chosen] - clean[:, :, 0, chosen]  # (B, T, k)
    handle.remove()
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift), rtol=0, atol=1e-6)
    assert (shift[0, 0] != shift[1, 0]).all()  # and another per sequence
    # positions: only those are recorded
    with torch.no_grad(), capture_ffn(state.encoder, torch.tensor([1, 2])) as capture:
        model(ids, mask)
        torch.testing.assert_close(capture.take(), clean[:, 1:3])
    # the perturbation check's evaluation: no neurons, or zero noise, is the plain accuracy
    plain = evaluate_all(state, model)["accuracy"]
    assert prompting.noisy_accuracy(model, state, {}, 0.5) == plain
    assert prompting.noisy_accuracy(model, state, {0: torch.tensor([]), 1: torch.tensor([], dtype=torch.long)},
                                        0.5) == plain
    assert prompting.noisy_accuracy(model, state, {1: torch.arange(64)}, 0.0) == plain


def test_three_classes_from_a_file_on_another_family_are_binarize_s_two_subtasks(run_chain, tmp_path):
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "examples" / "data"
    base = {"model": "tiny-electra",
            "task": {"name": "classification", "data_dir": str(data), "train": "feedback_train.csv",
                     "dev": "feedback_dev.csv", "max_length": 24},
            "train": {"max_steps": 3, "batch_size": 8, "eval_every": 3}}
    result, _ = run_chain(_cfg(base, readout="cls", perturb_fractions=[0.05]))
    saved = _npz(result)
    assert saved["per_subtask"].shape == (2, 2, 64)  # pn (class 0 vs 2), neu (class 1 vs rest)
    np.testing.assert_allclose(result.maps["neurons.predictivity"].values, saved["per_subtask"].max(axis=0))
    assert saved["selected"][0].sum(axis=1).tolist() == [3, 3]  # int(0.05 * 64) per layer: 1 from pn, 2 from neu
    assert "binary subtasks" in result.maps["neurons.predictivity"].meaning


def test_random_init_minilm_with_label_words():
    """The pretraining control (random:minilm-l6) and a verbalizer of the task's label words."""
    base = {"model": "random:minilm-l6",
            "task": {"name": "synthetic-cls", "num_train": 24, "num_eval": 16, "max_length": 16},
            "train": {"max_steps": 1, "batch_size": 8, "eval_every": 1}}
    result = skill_neurons.run(_cfg(base, prompt_length=2, verbalizer="label_words", perturb_fractions=[0.001]),
                               RunContext())
    assert result.maps["neurons.predictivity"].values.shape == (6, 1536)
    saved = _npz(result)
    assert saved["label_words"].tolist() == ["negative", "positive"] and saved["k"].tolist() == [6]  # 1 per layer


def test_random_words_follow_word_seed():
    from experiments.models import load_tokenizer

    tokenizer, words = load_tokenizer("tiny-bert"), []
    for word_seed in (None, 0, 1):
        state, _, _ = prompting.build(_cfg(verbalizer="random_words", word_seed=word_seed), RunContext())
        words.append(state.values["label_words"])
        rows = state.encoder.get_input_embeddings().weight[tokenizer.convert_tokens_to_ids(words[-1])]
        torch.testing.assert_close(state.decoder.words, rows / rows.norm(dim=1, keepdim=True))  # unit embeddings
        assert not state.decoder.words.requires_grad and not list(state.decoder.parameters())
    assert words[0] == words[1] != words[2]  # None = the run's seed (0)
    assert all(len(w) == 2 and w[0] != w[1] for w in words)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": {"name": "ud-pos"}}, r"task.name: skill_neurons needs a sentence classification task, and 'ud-pos' is tagging"),
        ({"skill_neurons": {"label_words": ["bad", "good"]}}, r"skill_neurons.label_words: read only with verbalizer label_words"),
        ({"skill_neurons": {"verbalizer": "label_words", "label_words": ["bad", "ok", "good"]}},
         r"skill_neurons.label_words: 3 words for the 2 classes"),
        ({"skill_neurons": {"word_seed": 3}}, r"skill_neurons.word_seed: read only with verbalizer random_words"),
        ({"model": "tiny-electra", "skill_neurons": {"verbalizer": "random_words"}},
         r"skill_neurons.verbalizer: random_words scores hidden states \(32\) against word embeddings \(16\)"),
        ({"model": "tiny-roberta", "skill_neurons": {"prompt_length": 100}, "task": {"max_length": 64}},
         r"skill_neurons.prompt_length: 100 prompt vectors \+ task.max_length 64 exceed the 129 positions"),
        ({"skill_neurons": {"perturb_fractions": [0.0, 0.1]}}, r"skill_neurons.perturb_fractions"),
        ({"skill_neurons": {"readout": "mask"}}, r"skill_neurons.readout"),
    ],
)
def test_bad_configs_fail_at_validation_naming_the_key(change, message):
    raw = {"model": "tiny-bert", "method": "skill_neurons", "task": {"name": "synthetic-cls"}}
    for key, value in change.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


@pytest.mark.parametrize("fraction", [1.0, 0.05])
def test_pruning_the_upper_layers_reports_a_sliced_copy(run_chain, fraction):
    """Keeping every neuron of the upper layers is the unpruned model (nothing folded, same
    accuracy, with the read-out's statistics left as trained); keeping 5 % (3 of 64) slices the upper
    layer's FFN and says what was kept."""
    result, _ = run_chain(_cfg(prune_fraction=fraction, perturb_fractions=[0.05], recalibrate_bn=fraction != 1.0))
    metrics = result.metrics
    assert metrics["pruned_kept_fraction"] == pytest.approx(int(fraction * 64) / 64)
    hidden = 32  # tiny-bert
    removed = 64 - int(fraction * 64)  # in layer 2, the upper three quarters of 2 layers (l >= ceil(2 / 4))
    assert metrics["pruned_params_full"] - metrics["pruned_params"] == removed * (2 * hidden + 1)
    if fraction == 1.0:
        assert metrics["pruned_accuracy"] == pytest.approx(metrics["accuracy"])
    assert 0.0 <= metrics["pruned_accuracy"] <= 1.0


def _readout_states(readout, model, state, n: int) -> torch.Tensor:
    """The read-out's input state (n, Hd) over the first ``n`` training examples, in one batch."""
    with torch.no_grad():
        hidden = model(state.data.train.input_ids[:n], state.data.train.attention_mask[:n]).last_hidden_state
        return readout.state(hidden)


@pytest.mark.parametrize("recalibrate_bn", [True, False])
def test_pruned_accuracy_reads_the_pruned_backbone_s_statistics(monkeypatch, recalibrate_bn):
    """recalibrate_bn: the pruned copy is evaluated with a read-out whose BatchNorm holds the mean and
    variance of the PRUNED backbone's read-out input over the training examples (not the unpruned
    model's, which the run's own read-out keeps); false: the run's read-out as it is (VERSION 2)."""
    seen = {}

    def spy(encoder, decoder, *args, **kwargs):
        seen.update(encoder=encoder, decoder=decoder, mean=decoder.norm.running_mean.clone(),
                    var=decoder.norm.running_var.clone())
        return {"accuracy": 0.5}

    monkeypatch.setattr(skill_neurons, "evaluate", spy)
    cfg = _cfg(prune_fraction=0.05, perturb_fractions=[0.05], recalibrate_bn=recalibrate_bn)
    state, model, _ = prompting.build(cfg, RunContext())
    state.train(False)
    trained = {k: v.clone() for k, v in state.decoder.norm.state_dict().items()}
    found = prompting.find_skill_neurons(model, state)
    skill_neurons._pruned(model, state, found, cfg.section)

    assert all(torch.equal(v, trained[k]) for k, v in state.decoder.norm.state_dict().items())  # the run's stays
    n = len(state.data.train)  # 64 < the 256 recalibration reads
    pruned = _readout_states(state.decoder, seen["encoder"], state, n)
    unpruned = _readout_states(state.decoder, model, state, n)
    assert (pruned.mean(0) - unpruned.mean(0)).abs().max() > 1e-3  # pruning moved the read-out's input
    if recalibrate_bn:
        assert seen["decoder"] is not state.decoder
        torch.testing.assert_close(seen["mean"], pruned.mean(0), rtol=0, atol=1e-5)
        torch.testing.assert_close(seen["var"], pruned.var(0), rtol=1e-4, atol=1e-5)
        assert (seen["mean"] - unpruned.mean(0)).abs().max() > 1e-3
        assert (seen["mean"] - trained["running_mean"]).abs().max() > 1e-3
    else:
        assert seen["decoder"] is state.decoder
        assert torch.equal(seen["mean"], trained["running_mean"]) and torch.equal(seen["var"], trained["running_var"])


def test_recalibrate_reads_the_first_n_examples_over_uneven_batches():
    """20 examples in batches of 16 and 4: the statistics of those 20, not an average of the two batches'."""
    state, model, _ = prompting.build(_cfg(), RunContext())
    readout = copy.deepcopy(state.decoder)
    prompting.recalibrate(readout, model, state, n=20)
    h = _readout_states(readout, model, state, 20)
    torch.testing.assert_close(readout.norm.running_mean, h.mean(0), rtol=0, atol=1e-5)
    torch.testing.assert_close(readout.norm.running_var, h.var(0), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(readout.norm.running_mean, _readout_states(readout, model, state, 64).mean(0))


# ------------------------------------------------------------------------------ parity with the reference code


def test_parity_noise_is_the_reference_s_one_draw_per_sequence():
    """THU-KEG/Skill-Neuron src/modelzoo.py:82-91 (``addmask``, type gaussian), re-implemented as its
    hook: per layer, ``bias = randn([B, width]) * alpha; bias = bias * cmask; output += bias.unsqueeze(1)``,
    for every layer of ``range(lowlayer, highlayer)`` (all), ``cmask`` the layer's row of the skill-neuron
    mask. With the same generator state ours gives the same activations, bit for bit. (7da99f0 drew
    ``randn((B, T, k))``: another draw at every token.)"""
    state, model, _ = prompting.build(_cfg(), RunContext())
    state.train(False)
    ids, mask = state.data.dev.input_ids[:5], state.data.dev.attention_mask[:5]
    pmask = torch.zeros(2, 64, dtype=torch.bool)
    pmask[0, [3, 17, 40]] = True
    pmask[1, [0, 5, 63, 8]] = True
    alpha = 0.1
    modules = [layer.intermediate for layer in state.encoder.encoder.layer]  # BERT: intermediate = act(dense(x))

    def reference_hook(k, g):
        def fn(_, __, output):
            cmask = pmask[k]
            bias = torch.randn([output.shape[0], 64], generator=g) * alpha
            bias = bias * cmask
            output += bias.unsqueeze(dim=1)
            return output
        return fn

    def activations():
        with torch.no_grad(), capture_ffn(state.encoder) as capture:
            model(ids, mask)
            return capture.take()  # (B, T, L, I)

    g = torch.Generator().manual_seed(7)
    handles = [modules[k].register_forward_hook(reference_hook(k, g)) for k in range(2)]
    reference = activations()
    for handle in handles:
        handle.remove()
    ours_handle = perturb_neurons(state.encoder, {k: pmask[k].nonzero().flatten() for k in range(2)}, alpha,
                                  torch.Generator().manual_seed(7))
    ours = activations()
    ours_handle.remove()
    assert torch.equal(ours, reference)
    assert not torch.equal(ours, activations())  # the noise was there


def test_parity_pruning_folds_the_prompt_position_training_means(monkeypatch):
    """THU-KEG/Skill-Neuron src/prune.py:44-49: ``ths = train_avg.mean(axis=1)`` (trainer.py:251-269,
    ``probe_avg``: the training set's mean activation at the prompt positions, (L, P, I)) folded into
    layers ``range(3, 12)`` of 12, keeping the skill neurons (``info`` at 0.02). On tiny-bert's 2
    layers: layer 1 (l >= ceil(2 / 4)). 7da99f0 folded the mean over every real token, upper half."""
    seen = {}

    def spy(encoder, evaluate, keep, baseline, fold="removed"):
        seen.update(keep=keep, baseline=baseline, fold=fold)
        return {}

    monkeypatch.setattr(skill_neurons, "pruned_metrics", spy)
    cfg = _cfg(prune_fraction=0.1, perturb_fractions=[0.1])
    state, model, _ = prompting.build(cfg, RunContext())
    state.train(False)
    found = prompting.find_skill_neurons(model, state)
    skill_neurons._pruned(model, state, found, cfg.section)
    # the reference's probe_avg, batch by batch over the training set: sum of hidden[k][:, :prompt_size] / N
    ths = torch.zeros(2, 4, 64, dtype=torch.float64)
    train = state.data.train
    with torch.no_grad(), capture_ffn(state.encoder) as capture:
        for start in range(0, len(train), 16):
            model(train.input_ids[start : start + 16], train.attention_mask[start : start + 16])
            hidden = capture.take()  # (B, T, L, I)
            for k in range(2):
                ths[k] += hidden[:, 1:5, k].double().sum(dim=0)  # our prompt: positions 1 .. n
    ths = ths / len(train)
    pbias = ths.mean(dim=1)  # (L, I)
    assert list(seen["keep"]) == [1] and seen["fold"] == "removed"
    torch.testing.assert_close(seen["baseline"][1], pbias[1].float(), rtol=0, atol=1e-6)
    score = found["per_subtask"][0, 1]
    kept = seen["keep"][1]
    assert len(kept) == 6 and score[kept].min() >= score[~torch.isin(torch.arange(64), kept)].max()


def test_reference_restores_the_reference_fold():
    assert skill_neurons.REFERENCE == {"prune_fold": "all", "prompt_optimizer": "reference"}
    cfg = parse_config({"model": "tiny-bert", "method": "skill_neurons", "task": {"name": "synthetic-cls"},
                        "skill_neurons": skill_neurons.REFERENCE})
    assert cfg.section.prune_fold == "all" and skill_neurons.Config().prune_fold == "removed"
