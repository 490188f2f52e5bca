"""Parity of the paper recipes' optimisers with the reference scripts (issue 31 item 2).

examples/papers/michel_2019.yaml fine-tunes as pytorch-pretrained-BERT's ``paul`` branch
(examples/run_classifier.py:282-305, experiments/prepare_task.sh: ``--learning_rate 2e-5``), and
examples/papers/liu_2022.yaml as llyx97/sparse-and-robust-PLM's hg_transformers/trainer_imp.py:312-323
(TrainingArguments: lr 5e-5, weight_decay 0.0). Each test rebuilds the reference's param groups by
name on BertForSequenceClassification's parameter names (``bert.*``, ``classifier.*``) and checks
that headsweep's optimiser gives every parameter the same lr and weight decay.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from base.sections import ConfigError
from experiments import parse_config
from experiments.models import load_backbone
from experiments.tasks import TASKS
from experiments.training.seeding import derive_seed
from experiments.training.state import build_decoder, fine_tuning_groups, read_pooler_for_good

PAPERS = Path(__file__).resolve().parents[2] / "examples" / "papers"


def _recipe_train(paper: str) -> dict:
    return yaml.safe_load((PAPERS / f"{paper}.yaml").read_text())["base"]["train"]


def _model(train: dict):
    """The tiny BERT with the recipe's train section, and its encoder and classifier, as set_up builds them."""
    cfg = parse_config({"model": "tiny-bert", "method": "finetune", "train": train,
                        "task": {"name": "synthetic-cls", "num_train": 16, "num_eval": 8}})
    encoder, _ = load_backbone(cfg.model, 0)
    decoder = build_decoder(TASKS[cfg.task.name], encoder.config.hidden_size, 2, cfg.seed)
    return cfg, encoder, decoder


def _named(encoder, decoder) -> list[tuple[str, torch.nn.Parameter]]:
    """BertForSequenceClassification's names of the same parameters: ``bert.<...>``, ``classifier.<...>``."""
    return ([(f"bert.{n}", p) for n, p in encoder.named_parameters()]
            + [(n, p) for n, p in decoder.named_parameters()])


def _reference_michel(named, learning_rate: float) -> dict[str, tuple[float, float]]:
    """run_classifier.py:282-292 (paul): two groups by name, BertAdam(lr=args.learning_rate) over both."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    groups = [
        {"params": [n for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [n for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    return {n: (learning_rate, g["weight_decay"]) for g in groups for n in g["params"]}


def _reference_liu(named, learning_rate: float = 5e-5, weight_decay: float = 0.0) -> dict[str, tuple[float, float]]:
    """trainer_imp.py:312-323: two groups by name, AdamW(lr=args.learning_rate), args.weight_decay 0.0."""
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [n for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": weight_decay},
        {"params": [n for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    return {n: (learning_rate, g["weight_decay"]) for g in groups for n in g["params"]}


def optimiser_table(cfg, encoder, decoder) -> dict[str, tuple[float, float]]:
    """Each parameter's (lr, weight decay) in headsweep's fine-tuning optimiser, by reference name."""
    by_id = {id(p): (g["lr"], g["weight_decay"]) for g in fine_tuning_groups(encoder, decoder, cfg.train)
             for p in g["params"]}
    return {n: by_id[id(p)] for n, p in _named(encoder, decoder)}


def test_michel_recipe_trains_every_parameter_as_run_classifier():
    cfg, encoder, decoder = _model(_recipe_train("michel_2019"))
    ours = optimiser_table(cfg, encoder, decoder)
    assert ours == _reference_michel(_named(encoder, decoder), 2e-5)
    assert {lr for lr, _ in ours.values()} == {2e-5}
    assert ours["classifier.weight"] == (2e-5, 0.01) and ours["bert.pooler.dense.weight"] == (2e-5, 0.01)
    assert ours["bert.embeddings.LayerNorm.weight"] == (2e-5, 0.0)


def test_liu_recipe_trains_every_parameter_as_trainer_imp():
    cfg, encoder, decoder = _model(_recipe_train("liu_2022"))
    ours = optimiser_table(cfg, encoder, decoder)
    assert ours == _reference_liu(_named(encoder, decoder))
    assert set(ours.values()) == {(5e-5, 0.0)}


def test_default_keeps_the_decoder_lr_one_key_away():
    """Without the recipes' keys the classifier trains at train.decoder_lr (1e-3), not the references' lr."""
    cfg, encoder, decoder = _model({"lr": 2e-5})
    ours = optimiser_table(cfg, encoder, decoder)
    assert ours != _reference_michel(_named(encoder, decoder), 2e-5)
    assert ours["classifier.weight"] == (1e-3, 0.01) and ours["bert.encoder.layer.0.output.dense.weight"] == (2e-5, 0.01)


def test_pooler_key_puts_berts_pooler_between_cls_and_classifier():
    """train.pooler: the classifier reads tanh(W_p h_[CLS] + b_p), BertForSequenceClassification's
    ``pooled_output`` (modeling.py BertPooler), not h_[CLS]."""
    cfg, encoder, decoder = _model(_recipe_train("michel_2019"))
    assert cfg.train.pooler
    ids = torch.tensor([[2, 7, 9, 11, 3], [2, 5, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        plain = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        read_pooler_for_good(encoder, decoder, cfg.model)
        pooled = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    reference = torch.tanh(plain[:, 0] @ encoder.pooler.dense.weight.T + encoder.pooler.dense.bias)
    torch.testing.assert_close(pooled[:, 0], reference)
    torch.testing.assert_close(pooled[:, 1:], plain[:, 1:])


def test_pooler_key_refuses_a_model_without_a_pooler():
    cfg, encoder, decoder = _model({"pooler": True})
    encoder.pooler = None
    with pytest.raises(ConfigError, match="train.pooler: tiny-bert has no pooler; set train.pooler=false"):
        read_pooler_for_good(encoder, decoder, cfg.model)


def test_michel_chain_fine_tunes_the_pooler_and_scores_heads_through_it(run_chain):
    """The recipe's chain on the tiny BERT (a 3-step fine-tune, then head importance): the fine-tune
    trains the pooler with everything else (it is read; without train.pooler it gets no gradient and
    stays), and the importance run reads it too."""
    train = _recipe_train("michel_2019") | {"max_steps": 3, "batch_size": 8, "eval_every": 3, "epochs": 1}
    raw = {"model": "tiny-bert", "method": "head_importance", "train": train,
           "task": {"name": "synthetic-cls", "num_train": 32, "num_eval": 16, "max_length": 16},
           "head_importance": {"examples": 16}}
    cfg = parse_config(raw)
    result, store = run_chain(cfg)
    (finetuned,) = [weights for key, weights in store.items() if key != cfg.run_key]
    pretrained, _ = load_backbone("tiny-bert", derive_seed(cfg.seed, "model_init"))
    assert cfg.upstreams["init_from"].train.pooler
    assert not torch.equal(finetuned["encoder.pooler.dense.weight"], pretrained.pooler.dense.weight)
    assert np.isfinite(result.maps["heads.importance"].values).all()
    plain = parse_config({k: v for k, v in raw.items() if k != "head_importance"}
                         | {"method": "finetune", "train": train | {"pooler": False}})
    _, store = run_chain(plain)
    assert torch.equal(store[plain.run_key]["encoder.pooler.dense.weight"], pretrained.pooler.dense.weight)
