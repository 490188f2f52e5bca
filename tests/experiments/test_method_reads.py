"""A key nothing reads is refused (issue 43): each method's ``READS`` and ``unread`` against what its
code consults on a real tiny run.

The property: for every method, every pipeline, and every ``train.*`` key and key of the method's
own section set away from its default, either ``parse_config`` refuses it, or the run (the method's
``stages`` and ``run`` on a recording proxy of the config, after its stages, each recorded too)
consults it. A key accepted and never read would change the run key and nothing else. ``model``
is read by every method. tests/experiments/method_reads.py records; test_task_reads.py does the
same for ``task.*`` keys.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from base.sections import ConfigError, TrainConfig
from experiments.harness.config import parse_config
from experiments.methods import METHODS, bias_only, probes
from experiments.training.reads import FINE_TUNING
from orchestrator.driving.grid import expand, parse_grid

sys.path.insert(0, str(Path(__file__).parent))  # the recorder beside this file
from method_reads import consulted, tiny  # noqa: E402 (tests/experiments/method_reads.py)

TRAIN = {"epochs": 2.0, "max_steps": 3, "batch_size": 4, "lr": 1e-3, "decoder_lr": 2e-3, "weight_decay": 0.0,
         "pooler": True, "warmup_ratio": 0.2, "eval_every": 1, "grad_clip": 0.5, "precision": "bf16"}
"""A value away from its default of each ``train.*`` key."""
OWN = {
    "head_gates": {"lambda": 0.05, "lr": 0.01, "sparsity": 0.5, "sp_finetune_steps": 2, "clip_gates": True},
    "finetune": {},  # loss: tests/experiments/test_debias.py (its stages read what they inherit)
    "bias_only": {"steps": 3, "lr": 0.1, "l2": 0.01},
    "mask_train": {"sparsity": 0.3, "initial_sparsity": 0.1, "schedule_end": 0.5, "init": "magnitude",
                   "reset_every": 1, "lr": 1e-3, "train_classifier": True, "pooler": False},
    "imp": {"sparsity": 0.3, "pooler": False, "round_fraction": 0.5, "rewind_steps": 1},
    "multitask": {"alpha": 0.5, "lambda": 0.1, "lr": 0.01},
    "skill_neurons": {"prompt_length": 3, "lr": 0.01, "readout_lr": 0.1, "readout": "cls", "verbalizer": "random_words",
                      "label_words": ["good", "bad"], "word_seed": 1, "noise_std": 0.2, "prune_fraction": 0.05,
                      "prune_baseline": "tokens", "prune_fold": "all", "recalibrate_bn": False, "perturb_fractions": [0.2],
                      "prompt_optimizer": "reference"},
    "prompt_transfer": {"source_task": "synthetic-cls", "skill_neurons": {"prompt_length": 3}, "noise_std": 0.2,
                        "perturb_fractions": [0.2]},
    "probes": {"fit_sentences": 10, "score_sentences": 5, "centroids_from": "scored", "max_length": 20,
               "top_labels": 2, "batch_size": 4, "ud_dir": "UD"},
    "attention_analysis": {"eval_examples": 4, "sentences": 5, "max_length": 20, "relations": ["det"],
                           "batch_size": 4, "ud_dir": "UD", "finetune_steps": 1, "attention_change_length": 8},
    "head_importance": {"examples": 4, "step": 0.1, "recompute": True, "normalize_layers": False, "finetune_steps": 1},
    "head_ablation": {"examples": 4, "finetune_steps": 1},
}
"""A value away from its default of each key of each method's own section (``UD``: the shared UD folder)."""

CASES = [(method, pipeline) for method, module in METHODS.items() for pipeline in module.PIPELINES]


@pytest.fixture(scope="module")
def ud_dir(shared_data):
    return str(shared_data / "ud_ewt")


def _sample(method: str, ud_dir: str) -> list[tuple[str, dict]]:
    """(dotted key, the sections that set it) of every key to try on ``method``."""
    own = {key: ud_dir if value == "UD" else value for key, value in OWN[method].items()}
    return ([(f"train.{key}", {"train": {key: value}}) for key, value in TRAIN.items()]
            + [(f"{method}.{key}", {method: {key: value}}) for key, value in own.items()])


def accepted_but_unread(method: str, pipeline: str, ud_dir: str) -> list[str]:
    """The keys a run of ``method`` / ``pipeline`` accepts set away from their default and never
    consults (one run of the tiny config; one more for each key it did not consult there)."""
    pipe = pipeline if len(METHODS[method].PIPELINES) > 1 else None
    seen = consulted(parse_config(tiny(method, pipe)))
    assert "model" in seen, f"{method} never reads model"
    unread = []
    for key, sections in _sample(method, ud_dir):
        try:
            cfg = parse_config(tiny(method, pipe, **sections))
        except ConfigError:
            continue  # refused: the rule holds
        if key not in seen and key not in consulted(cfg):
            unread.append(key)
    return unread


def test_every_method_has_a_sample_of_every_key():
    assert set(OWN) == set(METHODS)
    assert set(TRAIN) == set(TrainConfig.model_fields)
    for method, module in METHODS.items():
        keys = {field.alias or name for name, field in module.Config.model_fields.items()} - {"pipeline", "loss", "tasks"}
        assert keys <= set(OWN[method]), f"{method}: no sample of {keys - set(OWN[method])}"


@pytest.mark.parametrize(("method", "pipeline"), CASES)
def test_every_key_a_method_accepts_is_read(method, pipeline, ud_dir):
    assert accepted_but_unread(method, pipeline, ud_dir) == []


def test_the_property_catches_a_method_that_accepts_a_train_key_it_does_not_read(monkeypatch, ud_dir):
    """The broken variant: probes made to accept train.grad_clip, which it never reads (it trains nothing)."""
    monkeypatch.setattr(probes, "READS", (*probes.READS, "grad_clip"))
    assert parse_config(tiny("probes", train={"grad_clip": 0.5})).train.grad_clip == 0.5
    assert accepted_but_unread("probes", "none", ud_dir) == ["train.grad_clip"]


def test_the_property_catches_a_method_that_accepts_an_own_key_it_does_not_read(monkeypatch, ud_dir):
    """The broken variant: head_gates' dp made to accept sp_finetune_steps (only sp's stage reads it)."""
    from experiments.methods import head_gates

    monkeypatch.setattr(head_gates, "unread", lambda section, train: {})
    assert accepted_but_unread("head_gates", "dp", ud_dir) == ["head_gates.sp_finetune_steps"]


@pytest.mark.parametrize(("raw", "line"), [
    (tiny("probes", train={"grad_clip": 0.5}),
     "train.grad_clip: the probes method does not read train.grad_clip; the methods head_gates, finetune, mask_train, "
     "imp, multitask read it"),
    (tiny("bias_only", train={"lr": 0.1}),
     "train.lr: the bias_only method does not read train.lr; the methods head_gates, finetune, mask_train, imp, "
     "multitask read it"),
    (tiny("skill_neurons", train={"warmup_ratio": 0.2}),
     "train.warmup_ratio: the skill_neurons method does not read train.warmup_ratio; the methods head_gates, "
     "finetune, mask_train, imp, multitask read it"),
    (tiny("mask_train", train={"weight_decay": 0.0}),
     "train.weight_decay: the mask_train method does not read train.weight_decay with pipeline prune_only (its masks "
     "learn at mask_train.lr over frozen weights); the methods head_gates, finetune, mask_train, imp, multitask read it"),
    (tiny("head_ablation", head_ablation={"finetune_steps": 2}),  # tiny() sets train.max_steps: its stage sets its own
     "train.max_steps: the head_ablation method does not read train.max_steps (its init_from stage sets its own "
     "train.max_steps); the methods head_gates, finetune, mask_train, imp, multitask, skill_neurons read it"),
    (tiny("head_gates", "dp", head_gates={"sp_finetune_steps": 5}),
     "head_gates.sp_finetune_steps: read only with pipeline sp (it is dp)"),
    (tiny("multitask", "none", multitask={"lr": 0.01}),
     "multitask.lr: read only with pipeline shared or per_task (it is none: no gates)"),
])
def test_a_key_the_run_does_not_read_is_refused_with_one_line(raw, line):
    with pytest.raises(ConfigError) as err:
        parse_config(raw, check_files=False)
    assert str(err.value) == line


def test_a_train_key_a_stage_reads_is_accepted_and_reaches_the_stage():
    """head_ablation reads no learning rate, its finetune stage does; prompt_transfer trains nothing
    itself, its skill_neurons stages train (a key none of them reads is refused)."""
    cfg = parse_config(tiny("head_ablation", train={"lr": 1e-3}), check_files=False)
    assert cfg.upstreams["init_from"].train.lr == 1e-3
    cfg = parse_config(tiny("prompt_transfer", train={"epochs": 2.0}), check_files=False)
    assert {up.train.epochs for up in cfg.upstreams.values()} == {2.0}
    with pytest.raises(ConfigError, match=r"^train.grad_clip: the prompt_transfer method does not read"):
        parse_config(tiny("prompt_transfer", train={"grad_clip": 0.5}), check_files=False)


def test_a_stage_inherits_only_the_train_keys_it_reads_and_refuses_what_it_is_given():
    """A debiasing fine-tune's bias_only stage does not inherit its train.lr or max_steps (it reads only
    eval_every): it is the bias_only run a grid cell of the same task would be, one run for every lr
    of its dependants, as a stage inherits only the task keys its task reads. The same key written on
    the stage itself is refused."""
    raw = tiny("finetune", task={"name": "synthetic-shortcut"}, train={"lr": 1e-3}, finetune={"loss": "poe"})
    cfg = parse_config(raw, check_files=False)
    stage = cfg.upstreams["bias_model"]
    alone = parse_config({"model": "tiny-bert", "method": "bias_only", "task": raw["task"],
                          "train": {"eval_every": raw["train"]["eval_every"]}}, check_files=False)
    assert stage.method == "bias_only" and stage.train.lr == TrainConfig().lr and stage.run_key == alone.run_key
    with pytest.raises(ConfigError) as err:
        parse_config(raw | {"bias_model": {"method": "bias_only", "train": {"lr": 0.1}}}, check_files=False)
    assert str(err.value).startswith("bias_model.train.lr: the bias_only method does not read train.lr; ")


def test_a_grid_cell_and_the_stage_it_equals_are_one_run():
    """liu_2022's shape: prune_then_ft starts from a prune_only run; the grid's own prune_only cell,
    which does not read train.weight_decay, and that stage are one run (one key)."""
    cells = _grid(base={"model": "tiny-bert", "method": "mask_train", "train": {"weight_decay": 0.0}},
                  axes={"pipeline": ["prune_only", "prune_then_ft"]})
    alone, then_ft = cells
    assert then_ft.train.weight_decay == 0.0 and alone.train.weight_decay == TrainConfig().weight_decay
    assert then_ft.upstreams["init_from"].run_key == alone.run_key


def test_a_key_at_its_default_is_not_set():
    for method in METHODS:
        raw = tiny(method, train={"grad_clip": 1.0, "warmup_ratio": 0.1, "lr": 5e-5})
        assert parse_config(raw, check_files=False).method == method


def test_the_declarations_name_real_keys():
    for method, module in METHODS.items():
        assert set(module.READS) <= set(FINE_TUNING), method
    assert bias_only.READS == ("eval_every",)


# ------------------------------------------------------------------------------ grids


def _grid(**spec) -> list:
    return expand(parse_grid({"name": "reads", **spec}))


def test_a_grid_leaves_a_train_key_out_of_the_cells_that_do_not_read_it():
    cells = _grid(base={"model": "tiny-bert", "train": {"lr": 1e-3, "grad_clip": 0.5}},
                  axes={"method": ["finetune", "probes"]})
    by_method = {cell.method: cell for cell in cells}
    assert by_method["finetune"].train.lr == 1e-3 and by_method["finetune"].train.grad_clip == 0.5
    assert by_method["probes"].train == TrainConfig()
    assert by_method["probes"].run_key == parse_config({"model": "tiny-bert", "method": "probes"},
                                                       check_files=False).run_key


def test_a_grid_leaves_an_own_key_out_of_the_pipelines_that_do_not_read_it():
    cells = _grid(base={"model": "tiny-bert", "head_gates": {"sp_finetune_steps": 5}}, axes={"pipeline": ["dp", "sp"]})
    assert [(c.section.pipeline, c.section.sp_finetune_steps) for c in cells] == [("dp", None), ("sp", 5)]
    cells = _grid(base={"model": "tiny-bert", "method": "multitask", "multitask": {"tasks": [{"name": "synthetic-tag"}]}},
                  axes={"pipeline": ["none", "shared"], "lambda": [0.1, 0.2]})
    assert [(c.section.pipeline, c.section.lambda_) for c in cells] == [("none", 0.001), ("shared", 0.1), ("shared", 0.2)]


@pytest.mark.parametrize(("spec", "line"), [
    ({"base": {"method": "probes", "train": {"grad_clip": 0.5}}, "axes": {"seed": [0, 1]}},
     "base: 'train.grad_clip' applies to no cell: the probes method does not read train.grad_clip; the methods "
     "head_gates, finetune, mask_train, imp, multitask read it"),
    ({"base": {"method": "multitask", "multitask": {"tasks": [{"name": "synthetic-tag"}]}}, "axes": {"lambda": [0.1, 0.2]}},
     "axes: 'lambda' applies to no cell: multitask.lambda: read only with pipeline shared or per_task (it is none: "
     "no gates)"),
    ({"base": {"method": "probes"}, "axes": {"seed": [0]}, "include": [{"train": {"lr": 0.1}}]},
     "cell 1 (include[0]: train.lr=0.1): train.lr: the probes method does not read train.lr; the methods head_gates, "
     "finetune, mask_train, imp, multitask read it"),
])
def test_a_grid_refuses_a_key_no_cell_reads(spec, line):
    with pytest.raises(ConfigError) as err:
        _grid(**spec)
    assert str(err.value) == line


# ------------------------------------------------------------------------------ task.id in a grid


def test_an_include_that_changes_the_task_does_not_carry_the_base_s_task_id():
    cells = _grid(base={"model": "tiny-bert", "task": {"name": "synthetic-cls", "id": "mine"}}, axes={"seed": [0]},
                  include=[{"task": "synthetic-tag"}, {"task": "synthetic-cue", "task.id": "cues"},
                           {"task": {"name": "synthetic-cls", "num_train": 30}}])
    assert [(c.task.name, c.labels()["task"]) for c in cells] == [
        ("synthetic-cls", "mine"), ("synthetic-tag", "synthetic-tag"), ("synthetic-cue", "cues"), ("synthetic-cls", "mine")]


def test_an_axis_over_tasks_keeps_the_base_s_task_id_on_its_own_task_only():
    cells = _grid(base={"model": "tiny-bert", "task": {"id": "mine"}}, axes={"task": ["synthetic-tag", "synthetic-cls"]})
    assert [c.labels()["task"] for c in cells] == ["synthetic-tag", "mine"]
    with pytest.raises(ConfigError, match=r"^base: 'task.id' applies to no cell: task.id: the base's task.id names its "
                                          r"task synthetic-cls, and a cell of task synthetic-\w+ does not take it"):
        _grid(base={"model": "tiny-bert", "task": {"id": "mine"}}, axes={"task": ["synthetic-tag", "synthetic-cue"]})


def test_the_methods_page_says_what_each_method_reads():
    import re

    text = (Path(__file__).parents[2] / "docs" / "methods.md").read_text()
    for name, module in METHODS.items():
        row = re.search(rf"^\| `{name}`.*\|$", text, re.MULTILINE).group(0)
        said = row.strip("|").split("|")[4].strip()
        assert said == ("all" if tuple(module.READS) == FINE_TUNING else ", ".join(module.READS) or "-"), name
