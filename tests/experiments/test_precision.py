"""train.precision (fp32 | bf16 | fp16): autocast decided in one place, honoured by every method's
forwards, float32 weights, gates and losses, fp16's grad scaler in every step, fp16 refused on CPU."""

import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from base import outputs
from base.sections import ConfigError
from experiments import RunContext, parse_config, run
from experiments.interventions.gates import HeadGates
from experiments.interventions.heads import attach_head_gates
from experiments.maths.hard_concrete import l0_penalty
from experiments.methods import METHODS
from experiments.models import architecture_of
from experiments.training.loop import evaluate_all, forward_logits, take, update
from experiments.training.precision import autocast, check_precision, grad_scaler
from experiments.training.state import set_up
from experiments.training.tracking import MemoryTracker
from orchestrator.registry.stages import with_upstreams

sys.path.insert(0, str(Path(__file__).parent))  # tests/experiments/method_reads.py beside it
from method_reads import parse_without_unread_train  # noqa: E402

TASK = {"name": "synthetic-cls", "num_train": 32, "num_eval": 16, "max_length": 16}
TAG = {"name": "synthetic-tag", "num_train": 32, "num_eval": 16, "max_length": 16}
TRAIN = {"max_steps": 2, "batch_size": 8, "eval_every": 2, "lr": 1e-3}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(method: str, precision: str = "bf16", model: str = "tiny-bert", train: dict | None = None, **section):
    return parse_without_unread_train({"model": model, "method": method, "task": dict(TASK),
                                  "train": {**TRAIN, **(train or {}), "precision": precision}, method: section})


def _error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- the key


def test_precision_is_a_train_key_whose_default_keeps_every_run_key():
    assert parse_config({}).train.precision == "fp32"
    # pinned in test_config.py before the key existed: a config at defaults keeps its key
    ft = parse_config({"method": "finetune", "model": "tiny-bert", "seed": 3, "train": {"max_steps": 6}})
    assert (ft.run_key, ft.group_key) == ("79d500251385e279", "af17ab6bbf173dc2")
    explicit = parse_config({"method": "finetune", "model": "tiny-bert", "seed": 3,
                             "train": {"max_steps": 6, "precision": "fp32"}})
    assert explicit.run_key == ft.run_key and "train.precision" not in ft._key_material["config"]
    bf16 = parse_config({"method": "finetune", "model": "tiny-bert", "seed": 3,
                         "train": {"max_steps": 6, "precision": "bf16"}})
    assert bf16.run_key != ft.run_key and bf16._key_material["config"]["train.precision"] == "bf16"
    # a stage inherits the run's train section: SP's fine-tune is a bf16 run too
    sp = parse_config({"train": {"precision": "bf16"}, "head_gates": {"pipeline": "sp"}})
    assert sp.upstreams["init_from"].train.precision == "bf16"
    assert _error(parse_config, {"train": {"precision": "fp8"}}).startswith(
        "train.precision: Input should be 'fp32', 'bf16' or 'fp16'")


def test_the_key_is_documented_in_headsweep_methods(capsys):
    from experiments.harness import config_keys
    from experiments.harness.config import RunConfig
    from headsweep.cli import main

    assert main(["methods", "finetune", "--shared"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert '│ train.precision │ "fp32" │ Forward-pass precision' in shown
    (meaning,) = [m for key, _, m in config_keys.describe(RunConfig) if key == "train.precision"]
    assert all(word in meaning for word in ("bf16", "fp16", "grad scaler", "CUDA only: use bf16 on CPU"))


def test_fp16_on_cpu_is_a_one_line_config_error_naming_the_key_before_anything_runs(tmp_path, monkeypatch, capsys):
    cfg = _cfg("finetune", "fp16")  # where it runs decides: parse_config cannot know the device
    message = _error(run, cfg, RunContext(tracker=(tracker := MemoryTracker())))
    assert message.startswith("train.precision: fp16 needs a CUDA GPU") and "use bf16 on CPU" in message
    assert not tracker.metrics and not tracker.params  # nothing ran, nothing was logged
    check_precision(cfg, "cuda")  # fine on a GPU
    # a stage that asks for fp16 is named by its role
    staged = parse_config({**cfg.to_dict(), "train": {**TRAIN, "precision": "bf16"},
                           "init_from": {"method": "finetune", "train": {"precision": "fp16"}}})
    assert _error(check_precision, staged, "cpu").startswith("init_from.train.precision: fp16 needs a CUDA GPU")
    with pytest.raises(ConfigError, match="train.precision"):
        autocast("fp16", "cpu")

    # headsweep run trains on CPU: exit 2, one line, no MLflow store
    from headsweep.cli import main

    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    config = tmp_path / "c.yaml"
    config.write_text("method: finetune\nmodel: tiny-bert\n")
    assert main(["run", str(config), "--set", "train.precision=fp16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headsweep: error: train.precision: fp16 needs a CUDA GPU") and "\n" not in err
    assert not (tmp_path / "home" / "mlflow.db").exists()

    # a grid whose trials get no GPU fails at expansion, naming the cell; with a GPU it expands
    from orchestrator.driving.grid import expand, parse_grid

    grid = {"name": "p", "base": {"method": "finetune", "model": "tiny-bert", "train.precision": "fp16"},
            "axes": {"seed": [0, 1]}}
    assert "train.precision: fp16 needs a CUDA GPU" in _error(lambda: expand(parse_grid(grid)))
    assert "resources.gpus is 0" in _error(lambda: expand(parse_grid(grid)))
    assert len(expand(parse_grid(grid | {"resources": {"gpus": 1}}))) == 2


def test_autocast_is_decided_in_one_place():
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert grad_scaler("fp32", "cpu") is None and grad_scaler("bf16", "cuda") is None
    state = set_up(_cfg("finetune"), RunContext())
    assert (state.precision, state.scaler) == ("bf16", None)
    with state.autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    # master weights stay float32: autocast, not .half()
    assert {p.dtype for module in state.modules().values() for p in module.parameters()} == {torch.float32}


# --------------------------------------------------------------------------- forwards, gates, losses


def _attn_out_inputs(encoder) -> tuple[list[torch.dtype], list]:
    """A pre-hook on every layer's attention output projection recording its input's dtype."""
    arch = architecture_of(encoder)
    seen: list[torch.dtype] = []
    hooks = [layer.get_submodule(arch.attn_out).register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
             for layer in encoder.get_submodule(arch.layers)]
    return seen, hooks


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-roberta"])
def test_evaluation_runs_in_the_run_precision_and_reports_float32_metrics(model):
    metrics = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        state = set_up(_cfg("finetune", precision, model), RunContext())
        seen, hooks = _attn_out_inputs(state.encoder)
        metrics[precision] = evaluate_all(state)
        assert seen and set(seen) == {dtype}, precision
        for hook in hooks:
            hook.remove()
        ids, mask, _ = take(state.data.dev, torch.arange(4), state.device)
        assert forward_logits(state.encoder, state.decoder, ids, mask, precision).dtype == torch.float32
    assert all(math.isfinite(v) for v in metrics["bf16"].values())
    assert metrics["bf16"]["loss"] == pytest.approx(metrics["fp32"]["loss"], abs=0.05)
    assert metrics["bf16"]["accuracy"] == pytest.approx(metrics["fp32"]["accuracy"], abs=0.2)


def test_gates_are_sampled_in_float32_and_multiply_heads_in_the_activation_dtype():
    state = set_up(_cfg("head_gates"), RunContext())
    gates = HeadGates(state.num_layers, state.num_heads, torch.Generator().manual_seed(0))
    handle = attach_head_gates(state.encoder, gates)
    seen, hooks = _attn_out_inputs(state.encoder)  # registered after the gates: sees the gated heads
    ids, mask, labels = take(state.data.train, torch.arange(8), state.device)
    with state.autocast():
        assert gates().dtype == torch.float32  # training-mode sample, inside autocast
        logits = forward_logits(state.encoder, state.decoder, ids, mask)  # already inside: nested is fine
    assert handle.gates.dtype == torch.float32 and set(seen) == {torch.bfloat16}
    penalty = l0_penalty(gates.log_alpha)
    assert logits.dtype == penalty.dtype == torch.float32
    (nn.functional.cross_entropy(logits, labels) + penalty).backward()
    assert gates.log_alpha.grad.dtype == torch.float32 and torch.isfinite(gates.log_alpha.grad).all()
    assert gates.log_alpha.grad.abs().sum() > 0
    handle.remove()
    for hook in hooks:
        hook.remove()


# --------------------------------------------------------------------------- fp16's grad scaler


def _toy(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 4)


def test_update_with_a_grad_scaler_steps_on_the_true_clipped_gradients_and_skips_overflows():
    """fp16 runs only on CUDA; the scaler's bookkeeping in ``update`` is the same on CPU."""
    plain, opt, x = _toy()
    update(plain(x).square().mean(), opt, params=list(plain.parameters()), grad_clip=0.05)

    scaled, opt2, _ = _toy()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    extra = torch.optim.SGD([gate := nn.Parameter(torch.ones(3))], lr=0.1)  # a second optimiser (gates)
    loss = scaled(x).square().mean() + gate.sum()
    value = update(loss, [opt2, extra], None, list(scaled.parameters()), 0.05, scaler)
    assert value == pytest.approx(loss.item())  # the unscaled loss
    for a, b in zip(plain.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # unscaled before clipping: the same step as without a scaler
    torch.testing.assert_close(gate.detach(), torch.full((3,), 0.9))  # the second optimiser stepped, unscaled

    before = [p.detach().clone() for p in scaled.parameters()]
    update(scaled(x).square().mean() * float("inf"), opt2, scaler=scaler)  # overflow: step skipped
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**11  # backed off


def test_the_scaler_is_part_of_a_checkpoint():
    state = set_up(_cfg("finetune", "fp32"), RunContext())
    assert "scaler" not in state.state_dict()
    state.scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    saved = state.state_dict()
    state.scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    state.load_state_dict(saved)
    assert state.scaler.get_scale() == 8.0


# --------------------------------------------------------------------------- every method


def _run_chains(configs, linear_dtypes: dict):
    """Run the configs after their upstreams (each distinct run once, weights in memory), recording
    the output dtype of every nn.Linear forward under the method of the run that made it."""
    chain, _ = with_upstreams(configs)
    store, results, current = {}, {}, [None]

    def hook(module, _args, output):
        if isinstance(module, nn.Linear) and isinstance(output, torch.Tensor):
            linear_dtypes.setdefault(current[0], set()).add(output.dtype)

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        for key, step in chain.items():
            current[0] = step.method
            ctx = RunContext(load_upstream=lambda role, step=step: store[step.upstreams[role].run_key],
                             save_weights=lambda weights, key=key: store.__setitem__(key, weights))
            results[key] = run(step, ctx)
    finally:
        handle.remove()
    return results, store


@pytest.fixture
def _no_pngs(monkeypatch):
    """Skip drawing (about 1 s a figure here): the methods' own tests look at their PNGs."""
    monkeypatch.setattr("experiments.harness.runner.map_png", lambda *args, **kwargs: b"")
    monkeypatch.setattr("experiments.harness.runner.gate_map_png", lambda *args, **kwargs: b"")
    for name in ("_perturbation_png", "_by_layer_png"):
        monkeypatch.setattr(f"experiments.methods.skill_neurons.{name}", lambda *args, **kwargs: b"")


SMALL = {
    "finetune": {},
    "head_gates": {"lambda": 0.5, "lr": 0.1},
    "mask_train": {"pipeline": "prune_then_ft", "sparsity": 0.5},  # and its prune_only stage
    "imp": {"pipeline": "prune_then_ft", "sparsity": 0.1},
    "multitask": {"tasks": [TAG], "pipeline": "shared", "lambda": 0.5},
    "skill_neurons": {"prompt_length": 2, "perturb_fractions": [0.1]},
    "prompt_transfer": {"skill_neurons": {"prompt_length": 2, "perturb_fractions": [0.1]}},  # its stages: the run above
    "probes": {"fit_sentences": 8, "score_sentences": 4, "max_length": 24, "top_labels": 1},
    "attention_analysis": {"eval_examples": 8, "sentences": 4, "max_length": 24, "relations": ["nsubj"]},
    "head_importance": {"examples": 8, "step": 0.5},
    "head_ablation": {"examples": 8},
}
NO_ENCODER = {"bias_only"}  # a logistic regression on hand-made features, float32: no forward to autocast


def test_every_method_runs_its_forwards_in_bf16_and_trains_close_to_fp32(_no_pngs):
    assert set(SMALL) | NO_ENCODER == set(METHODS), "a new method: add it here"
    dtypes: dict[str, set] = {}
    configs = {name: _cfg(name, **copy.deepcopy(section)) for name, section in SMALL.items()}
    results, store = _run_chains(list(configs.values()), dtypes)
    for name in SMALL:  # every matrix product of every forward (training, evaluation, analysis) in bf16
        assert dtypes.get(name) == {torch.bfloat16}, name
        assert all(math.isfinite(v) for v in results[configs[name].run_key].metrics.values()), name
    for key, step in with_upstreams(list(configs.values()))[0].items():  # the runs and their upstream stages:
        result = results[key]  # every map and metric each reports is declared (base.outputs)
        assert (METHODS[step.method].OUTPUTS + outputs.RUNNER).undeclared(result.maps, result.metrics) == [], step.method
    for key, weights in store.items():  # master weights handed on stay float32
        assert {w.dtype for w in weights.values() if w.is_floating_point()} == {torch.float32}, key

    # the same training in fp32: bf16's results are close (a loose bound: bf16 keeps ~3 digits)
    fp32 = {name: _cfg(name, "fp32", **copy.deepcopy(SMALL[name])) for name in ("finetune", "head_gates")}
    plain, _ = _run_chains(list(fp32.values()), dtypes32 := {})
    assert dtypes32 == {"finetune": {torch.float32}, "head_gates": {torch.float32}}
    for name, cfg in fp32.items():
        low, full = results[configs[name].run_key], plain[cfg.run_key]
        for metric in ("loss", "train_loss"):
            assert low.metrics[metric] == pytest.approx(full.metrics[metric], abs=0.05), (name, metric)
        assert low.metrics["accuracy"] == pytest.approx(full.metrics["accuracy"], abs=0.2), name
    gates_low, gates_full = (r.maps["heads.gate"].values for r in (results[configs["head_gates"].run_key],
                                                                    plain[fp32["head_gates"].run_key]))
    np.testing.assert_allclose(gates_low, gates_full, atol=0.05)


@pytest.mark.parametrize("model", ["tiny-deberta-v2", "random:tiny-electra"])
def test_head_gates_train_in_bf16_on_other_families(model):
    low = run(_cfg("head_gates", "bf16", model, lambda_=0.5), RunContext())
    full = run(_cfg("head_gates", "fp32", model, lambda_=0.5), RunContext())
    assert all(math.isfinite(v) for v in low.metrics.values())
    assert low.metrics["loss"] == pytest.approx(full.metrics["loss"], abs=0.05)
    np.testing.assert_allclose(low.maps["heads.gate"].values, full.maps["heads.gate"].values, atol=0.05)
