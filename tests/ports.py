"""Free TCP ports for the servers a test starts in a process of its own.

A port the kernel hands out for ``bind(0)`` lies in the ephemeral range, the same range it draws the
local ports of outgoing connections from. Between our closing the probe socket and the server binding
the port, any connection of this machine may take it, a test's own poll of that very port included (a
TCP self-connect on loopback): the server then dies with "address already in use" (CI, stop 48). So the
ports here come from below the ephemeral range, which the kernel never hands to a connection, drawn at
random so that two runs rarely meet, and each is checked free by binding it as a server would.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port p such that p .. p + span - 1 are all free and outside the ephemeral range (Weaviate's
    gossip/data and raft/RPC ports come in pairs: ``span=2``)."""
    highest = _ephemeral_start() - span
    for _ in range(200):
        port = random.randint(LOWEST, highest)
        if all(_free(port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} free adjacent ports between {LOWEST} and {highest}")
