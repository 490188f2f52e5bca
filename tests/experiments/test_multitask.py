"""multitask on tiny random models: task sampling by n ** 0.8, a decoder (and gate set) per task
that moves only on its task's steps, per-task metrics, shared vs per-task gates, resume, stages,
and validation naming the key."""

import copy
import doctest

import numpy as np
import pytest
import torch

from base.sections import ConfigError
from experiments import RunContext, parse_config
from experiments.maths import task_sampling
from experiments.maths.task_sampling import batch_positions, task_probabilities, task_schedule
from experiments.methods import multitask
from experiments.training.seeding import generator
from experiments.training.state import set_up
from experiments.training.tracking import MemoryTracker

CLS = {"name": "synthetic-cls", "num_train": 48, "num_eval": 24, "max_length": 24}
TAG = {"name": "synthetic-tag", "num_train": 96, "num_eval": 24, "max_length": 24}
TINY = {
    "method": "multitask",
    "model": "tiny-bert",
    "task": CLS,
    "train": {"max_steps": 8, "batch_size": 8, "eval_every": 4, "lr": 1e-3},
    "multitask": {"tasks": [TAG], "lambda": 0.5, "lr": 0.1},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _cfg(**section):
    raw = copy.deepcopy(TINY)
    raw["multitask"] |= section
    if raw["multitask"].get("pipeline", "none") == "none":  # no gates: their lambda and lr are not read (issue 43)
        raw["multitask"] = {k: v for k, v in raw["multitask"].items() if k not in ("lambda", "lr") or k in section}
    return parse_config(raw)


# ------------------------------------------------------------------------------ sampling


def test_tasks_are_drawn_in_proportion_to_n_to_the_0_8():
    assert doctest.testmod(task_sampling).failed == 0
    sizes = [8000, 1000, 50]
    p = task_probabilities(sizes).numpy()
    by_hand = np.array([8000**0.8, 1000**0.8, 50**0.8])
    np.testing.assert_allclose(p, by_hand / by_hand.sum(), rtol=1e-12)
    assert p[0] < 8000 / 9050  # flatter than proportional: the small tasks get more than their share
    np.testing.assert_allclose(task_probabilities(sizes, alpha=1.0).numpy(), np.array(sizes) / 9050)
    np.testing.assert_allclose(task_probabilities(sizes, alpha=0.0).numpy(), [1 / 3] * 3)

    schedule = task_schedule(task_probabilities(sizes), 40_000, generator(0, "task_order"))
    share = np.bincount(schedule.numpy(), minlength=3) / 40_000
    np.testing.assert_allclose(share, p, atol=0.01)  # ~5 standard errors
    again = task_schedule(task_probabilities(sizes), 40_000, generator(0, "task_order"))
    assert torch.equal(schedule, again)  # a pure function of the seed: a resumed run draws the same

    position = batch_positions(schedule, 3)
    for t in range(3):  # each task's steps number its batches 0, 1, 2, ...
        assert position[schedule == t].tolist() == list(range(int((schedule == t).sum())))
    with pytest.raises(ValueError, match="at least one training example"):
        task_probabilities([10, 0])


# ------------------------------------------------------------------------------ runs


def _parts(state) -> dict[str, torch.Tensor]:
    """Every decoder's and per-task gate set's parameters, flattened copies."""
    parts = {f"decoders.{name}": module for name, module in state.decoders.items()}
    gates = state.interventions.get("gates")
    if isinstance(gates, torch.nn.ModuleDict):
        parts |= {f"gates.{name}": module for name, module in gates.items()}
    return {name: torch.cat([p.detach().flatten().clone() for p in module.parameters()])
            for name, module in parts.items()}


def _watch(monkeypatch):
    """Wrap the run's loop body: after every step, which decoders and gate sets changed."""
    states, changed = [], []
    original = multitask.train_steps

    def watching(state, ctx, total, step_fn, eval_fn=None, batch_fn=None):
        states.append(state)
        before = [_parts(state)]

        def step(state, batch):
            values = step_fn(state, batch)
            now = _parts(state)
            changed.append(sorted(n for n in now if not torch.equal(now[n], before[0][n])))
            before[0] = now
            return values

        return original(state, ctx, total, step, eval_fn, batch_fn)

    monkeypatch.setattr(multitask, "train_steps", watching)
    return states, changed


def test_each_decoder_and_gate_set_moves_only_on_its_tasks_steps(monkeypatch):
    cfg = _cfg(pipeline="per_task")
    states, changed = _watch(monkeypatch)
    result = multitask.run(cfg, RunContext())

    schedule = task_schedule(task_probabilities([48, 96]), 8, generator(cfg.seed, "task_order")).tolist()
    assert set(schedule) == {0, 1}  # this seed's 8 steps visit both tasks
    names = ["synthetic-cls", "synthetic-tag"]
    decoder = {0: "decoders.task", 1: "decoders.synthetic-tag"}  # the run's task is decoders["task"]
    assert changed == [sorted([decoder[t], f"gates.{names[t]}"]) for t in schedule]
    assert sorted(states[0].decoders) == ["synthetic-tag", "task"] and result.steps == 8


def test_every_task_reports_its_metrics_and_the_primary_keeps_plain_names():
    tracker = MemoryTracker()
    result = multitask.run(_cfg(), RunContext(tracker=tracker))
    m = result.metrics
    for task in ("synthetic-cls", "synthetic-tag"):
        assert 0 <= m[f"accuracy/{task}"] <= 1 and m[f"loss/{task}"] > 0
        assert [step for step, _ in tracker.metrics[f"accuracy/{task}"]] == [4, 8]
    assert m["accuracy/mean"] == pytest.approx((m["accuracy/synthetic-cls"] + m["accuracy/synthetic-tag"]) / 2)
    assert (m["accuracy"], m["loss"]) == (m["accuracy/synthetic-cls"], m["loss/synthetic-cls"])  # the run's task
    assert m["open_heads"] == 8 and result.maps == {}  # pipeline none: no gates, every head open


def test_shared_gates_are_one_set_and_per_task_gates_one_set_per_task(monkeypatch):
    states, _ = _watch(monkeypatch)
    shared = multitask.run(_cfg(pipeline="shared"), RunContext())
    per_task = multitask.run(_cfg(pipeline="per_task"), RunContext())

    assert sorted(shared.maps) == ["heads.gate", "heads.log_alpha"] and list(shared.trajectories) == ["heads.gate"]
    assert [k for k in states[0].weights() if k.startswith("interventions.")] == ["interventions.gates.log_alpha"]
    names = ["synthetic-cls", "synthetic-tag"]
    assert sorted(per_task.maps) == [f"heads.{m}.{t}" for m in ("gate", "log_alpha") for t in names]
    assert sorted(k for k in states[1].weights() if k.startswith("interventions.")) == [
        f"interventions.gates.{t}.log_alpha" for t in names]
    a, b = (per_task.maps[f"heads.log_alpha.{t}"].values for t in names)
    assert not np.allclose(a, b)  # two sets, each trained on its own task's steps
    assert per_task.trajectories[f"heads.gate.{names[1]}"].shape == (2, 2, 4)  # (evaluations, layers, heads)
    opened = [per_task.metrics[f"open_heads/{t}"] for t in names]
    union = (np.stack([per_task.maps[f"heads.gate.{t}"].values for t in names]) > 1e-3).any(axis=0).sum()
    assert per_task.metrics["open_heads"] == union >= max(opened)


class _MemoryCheckpointer:
    def __init__(self):
        self.state = None

    def save(self, state):
        self.state = copy.deepcopy(state)

    def load(self):
        return copy.deepcopy(self.state)


def test_a_crashed_run_resumes_from_its_checkpoint_to_the_same_result():
    cfg = _cfg(pipeline="per_task")
    straight = multitask.run(cfg, RunContext())
    checkpointer = _MemoryCheckpointer()

    def crash_at_6(step, total, values):
        if step == 6:
            raise RuntimeError("worker killed")

    with pytest.raises(RuntimeError):
        multitask.run(cfg, RunContext(checkpointer=checkpointer, on_progress=crash_at_6))
    assert checkpointer.state["step"] == 4
    resumed = multitask.run(cfg, RunContext(checkpointer=checkpointer))
    assert resumed.metrics == straight.metrics
    for name, unit_map in straight.maps.items():
        np.testing.assert_array_equal(resumed.maps[name].values, unit_map.values)
    for name, trajectory in straight.trajectories.items():
        np.testing.assert_array_equal(resumed.trajectories[name], trajectory)


def test_its_weights_start_a_dependant_on_its_task_or_on_another(run_chain):
    """A finetune from a multitask run: on the multitask run's task it loads the encoder and that
    task's decoder (``decoders.task``; the other decoders are in the weights too); on another
    task, the encoder only."""
    mtl = {"method": "multitask", "multitask": {"tasks": [TAG], "pipeline": "shared"}}
    ft = parse_config({**{k: TINY[k] for k in ("model", "task", "train")}, "method": "finetune",
                       "train": {**TINY["train"], "max_steps": 2}, "init_from": mtl})
    _, store = run_chain(ft)
    up = ft.upstreams["init_from"]
    weights = store[up.run_key]
    assert up.method == "multitask" and up.task == ft.task
    assert {k.split(".")[1] for k in weights if k.startswith("decoders.")} == {"task", "synthetic-tag"}

    ctx = RunContext(load_upstream=lambda role: weights)
    state = set_up(ft, ctx)
    for key, value in state.encoder.state_dict().items():
        assert torch.equal(value, weights[f"encoder.{key}"]), key
    for key, value in state.decoder.state_dict().items():
        assert torch.equal(value, weights[f"decoders.task.{key}"]), key

    other = parse_config({**ft.to_dict(), "task": TAG, "init_from": {**mtl, "task": CLS}})
    assert other.upstreams["init_from"].task != other.task
    fresh = set_up(other, RunContext(load_upstream=lambda role: weights))  # encoder only: a new tagging decoder
    assert torch.equal(fresh.encoder.embeddings.word_embeddings.weight, weights["encoder.embeddings.word_embeddings.weight"])


@pytest.mark.parametrize("model", ["tiny-roberta", "random:tiny-bert"])
def test_it_runs_on_another_family_and_on_a_random_model(model):
    raw = copy.deepcopy(TINY) | {"model": model}
    raw["train"]["max_steps"] = 4
    result = multitask.run(parse_config(raw | {"multitask": {"tasks": [TAG], "pipeline": "shared"}}), RunContext())
    assert result.steps == 4 and result.maps["heads.gate"].values.shape == (2, 4)
    assert {"accuracy/synthetic-cls", "accuracy/synthetic-tag", "accuracy/mean"} <= set(result.metrics)


def test_the_run_key_holds_every_tasks_data_and_version(monkeypatch, shared_data):
    base = {"method": "multitask", "task": {"name": "sst2", "max_train": 100}, "multitask": {"tasks": [{"name": "ud-pos"}]}}
    cfg = parse_config(base)
    assert cfg._key_material["tasks"]["multitask.tasks.0"]["data"] == multitask.TASKS["ud-pos"].fingerprint(cfg.section.tasks[0])
    assert parse_config({**base, "multitask": {"tasks": [{"name": "ud-dep"}]}}).run_key != cfg.run_key
    monkeypatch.setattr(multitask.TASKS["ud-pos"], "VERSION", "99")
    assert parse_config(base).run_key != cfg.run_key
    assert "tasks" not in parse_config({"method": "finetune"})._key_material  # other methods: keys unchanged


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({}, "multitask.tasks: list the tasks trained beside the run's task, e.g. [{name: ud-pos}] "
             "(the run's task is the first)"),
        ({"tasks": [{"name": "ud-dpe"}]}, "multitask.tasks.0.name: unknown task 'ud-dpe'; did you mean 'ud-dep'?"),
        ({"tasks": [TAG, {"nmae": "sst2"}]}, "unknown key 'multitask.tasks.1.nmae'; did you mean 'multitask.tasks.1.name'?"),
        ({"tasks": [TAG | {"max_train": 0}]}, "multitask.tasks.0.max_train: Input should be greater than 0 (got 0)"),
        ({"tasks": [TAG, TAG]}, "multitask.tasks.1.name: task 'synthetic-tag' is already in this run "
                                "(multitask.tasks.0.name): each task once, its metrics are named <metric>/synthetic-tag"),
        ({"tasks": [CLS]}, "multitask.tasks.0.name: task 'synthetic-cls' is already in this run (task.name): "
                           "each task once, its metrics are named <metric>/synthetic-cls"),
        ({"tasks": [{"name": "ud-pos", "data_dir": "/nowhere"}]},
         "multitask.tasks.0: task 'ud-pos': en_ewt-ud-dev.conllu not found in /nowhere/ud_ewt "
         "(set the task's data_dir or $HEADSWEEP_DATA)"),
        ({"tasks": [TAG], "pipeline": "pertask"},
         "multitask.pipeline: method 'multitask' has no pipeline 'pertask' (it has none, shared, per_task); "
         "did you mean 'per_task'?"),
        ({"tasks": [TAG], "alpha": 2}, "multitask.alpha: Input should be less than or equal to 1 (got 2)"),
    ],
)
def test_a_bad_task_entry_fails_at_validation_naming_the_key(section, expected):
    raw = copy.deepcopy(TINY)
    raw["multitask"] = section
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value) == expected


def test_lambda_is_a_label_only_where_gates_are_trained():
    """pipeline none trains no gate: no lambda in the run's labels (tables, run names, registry)."""
    assert _cfg(pipeline="none").labels()["lambda"] is None
    assert _cfg(pipeline="shared").labels()["lambda"] == 0.5
    assert _cfg(pipeline="per_task").labels()["lambda"] == 0.5
