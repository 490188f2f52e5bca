"""Whether every node of the cluster sees, at the same paths, the files a sweep keeps on disk.

A sweep whose registry is the default SQLite file, whose MLflow store or artifacts are local folders,
whose upstream runs keep their weights in a local folder, or whose trials read the shipped data or
the Hugging Face cache, needs those paths on a filesystem every node mounts (docs/clusters.md, "What
must be shared between hosts"). On one machine they always are; on several hosts a node that does
not see them would fail each of its runs (a registry of its own, no model). ``submit`` and
``resume`` check first (:func:`unseen_on_nodes`): on a cluster of several nodes with such paths,
one small Ray job runs a zero-CPU task pinned to every live node, which looks for them; a node that
does not see one is a one-line error naming the node and the path, before anything is registered.

Folders headsweep writes (the registry's, MLflow's, the checkpoints') are checked by a marker file
the submitting host writes into them for the check (a host with its own ``~/.headsweep`` has a
registry file at the same path, but not this one); what it only reads (the data, the hub cache's
models) by the path itself.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.cluster.head import ClusterError

CHECK_S = 120.0
"""How long the check's Ray job may take (its start included) before the submit stops waiting for it."""


def _local_file(uri: str) -> str | None:
    """The file behind a SQLite URL, or the folder behind a file URI or plain path; None for a server."""
    if uri.startswith("sqlite:"):
        path = uri.split("///", 1)[-1] if "///" in uri else ""
        return path if path and path != ":memory:" else None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    return uri if parsed.scheme == "" and os.path.isabs(uri) else None  # a plain path; else a server's name


def local_paths(env: dict[str, str], *, track: bool, artifacts: str | None, checkpoints: str, staged: bool,
                hub_models: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """What the sweep's nodes must see: ({what: folder} headsweep writes, {what: path} it only reads),
    from the driver's environment (``driver_job.driver_env``); only what is on a local filesystem."""
    written: dict[str, str] = {}
    registry = _local_file(env["HEADSWEEP_DB"])
    if registry:
        written["the registry"] = str(Path(registry).parent)
    if track:
        store = _local_file(env["HEADSWEEP_TRACKING_URI"])
        if store:
            written["MLflow's store"] = str(Path(store).parent if env["HEADSWEEP_TRACKING_URI"].startswith("sqlite:") else store)
        folder = _local_file(artifacts) if artifacts else None
        if folder:
            written["MLflow's artifacts"] = folder
    folder = _local_file(checkpoints)
    if staged and folder:
        written["the checkpoints of upstream runs"] = folder
    read = {"the data (HEADSWEEP_DATA)": env["HEADSWEEP_DATA"]} if Path(env["HEADSWEEP_DATA"]).is_dir() else {}
    if hub_models and env.get("HF_HUB_CACHE"):
        for model in hub_models:
            read[f"hub model {model}"] = str(Path(env["HF_HUB_CACHE"]) / ("models--" + model.replace("/", "--")))
    return written, read


def missing(paths: dict[str, str]) -> list[str]:
    """The ``what``s whose path does not exist on this host."""
    return [what for what, path in paths.items() if not os.path.exists(path)]


def unseen_on_nodes(dashboard: str, runtime_env: dict, written: dict[str, str], read: dict[str, str],
                    nodes: int) -> None:
    """Raise ClusterError, one line, when a live node of a cluster of several does not see one of the
    paths; nothing to do on one node or with nothing on disk."""
    if nodes < 2 or not (written or read):
        return
    token = uuid.uuid4().hex[:12]
    markers = {what: str(Path(folder) / f".headsweep-shared-{token}") for what, folder in written.items()}
    made = []
    try:
        for path in markers.values():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
            made.append(path)
        seen = _ask_nodes(dashboard, runtime_env, {**markers, **read})
    finally:
        for path in made:
            Path(path).unlink(missing_ok=True)
    for node in seen:
        if node["missing"]:
            what = node["missing"][0]
            path = written.get(what) or read[what]
            raise ClusterError(
                f"node {node['host']} ({node['address']}) does not see {what} ({path}) as this host does"
                + (f" (nor {len(node['missing']) - 1} more)" if len(node["missing"]) > 1 else "")
                + ": on several hosts it must be on a filesystem every node mounts, or elsewhere "
                "(docs/clusters.md, 'What must be shared between hosts')")


def _ask_nodes(dashboard: str, runtime_env: dict, paths: dict[str, str]) -> list[dict]:
    """Run this module's check as a Ray job on the cluster; what every live node is missing."""
    from orchestrator.cluster.jobs import job_client

    client = job_client(dashboard)
    submission = client.submit_job(entrypoint=f"{sys.executable} -m orchestrator.cluster.shared {shlex.quote(json.dumps(paths))}",
                                   submission_id=f"headsweep-shared-check-{uuid.uuid4().hex[:8]}",
                                   runtime_env=runtime_env)
    deadline = time.monotonic() + CHECK_S
    while (state := str(client.get_job_status(submission).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            client.stop_job(submission)
            raise ClusterError(f"the check that every node sees the sweep's files (Ray job {submission}) did not "
                               f"end in {CHECK_S:.0f} s ({state})")
        time.sleep(0.5)
    logs = client.get_job_logs(submission)
    answer = [line for line in logs.splitlines() if line.startswith("[{") or line == "[]"]
    if state != "SUCCEEDED" or not answer:
        raise ClusterError(f"the check that every node sees the sweep's files (Ray job {submission}) "
                           f"{state}: {logs.strip().splitlines()[-1:] or ''}")
    return json.loads(answer[-1])


def _on_node(paths: dict[str, str]) -> dict:
    return {"host": socket.gethostname(), "missing": missing(paths)}


def main(argv: list[str] | None = None) -> int:
    """The check job: one zero-CPU task pinned to each live node; prints [{host, address, missing}]."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    paths = json.loads((sys.argv[1:] if argv is None else argv)[0])
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    check = ray.remote(num_cpus=0, max_retries=0)(_on_node)
    nodes = [node for node in ray.nodes() if node["Alive"]]
    answers = ray.get([check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                       .remote(paths) for node in nodes], timeout=CHECK_S / 2)
    print(json.dumps([answer | {"address": node["NodeManagerAddress"]} for node, answer in zip(nodes, answers, strict=True)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
