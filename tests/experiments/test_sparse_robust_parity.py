"""Parity with Liu et al. 2022's reference code (llyx97/sparse-and-robust-PLM, issue 18 items 7 and 8).

Each test re-implements the reference's computation from its lines (cited per test) on small
fixed inputs or the tiny random BERT, and checks mask_train / imp do the same. Paths are in
that repository: hg_transformers/mask_trainer.py (mask training's loop), masking/maskers.py and
masking/sparsity_control.py (masks, schedule), mask_run_glue.py (what is masked),
hg_transformers/optimization.py (lr schedule), hg_transformers/trainer_imp.py (IMP) and
scripts/mask_train/mask_on_plm_pt/std/mnli/0.5.sh (--mask_classifier true --train_classifier false,
--learning_rate 5e-5 --warmup_steps 3600).
"""

import copy
import sys
from pathlib import Path

import pytest
import torch

from experiments.interventions.masks import MaskScores, magnitude_mask
from experiments.maths.schedules import cubic_sparsity
from experiments.models import load_backbone
from experiments.tasks import TASKS
from experiments.training.seeding import derive_seed
from experiments.training.state import build_decoder

sys.path.insert(0, str(Path(__file__).parent))  # tests/experiments/method_reads.py beside it
from method_reads import parse_without_unread_train  # noqa: E402

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 4, "batch_size": 8, "eval_every": 4, "lr": 1e-3},
}
ROLE_PATHS = {  # ours -> the reference's module names (masking/maskers.py:14-20, _bert_roberta_names)
    "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
    "attn_out": "attention.output.dense", "ffn_in": "intermediate.dense", "ffn_out": "output.dense",
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(method: str, train: dict | None = None, **section):
    raw = copy.deepcopy(TINY) | {"method": method, method: section}
    raw["train"] |= train or {}
    return parse_without_unread_train(raw)


def _start(cfg):
    """The pretrained encoder and the seed's initial classifier, as set_up builds them."""
    encoder, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    decoder = build_decoder(TASKS[cfg.task.name], encoder.config.hidden_size, 2, cfg.seed)
    return encoder, decoder


# --------------------------------------------------------------------------- mask training


def _reference_reset_threshold(scores: torch.Tensor, threshold: torch.Tensor, tgt_sparsity: float) -> torch.Tensor:
    """mask_trainer.py:419-427 (``reset_threshold``, local pruning), for one module."""
    _num_zero_element = int(scores.nelement() * tgt_sparsity)
    if _num_zero_element > 0:
        kthvalue = torch.kthvalue(input=scores.view(-1), k=_num_zero_element).values
        # do not reset the threshold when all the values in weight_mask are the same
        threshold = kthvalue if kthvalue < scores.max() else threshold
    return threshold


@pytest.mark.parametrize("values, sparsity", [
    ([0.3, -0.1, 0.7, 0.2], 0.5),                    # a plain k-th score
    ([0.02, 0.02, 0.02, 0.02], 0.5),                 # every score the same: the guard keeps 0.01
    ([0.0, 0.02, 0.02, 0.02], 0.5),                  # ties reach the top: the guard again
    ([0.05, -0.2, 0.011, 0.0, 0.3, 0.011, 0.2, 0.1, -0.05, 0.4], 0.7),
])
def test_threshold_reset_matches_the_reference_and_its_guard(values, sparsity):
    scores = MaskScores({"m": torch.ones(len(values))}, sparsity=0.0)
    with torch.no_grad():
        scores.scores[0].copy_(torch.tensor(values))
    expected = _reference_reset_threshold(torch.tensor(values), torch.tensor(0.01), sparsity)
    scores.reset_thresholds(sparsity)
    assert scores.thresholds[0].item() == pytest.approx(expected.item())
    assert scores.binary_masks()["m"].any()  # the guard never removes every weight


def _reference_target_sparsity(epoch: float, init_sparsity: float, final_sparsity: float, num_epochs: float) -> float:
    """masking/sparsity_control.py:10-38 (automated_gradual_sparsity) with init_epoch 0 and final_epoch
    = --final_sparsity_epoch = num_epochs (mask_run_glue.py:113; the gradual_sparsity_increase scripts
    pass $num_epoch), clamped to [init, final] as MaskerScheduler.step does (:161-171)."""
    final_epoch, init_epoch = num_epochs, 0
    if epoch > final_epoch:
        target = final_sparsity
    else:
        span = final_epoch - init_epoch
        target = final_sparsity + (init_sparsity - final_sparsity) * (1.0 - (1.0 * (epoch - init_epoch) / span)) ** 3
    return min(final_sparsity, max(target, init_sparsity))


def test_cubic_schedule_reaches_its_final_sparsity_at_the_last_epoch_as_the_reference():
    """The reference steps the schedule at epoch = global_step / steps per epoch
    (mask_trainer.py:634, 654); 5 epochs of 20 steps, 0.7 -> 0.9 (the gradual script's values)."""
    from experiments.methods.mask_train import Config

    hp = Config(sparsity=0.9, initial_sparsity=0.7)
    epochs, per_epoch = 5, 20
    total = epochs * per_epoch
    for step in range(0, total + 1, 5):
        ours = cubic_sparsity(step, hp.initial_sparsity, hp.sparsity, 0, round(hp.schedule_end * total))
        assert ours == pytest.approx(_reference_target_sparsity(step / per_epoch, 0.7, 0.9, epochs)), step
    assert cubic_sparsity(total - 1, 0.7, 0.9, 0, round(hp.schedule_end * total)) < 0.9  # still rising


def test_mask_train_steps_its_sparsity_on_the_reference_schedule():
    from experiments.methods.mask_train import Config, scheduled_sparsity

    hp = Config(sparsity=0.9, initial_sparsity=0.7)
    for step in range(0, 101, 5):
        assert scheduled_sparsity(step, 100, hp) == pytest.approx(_reference_target_sparsity(step / 20, 0.7, 0.9, 5))


def _reference_lr_lambda(current_step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    """hg_transformers/optimization.py:52-57 (get_linear_schedule_with_warmup's lr_lambda)."""
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))


def test_prune_only_trains_only_the_scores_at_the_reference_learning_rate(run_chain, monkeypatch):
    """The scripts run --learning_rate 5e-5 with --warmup_steps and linear decay
    (mask_trainer.py:342-356: one AdamW and get_linear_schedule_with_warmup over the model's
    trainable parameters, which with --train_classifier false are the scores only: maskers.py:578-582,
    612). 10 steps, warm-up 2 (train.warmup_ratio 0.2). Our shared linear_warmup_decay warms up one
    step ahead (step s uses the reference's s + 1: no step at lr 0); from the peak on they agree."""
    from experiments.methods import mask_train

    seen = []
    real_update = mask_train.update

    def spy(loss, optimizer, *args, **kwargs):
        seen.append([(group["lr"], [tuple(p.shape) for p in group["params"]]) for group in optimizer.param_groups])
        return real_update(loss, optimizer, *args, **kwargs)

    monkeypatch.setattr(mask_train, "update", spy)
    total, warmup = 10, 2
    cfg = _cfg("mask_train", train={"max_steps": total, "warmup_ratio": 0.2, "eval_every": total}, reset_every=5)
    run_chain(cfg)
    assert len(seen) == total
    assert all(len(groups) == 1 for groups in seen)  # one group: the scores, no decoder
    lrs = [groups[0][0] for groups in seen]
    reference = [5e-5 * _reference_lr_lambda(s, warmup, total) for s in range(total + 1)]
    assert lrs[:warmup] == pytest.approx(reference[1 : warmup + 1])
    assert lrs[warmup:] == pytest.approx(reference[warmup:total])
    assert max(lrs) == pytest.approx(5e-5)


def test_prune_only_masks_the_reference_matrices_and_updates_no_weight(run_chain):
    """mask_run_glue.py:144 (weight types K, Q, V, AO, I, O, P: P = bert.pooler.dense) and :157-159
    (--mask_classifier true adds `classifier`); maskers.py:578-582, 612 freeze every weight and bias
    of the model (the classifier too with --train_classifier false): only the scores train."""
    from experiments.interventions.masks import unpack_masks

    cfg = _cfg("mask_train", sparsity=0.5, lr=0.05, reset_every=2)
    result, store = run_chain(cfg)
    masks = unpack_masks(result.artifacts["masks.npz"])
    encoder, decoder = _start(cfg)
    layers = encoder.config.num_hidden_layers
    reference = {f"bert.encoder.layer.{i}.{path}" for i in range(layers) for path in ROLE_PATHS.values()}
    reference |= {"bert.pooler.dense", "classifier"}
    ours = {f"bert.encoder.layer.{name.split('.')[1]}.{ROLE_PATHS[name.split('.')[2]]}" if name.startswith("layer.")
            else {"pooler": "bert.pooler.dense", "decoder.classifier": "classifier"}[name] for name in masks}
    assert ours == reference
    assert all(abs(1 - m.float().mean().item() - 0.5) < 0.01 for m in masks.values())
    weights = store[cfg.run_key]
    assert all(torch.equal(weights[f"encoder.{k}"], v) for k, v in encoder.state_dict().items())
    assert all(torch.equal(weights[f"decoders.task.{k}"], v) for k, v in decoder.state_dict().items())
    assert any(not m.all() for n, m in masks.items() if n == "decoder.classifier")


def test_the_classifier_reads_the_masked_pooler_as_bert_for_sequence_classification():
    """modeling_bert.py:1214-1217 (pooled_output = outputs[1]; dropout; classifier) with the pooler
    of :477-489 (tanh(dense(h[:, 0]))), the masked pooler's weight W * m (maskers.py MaskedLinear1).
    transformers' BertForSequenceClassification is the same code: ours must give its logits."""
    from transformers import BertForSequenceClassification

    from experiments.interventions.masks import (
        attach_masks,
        maskable_weights,
        read_pooler,
        uses_pooler,
    )

    encoder, _ = load_backbone("tiny-bert", 0)
    decoder = build_decoder(TASKS["synthetic-cls"], encoder.config.hidden_size, 3, 0).eval()
    assert uses_pooler(encoder, decoder)
    mask = torch.rand(encoder.pooler.dense.weight.shape, generator=torch.Generator().manual_seed(0)) > 0.5
    reference = BertForSequenceClassification(_with_labels(encoder.config, 3)).eval()
    reference.bert.load_state_dict(encoder.state_dict())
    reference.classifier.load_state_dict(decoder.classifier.state_dict())
    with torch.no_grad():
        reference.bert.pooler.dense.weight.mul_(mask)
    ids = torch.tensor([[2, 7, 9, 4, 3, 0], [2, 5, 3, 0, 0, 0]])
    attention = (ids != 0).long()

    hook = read_pooler(encoder)
    handle = attach_masks({"pooler": maskable_weights(encoder)["pooler"]}, {"pooler": mask}.__getitem__)
    ours = decoder(encoder(input_ids=ids, attention_mask=attention).last_hidden_state, attention)
    handle.remove(), hook.remove()
    torch.testing.assert_close(ours, reference(input_ids=ids, attention_mask=attention).logits)


def _with_labels(config, num_labels: int):
    config = copy.deepcopy(config)
    config.num_labels = num_labels
    return config


# --------------------------------------------------------------------------- IMP


def _record_imp(run_chain, monkeypatch):
    """Run imp prune_then_ft at 30 % (3 rounds of 2 steps, a tenth of the train section's 20, then
    the 20-step retraining) on the tiny BERT, recording each
    pruning (round, step, the weights pruned, the classifier then) and each mask attachment (the
    encoder and classifier then, the mask): the first attachment is the run's, then one per round."""
    from experiments.methods import imp

    record = {"state": None, "pruned": [], "attached": []}
    real_set_up, real_prune, real_attach = imp.set_up, imp.imp_prune, imp.attach_masks

    def set_up(cfg, ctx):
        record["state"] = real_set_up(cfg, ctx)
        return record["state"]

    def imp_prune(weights, masks, k, *args):
        state = record["state"]
        record["pruned"].append((k, state.step, {n: w.detach().clone() for n, w in weights.items()},
                                 copy.deepcopy(state.decoder.state_dict())))
        return real_prune(weights, masks, k, *args)

    def attach_masks(linears, source):
        state = record["state"]
        record["attached"].append((copy.deepcopy(state.encoder.state_dict()), copy.deepcopy(state.decoder.state_dict()),
                                   {n: source(n).clone() for n in linears}))
        return real_attach(linears, source)

    monkeypatch.setattr(imp, "set_up", set_up)
    monkeypatch.setattr(imp, "imp_prune", imp_prune)
    monkeypatch.setattr(imp, "attach_masks", attach_masks)
    cfg = _cfg("imp", train={"max_steps": 20, "eval_every": 100}, pipeline="prune_then_ft", sparsity=0.3)
    result, _ = run_chain(cfg)
    return record, cfg, result


def test_imp_prunes_the_pretrained_magnitudes_at_step_0(run_chain, monkeypatch):
    """trainer_imp.py:595 (orig_param = rewind(state_dict) before training), :625 (the first
    pruning_and_save at step 0: 10 % of the pretrained magnitudes, L1 per matrix, :484-496, the
    pooler included: :492), :732 (the next ones every save_steps = t_total / 10, :560)."""
    from experiments.methods import imp

    record, cfg, result = _record_imp(run_chain, monkeypatch)
    encoder, _ = _start(cfg)
    assert [(k, step) for k, step, _, _ in record["pruned"]] == [(0, 0), (1, 2), (2, 4)]
    assert result.steps == 4 + 20  # two rounds of t_total / 10, then the retraining of t_total
    _, _, first_weights, _ = record["pruned"][0]
    linears = imp.maskable_weights(encoder)
    assert set(first_weights) == set(linears)  # every layer's six and the pooler
    for name, linear in linears.items():
        torch.testing.assert_close(first_weights[name], linear.weight, rtol=0, atol=0)
        assert torch.equal(record["attached"][1][2][name], magnitude_mask(linear.weight, 0.1))


def test_imp_rewinds_the_encoder_and_keeps_the_trained_classifier(run_chain, monkeypatch):
    """trainer_imp.py:445-453 (after each pruning the weights in orig_param return) and :361-382
    (rewind() keeps only the keys with 'bert': the trained classifier stays). The subnetwork is then
    retrained in a new run (scripts/imp/lt/retrain/std/mnli/0.5.sh: from bert-base-uncased, so the
    pretrained encoder and the seed's initial classifier)."""
    record, cfg, _ = _record_imp(run_chain, monkeypatch)
    encoder, decoder = _start(cfg)
    start_encoder, start_decoder = encoder.state_dict(), decoder.state_dict()
    assert [k for k, *_ in record["pruned"]] == [0, 1, 2]
    for (k, _, _, decoder_before), (enc_after, dec_after, _) in zip(record["pruned"][1:], record["attached"][2:],
                                                                   strict=True):
        assert all(torch.equal(enc_after[key], value) for key, value in start_encoder.items())  # bert.* rewound
        kept = decoder_before if k < 2 else start_decoder  # rounds keep the classifier; the retraining starts afresh
        assert all(torch.equal(dec_after[key], value) for key, value in kept.items()), k
        if k < 2:
            assert not all(torch.equal(decoder_before[key], value) for key, value in start_decoder.items())


def test_imp_rounds_train_at_the_reference_learning_rate(run_chain, monkeypatch):
    """trainer_imp.py:431-433 (pruning_and_save rebuilds the optimiser and
    get_linear_schedule_with_warmup(t_total) at every pruning; the pruning scripts set no
    --warmup_steps) and optimization.py:52-57: a round of t_total / 10 steps runs the first tenth
    of the decay, from lr to 0.9 lr; the retraining (a new run) decays to 0 over its own steps."""
    from experiments.methods import imp

    lrs = []
    real_update = imp.update

    def spy(loss, optimizer, *args, **kwargs):
        lrs.append(optimizer.param_groups[0]["lr"])
        return real_update(loss, optimizer, *args, **kwargs)

    monkeypatch.setattr(imp, "update", spy)
    t_total = 20
    run_chain(_cfg("imp", train={"warmup_ratio": 0.0, "max_steps": t_total, "eval_every": 100},
                   pipeline="prune_then_ft", sparsity=0.3))
    rounds = [1e-3 * _reference_lr_lambda(s, 0, t_total) for s in range(t_total // 10)] * 2
    retrain = [1e-3 * _reference_lr_lambda(s, 0, t_total) for s in range(t_total)]
    assert lrs == pytest.approx(rounds + retrain)
    assert rounds[-1] == pytest.approx(0.95e-3)


# --------------------------------------------------------------------------- gradual schedules: magnitude_soft


def _reference_magnitude_soft(weight: torch.Tensor, init_sparsity: float) -> tuple[torch.Tensor, torch.Tensor | int]:
    """maskers.py:163-166, 182-187 (``controlled_init``, ``_magnitude_soft``): the mask's scores are
    |W| and the module's threshold the k-th |W|, k = int(numel * init_sparsity) (0 when k = 0)."""
    _weight_size = weight.nelement()
    _num_zero_element = int(_weight_size * init_sparsity)
    _weight = weight.abs()
    _flatten_weight = _weight.view(-1)
    kthvalue = torch.kthvalue(input=_flatten_weight, k=_num_zero_element).values if _num_zero_element > 0 else 0
    return _weight, kthvalue


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.7])
def test_soft_magnitude_init_is_the_references_magnitude_soft(sparsity):
    """Small fixed matrices (ties included): the same scores, thresholds and first mask (|W| > kth)."""
    weights = {
        "a": torch.tensor([[0.3, -0.1, 0.2], [-0.05, 0.4, -0.2], [0.0, 0.15, -0.3]]),
        "b": torch.linspace(-1, 1, 20).reshape(4, 5),
    }
    ours = MaskScores(weights, sparsity, init="magnitude_soft")
    for index, (name, weight) in enumerate(weights.items()):
        scores, threshold = _reference_magnitude_soft(weight, sparsity)
        torch.testing.assert_close(ours.scores[index].detach(), scores, rtol=0, atol=0)
        assert float(ours.thresholds[index]) == pytest.approx(float(threshold), abs=1e-7)
        assert torch.equal(ours.binary_masks()[name], scores > threshold)


def test_gradual_mask_train_starts_from_soft_magnitude_scores_constant_from_hard(monkeypatch):
    """The reference's gradual scripts (scripts/mask_train/.../gradual_sparsity_increase/0.9.sh:
    --controlled_init magnitude_soft with --init_sparsity) and its constant-sparsity ones
    (--controlled_init magnitude): init auto picks the same; init magnitude keeps the hard start."""
    from experiments.methods.mask_train import Config, score_init

    assert score_init(Config(sparsity=0.9, initial_sparsity=0.7)) == "magnitude_soft"
    assert score_init(Config(sparsity=0.5)) == "magnitude"
    assert score_init(Config(sparsity=0.9, initial_sparsity=0.7, init="magnitude")) == "magnitude"


def test_gradual_run_ranks_by_magnitude_and_stores_its_initial_mask(run_chain):
    """A gradual run's stored initial mask is the reference's magnitude_soft mask of the pretrained
    weights at init_sparsity; its final mask holds the final sparsity."""
    from experiments.interventions.masks import maskable_weights, unpack_masks

    cfg = _cfg("mask_train", train={"max_steps": 4, "eval_every": 4}, sparsity=0.6, initial_sparsity=0.3,
               lr=1e-3, reset_every=2)
    result, _ = run_chain(cfg)
    initial = unpack_masks(result.artifacts["initial_masks.npz"])
    final = unpack_masks(result.artifacts["masks.npz"])
    encoder, decoder = _start(cfg)
    for name, linear in maskable_weights(encoder, decoder).items():
        scores, threshold = _reference_magnitude_soft(linear.weight.detach(), 0.3)
        assert torch.equal(initial[name], scores > threshold), name
        assert abs(1 - final[name].float().mean().item() - 0.6) < 0.02, name
