"""Today's failure mode of issue 42: one SQLite registry file written from two hosts over a network filesystem.

``python tests/shared_fs_sqlite.py [--n 5000] [--journal wal|delete|both]`` (as root; sshfs and
openssh-server installed) brings up three hosts (tests/hosts.py: network namespaces, each its own
mounts): ``store`` keeps a folder on its disk and serves it over SSH; ``a`` and ``b`` mount it with
sshfs at the same path (:func:`hosts.share_over_sshfs`), as a cluster's hosts share a network
filesystem. A file with a registry-shaped table of ``2 n`` pending runs is made there; then ``a``
and ``b`` each claim their own ``n`` runs at the same moment, one transaction per claim as
``Registry.claim`` does (``BEGIN IMMEDIATE``, the run pending -> running with attempts + 1, an event
row, ``COMMIT``), with the registry's own PRAGMAs (``orchestrator/registry/db.py`` ``make_engine``:
busy_timeout 20000, foreign_keys ON, synchronous NORMAL, journal_mode WAL; ``--journal delete``: a
rollback journal instead). Afterwards it counts what survived and runs ``PRAGMA integrity_check``, and
prints: rows expected and present, the integrity check's answer, what each host's commits said,
wall time and load (/proc/loadavg). Controls: ``--same-host`` (both writers are processes on host ``a``,
one mount: its kernel's locks hold) and ``--folder kernel`` (hosts ``a`` and ``b`` writing the hosts'
one-kernel shared folder, as every multi-host test did before sshfs). Measured numbers: docs/clusters.md
"What must be shared between hosts".

Each host runs :data:`WRITERS` [``--writer``] ``(path_or_url, n, host_label, **options)`` in a process
of its own (this file with ``--worker``): ``sqlite`` writes the file directly (today's way). Another
way of writing is one more entry there; the report counts the same table. ``--writer writer`` is issue
42's way: a Ray head on ``a``, a Ray worker on ``b``, the sweep's writer (orchestrator.driving.writer, a
Ray actor beside the driver on ``a``) on a real registry (the product's schema and engine: a rollback
journal on sshfs), and a Ray task on each host claiming its ``n`` runs through ``writer.Remote`` (no task
opens the file). Measured (n 5000, 2 cores, load 1.3-3.6): 10,000 claims returned, 10,000 runs running,
``integrity_check`` ok, 84 and 88 s (n 1000: 2,000 of 2,000, ok, 16 s). Everything started is stopped by PID and the namespaces deleted, pass or fail
(``python tests/hosts.py`` cleans up after a killed run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

RUNS = """CREATE TABLE hs_runs (run_key TEXT PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, worker TEXT, started_at TEXT, heartbeat_at TEXT, updated_at TEXT)"""
EVENTS = """CREATE TABLE hs_run_events (id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_key TEXT NOT NULL REFERENCES hs_runs(run_key), event TEXT NOT NULL, worker TEXT, at TEXT NOT NULL)"""
CONFIG = json.dumps({"model": "tiny-bert", "task": {"name": "synthetic-cls", "num_train": 200}, "seed": 0,
                     "train": {"max_steps": 20, "batch_size": 8}}, sort_keys=True)  # a row's usual bulk


def run_keys(host_label: str, n: int) -> list[str]:
    """The ``n`` runs ``host_label`` claims (each host its own: every claim must succeed)."""
    return [f"{host_label}-{i:07d}" for i in range(n)]


def _path(path_or_url: str) -> str:
    return path_or_url.removeprefix("sqlite:///") if path_or_url.startswith("sqlite:///") else path_or_url


class _Connection(sqlite3.Connection):
    journal_mode = ""  # what PRAGMA journal_mode answered


def connect(path_or_url: str, journal: str = "wal") -> _Connection:
    """A connection as the registry's engine makes one (make_engine's PRAGMAs; BEGIN emitted by us)."""
    connection = sqlite3.connect(_path(path_or_url), timeout=20, isolation_level=None, check_same_thread=False,
                                 factory=_Connection)
    connection.execute("PRAGMA busy_timeout = 20000")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.journal_mode = connection.execute(f"PRAGMA journal_mode = {journal}").fetchone()[0]
    return connection


def create_store(path_or_url: str, labels: list[str], n: int, journal: str = "wal") -> None:
    """The file with ``n`` pending runs per label, made where the folder is local (the storage host)."""
    connection = connect(path_or_url, journal)
    connection.execute(RUNS)
    connection.execute(EVENTS)
    connection.execute("BEGIN IMMEDIATE")
    connection.executemany("INSERT INTO hs_runs (run_key, config, status) VALUES (?, ?, 'pending')",
                           [(key, CONFIG) for label in labels for key in run_keys(label, n)])
    connection.execute("COMMIT")
    connection.close()


def write_claims(path_or_url: str, n: int, host_label: str, journal: str = "wal",
                 start_at: float | None = None) -> dict[str, Any]:
    """Claim this host's ``n`` runs, one transaction each, straight into the SQLite file (today's way).
    Returns ``{host, committed, claimed, errors: {message: count}, seconds}``: ``committed`` the
    COMMITs that returned, ``claimed`` those whose UPDATE found the run pending."""
    connection = connect(path_or_url, journal)
    if start_at is not None:  # both hosts at once
        time.sleep(max(0.0, start_at - time.time()))
    committed = claimed = 0
    errors: Counter[str] = Counter()
    began = time.monotonic()
    for key in run_keys(host_label, n):
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            connection.execute("BEGIN IMMEDIATE")
            row = connection.execute(
                "UPDATE hs_runs SET status = 'running', attempts = attempts + 1, worker = ?, started_at = ?,"
                " heartbeat_at = ?, updated_at = ? WHERE run_key = ? AND status IN ('pending', 'failed')"
                " RETURNING run_key, config, attempts", (host_label, when, when, when, key)).fetchone()
            connection.execute("INSERT INTO hs_run_events (run_key, event, worker, at) VALUES (?, 'claimed', ?, ?)",
                               (key, host_label, when))
            connection.execute("COMMIT")
            committed += 1
            claimed += row is not None
        except sqlite3.Error as error:
            errors[f"{type(error).__name__}: {error}"] += 1
            try:
                connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass
    seconds = time.monotonic() - began
    connection.close()
    return {"host": host_label, "journal_mode": connection.journal_mode, "committed": committed, "claimed": claimed,
            "errors": dict(errors), "seconds": round(seconds, 2)}


def _create_registry(url: str, labels: list[str], n: int) -> str:
    """A real registry (the product's schema, its engine's PRAGMAs) with ``n`` pending runs per label; its
    journal mode as this host's engine set it (DELETE on a network filesystem)."""
    from datetime import datetime, timezone

    from sqlalchemy import insert

    from orchestrator.registry import Registry
    from orchestrator.registry.schema import Run

    registry = Registry(url)
    when = datetime.now(timezone.utc).replace(tzinfo=None)
    rows = [{"run_key": key, "group_key": key, "config": json.loads(CONFIG), "labels": {}, "status": "pending",
             "attempts": 0, "created_at": when, "updated_at": when} for label in labels for key in run_keys(label, n)]
    with registry._write() as connection:  # noqa: SLF001 - rows without a sweep: only claims are measured
        connection.execute(insert(Run), rows)
    with registry._engine.connect() as connection:  # noqa: SLF001
        return connection.exec_driver_sql("PRAGMA journal_mode").scalar()


def write_through_writer(url: str, n: int, host_label: str, ray_address: str, nodes: dict[str, str]) -> dict[str, Any]:
    """Issue 42's way: one writer (orchestrator.driving.writer, a Ray actor on this node, the head) and a
    Ray task on each of ``nodes`` ({label: node address}) claiming its ``n`` runs through it
    (``writer.Remote.claim``: the registry's own claim, one transaction each, in the writer's process);
    no task opens the file. Run by the driver on the head's host (``host_label``); returns
    ``{hosts: {label: {host, committed, claimed, errors, seconds}}, journal_mode}``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.driving import writer

    journal_mode = _create_registry(url, sorted(nodes), n)
    ray.init(address=ray_address, log_to_driver=False, _node_ip_address=ray_address.rsplit(":", 1)[0])
    by_address = {node["NodeManagerAddress"]: node["NodeID"] for node in ray.nodes() if node["Alive"]}
    name = f"shared-fs-{host_label}"
    remote = writer.start(name, url, None)

    @ray.remote(num_cpus=0)
    def claims(label: str, keys: list[str], start_at: float) -> dict[str, Any]:
        import socket

        through = writer.Remote(writer.actor_name(name))  # looked up by name where the task runs
        through.ping()
        time.sleep(max(0.0, start_at - time.time()))
        committed = claimed = 0
        errors: Counter[str] = Counter()
        began = time.monotonic()
        for key in keys:
            try:
                claimed += through.claim(key, label, 3600.0) is not None
                committed += 1
            except Exception as error:  # noqa: BLE001 - counted, as the direct writers' are
                errors[f"{type(error).__name__}: {str(error).splitlines()[-1][:200]}"] += 1
        return {"host": f"{label} (task on {socket.gethostname()})", "journal_mode": journal_mode,
                "committed": committed, "claimed": claimed, "errors": dict(errors),
                "seconds": round(time.monotonic() - began, 2)}

    start_at = time.time() + 3  # every task connected to the writer first, then all at once
    pending = {label: claims.options(scheduling_strategy=NodeAffinitySchedulingStrategy(by_address[address], soft=False))
               .remote(label, run_keys(label, n), start_at) for label, address in nodes.items()}
    said = {label: ray.get(ref) for label, ref in pending.items()}
    said_writer = remote.ping()
    remote.stop()
    ray.shutdown()
    return {"hosts": said, "journal_mode": journal_mode, "writer_at": said_writer}


WRITERS: dict[str, Callable[..., dict[str, Any]]] = {"sqlite": write_claims, "writer": write_through_writer}
"""How a host writes its claims: ``(path_or_url, n, host_label, **options) -> {host, committed, ...}``;
``writer`` (issue 42's way) is one process on the Ray head's host that drives a Ray task on each host."""


def count(path: Path, n_hosts: int, n: int) -> dict[str, Any]:
    """What the file holds once every writer is gone (read where it is local)."""
    seen: dict[str, Any] = {"expected": n_hosts * n}
    try:
        connection = sqlite3.connect(path, timeout=20)
    except sqlite3.Error as error:
        return seen | {"open": str(error)}
    for name, query in (("running", "SELECT count(*) FROM hs_runs WHERE status = 'running'"),
                        ("attempts", "SELECT coalesce(sum(attempts), 0) FROM hs_runs"),
                        *([("events", "SELECT count(*) FROM hs_run_events")] if connection.execute(
                            "SELECT 1 FROM sqlite_master WHERE name = 'hs_run_events'").fetchone() else []),
                        ("runs", "SELECT count(*) FROM hs_runs")):
        try:
            seen[name] = connection.execute(query).fetchone()[0]
        except sqlite3.Error as error:
            seen[name] = f"{type(error).__name__}: {error}"
    try:
        seen["integrity_check"] = [line for row in connection.execute("PRAGMA integrity_check(100)")
                                   for line in row[0].splitlines()]
    except sqlite3.Error as error:
        seen["integrity_check"] = [f"{type(error).__name__}: {error}"]
    connection.close()
    return seen


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def demonstrate(cluster: Any, folder: Path, writers: list[tuple[str, str]], n: int, journal: str, writer: str,
                timeout: float) -> dict[str, Any]:
    """One round: a fresh file in ``folder``, each of ``writers`` (host, label: a process on that host)
    claiming ``n`` runs at once; what survived."""
    path = folder / f"registry-{journal}.db"
    if writer == "writer":
        return demonstrate_writer(cluster, folder, writers, n, timeout)
    create_store(str(path), [label for _, label in writers], n, journal)
    start_at = time.time() + 3  # every writer connected first, then all at once
    load_before, began = load(), time.monotonic()
    processes = {label: cluster.popen(name, [sys.executable, str(Path(__file__).resolve()), "--worker", str(path),
                                             "--writer", writer, "--n", str(n), "--host", label,
                                             "--journal", journal, "--start-at", str(start_at)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name, label in writers}
    said = {}
    for name, process in processes.items():
        try:
            out, err = process.communicate(timeout=max(1.0, timeout - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # nsenter and the writer it forked (they hold the pipes)
            process.wait(30)
            said[name] = {"host": name, "timed_out": f"after {timeout:.0f} s"}
            continue
        lines = out.strip().splitlines()
        said[name] = json.loads(lines[-1]) if process.returncode == 0 and lines else \
            {"host": name, "exit": process.returncode, "stderr": err.strip()[-800:]}
    return {"journal": journal, "writer": writer, "n": n, "hosts": said, "wall_s": round(time.monotonic() - began, 1),
            "load_before": load_before, "load_after": load(), "found": count(path, len(writers), n),
            "leftovers": sorted(p.name for p in folder.iterdir() if p.name.startswith(path.name))}


def demonstrate_writer(cluster: Any, folder: Path, writers: list[tuple[str, str]], n: int,
                       timeout: float) -> dict[str, Any]:
    """One round through the sweep's writer: a Ray head on the first writer's host, a Ray worker on each
    other one; the driver there makes the registry (the product's, on the share), starts the writer
    beside it and a claiming task on each host."""
    path = folder / "registry-writer.db"
    ray = str(Path(sys.executable).parent / "ray")
    head = writers[0][0]
    address = f"{cluster.address(head)}:6379"
    env = {**os.environ, "RAY_worker_niceness": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    for name, _ in writers:
        role = ["--head", "--port=6379", "--include-dashboard=false"] if name == head else [f"--address={address}"]
        done = cluster.run(name, [ray, "start", *role, f"--node-ip-address={cluster.address(name)}",
                                  "--temp-dir=/tmp/sfs-ray", "--num-cpus=2", "--num-gpus=0",
                                  "--disable-usage-stats"], env=env, cwd="/tmp", timeout=300)
        if done.returncode:
            raise RuntimeError(f"ray start on {name}: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    load_before, began = load(), time.monotonic()
    nodes = json.dumps({label: cluster.address(name) for name, label in writers})
    driver = cluster.run(head, [sys.executable, str(Path(__file__).resolve()), "--worker", f"sqlite:///{path}",
                                "--writer", "writer", "--n", str(n), "--host", head, "--ray-address", address,
                                "--nodes", nodes], env=env, cwd=str(HERE.parent), timeout=timeout)
    lines = driver.stdout.strip().splitlines()
    said = json.loads(lines[-1]) if driver.returncode == 0 and lines else \
        {"hosts": {head: {"host": head, "exit": driver.returncode, "stderr": driver.stderr.strip()[-1500:]}}}
    return {"journal": said.get("journal_mode", "?"), "writer": f"writer (at {said.get('writer_at', '?')})", "n": n,
            "hosts": said["hosts"], "wall_s": round(time.monotonic() - began, 1), "load_before": load_before,
            "load_after": load(), "found": count(path, len(writers), n),
            "leftovers": sorted(p.name for p in folder.iterdir() if p.name.startswith(path.name))}


SHOWN = 8  # integrity_check lines printed (up to 100 are kept in --json)


def report(result: dict[str, Any]) -> str:
    found = result["found"]
    lines = [f"journal_mode={result['journal'].upper()} writer={result['writer']}: {len(result['hosts'])} writers "
             f"({result['where']}) x {result['n']} claims at once",
             f"  rows expected {found['expected']}: running {found.get('running')}, sum(attempts) "
             f"{found.get('attempts')}, event rows {found.get('events', '(no such table)')} (runs table {found.get('runs')})"]
    checked = found.get("integrity_check", [found.get("open")])
    shown = checked[:SHOWN] + ([f"... {len(checked)} lines in all"] if len(checked) > SHOWN else [])
    lines.append(f"  integrity_check: {shown[0]}" + "".join(f"\n                   {line}" for line in shown[1:]))
    for said in result["hosts"].values():
        errors = "; ".join(f"{count} x {message}" for message, count in said.get("errors", {}).items()) or "none"
        if "committed" in said:
            lines.append(f"  writer {said['host']} (journal_mode {said['journal_mode']}): {said['committed']} COMMITs returned, {said['claimed']} found their "
                         f"run pending, errors: {errors}, {said['seconds']} s")
        else:
            lines.append(f"  writer {said['host']}: {said}")
    lines.append(f"  wall {result['wall_s']} s (3 s of it the common start); load before {result['load_before']}, "
                 f"after {result['load_after']}; files left: {' '.join(result['leftovers'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="claims per host (default 5000)")
    parser.add_argument("--journal", choices=("wal", "delete", "both"), default="wal",
                        help="journal_mode of the file: the registry's WAL, a rollback journal, or both in turn")
    parser.add_argument("--folder", choices=("sshfs", "kernel"), default="sshfs",
                        help="where the file lives: the storage host's folder over sshfs (a network filesystem), "
                             "or the control: the hosts' folder of one kernel (tests/hosts.py's shared folder)")
    parser.add_argument("--same-host", action="store_true",
                        help="the control for locks: both writers are processes on host a (one sshfs mount)")
    parser.add_argument("--writer", choices=sorted(WRITERS), default="sqlite", help="how each host writes")
    parser.add_argument("--timeout", type=float, default=900, help="seconds the writers may take, per round")
    parser.add_argument("--json", action="store_true", help="also print each round as JSON")
    parser.add_argument("--worker", metavar="PATH_OR_URL", help=argparse.SUPPRESS)  # on a host: write, print JSON
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--ray-address", help=argparse.SUPPRESS)  # --writer writer: the head's GCS
    parser.add_argument("--nodes", help=argparse.SUPPRESS)  # --writer writer: {label: node address} as JSON
    args = parser.parse_args(argv)
    if args.worker:
        options = {"journal": args.journal, "start_at": args.start_at} if args.writer == "sqlite" else \
            {"ray_address": args.ray_address, "nodes": json.loads(args.nodes)}
        print(json.dumps(WRITERS[args.writer](args.worker, args.n, args.host, **options)), flush=True)
        return 0

    import hosts  # tests/hosts.py

    lacking = hosts.missing_tools()
    if lacking:
        print(f"needs {', '.join(lacking)}", file=sys.stderr)
        return 2
    began = time.monotonic()
    with hosts.Hosts(["store", "a", "b"]) as cluster:
        if args.folder == "sshfs":
            folder = hosts.share_over_sshfs(cluster, "store", ["a", "b"])
            print(f"store ({cluster.address('store')}) serves {folder}; a ({cluster.address('a')}) and b "
                  f"({cluster.address('b')}) mount it with sshfs ({hosts.mount_type(cluster, 'a', folder)}) at that path")
        else:
            folder = cluster.shared
            print(f"control: a and b write {folder}, one kernel's folder (no network filesystem between them)")
        journals = ("wal", "delete") if args.journal == "both" else (args.journal,)
        for journal in journals if args.writer == "sqlite" else ("as the registry sets it",):
            writers = [("a", "a1"), ("a", "a2")] if args.same_host else [("a", "a"), ("b", "b")]
            result = demonstrate(cluster, folder, writers, args.n, journal, args.writer, args.timeout)
            result["where"] = "both on host a" if args.same_host else "on hosts a and b"
            print(report(result), flush=True)
            if args.json:
                print(json.dumps(result), flush=True)
    print(f"done in {time.monotonic() - began:.0f} s (hosts torn down)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
