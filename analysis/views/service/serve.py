"""The analysis service on Ray Serve: the FastAPI app of ``app.build_app`` in a Serve deployment,
bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import os
import threading
from typing import Any

from fastapi import FastAPI

APP_NAME = "headsweep-analysis"


def _deployment():
    from ray import serve

    @serve.deployment(name="analysis", num_replicas=1, max_ongoing_requests=100)
    @serve.ingress()
    class AnalysisService:
        """Ray Serve ingress: the FastAPI app is built in the replica, from the URL."""

        def __init__(self, registry_url: str, artifact_uris=None):
            self.registry_url, self.artifact_uris = registry_url, artifact_uris

        def __serve_build_asgi_app__(self) -> FastAPI:
            from analysis.views.service.app import build_app

            return build_app(self.registry_url, self.artifact_uris)

    return AnalysisService


def _replica_grpc_on_loopback() -> None:
    """Serve 2.60 replicas open their inter-deployment gRPC server on ``[::]:0``, every interface, with
    no option to change it: in a private (single-machine) Ray, put it on 127.0.0.1 (a worker setup hook)."""
    from ray.serve._private import replica

    add_port = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: add_port(server, address.replace("[::]:", "127.0.0.1:", 1))


def serve_app(registry_url: str, host: str = "127.0.0.1", port: int = 8000, blocking: bool = False,
              artifact_uris: Any = None) -> str:
    """Run the app on Ray Serve at ``http://host:port/`` and return that URL (``artifact_uris``: as
    ``build_app`` takes it, a picklable callable).

    Starts a private local Ray unless one is initialised (or ``RAY_ADDRESS``
    names a cluster). ``blocking=True`` waits for Ctrl-C, then shuts Serve
    (and the Ray it started) down.
    """
    import ray
    from ray import serve

    address = os.environ.get("RAY_ADDRESS") or "local"
    private = not ray.is_initialized() and address == "local"
    if private:
        # Ray's single-machine mode: node IP 127.0.0.1, so the private Ray (GCS, raylet, workers)
        # listens on loopback only, as the local head does (orchestrator/cluster/head.py); read at call
        # time, and inherited by the processes it starts.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        # Serve's controller kills a proxy that is not ready within 5 s, and serve.start() then fails:
        # starting a worker takes longer than that on a loaded 2-core machine.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
        # the replica at the priority of any process, not Ray's niceness 15 (as our heads: cluster/head.py)
        os.environ.setdefault("RAY_worker_niceness", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"worker_process_setup_hook": _replica_grpc_on_loopback} if private else None)
    # No access log: one line per request in the proxy and the replica costs ~10 % of a cached answer.
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
        serve.run(_deployment().bind(registry_url, artifact_uris), name=APP_NAME, route_prefix="/", blocking=blocking,
                  logging_config=quiet)
    except KeyboardInterrupt:
        # Ctrl-C. A private Ray goes with Serve in it: serve.shutdown() first would wait for the
        # controller to drain each proxy and replica, tens of seconds on a loaded machine. Whatever
        # happens, `headsweep serve` ends within 10 s: the processes of a private Ray die with this one
        # (Ray starts them with the kernel's parent-death signal).
        if blocking:
            watchdog = threading.Timer(8.0, os._exit, args=(0,))
            watchdog.daemon = True
            watchdog.start()
        if not private:
            serve.shutdown()
        if started:
            ray.shutdown()
    return f"http://{host}:{port}"
