"""The container image's health check: GET /-/healthy wherever this container's specwatch really listens."""

from __future__ import annotations

import argparse
import http.client
import socket
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .web import DEFAULT_PORT, HEALTHY_PATH

TIMEOUT = 2.0
"""Seconds for each connection and answer. A stopped or wedged process accepts connections (the kernel does) and
never answers: the check must time out and fail, well within the HEALTHCHECK's --timeout."""
LISTEN = "0A"  # TCP state in /proc/net/tcp


def _address(hex_address: str) -> tuple[str, int]:
    """('127.0.0.1', 9824) from /proc/net/tcp's '0100007F:2660' (each 32-bit word in host byte order)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def _listening(proc: Path) -> dict[str, tuple[str, int]]:
    """Socket inode -> (host, port) of every listening TCP socket in this network namespace."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN:
                found[fields[9]] = _address(fields[1])
    return found


def listen_addresses(proc: Path = Path("/proc"), pids: list[int] | None = None) -> list[tuple[str, int]] | None:
    """Where the processes `pids` (default: every process this user may look at) listen; None if none could be read.

    In a container that is specwatch's own socket, whatever --listen said: with `--network host` the port is rarely
    the default, and a check of 127.0.0.1:9824 would ask some other process on the host.
    """
    listening = _listening(proc)
    readable = False
    addresses: set[tuple[str, int]] = set()
    candidates = [proc / str(pid) for pid in pids] if pids is not None else [p for p in proc.iterdir() if p.name.isdigit()]
    for process in candidates:
        try:
            fds = list((process / "fd").iterdir())
        except OSError:
            continue  # another user's process, or gone
        readable = True
        for fd in fds:
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                addresses.add(listening[target[8:-1]])
    return sorted(addresses) if readable else None


def _reachable(host: str) -> str:
    if host == "0.0.0.0":
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def probe(host: str, port: int, timeout: float = TIMEOUT) -> str | None:
    """None when specwatch at host:port answers /-/healthy, over plain HTTP or TLS; else what went wrong."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # The certificate is not checked: this is the container talking to itself. A client certificate the endpoint
    # requires (RequireAndVerifyClientCert) cannot be given: use the orchestrator's TCP check then.
    context = ssl._create_unverified_context()
    problems = []
    for scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(f"{scheme}://{netloc}{HEALTHY_PATH}", timeout=timeout, context=context):
                return None
        except TimeoutError as err:
            return f"{scheme}://{netloc}{HEALTHY_PATH}: no answer within {timeout:g}s ({err})"
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                return f"{scheme}://{netloc}{HEALTHY_PATH}: no answer within {timeout:g}s ({err.reason})"
            problems.append(f"{scheme}: {err.reason}")
        except (OSError, ValueError, http.client.HTTPException) as err:
            # Plain HTTP on a TLS port ends in a reset or a malformed answer: try TLS next.
            problems.append(f"{scheme}: {err}")
    return f"{netloc}{HEALTHY_PATH}: " + "; ".join(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.daemon.healthcheck", description=__doc__)
    parser.add_argument("--pid", type=int, action="append", help="look only at this process's sockets (repeatable)")
    args = parser.parse_args(argv)
    addresses = listen_addresses(pids=args.pid)
    if addresses is None and args.pid:
        print(f"cannot look at process {', '.join(map(str, args.pid))}: not running, or another user's", file=sys.stderr)
        return 1
    if addresses is None:
        addresses = [("127.0.0.1", DEFAULT_PORT)]  # no process could be looked at: assume the default
    if not addresses:
        print("specwatch is not listening (yet): no listening TCP socket found", file=sys.stderr)
        return 1
    problems = [problem for host, port in addresses if (problem := probe(_reachable(host), port)) is not None]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
