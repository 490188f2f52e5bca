"""One run end to end on a tiny random model: what it records, determinism, resume, pipelines."""

import copy
import io

import numpy as np
import pytest
import torch

from experiments import RunContext, parse_config, run
from experiments.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 6, "batch_size": 8, "eval_every": 3, "lr": 1e-3},
    "gates": {"lambda": 0.5, "lr": 0.1},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(**overrides):
    raw = copy.deepcopy(TINY)
    for key, value in overrides.items():
        section, _, leaf = key.rpartition("__")
        (raw.setdefault(section, {}) if section else raw)[leaf] = value
    return parse_config(raw)


def test_run_records_params_tags_metrics_and_gate_artifacts():
    cfg = _cfg()
    tracker = MemoryTracker()
    result = run(cfg, RunContext(tracker=tracker))
    assert tracker.tags["run_key"] == cfg.run_key and tracker.tags["method"] == "head_gates"
    assert tracker.tags["task_version"] == "1" and tracker.tags["git_commit"]
    assert tracker.params["gates.lambda"] == 0.5 and "seeds.gate_noise" in tracker.params
    for name in ("accuracy", "l0_penalty", "expected_open_heads", "open_heads", "loss"):
        assert [step for step, _ in tracker.metrics[name]] == [3, 6]
    with np.load(io.BytesIO(tracker.artifacts["gates.npz"])) as npz:
        assert npz["trajectory"].shape == (2, 2, 4)  # (evals, layers, heads)
        np.testing.assert_array_equal(npz["final"], result.gates)
        assert npz["scores"].shape == (2, 4)
    assert tracker.artifacts["gate_map.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert result.gates.shape == (2, 4) and ((result.gates >= 0) & (result.gates <= 1)).all()
    assert result.metrics["open_heads"] == float((result.gates > 1e-3).sum())


def test_same_config_gives_identical_gates_and_metrics():
    a, b = run(_cfg()), run(_cfg())
    np.testing.assert_array_equal(a.gates, b.gates)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.metrics == b.metrics
    c = run(_cfg(seed=1))
    assert not np.array_equal(a.scores, c.scores)


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
    np.testing.assert_array_equal(resumed.gates, straight.gates)
    assert resumed.metrics == straight.metrics


@pytest.mark.parametrize("method,pipeline", [("head_gates", "sp"), ("finetune", "none")])
def test_other_pipelines_run(method, pipeline):
    result = run(_cfg(method=method, pipeline=pipeline, gates__sp_finetune_steps=3))
    assert result.steps == (9 if pipeline == "sp" else 6)
    if method == "finetune":
        assert (result.gates == 1).all() and result.scores is None
    else:  # SP: every head open while fine-tuning, gated afterwards
        assert (result.trajectory[0] == 1).all()


def test_sparsity_keeps_exactly_the_top_heads_by_log_alpha():
    result = run(_cfg(sparsity=0.25))
    assert result.gates.sum() == 6  # ceil(0.75 * 8)
    kept = result.scores[result.gates == 1].min()
    dropped = result.scores[result.gates == 0].max()
    assert kept >= dropped
    assert "accuracy_gated" in result.metrics


def test_gate_map_draws_layer_1_on_top_dark_when_open():
    from matplotlib.image import imread

    from experiments.plots import gate_map_png

    gates = np.full((2, 4), 0.5, dtype=np.float32)
    gates[0] = 1.0  # layer 1 open (black), layer 2 half open (grey)
    image = imread(io.BytesIO(gate_map_png(gates, "t")))[..., :3]  # (rows, cols, RGB)
    column = image[:, int(image.shape[1] * 0.4)].mean(axis=1)  # through the heat map
    dark = np.flatnonzero(column < 0.1)
    grey = np.flatnonzero((column > 0.3) & (column < 0.7))
    assert len(dark) > 10 and len(grey) > 10
    assert np.median(dark) < np.median(grey)  # layer 1 above layer 2
