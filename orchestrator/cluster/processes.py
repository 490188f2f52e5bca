"""Processes and sockets, read from /proc (Linux): a process tree by PID, the Ray processes of one
node by their temp dir, killing them (never another Ray on the machine: ``ray stop`` would), and
who listens on which address.

Used by the local head (``orchestrator.cluster.head``), the nodes of a SLURM allocation
(``orchestrator.slurm.allocation``) and the tests that check that every server binds loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every living process we can see. A zombie (killed, not yet
    reaped by its parent) is dead and left out."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if state != "Z":
            table[int(entry)] = (int(ppid), cmdline)
    return table


def process_tree(roots: set[int], table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """The roots and all their descendants."""
    table = table if table is not None else processes()
    tree, grew = set(roots), True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in tree} - tree
        tree |= children
        grew = bool(children)
    return tree


def ray_pids(tmp: str) -> set[int]:
    """Every living Ray process of the node that uses this temp dir: its daemons (named by the dir)
    and their children."""
    table = processes()
    mine = {os.getpid(), os.getppid()}
    roots = {pid for pid, (_, cmdline) in table.items()
             if tmp in cmdline and "/ray/" in cmdline.replace(tmp, "") and pid not in mine}
    return process_tree(roots, table) - mine


def kill_tree(tmp: str, grace_s: float = 5.0, kill_s: float = 15.0) -> set[int]:
    """SIGTERM every Ray process of the node that uses ``tmp`` (none when ``grace_s`` is 0: a machine that
    died), then SIGKILL what still lives after ``grace_s`` (:func:`kill_pids`). The PIDs signalled: empty
    if none ran."""
    return kill_pids(lambda: ray_pids(tmp), grace_s, kill_s)


def kill_pids(listed: Callable[[], set[int]], grace_s: float = 5.0, kill_s: float = 15.0) -> set[int]:
    """SIGTERM the processes ``listed()`` names (none when ``grace_s`` is 0), then SIGKILL what still
    lives after ``grace_s``, again and again until none does (``kill_s`` at most): a SIGKILLed process
    stays in /proc until the kernel has torn it down, and a parent may fork a child between the listing
    and the signal, so ``listed()`` is asked again each time. The processes first listed stay targets
    after their parent died (an orphan is no longer in the tree). The PIDs signalled."""
    known = listed()
    if grace_s:
        _signal(known, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive_pid(p) for p in known):
        time.sleep(0.1)
    deadline = time.monotonic() + kill_s
    while (alive := {p for p in known if _alive_pid(p)} | listed()) and time.monotonic() < deadline:
        _signal(alive, signal.SIGKILL)
        known |= alive
        time.sleep(0.05)
    return known


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive_pid(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def listening_sockets(pids: set[int] | None = None) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket (of these processes), read from /proc/net/tcp{,6}."""
    listening: dict[str, tuple[str, int]] = {}  # socket inode -> (address, port)
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            listening[fields[9]] = (_address(hex_addr[:width]), int(hex_port, 16))
    found = []
    for pid in sorted(pids if pids is not None else {int(p) for p in os.listdir("/proc") if p.isdigit()}):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                found.append((*listening[target[8:-1]], pid))
    return sorted(set(found))


def _address(hex_addr: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (little-endian 32-bit words) -> text."""
    raw = b"".join(bytes.fromhex(hex_addr[i:i + 8])[::-1] for i in range(0, len(hex_addr), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or 127.x as an IPv4-mapped IPv6 address (a dual-stack socket bound to loopback)."""
    return address.startswith(("127.", "::ffff:127.")) or address == "::1"


def stop_ray(tmp: str) -> bool:
    """Stop the Ray processes of one node that use the temp dir ``tmp`` (and their children), by PID,
    never another Ray on the machine. True if something was running."""
    return bool(kill_tree(tmp))
