"""What runs report is declared once (base/outputs.py, each method's ``OUTPUTS``) and read from
there: no map or metric name is typed in analysis/ or the runner, and the declarations hang together.

That every map and metric a run of each method reports is declared is checked where every method runs
(tests/experiments/test_precision.py::test_every_method_runs_its_forwards_in_bf16_and_trains_close_to_fp32).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.data.sweep import LABELS
from base import outputs
from experiments.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
READERS = [*sorted((ROOT / "analysis").rglob("*.py")), ROOT / "experiments" / "harness" / "runner.py"]
"""Where names are read, never typed: analysis and the runner."""


def _key(metric: outputs.Metric | outputs.MetricFamily) -> str:
    return metric.name if isinstance(metric, outputs.Metric) else metric.pattern


def _declared() -> tuple[list[outputs.MapOutput], list[outputs.Metric | outputs.MetricFamily]]:
    """Every map and metric declared: base.outputs' and each method's own."""
    maps = {m.name: m for m in outputs.MAPS}
    metrics = {_key(m): m for m in (*outputs.METRICS, *outputs.FAMILIES)}
    for module in METHODS.values():
        maps |= {m.name: m for m in module.OUTPUTS.maps}
        metrics |= {_key(m): m for m in module.OUTPUTS.metrics}
    return list(maps.values()), list(metrics.values())


def typed_names(source: str, maps, metrics, labels=()) -> list[tuple[int, str]]:
    """``(line, text)`` of each string in ``source`` (docstrings and comments aside) that is a declared map's
    name (or one of its per-part names) or a declared metric's (on any evaluation set), or that a metric
    family matches; ``labels`` aside (the label ``sparsity``, a setting, is not the metric ``sparsity``)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    docstrings |= {id(node.value) for node in ast.walk(tree)  # attribute docstrings: a bare string after a name
                   if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        text = node.value.strip().lstrip("-")  # "-heads.ablation_delta": a map with its sign flipped
        if text in labels:
            continue
        if any(m.matches(text) for m in maps) or any(m.matches(text) for m in metrics):
            found.append((node.lineno, node.value))
    return found


def test_no_map_or_metric_name_is_typed_in_analysis_or_the_runner():
    maps, metrics = _declared()
    typed = [f"{path.relative_to(ROOT)}:{line}: {text!r}" for path in READERS
             for line, text in typed_names(path.read_text(), maps, metrics, LABELS)]
    assert typed == [], "read these from base.outputs:\n" + "\n".join(typed)


def test_the_grep_finds_a_typed_name_and_not_a_docstring():
    maps, metrics = _declared()
    source = '''
"""Module doc naming heads.gate and accuracy_pruned_30."""
DEFAULT = "heads.gate"
"""An attribute doc naming heads.log_alpha."""
def f(data):
    """heads.importance in a docstring."""
    per_task = data.map("heads.gate.sst2")
    flipped = "-heads.ablation_delta"
    curve = data.metrics["accuracy_pruned_30/ood"]
    timing = data.metrics["cost.mlflow_s"]
    return data.metrics["open_heads"], data.metrics["loss/ood"], "spearman", "task", "heads"
'''
    assert sorted(text for _, text in typed_names(source, maps, metrics)) == sorted([
        "heads.gate", "heads.gate.sst2", "-heads.ablation_delta", "accuracy_pruned_30/ood", "cost.mlflow_s",
        "open_heads", "loss/ood"])


def test_the_declarations_hang_together():
    maps = {m.name: m for m in outputs.MAPS}
    assert len(maps) == len(outputs.MAPS)  # one declaration per name
    for declared in outputs.MAPS:
        for other in (declared.companion, declared.derived_from):
            assert other is None or maps[other].kind == declared.kind, declared.name
    assert outputs.companion("heads.gate") == "heads.log_alpha"
    assert outputs.companion("heads.gate.sst2") == "heads.log_alpha.sst2"  # multitask's per-task sets
    assert outputs.companion("heads.importance") is None
    assert outputs.DERIVED == {"heads.pruned_at": "heads.importance"}
    for name, module in METHODS.items():  # every built-in method declares what it reports, from these
        assert isinstance(module.OUTPUTS, outputs.Outputs), name
        assert all(maps.get(m.name) is m for m in module.OUTPUTS.maps), name


@pytest.mark.parametrize(("family", "fields", "name"), [
    (outputs.PRUNING_CURVE, {"metric": "accuracy", "pct": 30}, "accuracy_pruned_30"),
    (outputs.NOISE, {"metric": "accuracy", "which": "top", "fraction": 0.01}, "accuracy_noise_top_0.01"),
    (outputs.SOURCE_NOISE, {"metric": "accuracy", "which": "random", "fraction": 0.1}, "accuracy_noise_source_random_0.1"),
    (outputs.PRUNED, {"metric": "accuracy"}, "pruned_accuracy"),
    (outputs.COST, {"part": "mlflow"}, "cost.mlflow_s"),
])
def test_a_family_builds_a_name_and_reads_it_back(family, fields, name):
    assert family.name(**fields) == name
    parsed = family.parse(name)
    assert {k: parsed[k] for k in fields} == {k: str(v) for k, v in fields.items()}
    assert not outputs.NOISE.matches("accuracy_noise_source_top_0.1")  # two families, never confused
    assert outputs.PRUNING_CURVE.parse("accuracy_pruned_30/ood")["where"] == "/ood"


def test_a_bad_declaration_or_an_undeclared_output_is_named():
    with pytest.raises(ValueError, match="its name must be 'gate.<what>'"):
        outputs.MapOutput("gate", "no kind")
    with pytest.raises(ValueError, match="unknown map kind 'gates'"):
        outputs.MapOutput("gates.open", "not a kind of unit")
    with pytest.raises(ValueError, match="comes once per run"):
        outputs.KEPT.named("sst2")
    declared = outputs.Outputs(maps=(outputs.GATE,), metrics=(outputs.ACCURACY, outputs.PRUNING_CURVE))
    assert declared.undeclared(["heads.gate", "heads.gate.sst2", "heads.log_alpha"],
                               ["accuracy/ood", "accuracy_pruned_5", "loss"]) == ["heads.log_alpha", "loss"]
