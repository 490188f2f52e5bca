"""One way for every ``bench_*.py`` to report a figure, and ``make bench``'s runner.

A bench script prints one JSON line per figure through :func:`emit`: the measured fields, the
``target`` (text a person reads, e.g. ``"<= 1.5 x"``), ``met`` (computed here from the measured
value, never typed in) and the machine's 1-minute load average (these machines are shared: read
absolute times next to it). Every ratio's target is in one table, :data:`TARGETS`: a figure
named there is always emitted with its target, one not named there is information and its line
says why in its ``note`` (``"target": null, "met": null``); a correctness check (``check``: a count,
a flag, a share of an ideal computed in the run) brings its own. A target is always on a ratio
against a peer measured side by side in the same run (``ratio``, ``speedup`` or a field ending in
``_ratio`` or ``_speedup``: :data:`RATIO_FIELDS`), never on an absolute time, which moves with the
machine; absolute times ride along as information. A value that is not finite (inf, NaN: an
unresolved measurement) misses any target. Correctness checks are asserts (the script fails). The
script ends with :func:`finish`, which exits 1 naming the figures that missed their targets.
``test_bench_contract.py`` names every figure that must carry a target and the value last measured
for it: each target is met at that value and missed 30 % worse.

:func:`side_by_side` is the one way to time a figure against its peer: repetitions interleaved
(A, B, A, B, ...) so that the machine's noise hits both alike, compared by medians.

    BENCH_TIGHTEN=FIGURE[,FIGURE...]   makes those figures' targets unmeetable, to see a miss
    BENCH_SCALE=0.1                     shrinks every size read through :func:`scaled` (a quick check
                                        that the scripts run; ratios at a small size say less)

Run as a script (``make bench``), it runs every ``bench_*.py`` next to it, one after the other,
goes on past a failing one, and exits 1 at the end listing every missed figure of every script
(and every script that failed without a miss: a correctness check that asserts, a crash).

    .venv/bin/python tests/benchmarks/_bench.py [bench_x.py ...]
"""

from __future__ import annotations

import json
import math
import operator
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_COMPARE = {"<": operator.lt, "<=": operator.le, ">=": operator.ge}
_missed: list[str] = []


def is_ratio(field: str) -> bool:
    """Whether a field may carry a target: a ratio of two things measured side by side."""
    return field in ("ratio", "speedup") or field.endswith(("_ratio", "_speedup"))


RATIO_FIELDS = "'ratio', 'speedup' or a name ending in '_ratio' or '_speedup'"


@dataclass(frozen=True)
class Target:
    """``value <op> bound``, in ``unit`` (for the text only)."""

    op: str
    bound: float
    unit: str = ""

    def text(self) -> str:
        return f"{self.op} {self.bound:g}" + (f" {self.unit}" if self.unit else "")

    def met(self, value: float) -> bool:
        """Whether ``value`` meets the target; inf and NaN (an unresolved measurement) never do."""
        return math.isfinite(value) and bool(_COMPARE[self.op](value, self.bound))

    def tightened(self) -> Target:
        """A target no measurement meets (times and ratios are never negative)."""
        return Target(self.op, -1.0 if self.op in ("<", "<=") else math.inf, self.unit)


def below(bound: float, unit: str = "") -> Target:
    return Target("<", bound, unit)


def at_most(bound: float, unit: str = "") -> Target:
    return Target("<=", bound, unit)


def at_least(bound: float, unit: str = "") -> Target:
    return Target(">=", bound, unit)


# Every figure's target, by ``figure_name``. Each sits near its figure's last measure (the values and
# their runs: test_bench_contract.py's MEASURED): met there, missed 30 % worse. A new figure with a
# peer gets its line here and there; one without a peer is information (its ``note`` says why).
TARGETS: dict[str, Target] = {
    "analysis.http_aggregate_serve_vs_uvicorn": at_most(2.8, "x (p99)"),
    "ffn_prune.upper_layers": at_least(1.4, "x"),
    "head_analysis.importance_over_backward": at_most(1.2),
    "heads.gated_train_step": at_most(1.10),
    "heads.pruned_inference": at_least(1.10, "x"),
    "masks.mask_storage": at_most(1.25, "x the entropy bound"),
    "masks.mask_train_step": at_most(1.25),
    "orchestration.driver_memory": at_most(1.3),
    "orchestration.one_second_trials": at_least(0.9, "x Tune's"),
    "orchestration.overhead_vs_tune": at_most(1.0, "x Tune's"),
    "registry.register_vs_peers (postgresql)": at_least(11.5, "x each"),
    "registry.register_vs_peers (sqlite)": at_least(21, "x each"),
    "run_cost.minilm_warm_setup": at_most(0.028, "x plain"),
    "run_cost.per_run_vs_loop": at_most(2.9, "x the loops"),
    "run_cost.sweep_vs_loop": at_most(7.0, "x the loops"),
    "stats.pearson_matrix": at_least(2.2, "x"),
    "stats.rbo_pairs": at_least(3.0, "x"),
    "stats.spearman_between": at_least(11, "x"),
    "stats.stem_cell_fit": at_least(50, "x"),
    "tracking.run_logging": at_most(1.25, "x mlflow"),
    "writer.writer_vs_direct_per_run": at_most(3.1),
}


def _tightened() -> set[str]:
    return {name.strip() for name in os.environ.get("BENCH_TIGHTEN", "").split(",") if name.strip()}


def figure_name(bench: str, figure: str, backend: str | None = None) -> str:
    """How a missed figure is named: ``bench.figure``, with the backend when a script measures
    the same figure on several (``registry.resubmit_10000 (postgresql)``)."""
    return f"{bench}.{figure}" + (f" ({backend})" if backend else "")


def _rounded(value: object) -> object:
    """Floats to 4 decimals, small ones (a max difference of 1e-7) to 3 significant digits."""
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    return round(value, 4) if abs(value) >= 0.01 else float(f"{value:.3g}")


def emit(bench: str, figure: str, *, measured: str | None = None, target: Target | None = None,
         check: bool = False, note: str | None = None, **fields: object) -> dict:
    """Print (and return) the figure's JSON line. ``measured`` names the field of ``fields`` that its
    target is checked against: a ratio, whose target is its line in :data:`TARGETS`; or with ``check``
    a correctness check (a count or a flag that must hold, a share of an ideal computed in the same
    run), which brings its own ``target``. Never an absolute time. A figure without a target says
    why in ``note``."""
    row: dict[str, object] = {"bench": bench, "figure": figure}
    row.update({k: _rounded(v) for k, v in fields.items()})
    name = figure_name(bench, figure, fields.get("backend"))
    if check != (target is not None):
        raise ValueError(f"{name}: a check brings its own target; a ratio's target is its line in _bench.TARGETS")
    if not check:
        target = TARGETS.get(name)
    if target is None:
        if measured is not None:
            raise ValueError(f"{name}: measured={measured!r} but no target in _bench.TARGETS")
        if not note:
            raise ValueError(f"{name}: a figure without a target says why in its note")
        row.update(target=None, met=None)
    else:
        if measured not in fields:
            raise ValueError(f"{name}: measured={measured!r} is not one of its fields")
        if not (check or is_ratio(measured)):
            raise ValueError(f"{name}: measured={measured!r} is not a ratio; a target is on "
                             f"{RATIO_FIELDS} against a peer (absolute times go in without a target)")
        if figure in _tightened() or f"{bench}.{figure}" in _tightened():
            target = target.tightened()
            row["tightened"] = "BENCH_TIGHTEN"
        met = target.met(float(fields[measured]))
        row.update(target=target.text(), measured=measured, met=met)
        if not met:
            _missed.append(name)
    if note:
        row["note"] = note
    row["load_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(row), flush=True)
    return row


def scaled(n: int, least: int = 1) -> int:
    """``n`` times ``BENCH_SCALE`` (default 1), at least ``least``."""
    factor = float(os.environ.get("BENCH_SCALE", "1"))
    if not factor > 0:
        raise ValueError(f"BENCH_SCALE={factor}: a positive factor, e.g. BENCH_SCALE=0.1")
    return max(least, round(n * factor))


def side_by_side(steps: dict[str, Callable[[], object]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of ``reps`` calls of each step, the steps called in turn (A, B, C, A, B, C, ...) after
    ``warmup`` rounds, so a change in the machine's load hits each alike."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(reps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_interval(times_a: list[float], times_b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """(median, 2.5 %, 97.5 %) of the paired ratios ``a_i / b_i`` of interleaved repetitions: the
    median and its 95 % bootstrap interval (2,000 resamples)."""
    import numpy as np

    ratios = np.asarray(times_a) / np.asarray(times_b)
    resampled = np.random.default_rng(seed).choice(ratios, (2000, len(ratios)))
    low, high = np.percentile(np.median(resampled, axis=1), [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def resolved(step_a: Callable[[], object], step_b: Callable[[], object], half_width: float,
             least: int = 10, most: int = 60) -> tuple[list[float], list[float]]:
    """Interleaved repetitions of A and B until the 95 % interval of their median ratio is within
    ``half_width`` of it (at least ``least``, at most ``most`` pairs): enough to resolve an effect
    of that size. Returns the seconds of each."""
    times = side_by_side({"a": step_a, "b": step_b}, least)
    while len(times["a"]) < most:
        ratio, low, high = ratio_interval(times["a"], times["b"])
        if max(ratio - low, high - ratio) <= half_width * ratio:
            break
        more = side_by_side({"a": step_a, "b": step_b}, 5, warmup=0)
        times = {name: times[name] + more[name] for name in times}
    return times["a"], times["b"]


def start_ray(tries: int = 3, **kwargs: object) -> None:
    """``ray.init(**kwargs)``, tried again when the node does not come up: Ray waits a fixed 30 s
    for its raylet, which a loaded 2-core machine can miss (each try's failure is printed)."""
    import ray

    for attempt in range(1, tries + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for this
            ray.shutdown()
            print(f"ray.init try {attempt} of {tries} failed: {error}", file=sys.stderr, flush=True)
            if attempt == tries:
                raise


def finish() -> None:
    """Exit 1 naming the figures that missed their targets; return when every one was met."""
    if _missed:
        print(f"MISSED: {', '.join(_missed)}", file=sys.stderr, flush=True)
        sys.exit(1)


def run_scripts(scripts: list[Path]) -> list[str]:
    """Run each script, echoing its lines; return every miss (``figure_name``) and every script that
    failed without one. A line without ``target`` and ``met`` is a failure too."""
    failures: list[str] = []
    for script in scripts:
        print(f"== {script.name} (1-min load {os.getloadavg()[0]:.2f})", flush=True)
        started = time.monotonic()
        process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        missed_here: list[str] = []
        for line in process.stdout:
            print(line, end="", flush=True)
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or "figure" not in row:
                continue
            if "target" not in row or "met" not in row:
                failures.append(f"{script.name}: line '{row['figure']}' has no target/met")
            elif row["met"] is False:
                missed_here.append(figure_name(str(row.get("bench")), row["figure"], row.get("backend")))
        code = process.wait()
        print(f"== {script.name}: {time.monotonic() - started:.0f} s, exit {code} (1-min load {os.getloadavg()[0]:.2f})", flush=True)
        failures.extend(missed_here)
        if code != 0 and not missed_here:
            failures.append(f"{script.name}: exited {code} (a failed check or a crash: see above)")
    return failures


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = [Path(arg).resolve() for arg in argv] or sorted(here.glob("bench_*.py"))
    failures = run_scripts(scripts)
    if failures:
        print(f"\n{len(failures)} missed:\n  " + "\n  ".join(failures), file=sys.stderr, flush=True)
        return 1
    print(f"\nevery target met ({len(scripts)} scripts)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
