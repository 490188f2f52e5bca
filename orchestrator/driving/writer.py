"""The one owner of run and sweep state: each change to the registry, then to MLflow (DESIGN.md 16).

:class:`Writer` is every state change a sweep makes: a run claimed, tracked, finished, failed,
cancelled, orphaned; a sweep running or ended. Each writes the registry first (the source of truth),
then MLflow, with one map from a status to MLflow's (:data:`MLFLOW_STATUS`). The trials, the driver
and the supervisor call it; nothing else writes run or sweep state to MLflow.

Where it runs decides who opens the stores:
- **direct** (one host, a PostgreSQL registry and a tracking server, or ``HEADSWEEP_WRITER=off``):
  each process holds a :class:`Writer` of its own, as before;
- **through the sweep's writer** (:func:`writer_needed`: an embedded store, SQLite or a local MLflow
  store, on a cluster of several nodes or on a network filesystem): one :class:`Writer` runs as a Ray
  actor pinned to the driver's node (:func:`start`), and the trials and the driver reach it over Ray
  (:class:`Remote`), so one host writes those files. A call that finds the writer gone (its process
  killed: Ray restarts it; a driver resumed: it starts another under the same name) is retried with
  backoff within ``HEADSWEEP_RETRY_S``; a finished run's result is kept by its trial until then.

A registry or MLflow write that fails after the other committed is retried by ``retry.call``;
an MLflow status that still failed is kept and written again by :meth:`Writer.flush` (at the end of
the sweep), so the MLflow UI never shows a finished run RUNNING while the registry has it finished.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from base.sections import ConfigError
from orchestrator import filesystems, retry
from orchestrator.registry import Registry, RegistryReader
from orchestrator.status import RunStatus, SweepStatus

log = logging.getLogger("headsweep.writer")

MLFLOW_STATUS = {
    RunStatus.RUNNING: "RUNNING", RunStatus.FINISHED: "FINISHED", RunStatus.FAILED: "FAILED",
    RunStatus.CANCELLED: "KILLED", RunStatus.PENDING: "KILLED",  # pending again: its attempt was killed (orphaned)
    SweepStatus.RUNNING: "RUNNING", SweepStatus.FINISHED: "FINISHED", SweepStatus.FAILED: "FAILED",
    SweepStatus.CANCELLED: "KILLED",
}
"""A run's or a sweep's status -> its MLflow run's status: the one map."""

WRITER_ENV = "HEADSWEEP_WRITER"
"""``auto`` (default): a writer where :func:`writer_needed` says; ``on``: always (tests, one host);
``off``: never (a store whose hosts really share locks, at the user's word)."""


def embedded(url: str | None) -> bool:
    """A store that is a file of this filesystem (a SQLite URL, an MLflow file store), not a server."""
    return bool(url) and not url.startswith(("postgresql", "http://", "https://", "databricks", "mysql"))


def store_files(registry_url: str, tracking_uri: str | None) -> list[str]:
    """The embedded stores' files and folders (a SQLite file's, an MLflow file store's)."""
    found = []
    for url in (registry_url, tracking_uri):
        if not embedded(url):
            continue
        path = filesystems.sqlite_path(url) if url.startswith("sqlite:") else url.removeprefix("file://")
        if path:
            found.append(path)
    return found


def writer_needed(registry_url: str, tracking_uri: str | None, nodes: int) -> bool:
    """Whether a sweep's trials must write through its writer: an embedded store, and either a
    cluster of several nodes (trials on other hosts) or the store on a network filesystem (a
    node may join later; a login host reads it). ``HEADSWEEP_WRITER`` on/off overrides."""
    mode = os.environ.get(WRITER_ENV, "auto").lower()
    if mode in ("on", "1", "true"):
        return True
    if mode in ("off", "0", "false"):
        return False
    files = store_files(registry_url, tracking_uri)
    return bool(files) and (nodes > 1 or any(filesystems.on_network_filesystem(path) for path in files))


# ---------------------------------------------------------------------- one writer host: the lease

LEASE_S = 30.0
"""A writer's lease on a SQLite registry on a network filesystem is renewed every third of this;
one older than this is a dead writer's."""


def lease_path(registry_url: str) -> Path | None:
    """``<registry file>.writer`` when the registry is a SQLite file on a network filesystem (where
    one host may write it at a time), else None."""
    path = filesystems.sqlite_path(registry_url)
    return Path(path + ".writer") if path and filesystems.on_network_filesystem(path) else None


def lease_holder(registry_url: str) -> dict[str, Any] | None:
    """The live writer's lease on the registry (``{"host", "pid", "sweep", "at"}``), None when there
    is none, it is this host's, or it is older than :data:`LEASE_S` (its writer died)."""
    path = lease_path(registry_url)
    try:
        held = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not held or held.get("host") == socket.gethostname() or time.time() - float(held.get("at", 0)) > LEASE_S:
        return None
    return held


def refuse_if_written_elsewhere(registry_url: str, doing: str) -> None:
    """One line, before anything is written, when another host's writer holds the registry: two
    hosts writing one SQLite file over a network filesystem lose rows with every COMMIT succeeding."""
    held = lease_holder(registry_url)
    if held:
        where = filesystems.sqlite_path(registry_url)
        age = max(0.0, time.time() - float(held["at"]))
        raise ConfigError(
            f"{doing}: sweep {held.get('sweep')}'s writer on host {held.get('host')} is writing the SQLite registry "
            f"{where} on a network filesystem ({filesystems.filesystem_type(where)}), and two hosts cannot write one "
            "SQLite file at once (rows are lost with every COMMIT succeeding): wait until that sweep ends "
            f"(`headsweep status`; a writer that died holds it {LEASE_S - age:.0f} s more), or use a PostgreSQL "
            "registry (HEADSWEEP_DB)")


def for_looking(registry_url: str) -> Registry | RegistryReader:
    """The registry as ``status``, ``ls`` and ``wait`` open it: a reader (read-only) where it is a SQLite
    file on a network filesystem, which its sweep's host alone writes; elsewhere writable (they record a
    lost driver there, ``driver_job.driver_gone``)."""
    return RegistryReader(registry_url) if lease_path(registry_url) is not None else Registry(registry_url)


def cancel_flag(registry_url: str, sweep_id: str) -> Path | None:
    """Where ``headsweep cancel`` on another host asks a leased registry's writer to cancel a sweep."""
    path = lease_path(registry_url)
    return _cancel_file(path, sweep_id) if path else None


def _cancel_file(lease: Path, sweep_id: str) -> Path:
    return lease.with_name(f"{lease.name}.cancel-{sweep_id}")


class Writer:
    """Run and sweep state changes over one registry and one MLflow store (``tracking_uri`` None:
    untracked). A run's MLflow logging (params, metrics, artifacts) goes through it too. ``lease``
    (the sweep's id): hold the registry's lease (:func:`lease_path`) while it lives."""

    def __init__(self, registry: Registry | str, tracking_uri: str | None, lease: str | None = None) -> None:
        self.registry = Registry(registry) if isinstance(registry, str) else registry
        self.tracking_uri = tracking_uri
        self._mlflow = None
        self._unsynced: dict[str, str] = {}  # MLflow run id -> status its last try did not write
        self._lease = lease_path(self.registry.url) if lease else None
        if self._lease is not None:
            self._released = threading.Event()
            self._renew(lease)
            threading.Thread(target=self._renewing, args=(lease,), daemon=True).start()

    def _renew(self, sweep_id: str) -> None:
        held = {"host": socket.gethostname(), "pid": os.getpid(), "sweep": sweep_id, "at": time.time()}
        partial = self._lease.with_name(f"{self._lease.name}.{os.getpid()}")
        partial.write_text(json.dumps(held))
        partial.replace(self._lease)  # whole or not at all, for a reader on another host

    def _renewing(self, sweep_id: str) -> None:
        while not self._released.wait(LEASE_S / 3):
            try:
                self._renew(sweep_id)
            except OSError as err:  # the filesystem is away for a moment: the next renewal tries again
                log.warning("could not renew the registry's writer lease: %s", err)

    def release(self) -> None:
        """Give the lease up (the sweep's driver, once it is done)."""
        if self._lease is not None:
            self._released.set()
            self._lease.unlink(missing_ok=True)

    def cancel_requested(self, sweep_id: str) -> bool:
        """The sweep's cancel flag; a ``headsweep cancel`` from another host (a file beside a leased
        registry, :func:`cancel_flag`) is recorded here first, by the one writer."""
        # the lease's path, found once: a poll every few seconds per trial reads no mountinfo
        flag = _cancel_file(self._lease, sweep_id) if self._lease is not None else None
        if flag is not None and flag.exists():
            self.registry.cancel_sweep(sweep_id)
            flag.unlink(missing_ok=True)
        return self.registry.cancel_requested(sweep_id)

    @property
    def mlflow(self):
        if self._mlflow is None and self.tracking_uri:
            from orchestrator import tracking

            self._mlflow = tracking.client(self.tracking_uri)
        return self._mlflow

    def ping(self) -> str:
        """Where the writer runs (its host and process): for logs and tests."""
        import socket

        return f"{socket.gethostname()}:{os.getpid()}"

    def registry_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A registry method by name: the reads, and the sweep's bookkeeping (events, waves, blocks)."""
        return getattr(self.registry, method)(*args, **kwargs)

    # ------------------------------------------------------------------ MLflow status, after the registry

    def _set_mlflow_status(self, run_id: str | None, status: str, error: str | None = None) -> None:
        if not run_id or self.mlflow is None:
            return
        try:
            if error is not None:
                self.mlflow.set_tag(run_id, "error", error[:4000])
            if MLFLOW_STATUS[status] == "RUNNING":
                self.mlflow.update_run(run_id, status="RUNNING")
            else:
                self.mlflow.set_terminated(run_id, status=MLFLOW_STATUS[status])
            self._unsynced.pop(run_id, None)
        except Exception as err:  # noqa: BLE001 - the registry has it; flush() writes it again
            self._unsynced[run_id] = status
            log.warning("MLflow run %s: could not set %s (%s); written again at the sweep's end", run_id,
                        MLFLOW_STATUS[status], type(err).__name__)

    def flush(self, sweep_id: str | None = None) -> int:
        """Write again the MLflow statuses that failed; how many are still unwritten. With ``sweep_id``
        also every MLflow run of the sweep still RUNNING whose run the registry has ended: a writer
        that died between the two writes (its host cut off) left it so, and no trial will end it."""
        for run_id, status in list(self._unsynced.items()):
            self._set_mlflow_status(run_id, status)
        if sweep_id is not None and self.mlflow is not None:
            for run_id, status in self._ended_but_running(sweep_id).items():
                self._set_mlflow_status(run_id, status)
        return len(self._unsynced)

    def _ended_but_running(self, sweep_id: str) -> dict[str, str]:
        from orchestrator import tracking

        experiment_id = self.registry.get_sweep(sweep_id)["mlflow_experiment_id"]
        running = tracking.running_run_ids(self.mlflow, experiment_id) if experiment_id is not None else set()
        if not running:  # the usual case at a sweep's end: no read of every run's row
            return {}
        runs = self.registry.sweep_runs(sweep_id)
        ended = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED)
        return {run_id: str(status) for run_id, status in zip(runs["mlflow_run_id"], runs["status"], strict=True)
                if run_id in running and status in ended}

    # ------------------------------------------------------------------ one run

    def _ended_by(self, run_key: str, worker: str | None, status: str) -> bool:
        """Whether the run already has ``status`` from ``worker``: a retried call whose first try
        committed before its writer died (its MLflow write may not have happened: it is made now)."""
        run = self.registry.get_run(run_key)
        return worker is not None and run["status"] == status and run["worker"] == worker

    def claim(self, run_key: str, worker: str, stale_after_s: float) -> dict[str, Any] | None:
        return self.registry.claim(run_key, worker, stale_after_s=stale_after_s)

    def heartbeat(self, run_key: str, worker: str) -> bool:
        return self.registry.heartbeat(run_key, worker)

    def track(self, run_key: str, reused_run_id: str | None, experiment_id: str, name: str,
              tags: Mapping[str, str], parent_run_id: str | None) -> str:
        """The claimed run's MLflow run, RUNNING: its earlier attempt's (reused), or a new child of
        the sweep's parent run, recorded in the registry."""
        from orchestrator import tracking

        if reused_run_id:
            self._set_mlflow_status(reused_run_id, RunStatus.RUNNING)
            return reused_run_id
        run_id = tracking.start_run(self.mlflow, experiment_id, name, tags=tags, parent_run_id=parent_run_id)
        self.registry.set_mlflow_run(run_key, run_id)
        return run_id

    def finish(self, run_key: str, metrics: Mapping[str, Any], worker: str, maps: Mapping[str, Any] | None,
               run_id: str | None) -> bool:
        """The run's result -> finished (False: it was not running by ``worker``: never twice), then
        its MLflow run FINISHED."""
        done = self.registry.finish(run_key, metrics, worker=worker, maps=maps)
        if done or self._ended_by(run_key, worker, RunStatus.FINISHED):
            self._set_mlflow_status(run_id, RunStatus.FINISHED)
        return done

    def add_metrics(self, run_key: str, metrics: Mapping[str, Any], run_id: str | None,
                    mlflow_metrics: Mapping[str, float] | None = None) -> None:
        """Metrics known once the run is finished (its costs): ``metrics`` into the registry's,
        ``mlflow_metrics`` (default: the same) to its MLflow run."""
        self.registry.add_metrics(run_key, metrics)
        if run_id and self.mlflow is not None:
            self.tracker(run_id).log_metrics(dict(mlflow_metrics or metrics), 0)

    def fail(self, run_key: str, error: str, worker: str | None, run_id: str | None, summary: str | None = None) -> bool:
        """A running run -> failed with ``error`` (its traceback), then its MLflow run FAILED with the
        error's ``summary`` as a tag; False when it was not running (by ``worker``)."""
        done = self.registry.fail(run_key, error, worker)
        if done or self._ended_by(run_key, worker, RunStatus.FAILED):
            self._set_mlflow_status(run_id, RunStatus.FAILED, error=summary or error)
        return done

    def cancel(self, run_key: str, worker: str | None, run_id: str | None) -> bool:
        done = self.registry.cancel_run(run_key, worker)
        if done or self._ended_by(run_key, worker, RunStatus.CANCELLED):
            self._set_mlflow_status(run_id, RunStatus.CANCELLED)
        return done

    def reset_orphans(self, sweep_id: str, stale_after_s: float) -> dict[str, str]:
        """Runs left RUNNING by a dead worker or driver -> pending, their MLflow runs KILLED; each
        run's key with the worker that held it ("" if none)."""
        orphans = self.registry.reset_orphans(sweep_id, stale_after_s)
        for orphan in orphans:
            self._set_mlflow_status(orphan.get("mlflow_run_id"), RunStatus.PENDING,
                                    error="orphaned: worker stopped heartbeating")
        return {orphan["run_key"]: orphan["worker"] or "" for orphan in orphans}

    # ------------------------------------------------------------------ a run's MLflow logging

    def tracker(self, run_id: str):
        from orchestrator import tracking

        return tracking.MlflowTracker(self.mlflow, run_id)

    def log(self, run_id: str, what: str, *args: Any) -> None:
        """``MlflowTracker.<what>(*args)`` on run ``run_id`` (log_params, set_tags, log_metrics,
        log_artifact): a trial's logging, where its writer is."""
        if what not in ("log_params", "set_tags", "log_metrics", "log_artifact"):
            raise ValueError(f"not a tracker call: {what}")
        getattr(self.tracker(run_id), what)(*args)

    # ------------------------------------------------------------------ the sweep

    def sweep_status(self, sweep_id: str, status: str, parent_run_id: str | None) -> None:
        """The sweep -> ``status`` in the registry, then its parent MLflow run's status."""
        self.registry.set_sweep(sweep_id, status=status)
        self._set_mlflow_status(parent_run_id, status)

    def sweep_mlflow_status(self, parent_run_id: str | None, status: str) -> None:
        """Only the parent MLflow run's status, for a registry change made elsewhere (a lost driver)."""
        self._set_mlflow_status(parent_run_id, status)


class Tracker:
    """experiments' Tracker on one MLflow run, through a writer (its own or the sweep's over Ray)."""

    def __init__(self, writer: Writer | Remote, run_id: str) -> None:
        self.writer, self.run_id = writer, run_id

    def log_params(self, params: Mapping[str, object]) -> None:
        self.writer.log(self.run_id, "log_params", {k: str(v) for k, v in params.items()})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.writer.log(self.run_id, "set_tags", dict(tags))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.writer.log(self.run_id, "log_metrics", {k: float(v) for k, v in metrics.items()}, step)

    def log_artifact(self, name: str, data: bytes) -> None:
        self.writer.log(self.run_id, "log_artifact", name, bytes(data))


# ---------------------------------------------------------------------- the writer as a Ray actor


def actor_name(sweep_id: str) -> str:
    return f"headsweep-writer-{sweep_id}"


NAMESPACE = "headsweep"


def start(sweep_id: str, registry_url: str, tracking_uri: str | None) -> Remote:
    """The sweep's writer: a Ray actor on this (the driver's) node, restarted by Ray if its process
    dies, ended with the driver. The stores are opened there, once (``ping`` waits for it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(Writer).options(
        name=actor_name(sweep_id), namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_restarts=-1, max_concurrency=8,
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        runtime_env={"env_vars": {key: os.environ[key] for key in _PASSED if key in os.environ}},
    ).remote(registry_url, tracking_uri, lease=sweep_id)
    remote = Remote(actor_name(sweep_id), actor)
    log.info("sweep %s: its writer runs at %s", sweep_id, remote.ping())
    return remote


_PASSED = ("HEADSWEEP_HOME", "HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI",
           "HEADSWEEP_ARTIFACT_ROOT", "HEADSWEEP_CHECKPOINTS", "HEADSWEEP_RETRY_S")
"""What the writer reads of where things live: the driver's values, wherever Ray starts it."""


def _writer_gone(err: BaseException) -> bool:
    """A Ray error that says the writer is (for now) not there: its process died or is restarting,
    its node is unreachable, or no actor has its name yet (a resumed driver is starting one)."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

    if isinstance(err, ActorDiedError | ActorUnavailableError | RayActorError | GetTimeoutError):
        return True
    return isinstance(err, ValueError) and "Failed to look up actor" in str(err)


class Remote:
    """The sweep's writer, reached over Ray: :class:`Writer`'s methods, each retried (within
    ``HEADSWEEP_RETRY_S``) while the writer is gone. ``registry``: its registry's methods, by name.
    Picklable by the actor's name (a trial looks it up where it runs)."""

    def __init__(self, name: str, actor: Any = None) -> None:
        # the driver's handle (the actor's owner's) is kept while the driver runs: a non-detached
        # actor whose owner drops every handle is ended for good, where a killed one is restarted
        self.name, self._owned, self._actor = name, actor, actor
        self.registry = _RemoteRegistry(self)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (self.name,))

    def stop(self) -> None:
        """End the writer (the driver, once the sweep's last state is written)."""
        import ray

        try:
            self.call("release")
            ray.kill(self._handle(), no_restart=True)
        except ValueError:  # gone already
            pass

    def _handle(self) -> Any:
        if self._actor is None:
            import ray

            self._actor = ray.get_actor(self.name, namespace=NAMESPACE)
        return self._actor

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        def once() -> Any:
            try:
                return ray.get(getattr(self._handle(), method).remote(*args, **kwargs), timeout=_CALL_TIMEOUT_S)
            except Exception as err:
                if _writer_gone(err) and self._owned is None:
                    self._actor = None  # looked up again by name: a new writer (a resumed driver's)
                raise

        return retry.call(once, _writer_gone, retry.Backoff(max_delay_s=5.0), what=f"writer {method}")

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_") or method in ("name", "registry", "stop"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)


_CALL_TIMEOUT_S = 120.0
"""One call's longest wait for the writer's answer (a write on a slow network filesystem takes
well under a second; a stuck writer is waited out again within the retry budget)."""


class _RemoteRegistry:
    """The writer's registry, by method name: ``remote.registry.get_run(key)``."""

    def __init__(self, remote: Remote) -> None:
        self._remote = remote

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._remote.call("registry_call", method, *args, **kwargs)


def of_sweep(sweep_id: str, registry: Registry, tracking_uri: str | None) -> Writer | Remote:
    """Where a process beside the driver (the supervisor) writes a sweep's state: its writer while one
    runs (looked up by name on the connected Ray), else directly, on ``registry``'s stores."""
    try:
        import ray

        if ray.is_initialized():
            return Remote(actor_name(sweep_id), ray.get_actor(actor_name(sweep_id), namespace=NAMESPACE))
    except ValueError:  # no writer by that name: the sweep writes directly, or its driver is gone
        pass
    return Writer(registry, tracking_uri)
