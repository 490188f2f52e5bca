"""The shared step loop (experiments.training.loop.train_steps): evaluation steps, resume, stages, cancel.

The step function here is a stub that records what the loop hands it, so these tests check the
bookkeeping only; tests/experiments/test_run.py checks real methods over it end to end.
"""

import copy

import pytest
import torch

from experiments import RunContext, parse_config
from experiments.training.context import RunCancelled
from experiments.training.loop import batch_indices, evaluate_all, num_steps, take, train_steps
from experiments.training.state import set_up
from experiments.training.tracking import MemoryTracker

TINY = {
    "model": "tiny-bert",
    "method": "finetune",
    "task": {"name": "synthetic-cls", "num_train": 40, "num_eval": 16, "max_length": 16},
    "train": {"max_steps": 7, "batch_size": 8, "eval_every": 3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _state(**train):
    raw = copy.deepcopy(TINY)
    raw["train"] |= train
    return set_up(parse_config(raw), RunContext())


class _Recorder:
    """step_fn and eval_fn stubs that remember what they saw; the step nudges the decoder."""

    def __init__(self):
        self.steps, self.batches, self.evals = [], [], []

    def step(self, state, batch):
        self.steps.append(state.step)
        self.batches.append(batch)
        with torch.no_grad():
            next(state.decoder.parameters()).add_(1.0)
        return {"loss": 10.0 + state.step, "open_heads": 8}

    def evaluate(self, state):
        self.evals.append(state.step)
        return {"accuracy": state.step / 10}


class _MemoryCheckpointer:
    def __init__(self):
        self.state, self.saved_steps = None, []

    def save(self, state):
        self.state = copy.deepcopy(state)
        self.saved_steps.append(state["step"])

    def load(self):
        return copy.deepcopy(self.state)


def test_evaluates_every_eval_every_steps_and_at_the_end_and_logs_the_step_values():
    state, rec, tracker = _state(), _Recorder(), MemoryTracker()
    progress = []
    ctx = RunContext(tracker=tracker, on_progress=lambda s, t, m: progress.append((s, t, dict(m))))
    metrics = train_steps(state, ctx, 7, rec.step, rec.evaluate)
    assert rec.steps == list(range(7)) and state.step == 7
    assert rec.evals == [3, 6, 7] and state.values["eval_steps"] == [3, 6, 7]
    # the step's values join the evaluation: its loss as train_loss (dev has its own loss), as floats
    assert tracker.metrics["accuracy"] == [(3, 0.3), (6, 0.6), (7, 0.7)]
    assert tracker.metrics["train_loss"] == [(3, 12.0), (6, 15.0), (7, 16.0)]
    assert metrics == {"accuracy": 0.7, "train_loss": 16.0, "open_heads": 8.0}
    assert type(metrics["open_heads"]) is float
    assert [(s, t) for s, t, _ in progress] == [(s, 7) for s in range(1, 8)]
    assert progress[0][2] == {"loss": 10.0, "open_heads": 8}  # the step's own values, as returned


def test_batches_follow_the_seeded_order_of_the_step():
    state, rec = _state(), _Recorder()
    train_steps(state, RunContext(), 7, rec.step, rec.evaluate)
    n = len(state.data.train)
    for step, (ids, _, labels) in enumerate(rec.batches):
        expected = take(state.data.train, batch_indices(step, n, 8, state.cfg.seed), "cpu")
        assert torch.equal(ids, expected[0]) and torch.equal(labels, expected[2])
    epoch = torch.cat([batch_indices(step, n, 8, state.cfg.seed) for step in range(5)])
    assert sorted(epoch.tolist()) == list(range(n))  # 40 examples: 5 batches see each once


def test_default_evaluation_scores_the_task_on_dev_in_eval_mode():
    state = _state()
    state.train()
    metrics = train_steps(state, RunContext(), 1, lambda s, b: {"loss": 0.0})
    assert set(metrics) == {"accuracy", "loss", "train_loss", "top_class_share", "loss_vs_uniform"}
    assert metrics == evaluate_all(state) | {"train_loss": 0.0}
    assert state.encoder.training and state.decoder.training  # modes restored after evaluating


def test_a_resumed_loop_continues_at_the_saved_step_with_the_saved_state():
    checkpointer = _MemoryCheckpointer()
    first, rec = _state(), _Recorder()

    def crash_at_5(step, total, metrics):
        if step == 5:
            raise RuntimeError("worker killed")

    with pytest.raises(RuntimeError):
        train_steps(first, RunContext(checkpointer=checkpointer, on_progress=crash_at_5), 7, rec.step, rec.evaluate)
    assert checkpointer.saved_steps == [3] and checkpointer.state["step"] == 3

    second, resumed = _state(), _Recorder()
    straight, rec_straight = _state(), _Recorder()
    train_steps(second, RunContext(checkpointer=checkpointer), 7, resumed.step, resumed.evaluate)
    train_steps(straight, RunContext(), 7, rec_straight.step, rec_straight.evaluate)
    assert resumed.steps == [3, 4, 5, 6] and resumed.evals == [6, 7]
    assert second.values["eval_steps"] == [3, 6, 7]  # restored from the checkpoint, then continued
    for a, b in zip(second.decoder.state_dict().values(), straight.decoder.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # 3 nudges before the crash (restored) + 4 after = 7 straight


def test_a_run_resumed_at_its_last_step_returns_its_last_metrics():
    checkpointer = _MemoryCheckpointer()
    state, rec = _state(), _Recorder()
    metrics = train_steps(state, RunContext(checkpointer=checkpointer), 7, rec.step, rec.evaluate)
    again = _Recorder()
    assert train_steps(_state(), RunContext(checkpointer=checkpointer), 7, again.step, again.evaluate) == metrics
    assert again.steps == [] and again.evals == []


def test_save_weights_gets_the_final_encoder_and_decoder_weights_once():
    state, rec, handed = _state(), _Recorder(), []
    train_steps(state, RunContext(save_weights=handed.append), 7, rec.step, rec.evaluate)
    assert len(handed) == 1
    weights = handed[0]
    expected = {f"encoder.{k}": v for k, v in state.encoder.state_dict().items()}
    expected |= {f"decoders.task.{k}": v for k, v in state.decoder.state_dict().items()}
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)  # after the last step: 7 nudges
    assert all(weights[k].device.type == "cpu" for k in weights)


def test_cancelling_raises_run_cancelled_and_hands_no_weights_on():
    state, rec, handed = _state(), _Recorder(), []
    ctx = RunContext(should_stop=lambda: len(rec.steps) >= 2, save_weights=handed.append)
    with pytest.raises(RunCancelled, match="stopped at step 2 of 7"):
        train_steps(state, ctx, 7, rec.step, rec.evaluate)
    assert rec.steps == [0, 1] and handed == []


def test_num_steps_is_max_steps_or_whole_epochs_rounded_up():
    assert num_steps(40, 8, 3.0, 11) == 11
    assert num_steps(40, 8, 1.5, None) == 8  # ceil(1.5 * 5)
    assert num_steps(41, 8, 1.0, None) == 6  # the last batch is partial
