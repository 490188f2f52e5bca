"""A simulated GPU cluster on this machine: thousands of short trials at a quarter GPU each, and a lost node.

A Ray head (the project's local head, no GPUs) and ``--nodes`` worker nodes of ``--gpus-per-node``
logical GPUs each (``ray start --num-gpus``: Ray counts them and sets ``CUDA_VISIBLE_DEVICES`` per
trial; no CUDA), each node with its own temp dir and ports (tests/ray_nodes.py), all on 127.0.0.1.
``headsweep submit`` (the real CLI, MLflow off: ``--no-track``, see below) runs a grid of
``--trials`` runs of the ``gpu_sleep`` plug-in method (tests/benchmarks/scale_methods.py, named in
``HEADSWEEP_METHODS``: it sleeps a seeded 0.2-1 s and records its node, GPU and start/end) at
``resources: {gpus: 0.25}``. Once ``--kill-after`` runs finished, every process of the worker node
running the most trials is SIGKILLed (a machine that died).

Checked (exit 1 when one fails), one JSON line each with its target and ``met``:
- no logical GPU (node, GPU id) ran more than 4 trials at once (a sweep over start/end events;
  a killed attempt ends at the kill);
- every run finished exactly once: the registry says finished for all, each run's finishing
  attempt is one recorded attempt, no run has two completed attempts except ones killed on the
  lost node between their end and their result;
- every logical GPU was used;
- the lost node: its runs reran on other nodes (nothing lost, nothing duplicated; its attempts have
  no end) and ``headsweep status`` names the node in one line.
Reported: scheduling throughput (trials/s), wall time against the ideal, how busy the GPU slots
were (occupied slot-seconds / available), against ``max_concurrent`` and against 4 x GPUs, and
the trial workers' memory.

Memory: every running trial is a Ray worker process that imports the trial path (torch, Ray Tune,
SQLAlchemy, matplotlib: ~280 MB of its own, measured by a probe task before the sweep).
``max_concurrent`` is what fits ``--memory-gib`` (default 16) at that size, at most 4 x GPUs.

MLflow is off: this measures scheduling, packing and a node's loss; MLflow's cost per run at
thousands of runs is the 2,000-run harness's (scale_sweep.py), and its SQLite store would make
this a figure of MLflow's writers.

    .venv/bin/python tests/benchmarks/scale_gpus.py                      # 8 x 8 GPUs, 10,000 trials
    .venv/bin/python tests/benchmarks/scale_gpus.py --nodes 2 --gpus-per-node 8 --trials 300 --kill-after 100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import ray_nodes  # noqa: E402  (tests/ray_nodes.py)
import scale_methods  # noqa: E402
from _bench import at_least, at_most, emit, finish  # noqa: E402

from orchestrator.cluster.head import HEAD_ENV, head_pids, local_head, stop_local_head, temp_dir  # noqa: E402
from orchestrator.cluster.jobs import cluster_nodes  # noqa: E402
from orchestrator.cluster.processes import processes  # noqa: E402
from orchestrator.registry import Registry  # noqa: E402
from orchestrator.registry.history import worker_node  # noqa: E402

BENCH = "scale_gpus"
PER_GPU = 4  # trials at gpus: 0.25


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=8, help="worker nodes (the head has no GPU)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="logical GPUs per worker node")
    p.add_argument("--cpus-per-node", type=int, help="logical CPUs per worker node (default: 4 per GPU)")
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--sleep", default="0.2,1.0", help="MIN,MAX seconds each trial sleeps (seeded per trial)")
    p.add_argument("--kill-after", type=int, help="kill a node once this many runs finished (default trials/3; 0: none)")
    p.add_argument("--memory-gib", type=float, default=16.0, help="memory the trial workers may use together")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: what fits --memory-gib)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the sweep may take")
    p.add_argument("--keep", action="store_true", help="keep the temp home (registry, records) and Ray's temp dirs (logs)")
    args = p.parse_args(argv)
    args.cpus_per_node = args.cpus_per_node or PER_GPU * args.gpus_per_node
    args.kill_after = args.trials // 3 if args.kill_after is None else args.kill_after
    args.min_s, args.max_s = (float(x) for x in args.sleep.split(","))
    return args


# --------------------------------------------------------------------------- memory


def memory_mib(pid: int) -> dict[str, float]:
    """RSS, PSS and USS (private pages: what one more such process costs) of a process, in MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[name] = int(value.split()[0]) / 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


PROBE = """
import json, os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="WARNING")

@ray.remote(num_cpus=1, num_gpus=0.25)
def probe():
    import experiments.harness.runner, orchestrator.driving.trial  # what a trial worker imports before its method
    return os.getpid(), sorted(m for m in ("torch", "transformers", "matplotlib", "sqlalchemy", "mlflow") if m in sys.modules)

pid, modules = ray.get(probe.remote())
print(json.dumps({"pid": pid, "modules": modules}), flush=True)
sys.stdin.read()  # the worker lives while this driver does: until it is measured
"""


def probe_worker(address: str, nodes: list[dict]) -> dict:
    """A Ray worker on a GPU node that imported the trial path, measured while it lives: what each
    concurrent trial costs before its method runs, and the heavy modules it holds."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=os.environ | HEAD_ENV)
    try:
        found = json.loads(probe.stdout.readline())
        assert any(found["pid"] in ray_nodes.node_pids(node["tmp"]) for node in nodes), "the probe ran off the GPU nodes"
        return memory_mib(found["pid"]) | {"modules": found["modules"]}
    finally:
        probe.communicate(timeout=60)


def _measured(pids: list[int]) -> list[dict[str, float]]:
    """``memory_mib`` of each of the processes that still lives."""
    measured = []
    for pid in pids:
        try:
            measured.append(memory_mib(pid))
        except OSError:  # ended meanwhile
            continue
    return measured


def trial_workers(nodes: list[dict]) -> list[int]:
    """The Tune trial processes (``ray::ImplicitFunc``) of the worker nodes."""
    table = processes()
    pids = set().union(*(ray_nodes.node_pids(node["tmp"]) for node in nodes))
    return [pid for pid in pids if table.get(pid, (0, ""))[1].startswith("ray::ImplicitFunc")]


def rss_by_kind(table: dict[int, tuple[int, str]]) -> dict[str, float]:
    """MiB of resident memory of every process on the machine, summed by what it is (its command's
    first word: ``ray::ImplicitFunc``, ``raylet``, ``gcs_server``, ``python``, ...): what grew when
    memory ran out (three full-size runs died of it, each after ~3,300 trials)."""
    page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    kinds: dict[str, float] = {}
    for pid, (_, cmdline) in table.items():
        try:
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        words = cmdline.split()
        kind = Path(words[0]).name if words else "?"
        if kind.startswith("python") and len(words) > 2 and words[1] == "-m":
            kind = f"python -m {words[2]}"
        kinds[kind] = kinds.get(kind, 0.0) + pages * page_mib
    return {kind: round(mib) for kind, mib in sorted(kinds.items(), key=lambda item: -item[1])[:8]}


def sample_memory(home: Path, sweep_id: str, nodes: list[dict]) -> dict[str, float]:
    """The trial workers now: how many, their USS summed and median; the driver's RSS; and the
    machine's available memory."""
    table = processes()
    driver = [pid for pid in head_pids(home) if table.get(pid, (0, ""))[1].strip().endswith(
        f"-m headsweep.sweep_job {sweep_id}")]
    used = _measured(trial_workers(nodes))
    uss = sorted(m["uss"] for m in used)
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable")) / 1024
    return {"workers": len(used), "uss_sum_mib": sum(uss), "uss_median_mib": uss[len(uss) // 2] if uss else 0.0,
            "rss_median_mib": sorted(m["rss"] for m in used)[len(used) // 2] if used else 0.0,
            "driver_rss_mib": sum(m["rss"] for m in _measured(driver)), "available_mib": available,
            "rss_by_kind_mib": rss_by_kind(table)}


# --------------------------------------------------------------------------- the records (pure)


def attempts(lines: list[dict], killed_at: float | None, lost_node: str | None) -> list[dict]:
    """One dict per attempt of a run (``scale_methods`` wrote a start and, unless killed, an end):
    run_key, node, gpu, pid, start, end (None when it has none) and ``until`` (its end, or the
    kill for an attempt of the lost node that has none)."""
    by_attempt: dict[str, dict] = {}
    for line in lines:
        attempt = by_attempt.setdefault(line["attempt"], {k: line[k] for k in ("run_key", "node", "gpus", "pid")}
                                        | {"start": None, "end": None})
        attempt[line["event"]] = line["t"]
    for attempt in by_attempt.values():
        killed = attempt["end"] is None and attempt["node"] == lost_node and killed_at is not None
        attempt["until"] = killed_at if killed else attempt["end"]
    return list(by_attempt.values())


def peak_per_gpu(runs: list[dict]) -> tuple[int, dict[tuple[str, str], int]]:
    """The most attempts that ran at once on one logical GPU (node, ``CUDA_VISIBLE_DEVICES``), and
    each GPU's peak: a sweep over start (+1) and end (-1) events, ends first at equal times."""
    events = defaultdict(list)
    for attempt in runs:
        if attempt["start"] is not None and attempt["until"] is not None:
            events[(attempt["node"], attempt["gpus"])] += [(attempt["start"], 1), (attempt["until"], -1)]
    peaks = {}
    for gpu, points in events.items():
        inside = peak = 0
        for _, step in sorted(points):
            inside += step
            peak = max(peak, inside)
        peaks[gpu] = peak
    return max(peaks.values(), default=0), peaks


def peak_overall(runs: list[dict]) -> int:
    """The most attempts running at once anywhere."""
    points = sorted(p for a in runs if a["until"] is not None for p in ((a["start"], 1), (a["until"], -1)))
    inside = peak = 0
    for _, step in points:
        inside += step
        peak = max(peak, inside)
    return peak


def open_attempts(path: Path) -> Counter:
    """Attempts started and not ended, per node (read from the records now)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    ended = {line["attempt"] for line in lines if line["event"] == "end"}
    return Counter(line["node"] for line in lines if line["event"] == "start" and line["attempt"] not in ended)


# --------------------------------------------------------------------------- the cluster and the sweep


def start_cluster(home: Path, args: argparse.Namespace, nodes: list[dict]) -> dict:
    """The head (no GPUs), and the worker nodes appended to ``nodes`` as they start (so that a failed
    start stops those already up), once all of them joined."""
    head = local_head(num_cpus=2, num_gpus=0, home=home)
    for i in range(args.nodes):
        nodes.append(ray_nodes.start_node(head["address"], f"/tmp/hsg{os.getpid()}-{i}", args.cpus_per_node,
                                          args.gpus_per_node))
    deadline = time.monotonic() + 120
    while len(cluster_nodes(head["dashboard"])) < args.nodes + 1:
        assert time.monotonic() < deadline, "the worker nodes did not all join"
        time.sleep(1)
    return head


def stop_cluster(home: Path, nodes: list[dict], keep: bool) -> None:
    """Stop every node by PID; their temp dirs (Ray's logs: the driver's is the head's) go unless ``keep``."""
    for node in nodes:
        ray_nodes.stop_node(node["tmp"])
    stop_local_head(home=home)
    for tmp in ([] if keep else [node["tmp"] for node in nodes] + [temp_dir(home)]):
        shutil.rmtree(tmp, ignore_errors=True)


def cli_env(home: Path, head: dict) -> dict[str, str]:
    """The CLI's environment: this home and cluster, the plug-in method on its path."""
    env = {k: v for k, v in os.environ.items() if k not in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI")}
    return env | HEAD_ENV | {
        "HEADSWEEP_HOME": str(home), "RAY_ADDRESS": head["address"], "HEADSWEEP_RAY_DASHBOARD": head["dashboard"],
        "HEADSWEEP_METHODS": "scale_methods", "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
    }


def headsweep(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "headsweep.cli", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def grid(args: argparse.Namespace, max_concurrent: int) -> dict:
    return {"name": "scale-gpus", "base": {"method": "gpu_sleep", "model": "tiny-bert",
                                           "gpu_sleep": {"min_s": args.min_s, "max_s": args.max_s}},
            "axes": {"seed": list(range(args.trials))}, "resources": {"gpus": 1 / PER_GPU},
            "max_concurrent": max_concurrent, "max_failures": 3}


def follow(sweep_id: str, home: Path, nodes: list[dict], args: argparse.Namespace) -> dict:
    """Follow the sweep as ``headsweep submit --wait`` does (``sweeps.wait``: a dead driver is recorded,
    the supervisor's resume awaited), killing a node once ``kill_after`` runs finished; memory sampled
    every ~5 s. Ray's memory monitor sees the whole machine from every simulated node: under memory
    pressure it kills workers on all of them, the head's job supervisor (and so the driver) included."""
    from orchestrator.driving.sweeps import wait

    started, state = time.monotonic(), {"lost": None, "samples": [], "sampled": 0.0}

    def update(sweep: dict, counts: dict) -> None:
        assert time.monotonic() - started < args.timeout, counts
        finished = counts.get("finished", 0)
        if time.monotonic() - state["sampled"] > 5:
            state["sampled"] = time.monotonic()
            state["samples"].append(sample_memory(home, sweep_id, nodes) | {"finished": finished})
            sample = state["samples"][-1]
            print(f"  {finished}/{args.trials} finished ({sweep['status']}); {sample['workers']} trial workers; "
                  f"{sample['available_mib'] / 1024:.1f} GiB available", file=sys.stderr)
            if len(state["samples"]) % 12 == 1:  # what holds the memory, printed as it goes: a run that dies of it still tells
                print(f"    MiB by process kind: {sample['rss_by_kind_mib']}", file=sys.stderr)
            died = [n["node_id"][:8] for n in nodes if n is not (state["lost"] or {}).get("node") and not ray_nodes.alive(n["tmp"])]
            assert not died, (f"node(s) {died} died by themselves (a raylet the GCS marks dead after missed health "
                              f"checks exits; load {os.getloadavg()[0]:.0f}): the run measures nothing more")
        running = open_attempts(home / scale_methods.RECORD) if (
            state["lost"] is None and args.kill_after and finished >= args.kill_after) else None
        if running:
            busiest = running.most_common(1)[0][0]
            (node,) = [n for n in nodes if n["node_id"] == busiest]
            state["lost"] = {"node": node, "killed_at": time.time(), "pids": len(ray_nodes.kill_node(node["tmp"]))}
            print(f"  killed node {busiest[:8]} ({state['lost']['pids']} processes) at {finished} finished", file=sys.stderr)

    wait(sweep_id, on_update=update, poll_s=0.5)
    return {"lost": state["lost"], "samples": state["samples"]}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its cluster (finally)
    home = Path(tempfile.mkdtemp(prefix="hsg-"))
    nodes: list[dict] = []
    load_before = os.getloadavg()
    try:
        head = start_cluster(home, args, nodes)
        worker = probe_worker(head["address"], nodes)
        fits = int(args.memory_gib * 1024 // worker["uss"])
        slots = PER_GPU * args.gpus_per_node * args.nodes
        cap = args.max_concurrent or min(slots, fits)
        env = cli_env(home, head)
        os.environ.update({name: env[name] for name in ("HEADSWEEP_HOME", "HEADSWEEP_RAY_DASHBOARD", "RAY_ADDRESS")})
        grid_file = home / "grid.yaml"
        grid_file.write_text(json.dumps(grid(args, cap)))  # JSON is YAML
        submitted_at = time.time()
        headsweep(env, "submit", str(grid_file), "--no-track")
        registry = Registry(f"sqlite:///{home}/registry.db")
        (sweep,) = registry.list_sweeps()
        followed = follow(sweep["id"], home, nodes, args)
        done_at = time.time()
        told = headsweep(env, "status", sweep["id"])
        print(told, file=sys.stderr)
        status = " ".join(told.split())
        report(args, registry, sweep["id"], home / scale_methods.RECORD, followed, status, worker, fits, cap, slots,
               submitted_at, done_at, load_before)
    finally:
        stop_cluster(home, nodes, args.keep)
        if args.keep:
            print(f"kept {home} and Ray's logs under {temp_dir(home)}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    finish()
    return 0


def finishers(registry_runs: dict[str, dict], runs: list[dict]) -> dict[str, dict | None]:
    """Each run's finishing attempt: the recorded attempt of that run whose node and process are the
    registry's ``worker`` of the finished run (None when no record matches)."""
    completed = {(a["run_key"], a["node"][:8], a["pid"]): a for a in runs if a["end"] is not None}
    out = {}
    for key, run in registry_runs.items():
        node = worker_node(run["worker"])
        out[key] = completed.get((key, node[0], int(run["worker"].rsplit(":", 1)[1]))) if node else None
    return out


def report(args, registry, sweep_id, records, followed, status, worker, fits, cap, slots,
           submitted_at, done_at, load_before) -> None:
    lost = followed["lost"]
    lost_node, killed_at = (lost["node"]["node_id"], lost["killed_at"]) if lost else (None, None)
    runs = attempts([json.loads(line) for line in records.read_text().splitlines()], killed_at, lost_node)
    registry_runs = {key: registry.get_run(key) for key in registry.sweep_runs(sweep_id)["run_key"]}
    finisher = finishers(registry_runs, runs)
    size = {"nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node, "trials": args.trials,
            "max_concurrent": cap, "load_before": [round(x, 2) for x in load_before]}

    peak, peaks = peak_per_gpu(runs)
    emit(BENCH, "max_concurrent_per_gpu", target=at_most(PER_GPU), check=True, measured="peak", peak=peak,
         gpus_at_peak=sum(p == peak for p in peaks.values()), peak_overall=peak_overall(runs), **size,
         note="the most trials inside their method at once on one logical GPU (node, CUDA_VISIBLE_DEVICES)")

    # once: finished in the registry, by a recorded attempt, and no other attempt completed, but for
    # one killed on the lost node after its end record and before its result was written
    counts = registry.sweep_counts(sweep_id)
    extra = Counter(a["run_key"] for a in runs if a["end"] is not None and a is not finisher.get(a["run_key"])
                    and a["node"] != lost_node)
    unended_elsewhere = [a for a in runs if a["end"] is None and a["node"] != lost_node]
    missing = [key for key, a in finisher.items() if a is None]
    once = counts == {"finished": args.trials} and not missing and not extra and not unended_elsewhere
    emit(BENCH, "every_trial_once", target=at_least(1), check=True, measured="once", once=int(once), counts=counts,
         finisher_not_recorded=len(missing), completed_twice=len(extra), attempts_without_end_off_the_lost_node=len(unended_elsewhere),
         attempts=len(runs), **size)

    # Ray packs fractional GPUs (a quarter GPU goes to the fullest GPU it fits): below 4 x GPUs at once,
    # max_concurrent / 4 GPUs at a time can hold them all, and which ones is Ray's choice
    used = {(a["node"], a["gpus"]) for a in runs}
    reachable = min(args.nodes * args.gpus_per_node, -(-cap // PER_GPU))
    emit(BENCH, "gpus_used", target=at_least(reachable), check=True, measured="used", used=len(used),
         nodes_used=len({a["node"] for a in runs}), **size,
         note="target: every GPU when max_concurrent >= 4 x GPUs; under a lower cap, the fewest GPUs that hold "
              "max_concurrent trials (Ray packs quarter GPUs 4 to a GPU)")

    if lost:
        check_lost_node(registry, sweep_id, runs, registry_runs, finisher, lost, status, size)

    first_start = min(a["start"] for a in runs)
    last_end = max(a["end"] for a in runs if a["end"] is not None)
    span = last_end - first_start
    useful = sum((run["metrics"] or {}).get("slept_s", 0.0) for run in registry_runs.values())  # each run's own sleep, once
    occupied = sum(a["until"] - a["start"] for a in runs if a["until"] is not None)
    alive = sum((min(last_end, killed_at) if node == lost_node else last_end) - first_start
                for node in {a["node"] for a in runs})  # GPU-node seconds
    finished = sum(run["status"] == "finished" for run in registry_runs.values())  # all, unless the sweep failed
    emit(BENCH, "throughput", target=None, trials_per_s=finished / span, finished=finished, span_s=span,
         submit_to_done_s=done_at - submitted_at, **size,
         note="informational: finished runs / (first trial start to last trial end); submit_to_done_s includes "
              "registering the grid and starting the driver")
    emit(BENCH, "wall_vs_ideal", target=None, wall_s=span, ideal_at_cap_s=useful / cap, ideal_at_4_per_gpu_s=useful / slots,
         of_ideal_at_cap=useful / cap / span, of_ideal_at_4_per_gpu=useful / slots / span,
         slot_s_per_trial_beyond_its_sleep=(cap * span - useful) / max(finished, 1), **size,
         note="informational: ideal = the runs' own sleeps / the slots (max_concurrent, and 4 x GPUs)")
    emit(BENCH, "gpu_busy", target=None, busy_of_cap=occupied / (cap * span),
         busy_of_4_per_gpu=occupied / (PER_GPU * args.gpus_per_node * alive), occupied_slot_s=occupied, **size,
         note="informational: occupied GPU-slot-seconds (each attempt's start to end, a killed one's to the kill) / "
              "available (max_concurrent x the span; 4 per GPU x each node's time alive)")
    samples = followed["samples"]
    busiest = max(samples, key=lambda s: s["workers"], default={})
    emit(BENCH, "trial_worker_memory", target=None, probe_rss_mib=worker["rss"], probe_pss_mib=worker["pss"],
         probe_uss_mib=worker["uss"], probe_modules=worker["modules"], fit_in_budget=fits, budget_gib=args.memory_gib, **size,
         most_workers=busiest.get("workers", 0), their_uss_sum_mib=busiest.get("uss_sum_mib", 0.0),
         uss_median_mib=busiest.get("uss_median_mib", 0.0), rss_median_mib=busiest.get("rss_median_mib", 0.0),
         min_available_mib=min((s["available_mib"] for s in samples), default=0.0),
         rss_by_kind_at_busiest_mib=busiest.get("rss_by_kind_mib", {}),
         rss_by_kind_at_least_available_mib=min(samples, key=lambda s: s["available_mib"], default={}).get("rss_by_kind_mib", {}),
         driver_rss_max_mib=max((s["driver_rss_mib"] for s in samples), default=0.0),
         note="informational: a trial worker imports torch, Ray Tune, SQLAlchemy and matplotlib before its "
              "method; max_concurrent = min(4 x GPUs, budget / probe USS) unless given")


def check_lost_node(registry, sweep_id, runs, registry_runs, finisher, lost, status, size) -> None:
    """The lost node's runs: each attempt killed there (no end) finished on another node; every run
    Tune ran twice lost an attempt there (a record or an event naming it); ``status`` names the node."""
    lost_node = lost["node"]["node_id"]
    killed = {a["run_key"] for a in runs if a["node"] == lost_node and a["end"] is None}
    elsewhere = {key for key in killed if finisher[key] is not None and finisher[key]["node"] != lost_node}
    events = registry.events(sweep_id)
    named = {e["detail"]["run_key"] for e in events if e["kind"] == "worker_lost"}
    named |= {key for e in events if e["kind"] == "orphaned" for key in e["detail"]["run_keys"]}
    on_node = {a["run_key"] for a in runs if a["node"] == lost_node} | named
    twice = {key for key, run in registry_runs.items() if run["attempts"] > 1}
    lost_events = [e for e in events if e["kind"] == "worker_lost"]
    nodes_named = {worker_node(e["detail"]["worker"])[0] for e in lost_events}
    # several runs lost together: one line for the node; a single run: its own line, naming the node
    line = (f"(Ray node {lost_node[:8]}, 127.0.0.1) at " if len(lost_events) > 1 else
            f"(Ray node {lost_node[:8]}, 127.0.0.1): ")
    said = line in status and (f": {len(lost_events)} runs rerun by Tune" in status if len(lost_events) > 1
                               else "Tune retried it" in status)
    checks = {"the kill hit running trials": bool(killed),
              "each killed attempt finished on another node": elsewhere == killed,
              "every run that ran twice was on the lost node": twice <= on_node,
              "status names the node and counts its runs": said,
              "every worker_lost event names the lost node": nodes_named == {lost_node[:8]}}
    failed = [name for name, held in checks.items() if not held]
    ok = not failed
    detected = min((_unix(e["at"]) for e in lost_events), default=None)
    emit(BENCH, "lost_node", target=at_least(1), check=True, measured="ok", ok=int(ok), node=lost_node[:8],
         killed_processes=lost["pids"], attempts_killed=len(killed), rerun_elsewhere=len(elsewhere),
         worker_lost_events=len(lost_events), orphaned=len(named) - len({e["detail"]["run_key"] for e in lost_events}),
         runs_with_2_attempts=len(twice), status_names_it=said, failed=failed,
         killed_not_rerun_elsewhere=sorted(killed - elsewhere), twice_off_the_node=sorted(twice - on_node),
         nodes_named=sorted(nodes_named),
         status_line=(line + status.split(line, 1)[1])[:160] if line in status else "",
         kill_to_first_event_s=round(detected - lost["killed_at"], 1) if detected else None, **size,
         note="ok: the kill hit running trials, each finished on another node, every run that ran twice "
              "was on the lost node, and status names the node and counts its runs")


def _unix(naive_utc) -> float:
    """A registry time (naive UTC) as Unix seconds."""
    return naive_utc.replace(tzinfo=UTC).timestamp()


if __name__ == "__main__":
    sys.exit(main())
