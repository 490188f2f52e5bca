"""One run end to end on a tiny random model: what it records, determinism, resume, pipelines."""

import copy
import io

import numpy as np
import pytest
import torch

from experiments import RunContext, parse_config, run
from experiments.harness.runner import _expected_open
from experiments.training.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 6, "batch_size": 8, "eval_every": 3, "lr": 1e-3},
    "head_gates": {"lambda": 0.5, "lr": 0.1},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(**overrides):
    raw = copy.deepcopy(TINY)
    for key, value in overrides.items():
        section, _, leaf = key.rpartition("__")
        (raw.setdefault(section, {}) if section else raw)[leaf] = value
    if raw.get("method", "head_gates") != "head_gates":
        raw.pop("head_gates")  # another method: head_gates' section would be an error
    return parse_config(raw)


def test_a_run_records_the_commit_of_the_checkout_it_runs_from(monkeypatch):
    """``git_commit`` is this checkout's HEAD (code shipped to Ray without .git: what the submitter set)."""
    import subprocess
    from pathlib import Path

    from experiments.harness.runner import code_version, source_hash

    monkeypatch.delenv("HEADSWEEP_CODE_COMMIT", raising=False)
    top = Path(__file__).resolve().parents[2]
    commit, src = code_version().split(" ")
    assert src == f"src:{source_hash()}"
    if (top / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=top, capture_output=True, text=True).stdout.strip()
        assert commit.removesuffix("+dirty") == head, commit
    else:  # a checkout without git: said, not guessed
        assert commit == "unknown"


def _gate(result):
    return result.maps["heads.gate"].values


def test_run_records_params_tags_metrics_and_map_artifacts():
    cfg = _cfg()
    tracker = MemoryTracker()
    result = run(cfg, RunContext(tracker=tracker))
    assert tracker.tags["run_key"] == cfg.run_key and tracker.tags["method"] == "head_gates"
    assert tracker.tags["task_version"] == "1" and tracker.tags["git_commit"]
    assert tracker.params["head_gates.lambda"] == 0.5 and "seeds.gates" in tracker.params
    for name in ("accuracy", "l0_penalty", "expected_open_heads", "open_heads", "loss"):
        assert [step for step, _ in tracker.metrics[name]] == [3, 6]
    with np.load(io.BytesIO(tracker.artifacts["maps.npz"])) as npz:
        assert npz["trajectory/heads.gate"].shape == (2, 2, 4)  # (evals, layers, heads)
        np.testing.assert_array_equal(npz["heads.gate"], _gate(result))
        np.testing.assert_array_equal(npz["heads.log_alpha"], result.maps["heads.log_alpha"].values)
        assert npz["eval_steps"].tolist() == [3, 6]
    assert tracker.artifacts["heads.gate.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert "heads.log_alpha.png" not in tracker.artifacts  # drawn by its gate map (runner.log_maps)
    assert {m.kind for m in result.maps.values()} == {"heads"}
    assert _gate(result).shape == (2, 4) and ((_gate(result) >= 0) & (_gate(result) <= 1)).all()
    assert result.metrics["open_heads"] == float((_gate(result) > 1e-3).sum())
    # the gate map's title gives expected open beside open: the run's own metric, from its final log_alpha
    assert _expected_open(result, "heads.gate") == pytest.approx(result.metrics["expected_open_heads"], rel=1e-5)


def test_same_config_gives_identical_gates_and_metrics():
    a, b = run(_cfg()), run(_cfg())
    for name in ("heads.gate", "heads.log_alpha"):
        np.testing.assert_array_equal(a.maps[name].values, b.maps[name].values)
    assert a.metrics == b.metrics
    c = run(_cfg(seed=1))
    assert not np.array_equal(a.maps["heads.log_alpha"].values, c.maps["heads.log_alpha"].values)


class _MemoryCheckpointer:
    def __init__(self):
        self.state = None

    def save(self, state):
        self.state = copy.deepcopy(state)

    def load(self):
        return copy.deepcopy(self.state)


def test_a_crashed_run_resumes_from_its_checkpoint_to_the_same_result():
    cfg = _cfg()
    straight = run(cfg)

    checkpointer = _MemoryCheckpointer()

    def crash_at_4(step, total, metrics):
        if step == 4:
            raise RuntimeError("worker killed")

    with pytest.raises(RuntimeError):
        run(cfg, RunContext(checkpointer=checkpointer, on_progress=crash_at_4))
    assert checkpointer.state["step"] == 3
    resumed = run(cfg, RunContext(checkpointer=checkpointer))
    np.testing.assert_array_equal(_gate(resumed), _gate(straight))
    assert resumed.metrics == straight.metrics


def test_finetune_learns_no_gates_and_reports_no_map():
    tracker = MemoryTracker()
    result = run(_cfg(method="finetune"), RunContext(tracker=tracker))
    assert result.steps == 6
    assert result.maps == {} and not any(name.endswith(".png") for name in tracker.artifacts)
    with np.load(io.BytesIO(tracker.artifacts["maps.npz"])) as npz:
        assert sorted(npz.files) == ["eval_steps", "meta"]


def test_sp_starts_from_its_fine_tune_stage_and_keeps_its_decoder_frozen():
    cfg = _cfg(head_gates__pipeline="sp", head_gates__sp_finetune_steps=3)
    upstream = cfg.upstreams["init_from"]
    assert (upstream.method, upstream.seed, upstream.train.max_steps) == ("finetune", cfg.seed, 3)
    saved = {}
    run(upstream, RunContext(save_weights=lambda weights: saved.update(weights)))
    assert {k.split(".")[0] for k in saved} == {"encoder", "decoders"}
    roles = []
    result = run(cfg, RunContext(load_upstream=lambda role: roles.append(role) or saved))
    assert roles == ["init_from"] and result.steps == 6  # no fine-tuning inside the SP run any more
    with pytest.raises(RuntimeError, match="starts from another run .init_from: finetune"):
        run(cfg)  # nobody to hand it the fine-tuned weights


def test_sp_gates_a_fine_tuned_model_with_its_decoder_frozen():
    cfg = _cfg(head_gates__pipeline="sp", head_gates__sp_finetune_steps=3)
    upstream, after = {}, {}
    run(cfg.upstreams["init_from"], RunContext(save_weights=lambda weights: upstream.update(weights)))
    run(cfg, RunContext(load_upstream=lambda role: upstream, save_weights=lambda weights: after.update(weights)))
    decoder = [k for k in upstream if k.startswith("decoders.")]
    assert decoder and all(torch.equal(after[k], upstream[k]) for k in decoder)  # frozen all along
    assert not all(torch.equal(after[k], upstream[k]) for k in upstream if k.startswith("encoder."))


def test_sparsity_keeps_the_top_heads_by_log_alpha_with_their_learned_gates():
    """Issue 7, defect 1: the fixed-count model is z * keep (a head trained at z ~ 0 is not
    reopened), and the run's gate map stays the learned gates; the kept set is its own map."""
    from experiments.maths.hard_concrete import eval_gates

    result = run(_cfg(head_gates__sparsity=0.25))
    log_alpha = result.maps["heads.log_alpha"].values
    learned = eval_gates(torch.from_numpy(log_alpha)).numpy()
    np.testing.assert_array_equal(_gate(result), learned)  # not a 0/1 mask
    keep = result.maps["heads.kept"].values
    assert keep.sum() == 6 and set(np.unique(keep)) <= {0.0, 1.0}  # ceil(0.75 * 8)
    assert log_alpha[keep == 1].min() >= log_alpha[keep == 0].max()
    assert result.metrics["heads_kept"] == 6
    assert result.metrics["open_heads"] == float(((learned * keep) > 1e-3).sum()) <= 6
    assert "accuracy_gated" in result.metrics and "loss_gated" in result.metrics


def test_gate_map_draws_layer_1_on_top_dark_when_open():
    from matplotlib.image import imread

    from experiments.harness.plots import gate_map_png

    gates = np.full((2, 4), 0.5, dtype=np.float32)
    gates[0] = 1.0  # layer 1 open (black), layer 2 half open (grey)
    image = imread(io.BytesIO(gate_map_png(gates, "t")))[..., :3]  # (rows, cols, RGB)
    column = image[:, int(image.shape[1] * 0.4)].mean(axis=1)  # through the heat map
    dark = np.flatnonzero(column < 0.1)
    grey = np.flatnonzero((column > 0.3) & (column < 0.7))
    assert len(dark) > 10 and len(grey) > 10
    assert np.median(dark) < np.median(grey)  # layer 1 above layer 2
