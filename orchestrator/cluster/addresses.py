"""A node's address on the cluster network, found without DNS or a default route (compute nodes
often have neither; Ray's own guess, the interface toward the default route, is then 127.0.0.1,
which Ray refuses on several nodes). Used by the SLURM allocation's nodes and by ``python -m
orchestrator.cluster.head ray-start`` (cluster.yaml's nodes, nodes started by hand)."""

from __future__ import annotations

import os
import socket
import subprocess

from base.sections import ConfigError
from orchestrator.cluster.processes import is_loopback


def node_ip(peer: str | None = None) -> str:
    """This node's address on the cluster network, found without DNS or a default route (compute
    nodes often have neither): ``HEADSWEEP_NODE_IP`` if set; else, on a worker, the address of the
    interface toward the head (``peer``); else the NodeAddr SLURM has for this node; else what the
    hostname resolves to; else the node's one non-loopback IPv4 address. Ray's own guess (the
    interface toward the default route, else 127.0.0.1) is never taken: on several nodes it is
    refused."""
    candidates = [lambda: os.environ.get("HEADSWEEP_NODE_IP", ""), lambda: _route_to(peer),
                  _slurm_node_addr, lambda: socket.gethostbyname(socket.gethostname()), _only_address]
    for candidate in candidates:
        try:
            address = candidate()
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        if address and not is_loopback(address):
            return address
    raise ConfigError(f"cannot tell {socket.gethostname()}'s address on the cluster network: set HEADSWEEP_NODE_IP "
                      "in the job's environment (the sbatch script's set-up) to it")


def _route_to(peer: str | None) -> str:
    """The local address the kernel picks to reach ``peer`` (a UDP socket sends nothing to connect)."""
    if not peer:
        return ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer.rpartition(":")[0] or peer, 9))
        return probe.getsockname()[0]


def _slurm_node_addr() -> str:
    """This node's NodeAddr in SLURM (an address, or a name resolved here)."""
    name = os.environ.get("SLURMD_NODENAME")
    if not name:
        return ""
    shown = subprocess.run(["scontrol", "-o", "show", "node", name], capture_output=True, text=True, timeout=30).stdout
    addr = next((word.split("=", 1)[1] for word in shown.split() if word.startswith("NodeAddr=")), "")
    return socket.gethostbyname(addr) if addr else ""


def _only_address() -> str:
    """The one IPv4 address of this node outside loopback ("" when there are several, or none)."""
    import psutil  # a dependency of Ray's

    found = {a.address for addresses in psutil.net_if_addrs().values() for a in addresses
             if a.family == socket.AF_INET and not is_loopback(a.address)}
    return found.pop() if len(found) == 1 else ""
