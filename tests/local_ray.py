"""The tests' one way to start a private local Ray: 2 CPUs, no dashboard, the workers' logs not
forwarded, and started again when Ray's own start-up wait runs out on a loaded machine.

``ray.init`` waits a fixed 30 s for its raylet to register with the GCS (ray/_private/node.py); on two
cores busy with other tests that wait can expire while nothing is wrong. A test that needs a Ray then
failed for the machine's load, not for the code it tests."""

from __future__ import annotations

import os

import ray

from orchestrator.cluster.processes import kill_pids, process_tree, processes

ATTEMPTS = 3
DEFAULTS = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False}


def _half_started() -> set[int]:
    """The Ray daemons this process started (and their children) that a failed start-up left."""
    table = processes()
    daemons = {pid for pid, (ppid, cmdline) in table.items() if ppid == os.getpid() and "/ray/" in cmdline}
    return process_tree(daemons, table)


def start_local_ray(**options):
    """``ray.init`` with the tests' defaults (``options`` override them); on Ray's start-up timeout,
    what it started is stopped and it starts again, ATTEMPTS times in all."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return ray.init(**(DEFAULTS | options))
        except Exception as error:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(error) or attempt == ATTEMPTS:
                raise
            ray.shutdown()
            kill_pids(_half_started)
