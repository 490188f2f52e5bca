"""The per-run stopwatch (base/costs.py) and the parts the runner times."""

import itertools

import pytest

from base import costs as costs_module
from base.costs import PARTS, Costs, active, timed
from experiments.harness.config import parse_config
from experiments.harness.runner import run
from experiments.training.context import RunContext


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter ticking 1.0 s per call: every interval is the number of reads inside it."""
    ticks = itertools.count()
    monkeypatch.setattr(costs_module.time, "perf_counter", lambda: float(next(ticks)))


def test_nested_parts_are_exclusive_and_add_up(clock):
    costs = Costs()  # t=0
    with costs.part("train"):  # 1
        with costs.part("model"):  # 2
            pass  # 3
        with costs.part("model"):  # 4
            with costs.part("model"):  # 5 (load_backbone calls load_tokenizer)
                pass  # 6
            pass  # 7
    # 8: train ran 1-2 and 3-4 and 7-8; model 2-3, 4-5, 5-6, 6-7
    costs.end()  # 9
    assert costs.metrics() == {"cost.train_s": 3.0, "cost.model_s": 4.0, "cost.total_s": 9.0,
                               "cost.first_in_worker": 0.0}


def test_total_only_once_ended_and_first_in_worker_reported():
    costs = Costs(first_in_worker=True)
    assert costs.metrics() == {"cost.first_in_worker": 1.0}
    costs.end()
    assert set(costs.metrics()) == {"cost.total_s", "cost.first_in_worker"}


def test_timed_adds_to_the_active_costs_only(clock):
    with timed("model"):  # nothing active: a no-op
        pass
    costs = Costs()
    with active(costs):
        with timed("data"):
            pass
    with timed("data"):  # no longer active
        pass
    assert costs.seconds == {"data": 1.0}


def test_a_run_times_its_parts(tmp_path):
    """A real tiny run through the runner: model, data, train, figures, artifacts and the MLflow
    writes (here the in-memory tracker) each get their time; the parts stay within the run's."""
    cfg = parse_config({
        "model": "tiny-bert", "method": "head_gates", "seed": 0,
        "task": {"name": "synthetic-cls", "num_train": 32, "num_eval": 16, "max_length": 16},
        "train": {"max_steps": 2, "batch_size": 8, "eval_every": 2},
    })
    ctx = RunContext()
    run(cfg, ctx)
    ctx.costs.end()
    seconds = ctx.costs.metrics()
    assert set(seconds) == {f"cost.{p}_s" for p in PARTS if p not in ("claim", "finish")} | {
        "cost.total_s", "cost.first_in_worker"}
    assert all(seconds[f"cost.{p}_s"] > 0 for p in ("mlflow", "model", "data", "train", "figures", "artifacts"))
    assert sum(v for k, v in seconds.items() if k.endswith("_s") and k != "cost.total_s") <= seconds["cost.total_s"]
