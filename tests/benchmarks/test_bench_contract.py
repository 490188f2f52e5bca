"""The benchmarks' contract: every figure line carries its target and whether it was met, a missed
target fails the script and ``make bench`` (which names it), and ``BENCH_TIGHTEN`` shows it.

The bench scripts themselves take minutes and need the whole machine; these tests run the helper
and the runner (``_bench.py``) on small scripts written here, and read the real scripts' source.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BENCH = HERE / "_bench.py"
SCRIPTS = sorted(HERE.glob("bench_*.py"))


def _helper():
    """A fresh copy of the helper (no misses remembered from another test)."""
    spec = importlib.util.spec_from_file_location("_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _script(folder: Path, name: str, body: str) -> Path:
    """A bench script in ``folder`` that imports the real helper."""
    path = folder / name
    path.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body))
    return path


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BENCH_TIGHTEN": "", **(env or {})})


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


FAST = """
    from _bench import at_least, below, emit, finish
    emit("toy", "sum_ratio", target=below(1), measured="sum_ratio", sum_ratio=0.01)
    emit("toy", "speedup", target=at_least(1.1, "x"), measured="speedup", speedup=1.5)
    emit("toy", "scale", target=None, note="informational: for scale", seconds=2.0)
    finish()
"""


def test_met_is_computed_from_the_measured_value(capsys):
    bench = _helper()
    met = bench.emit("toy", "a", target=bench.at_most(1.5, "x"), measured="ratio", ratio=1.5)
    missed = bench.emit("toy", "b", target=bench.at_most(1.5, "x"), measured="ratio", ratio=1.51,
                        backend="postgresql")
    faster = bench.emit("toy", "c", target=bench.at_least(1.1, "x"), measured="speedup", speedup=1.09)
    assert (met["met"], missed["met"], faster["met"]) == (True, False, False)
    assert met["target"] == "<= 1.5 x" and faster["target"] == ">= 1.1 x"
    assert isinstance(met["load_1m"], float)
    assert bench._missed == ["toy.b (postgresql)", "toy.c"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["met"] for row in printed] == [True, False, False]
    with pytest.raises(SystemExit) as exit_:
        bench.finish()
    assert exit_.value.code == 1
    assert "MISSED: toy.b (postgresql), toy.c" in capsys.readouterr().err


def test_a_figure_without_target_must_say_why():
    bench = _helper()
    row = bench.emit("toy", "scale", target=None, note="informational: for scale", seconds=1.0)
    assert (row["target"], row["met"]) == (None, None)
    with pytest.raises(ValueError, match="note"):
        bench.emit("toy", "bare", target=None, seconds=1.0)
    with pytest.raises(ValueError, match="measured"):
        bench.emit("toy", "what", target=bench.below(1), seconds=1.0)
    assert bench._missed == []


def test_a_target_is_on_a_ratio_never_on_an_absolute_time():
    bench = _helper()
    with pytest.raises(ValueError, match="'median_ms' is not a ratio"):
        bench.emit("toy", "alone", target=bench.at_most(15, "ms"), measured="median_ms", median_ms=9.0)
    row = bench.emit("toy", "peer", target=bench.at_most(2), measured="overhead_ratio", overhead_ratio=1.2,
                     median_ms=9.0)
    assert row["met"] is True and bench._missed == []


def test_side_by_side_interleaves_the_steps():
    bench = _helper()
    calls = []
    times = bench.side_by_side({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3)
    assert calls == ["a", "b"] * 4  # one warm-up round, then 3 interleaved
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for t in times["a"] + times["b"])


def test_small_differences_keep_their_digits():
    bench = _helper()
    row = bench.emit("toy", "diff", target=None, note="a check", max_abs_diff=8.123e-7)
    assert row["max_abs_diff"] == 8.12e-7


def test_a_script_meeting_its_targets_exits_0(tmp_path):
    done = _run(str(_script(tmp_path, "bench_fast.py", FAST)))
    assert done.returncode == 0, done.stderr
    assert [row["met"] for row in _lines(done.stdout)] == [True, True, None]


def test_tightening_one_target_fails_the_script_and_names_it(tmp_path):
    done = _run(str(_script(tmp_path, "bench_fast.py", FAST)), env={"BENCH_TIGHTEN": "speedup"})
    assert done.returncode == 1
    rows = {row["figure"]: row for row in _lines(done.stdout)}
    assert rows["speedup"]["met"] is False and rows["speedup"]["tightened"] == "BENCH_TIGHTEN"
    assert rows["sum_ratio"]["met"] is True
    assert "MISSED: toy.speedup" in done.stderr


def test_make_bench_runs_every_script_and_lists_every_miss(tmp_path):
    fast = _script(tmp_path, "bench_a.py", FAST)
    wrong = _script(tmp_path, "bench_b.py", """
        from _bench import below, emit, finish
        emit("other", "ratio", target=below(1), measured="ratio", ratio=3.0)
        assert 1e-2 < 1e-4, "sliced vs masked differ"
    """)
    bare = _script(tmp_path, "bench_c.py", """
        import json
        print(json.dumps({"bench": "bare", "figure": "untargeted", "seconds": 1.0}))
    """)
    done = _run(str(BENCH), str(fast), str(wrong), str(bare), env={"BENCH_TIGHTEN": "sum_ratio"})
    assert done.returncode == 1
    assert "== bench_a.py" in done.stdout and "== bench_c.py" in done.stdout  # went on past the failures
    listed = done.stderr.split("missed:", 1)[1]
    assert "toy.sum_ratio" in listed and "other.ratio" in listed
    assert "bench_c.py: line 'untargeted' has no target/met" in listed
    assert "toy.speedup" not in listed


def test_a_failed_correctness_check_fails_the_run(tmp_path):
    wrong = _script(tmp_path, "bench_wrong.py", """
        from _bench import emit, finish
        max_diff = 0.5
        assert max_diff < 1e-4, f"the pruned model differs by {max_diff}"
        emit("toy", "never", target=None, note="informational")
        finish()
    """)
    done = _run(str(BENCH), str(wrong))
    assert done.returncode == 1
    assert "bench_wrong.py: exited 1" in done.stderr


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_bench_line_goes_through_emit(script):
    """Lines come only from ``_bench.emit`` (which always writes target and met), and the script
    ends in ``finish`` (exit 1 on a miss)."""
    tree = ast.parse(script.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "_bench" for alias in node.names}
    assert {"emit", "finish"} <= imported, f"{script.name} does not report through _bench"
    assert _calls(tree, "emit") and _calls(tree, "finish")
    for call in _calls(tree, "print"):  # a figure printed by hand (a child's line to its parent is fine)
        figure = any(isinstance(node, ast.Constant) and node.value == "figure" for node in ast.walk(call))
        assert not (figure and _calls(call, "dumps")), f"{script.name}:{call.lineno} prints a figure itself"
    bench = _helper()
    for call in _calls(tree, "emit"):
        keywords = {keyword.arg: keyword.value for keyword in call.keywords}
        assert "target" in keywords, f"{script.name}:{call.lineno} has no target"
        measured = keywords.get("measured")
        if isinstance(measured, ast.Constant) and measured.value is not None:  # a target's field, named
            assert bench.is_ratio(measured.value), f"{script.name}:{call.lineno}: a target on {measured.value}"


def test_the_benchmarks_are_all_found():
    assert len(SCRIPTS) >= 8, [s.name for s in SCRIPTS]


def test_the_ratio_interval_is_of_the_paired_ratios():
    bench = _helper()
    assert bench.ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == (2.0, 2.0, 2.0)
    ratio, low, high = bench.ratio_interval([1.0, 1.2, 0.9, 1.1, 1.3, 1.0], [1.0] * 6)
    assert low <= ratio <= high and high - low > 0.05  # noisy pairs: an interval too wide to resolve 5 %


def test_resolved_repeats_until_the_interval_is_narrow_or_the_cap():
    bench = _helper()
    calls = {"a": 0, "b": 0}

    def count(name):  # ~1 ms each, so that the ratios of a loaded machine stay within a few x
        calls[name] += 1
        time.sleep(0.001)

    a, b = bench.resolved(lambda: count("a"), lambda: count("b"), half_width=10.0, least=4, most=20)
    assert len(a) == len(b) == 4 and calls == {"a": 5, "b": 5}  # one warm-up pair, then 4: wide enough
    a, b = bench.resolved(lambda: count("a"), lambda: count("b"), half_width=0.0, least=4, most=14)
    assert len(a) == len(b) == 14  # never narrow enough: stops at the cap, in steps of 5 after the first 4
