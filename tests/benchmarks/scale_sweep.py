"""The scale harness (issue 19): thousands of real runs through `headsweep submit --wait`, measured.

In a fresh temporary HEADSWEEP_HOME it submits, through the real CLI, a grid of real runs (tiny-bert
on the generated synthetic-cls task, a few training steps each; head_gates DP and SP, SP starting
from its fine-tune stage; 3 seeds x pipelines x two gate learning rates x enough lambdas to reach
``--runs``), with MLflow tracking and the per-run figures as a user has them (the defaults), then
times what a user does next on that sweep. Prints one JSON line per figure and a markdown table.

- runs, wall time of ``submit --wait`` and the ideal: the sum of the runs' own training CPU seconds
  (``cost.train_s``, measured inside the trial) over the machine's cores; throughput = ideal / wall
  (target >= 90 %), also over the span from the first run's start to the last run's end;
- the fixed cost per run by part (median and p90 of each ``cost.<part>_s``), and how many runs were
  the first of their worker process (``cost.first_in_worker``: they pay the imports);
- the driver's RSS over time: every ``--sample-s`` seconds, the RSS of the process running
  ``python -m headsweep.sweep_job SWEEP`` (the sweep's Ray Job), found among this home's Ray head's
  processes (``orchestrator.cluster.head.head_pids``: the head's daemons by their temp dir and every
  descendant, which the job's driver is), read from /proc/PID/status; beside it, every process
  of the head together (the trial workers included): what must fit in memory;
- the registry's and MLflow's store sizes (SQLite files, or ``pg_database_size`` and each side's
  tables), the artifact and checkpoint folders;
- how long ``status``, ``results``, ``agreement``, ``compare-maps`` and ``figures`` take as a user
  runs them (each a fresh process), and the HTTP API (``headsweep serve``: its start, then a few
  endpoints, first and cached);
- the MLflow UI at that many children (scale_mlflow_ui.py): pages timed in headless Chromium, with
  screenshots under ``--out``.

``--db postgres`` puts the registry and MLflow in one new database of a private PostgreSQL server
started for the run (the tests' own, tests/pg_server.py: ``pg_schema.pg_server_url``), removed at
the end; with ``--pg URL`` in a new database of that server instead, dropped at the end unless ``--keep``.

    .venv/bin/python tests/benchmarks/scale_sweep.py [--runs 2000] [--db sqlite|postgres [--pg URL]] [--steps 8] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _bench and scale_mlflow_ui beside it
from _bench import at_least, emit, finish  # noqa: E402
from pg_schema import pg_server, pg_server_url  # noqa: E402

HEADSWEEP = str(Path(sys.executable).parent / "headsweep")
SEEDS, PIPELINES, GATE_LRS = (0, 1, 2), ("dp", "sp"), (0.05, 0.2)
COST_PARTS = ("claim", "mlflow", "model", "data", "train", "figures", "artifacts", "finish", "total")
THROUGHPUT_TARGET = 90.0  # % of the ideal (issue 19)


def scale_grid(runs: int, steps: int) -> dict:
    """A grid of at least ``runs`` runs: 3 seeds x DP/SP x 2 gate learning rates x L lambdas
    (log-spaced from 0.001 to 1), plus the 3 fine-tunes (one per seed) the SP cells start from."""
    per_lambda = len(SEEDS) * len(PIPELINES) * len(GATE_LRS)
    lambdas = [float(f"{x:.4g}") for x in np.geomspace(0.001, 1.0, max(1, math.ceil((runs - len(SEEDS)) / per_lambda)))]
    assert len(set(lambdas)) == len(lambdas), "lambdas too close to tell apart at 4 digits"
    return {
        "name": f"scale-{runs}",
        "base": {
            "model": "tiny-bert", "method": "head_gates",
            "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 16},
            "train": {"max_steps": steps, "batch_size": 8, "eval_every": steps, "lr": 1.0e-3},
        },
        "axes": {"seed": list(SEEDS), "pipeline": list(PIPELINES), "head_gates.lr": list(GATE_LRS), "lambda": lambdas},
        "resources": {"cpus": 1},
        "max_concurrent": os.cpu_count() or 1,
        "max_failures": 1,
    }


def load() -> str:
    """The machine's load averages (1, 5, 15 min), to read every timing beside."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --------------------------------------------------------------------------- the database


@contextlib.contextmanager
def pg_database(server_url: str | None, keep: bool):
    """The SQLAlchemy URL of a new database on ``server_url``'s server (dropped after unless ``keep``),
    or on a private server started here (removed after, with its database)."""
    with pg_server_url(server_url) as server:
        url = pg_server.create_database(server)
        try:
            yield url
        finally:
            if not (keep and server_url):
                pg_server.drop_database(server, url)


def pg_sizes(url: str) -> dict[str, int]:
    """Bytes of the whole database, of the registry's tables (``hs_``) and of MLflow's (the rest)."""
    import psycopg

    with psycopg.connect(pg_server.libpq_url(url)) as conn:
        total = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        tables = conn.execute("SELECT relname, pg_total_relation_size(oid) FROM pg_class "
                              "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace").fetchall()
    registry = sum(size for table, size in tables if table.startswith("hs_"))
    return {"database": total, "registry_tables": registry, "mlflow_tables": sum(size for _, size in tables) - registry}


def folder_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path`` (0, 0 when it does not exist)."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def store_sizes(home: Path, pg_url: str | None) -> dict[str, float]:
    """MB of the registry, MLflow's store, its artifacts and the checkpoints (and the artifacts' file count)."""
    mb = 1 / 2**20
    artifacts_files, artifacts = folder_size(home / "mlartifacts")
    sizes = {"artifacts_mb": artifacts * mb, "artifact_files": artifacts_files,
             "checkpoints_mb": folder_size(home / "checkpoints")[1] * mb}
    if pg_url:
        pg = pg_sizes(pg_url)
        return sizes | {"database_mb": pg["database"] * mb, "registry_mb": pg["registry_tables"] * mb,
                        "mlflow_mb": pg["mlflow_tables"] * mb}
    sqlite = {name: sum(p.stat().st_size for p in home.glob(f"{name}.db*")) * mb for name in ("registry", "mlflow")}
    return sizes | {"registry_mb": sqlite["registry"], "mlflow_mb": sqlite["mlflow"]}


# --------------------------------------------------------------------------- the sweep


def rss_mb(pid: int) -> float | None:
    """A process's resident set (MB), None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0.0)


def argv(pid: int) -> list[str]:
    """A process's command line, [] when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def runs_module(pid: int, module: str, *args: str) -> bool:
    """Whether the process is ``python -m MODULE ARGS...`` (not the job's shell that starts it)."""
    return argv(pid)[1:3 + len(args)] == ["-m", module, *args]


class RssSampler(threading.Thread):
    """Every ``every_s`` seconds: the sweep driver's RSS and the RSS of all the home's Ray head's
    processes together (``samples``: (seconds since start, driver MB or None, head MB))."""

    def __init__(self, home: Path, every_s: float) -> None:
        super().__init__(daemon=True)
        self.home, self.every_s, self.samples, self.stopped = home, every_s, [], threading.Event()
        self.started_at = time.monotonic()

    def run(self) -> None:
        from orchestrator.cluster.head import head_pids

        while not self.stopped.wait(self.every_s):
            pids = head_pids(self.home)
            drivers = [pid for pid in pids if runs_module(pid, "headsweep.sweep_job")]
            driver = sum(filter(None, map(rss_mb, drivers))) if drivers else None
            self.samples.append((time.monotonic() - self.started_at, driver, sum(filter(None, map(rss_mb, pids)))))


def submit(grid: Path, env: dict[str, str]) -> tuple[str, float]:
    """``headsweep submit GRID --wait`` as a user runs it; (sweep id, wall seconds)."""
    started = time.perf_counter()
    done = subprocess.run([HEADSWEEP, "submit", str(grid), "--wait"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"submit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    sweep_id = next(line.split(":", 1)[0] for line in done.stdout.splitlines() if line.startswith("sw-"))
    return sweep_id, seconds


def await_driver_job(home: Path, sweep_id: str, limit_s: float = 3600) -> float:
    """Seconds until the sweep's Ray Job is done after ``--wait`` returned: its driver, then the
    sweep report it logs to the MLflow parent run (``headsweep report``)."""
    from orchestrator.cluster.head import head_pids

    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if not any(runs_module(pid, "headsweep.sweep_job", sweep_id)
                   for pid in head_pids(home)):
            return time.perf_counter() - started
        time.sleep(1)
    raise SystemExit(f"the driver job of {sweep_id} still runs after {limit_s:.0f} s")


def run_rows(sweep_id: str):
    """One row per run of the sweep (the Python API's table: labels, status, metrics.<name>)."""
    import headsweep

    return headsweep.sweep(sweep_id).runs()


def train_seconds(rows, sweep_id: str) -> tuple[np.ndarray, str]:
    """Each finished run's own training seconds and where they come from: ``cost.train_s``
    (measured inside the trial: the method's work less its model and data set-up), or, from a
    checkout that does not time the parts yet, MLflow's ``run_seconds`` (the method's whole run)."""
    column = "metrics.cost.train_s"
    if column in rows:
        return rows[column].dropna().to_numpy(float), "cost.train_s"
    return np.array(mlflow_metric(sweep_id, "run_seconds")), "run_seconds (MLflow; no cost.train_s)"


def mlflow_metric(sweep_id: str, name: str) -> list[float]:
    """A metric of every child run of the sweep that has it, page by page (a search stops at 1,000)."""
    from orchestrator import settings, tracking
    from orchestrator.registry import Registry

    experiment = Registry(settings.registry_url()).get_sweep(sweep_id)["mlflow_experiment_id"]
    client, values, token = tracking.client(), [], None
    while True:
        page = client.search_runs([experiment], f"tags.sweep = '{sweep_id}'", max_results=1000, page_token=token)
        values += [run.data.metrics[name] for run in page if name in run.data.metrics]
        token = page.token
        if not token:
            return values


def cost_parts(rows) -> dict[str, dict[str, float]]:
    """Median and p90 seconds of each ``cost.<part>_s`` over the sweep's runs."""
    parts = {}
    for part in COST_PARTS:
        values = rows.get(f"metrics.cost.{part}_s")
        if values is not None and values.notna().any():
            values = values.dropna().to_numpy(float)
            parts[part] = {"median_s": float(np.median(values)), "p90_s": float(np.percentile(values, 90))}
    return parts


def runs_span_s(sweep_id: str) -> float:
    """Seconds from the first run's start to the last run's end (the registry's timestamps)."""
    from sqlalchemy import create_engine, func, select

    from orchestrator import settings
    from orchestrator.registry.schema import Run, SweepRun

    query = (select(func.min(Run.started_at), func.max(Run.finished_at))
             .join(SweepRun, SweepRun.run_key == Run.run_key).where(SweepRun.sweep_id == sweep_id))
    engine = create_engine(settings.registry_url())
    with engine.connect() as connection:
        first, last = connection.execute(query).one()
    engine.dispose()
    return (last - first).total_seconds()


# --------------------------------------------------------------------------- what a user does next


def user_commands(sweep_id: str, out: Path) -> dict[str, list[str]]:
    """The analysis commands a user runs on a finished sweep, by figure name."""
    return {
        "status": ["status", sweep_id],
        "results": ["results", sweep_id, "--group-by", "pipeline,lambda", "--metric", "accuracy"],
        "agreement": ["agreement", sweep_id, "--across", "seed"],
        "compare_maps": ["compare-maps", sweep_id, "heads.log_alpha", "--across", "pipeline"],
        "figures": ["figures", sweep_id, "--out", str(out / "figures")],
    }


def time_command(args: list[str], env: dict[str, str]) -> dict:
    """Wall seconds of one ``headsweep`` command in a fresh process, and whether it succeeded."""
    started = time.perf_counter()
    done = subprocess.run([HEADSWEEP, *args], env=env, capture_output=True, text=True)
    return {"seconds": time.perf_counter() - started, "ok": done.returncode == 0,
            **({} if done.returncode == 0 else {"error": (done.stderr or done.stdout)[-500:]})}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(args: list[str], env: dict[str, str], ready_url: str, log: Path, limit_s: float = 300):
    """Start ``headsweep ARGS`` in its own session; (process, seconds until ``ready_url`` answers 200)."""
    started = time.perf_counter()
    with log.open("w") as sink:
        server = subprocess.Popen([HEADSWEEP, *args], env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    while time.perf_counter() - started < limit_s:
        if server.poll() is not None:
            raise SystemExit(f"headsweep {args[0]} exited {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(ready_url, timeout=10) as reply:
                if reply.status == 200:
                    return server, time.perf_counter() - started
        except OSError:
            time.sleep(0.5)
    stop_server(server)
    raise SystemExit(f"headsweep {args[0]} did not answer {ready_url} within {limit_s:.0f} s: {log.read_text()[-2000:]}")


def stop_server(server: subprocess.Popen, sig: int = signal.SIGINT) -> None:
    """Stop a server started by :func:`start_server`: its process group (it and what it started)."""
    for signal_now, wait_s in ((sig, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, signal_now)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def time_http(sweep_id: str, env: dict[str, str], out: Path) -> dict[str, dict]:
    """``headsweep serve`` on a free port: seconds until it answers, then each endpoint's first
    (computed) and second (memoised) answer."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server, ready_s = start_server(["serve", "--port", str(port)], env, f"{base}/sweeps", out / "serve.log")
    endpoints = {
        "sweeps": "/sweeps", "sweep": f"/sweeps/{sweep_id}", "runs": f"/sweeps/{sweep_id}/runs?limit=1000",
        "aggregate": f"/sweeps/{sweep_id}/aggregate?metric=accuracy&group_by=pipeline,lambda",
        "agreement": f"/sweeps/{sweep_id}/agreement?across=seed",
        "figures": f"/sweeps/{sweep_id}/figures",
    }
    timings = {"serve_start": {"seconds": ready_s, "ok": True}}
    try:
        for name, path in endpoints.items():
            for attempt in ("first", "cached"):
                started = time.perf_counter()
                error = None
                try:
                    with urllib.request.urlopen(base + path, timeout=600) as reply:
                        ok = reply.status == 200 and len(reply.read()) > 0
                except urllib.error.HTTPError as refused:  # the service's answer: what a user reads
                    ok, error = False, f"{refused.code}: {refused.read().decode(errors='replace')[:300]}"
                except OSError as err:
                    ok, error = False, repr(err)
                timings[f"http_{name}_{attempt}"] = {"seconds": time.perf_counter() - started, "ok": ok,
                                                     **({"error": error} if error else {})}
    finally:
        stop_server(server)
    return timings


# --------------------------------------------------------------------------- the report


INFORMATIONAL = "measured at this size: issue 19 asks for the number, with no target"


def figure(name: str, value, unit: str, context: dict, target=None, note: str | None = None, **extra) -> dict:
    """Print the figure's JSON line (the benchmarks' one way, ``_bench.emit``: target, met, load)
    and return it."""
    checked = target is not None  # the one target: throughput, a share of the ideal measured in the run
    return emit("scale_sweep", name, target=target, measured="value" if checked else None, check=checked,
                note=note or (None if checked else INFORMATIONAL), value=value, unit=unit, **context, **extra)


def markdown(rows: list[dict]) -> str:
    lines = ["| figure | value | unit | target | met | detail |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        detail = {k: v for k, v in row.items() if k not in ("bench", "figure", "value", "unit", "target", "measured",
                                                            "met", "db", "runs", "series", "note", "load_1m")}
        lines.append(f"| {row['figure']} | {row['value']} | {row['unit']} | {row['target'] or ''} | "
                     f"{'' if row['met'] is None else row['met']} | {json.dumps(detail) if detail else ''} |")
    return "\n".join(lines)


def sweep_figures(sweep_id: str, wall_s: float, report_s: float, sampler: RssSampler, context: dict) -> list[dict]:
    """Runs, wall, ideal, throughput, cost parts and the RSS series of the finished sweep."""
    rows = run_rows(sweep_id)
    finished = int((rows["status"] == "finished").sum())
    train, source = train_seconds(rows, sweep_id)
    cores = os.cpu_count() or 1
    ideal = float(train.sum()) / cores
    span = runs_span_s(sweep_id)
    total = rows.get("metrics.cost.total_s")
    in_trial = float(total.dropna().sum()) if total is not None else float("nan")
    throughput = 100 * ideal / wall_s
    first = rows.get("metrics.cost.first_in_worker")
    drivers = [(round(t, 1), round(d, 1)) for t, d, _ in sampler.samples if d is not None]
    head = [h for _, _, h in sampler.samples]
    out = [
        figure("runs", len(rows), "runs", context, finished=finished),
        figure("wall", wall_s, "s", context, note="headsweep submit --wait, Ray head start and registration included"),
        figure("ideal", ideal, "s", context, train_cpu_s=float(train.sum()), cores=cores, source=source),
        figure("throughput", throughput, "% of ideal", context, target=at_least(THROUGHPUT_TARGET, "%"),
               note="ideal / wall"),
        figure("throughput_runs_span", 100 * ideal / span, "% of ideal", context, runs_span_s=span,
               note="ideal / (last run's end - first run's start)"),
        figure("in_trial_share", 100 * in_trial / cores / wall_s, "% of wall x cores", context,
               in_trial_cpu_s=in_trial, note="the runs' whole in-trial time (cost.total_s: training and every "
               "fixed part) / cores / wall: what the orchestration around the trials leaves of the machine"),
        figure("report", report_s, "s", context, note="after --wait returned: the driver job's sweep report to MLflow"),
        figure("first_in_worker", int(first.sum()) if first is not None else -1, "runs", context,
               note="runs that were the first of their worker process (-1: not recorded)"),
    ]
    for part, stats in cost_parts(rows).items():
        out.append(figure(f"cost.{part}", stats["median_s"], "s (median)", context, p90_s=round(stats["p90_s"], 4)))
    out.append(figure("driver_rss", max((d for _, d in drivers), default=float("nan")), "MB (max)", context,
                      first_mb=drivers[0][1] if drivers else None, last_mb=drivers[-1][1] if drivers else None,
                      samples=len(drivers), series=drivers))
    out.append(figure("head_rss", max(head, default=float("nan")), "MB (max)", context,
                      note="every process of the home's Ray head together: driver, trial workers, daemons"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="at least this many runs (default 2000)")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--steps", type=int, default=8, help="training steps per run (default 8)")
    parser.add_argument("--sample-s", type=float, default=3.0, help="seconds between two RSS samples")
    parser.add_argument("--out", help="folder for the report, screenshots and figures (default: a new temp dir)")
    parser.add_argument("--pg", metavar="URL", help="with --db postgres: the server to create the database on "
                                                    "(default: a private one started for the run)")
    parser.add_argument("--keep", action="store_true", help="keep the home (and --pg's database)")
    parser.add_argument("--no-ui", action="store_true", help="skip the MLflow UI check")
    args = parser.parse_args(argv)

    out = Path(args.out or tempfile.mkdtemp(prefix="headsweep_scale_report_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="headsweep_scale_home_")).resolve()
    print(f"home {home}; report, screenshots and figures under {out}", file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HEADSWEEP_") and k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env |= {"HEADSWEEP_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    rows: list[dict] = []
    database = contextlib.ExitStack()  # the PostgreSQL database (and its private server), closed after the head
    try:
        pg_url = database.enter_context(pg_database(args.pg, args.keep)) if args.db == "postgres" else None
        if pg_url:
            env |= {"HEADSWEEP_DB": pg_url, "HEADSWEEP_TRACKING_URI": pg_url}
        os.environ.update(env)  # this process reads the same registry (the Python API, the timestamps)
        grid = home / "scale_grid.yaml"
        grid.write_text(yaml.safe_dump(scale_grid(args.runs, args.steps), sort_keys=False))

        sampler = RssSampler(home, args.sample_s)
        sampler.start()
        load_before = load()
        sweep_id, wall_s = submit(grid, env)
        report_s = await_driver_job(home, sweep_id)
        sampler.stopped.set()
        context = {"db": args.db, "runs": args.runs, "load": f"{load_before} -> {load()}"}
        rows += sweep_figures(sweep_id, wall_s, report_s, sampler, context)
        sizes = {k: round(v, 2) for k, v in store_sizes(home, pg_url).items()}
        rows.append(figure("stores", sizes["registry_mb"] + sizes["mlflow_mb"], "MB (registry + MLflow)", context, **sizes))
        for name, args_ in user_commands(sweep_id, out).items():
            timing = time_command(args_, env)
            rows.append(figure(f"cli_{name}", timing.pop("seconds"), "s", context | {"load": load()}, **timing))
        for name, timing in time_http(sweep_id, env, out).items():
            rows.append(figure(name, timing.pop("seconds"), "s", context | {"load": load()}, **timing))
        if not args.no_ui:
            from scale_mlflow_ui import check_ui

            for name, value, unit, extra in check_ui(sweep_id, env, out):
                rows.append(figure(f"ui_{name}", value, unit, context | {"load": load()}, **extra))
    finally:
        from orchestrator.cluster.head import stop_local_head

        stop_local_head(home)  # this home's Ray head only, by PID
        database.close()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
        (out / "report.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(markdown(rows))
        print(f"screenshots and figures: {out}" + (f"; home kept: {home}" if args.keep else ""), file=sys.stderr)
    failed = [row["figure"] for row in rows if row.get("ok") is False]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    finish()  # exits 1 naming a missed target
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
