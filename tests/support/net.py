"""Loopback addresses for tests: a port where nothing listens, a name no resolver answers, sockets left half-closed."""

from __future__ import annotations

import os
import socket

HOST = "127.0.0.1"
UNRESOLVABLE_URL = "http://specwatch-fault.invalid:8080"
"""RFC 6761 reserves .invalid: no resolver may ever answer it, so this is a DNS failure everywhere."""
UNREACHABLE_URL = "http://224.0.0.1:8080"
"""A multicast address: Linux refuses a TCP connection to it at once with "Network is unreachable", and sends nothing."""


def free_port() -> int:
    """A loopback port free a moment ago (another process may take it before it is used)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def refused_url() -> str:
    """A loopback URL where nothing listens: the port was just bound and released."""
    return f"http://{HOST}:{free_port()}"


def stranded_sockets(ports: set[int]) -> int:
    """This process's TCP sockets to `ports` in CLOSE_WAIT: the server hung up, the client never closed its end."""
    return len(stranded_socket_inodes(ports))


def stranded_socket_inodes(ports: set[int]) -> set[str]:
    """The inodes of stranded_sockets: the same socket seen twice some time apart has stayed stranded meanwhile."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if fields[3] == "08" and remote_port in ports and fields[9] in inodes:
                found.add(fields[9])
    return found
