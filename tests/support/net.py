"""Loopback addresses for tests: a port where nothing listens, a name no resolver answers, sockets left half-closed."""

from __future__ import annotations

import os
import socket

HOST = "127.0.0.1"
UNRESOLVABLE_URL = "http://specwatch-fault.invalid:8080"
"""RFC 6761 reserves .invalid: no resolver may ever answer it, so this is a DNS failure everywhere."""
UNREACHABLE_URL = "http://224.0.0.1:8080"
"""A multicast address: Linux refuses a TCP connection to it at once with "Network is unreachable", and sends nothing."""


_PORTS = range(20000, 32000)
"""Below Linux's default ephemeral range (32768-60999), where bind(0) and connect() pick their ports, so a server
started on port 0 never lands on a port handed out here."""
_next: dict[int, int] = {}


def _worker_ports() -> range:
    """This pytest-xdist worker's share of _PORTS: a port made for a server not started yet is never another
    worker's."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    size = len(_PORTS) // workers
    return range(_PORTS.start + index * size, _PORTS.start + (index + 1) * size)


def free_port() -> int:
    """A loopback port free a moment ago, from this worker's own range, each handed out once in turn."""
    ports = _worker_ports()
    for _ in range(len(ports)):
        port = ports[_next.get(os.getpid(), 0) % len(ports)]
        _next[os.getpid()] = _next.get(os.getpid(), 0) + 1
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue  # something of the machine's own listens there
            return port
    raise RuntimeError(f"no free loopback port in {ports}")


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
