"""A real load balancer in front of replicas: Debian's haproxy, round robin per request, as an eval's pool has it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.net import HOST, free_port
from tests.support.process import Process

CONFIG = """\
global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend pool
    bind {host}:{port}
    default_backend replicas
backend replicas
    balance roundrobin
{servers}
"""


@contextlib.contextmanager
def balancing(upstreams: Sequence[str], work: Path, name: str = "haproxy") -> Iterator[str]:
    """haproxy on a loopback port, each request to the next of `upstreams` (http://host:port) in turn; yields its URL."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    port = free_port()
    servers = "\n".join(f"    server r{i} {url.removeprefix('http://').rstrip('/')}" for i, url in enumerate(upstreams))
    config = work / f"{name}.cfg"
    config.write_text(CONFIG.format(host=HOST, port=port, servers=servers), encoding="utf-8")
    process = Process(name, [binary, "-db", "-f", str(config)], work).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
                break
            if process.exited() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not listen on {port}:\n{process.log_tail()}")
            time.sleep(0.05)
        yield f"http://{HOST}:{port}"
    finally:
        process.stop()
