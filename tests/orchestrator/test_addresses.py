"""A node's cluster address (orchestrator.cluster.addresses) and ``ray-start``'s use of it: a node
without DNS or a default route still tells Ray its address; a loopback head, or an address given,
is left alone."""

from __future__ import annotations

import pytest

from base.sections import ConfigError
from orchestrator.cluster import addresses
from orchestrator.cluster.head import LOOPBACK_ENV, with_node_address


def test_ray_start_gets_the_nodes_address_unless_given_or_on_loopback(monkeypatch):
    monkeypatch.setenv("HEADSWEEP_NODE_IP", "10.9.8.7")
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    assert with_node_address(["--head", "--port=6379"]) == ["--head", "--port=6379", "--node-ip-address=10.9.8.7"]
    assert with_node_address(["--address", "10.9.8.1:6379"])[-1] == "--node-ip-address=10.9.8.7"
    assert with_node_address(["--address=10.9.8.1:6379", "--node-ip-address=10.9.8.9"]) == [
        "--address=10.9.8.1:6379", "--node-ip-address=10.9.8.9"]
    assert with_node_address(["--address=127.0.0.1:6379"]) == ["--address=127.0.0.1:6379"]
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", LOOPBACK_ENV["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"])
    assert with_node_address(["--head"]) == ["--head"]


def test_a_worker_takes_the_address_of_its_route_to_the_head(monkeypatch):
    """Toward a peer on loopback the route's source is loopback, never taken: the next candidate."""
    monkeypatch.delenv("HEADSWEEP_NODE_IP", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert addresses._route_to("127.0.0.1:6379") == "127.0.0.1"
    assert addresses._route_to(None) == ""
    monkeypatch.setattr(addresses.socket, "gethostname", lambda: "no-such-host.invalid")
    monkeypatch.setattr(addresses, "_only_address", lambda: "")
    with pytest.raises(ConfigError, match="set HEADSWEEP_NODE_IP"):
        addresses.node_ip(peer="127.0.0.1:6379")
    monkeypatch.setattr(addresses, "_only_address", lambda: "10.1.2.3")
    assert addresses.node_ip(peer="127.0.0.1:6379") == "10.1.2.3"
