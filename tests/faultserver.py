"""A fake llama-server on a real loopback socket that can play every bad answer specwatch must survive."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx

from tests.fakes import FakeLlama

HOST = "127.0.0.1"
UNRESOLVABLE_URL = "http://specwatch-fault.invalid:8080"
"""RFC 6761 reserves .invalid: no resolver may ever answer it, so this is a DNS failure everywhere."""


class _Background:
    """One event loop in a daemon thread hosts every fault server of the process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="faultserver", daemon=True).start()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_background: _Background | None = None
_background_lock = threading.Lock()


def background() -> _Background:
    global _background
    with _background_lock:
        if _background is None:
            _background = _Background()
        return _background


@dataclass(frozen=True)
class Seen:
    """One request as the fault server received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json",
                extra: dict[str, str] | None = None) -> None:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(extra or {})}
    writer.write(_head(status, headers) + body)
    await writer.drain()


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # SO_LINGER 0 turns close() into an RST: the client sees a reset, not an orderly end.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Fault:
    """One bad answer; `play` returns True when the connection may serve another request."""

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        raise NotImplementedError


@dataclass
class Status(Fault):
    """An HTTP error in llama-server's error shape (or any body)."""

    code: int
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        body = self.body
        if body is None:
            body = json.dumps({"error": {"code": self.code, "message": HTTPStatus(self.code).phrase, "type": "fault"}}).encode()
        await _send(writer, self.code, body, extra=self.headers)
        return True


@dataclass
class Redirect(Fault):
    location: str
    code: int = 302

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        await _send(writer, self.code, b"", "text/plain", {"Location": self.location})
        return True


@dataclass
class Raw(Fault):
    """A 200 with any body, e.g. an HTML error page from a proxy."""

    body: bytes
    content_type: str = "text/html; charset=utf-8"
    status: int = 200

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        await _send(writer, self.status, self.body, self.content_type)
        return True


@dataclass
class Respond(Fault):
    """Whatever `answer(request)` returns as (status, headers, body): for answers built from the request."""

    answer: Callable[[Seen], tuple[int, dict[str, str], bytes]]

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        status, headers, body = self.answer(request)
        await _send(writer, status, body, headers.pop("Content-Type", "application/json"), headers)
        return True


@dataclass
class Reset(Fault):
    """Headers promising a body, part of it, then a TCP reset."""

    sent: int = 64

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": "100000"}) + b"{" + b" " * self.sent)
        await writer.drain()
        await asyncio.sleep(0.05)
        _abort_with_reset(writer)
        return False


class CloseAtOnce(Fault):
    """Read the request, answer nothing, reset the connection."""

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        _abort_with_reset(writer)
        return False


@dataclass
class Hang(Fault):
    """Never send a status line (slow headers), for `seconds` or until the server stops."""

    seconds: float = 3600.0

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(self.seconds)
        return False


@dataclass
class Trickle(Fault):
    """Prompt headers, then a body one byte at a time: every read is quick, the whole never arrives in time."""

    interval: float = 0.05

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": "100000"}) + b"[")
        await writer.drain()
        for _ in range(100000):
            await asyncio.sleep(self.interval)
            writer.write(b" ")
            await writer.drain()
        return False


class Truncated(Fault):
    """The healthy JSON cut in half, with a Content-Length that matches the cut body."""

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        status, content_type, body = server.healthy_answer(request)
        await _send(writer, status, body[: max(1, len(body) // 2)], content_type)
        return True


@dataclass
class Huge(Fault):
    """A JSON body of `size` bytes, declared up front or chunked with no length."""

    size: int = 64 * 1024 * 1024
    declared: bool = True

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        headers = {"Content-Type": "application/json"}
        headers.update({"Content-Length": str(self.size)} if self.declared else {"Transfer-Encoding": "chunked"})
        writer.write(_head(200, headers))
        block = b"[" + b"0," * 32767 + b"0"
        sent = 0
        while sent < self.size:
            piece = block[: self.size - sent]
            writer.write(piece if self.declared else f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
            await writer.drain()
        if not self.declared:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return False


@dataclass
class Mutate(Fault):
    """The healthy answer with its JSON (or each stream event) passed through `change`; NaN is written as NaN."""

    change: Callable[[Any], Any]

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        status, content_type, body = server.healthy_answer(request)
        if content_type.startswith("text/event-stream"):
            events = []
            for line in body.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append("data: " + json.dumps(self.change(json.loads(line[6:]))))
                elif line:
                    events.append(line)
            body = "".join(e + "\n\n" for e in events).encode()
        else:
            body = json.dumps(self.change(json.loads(body))).encode()
        await _send(writer, status, body, content_type)
        return True


@dataclass
class Chaos(Fault):
    """A different bad answer at random on each request, healthy about half the time (for the soak)."""

    rng: random.Random
    hang_seconds: float = 2.0

    def _choices(self) -> list[Fault | None]:
        return [
            None, None, None, None, None, None,
            Status(500), Status(503), Status(401), Status(404), Reset(), CloseAtOnce(),
            Raw(b"<html><body>502 Bad Gateway</body></html>"), Truncated(), Hang(self.hang_seconds),
            Mutate(lambda body: float("nan") if isinstance(body, dict) and "timings" not in body else body),
        ]

    async def play(self, server: FaultServer, request: Seen, writer: asyncio.StreamWriter) -> bool:
        fault = self.rng.choice(self._choices())
        if fault is None:
            status, content_type, body = server.healthy_answer(request)
            await _send(writer, status, body, content_type)
            return True
        return await fault.play(server, request, writer)


class FaultServer:
    """A llama-server look-alike (FakeLlama's answers) on 127.0.0.1 that plays `Fault`s on chosen paths."""

    def __init__(self, fake: FakeLlama | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.fake = fake or FakeLlama.plain()
        self.tls = tls
        self.faults: dict[str, Fault] = {}
        self.seen: list[Seen] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return self.url_as("https" if self.tls else "http")

    def url_as(self, scheme: str) -> str:
        return f"{scheme}://{HOST}:{self.port}"

    def play(self, fault: Fault | None, *paths: str) -> FaultServer:
        """Answer `paths` (default: every path) with `fault`; None makes them healthy again."""
        for path in paths or ("*",):
            if fault is None:
                self.faults.pop(path, None)
            else:
                self.faults[path] = fault
        return self

    def healthy(self) -> FaultServer:
        self.faults.clear()
        return self

    def count(self, path: str | None = None) -> int:
        return sum(1 for s in list(self.seen) if path is None or s.path == path)

    def healthy_answer(self, request: Seen) -> tuple[int, str, bytes]:
        target = f"http://fake{request.path}" + (f"?{request.query}" if request.query else "")
        response = self.fake(httpx.Request(request.method, target, headers=request.headers, content=request.body))
        return response.status_code, response.headers.get("content-type", "application/json"), response.content

    def start(self) -> FaultServer:
        background().run(self._start())
        return self

    def stop(self) -> None:
        if self._server is not None:
            background().run(self._stop())
            self._server = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._connection, HOST, self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                request = await _read_request(reader, writer)
                if request is None:
                    break
                self.seen.append(request)
                fault = self.faults.get(request.path) or self.faults.get("*")
                if fault is None:
                    status, content_type, body = self.healthy_answer(request)
                    await _send(writer, status, body, content_type)
                elif not await fault.play(self, request, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._handlers.discard(task)
            if not writer.transport.is_closing():
                writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Seen | None:
    try:
        first = await reader.readexactly(1)
        if first == b"\x16":
            # A TLS ClientHello on a plain port: answer as a plain HTTP server does, in clear text.
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return None
        head = first + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    path, _, query = target.partition("?")
    return Seen(method=method, path=path, query=query, headers=headers, body=body)


def refused_url() -> str:
    """A loopback URL where nothing listens: the port was just bound and released."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    return f"http://{HOST}:{port}"


def stranded_sockets(ports: set[int]) -> int:
    """This process's TCP sockets to `ports` in CLOSE_WAIT: the server hung up, the client never closed its end."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        count += fields[3] == "08" and remote_port in ports and fields[9] in inodes
    return count


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path, *, common_name: str = "specwatch-test") -> Certs:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(ca=directory / "ca.pem", cert=directory / "server.pem", key=directory / "server-key.pem")
    certs.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return certs


def server_tls(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert, certs.key)
    return context


class ExporterProcess:
    """`specwatch run` as a real process on a free loopback port, its stdout and stderr kept for inspection."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        command = [sys.executable, "-m", "exporter", "run", "--listen", f"{HOST}:0", "--log-format", "json", *args]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.port = 0
        for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr)):
            threading.Thread(target=self._collect, args=(stream, lines), daemon=True).start()

    @staticmethod
    def _collect(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in list(self.stdout):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def wait_started(self, timeout: float = 20.0) -> ExporterProcess:
        def listening() -> str | None:
            return next((e["listen"] for e in self.events() if e.get("event") == "started"), None)

        try:
            listen = wait_for(listening, timeout, "specwatch to start", alive=self.process)
        except AssertionError as err:
            raise AssertionError(f"{err}; its output:\n{self.output()}") from None
        self.port = int(listen.rsplit(":", 1)[1])
        return self

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{HOST}:{self.port}"

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def stop(self) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode

    def __enter__(self) -> ExporterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(check: Callable[[], Any], timeout: float, what: str, *, alive: subprocess.Popen | None = None,
             interval: float = 0.05) -> Any:
    """The first truthy result of `check`, polled until `timeout`; fails early if `alive` exits."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"process exited with {alive.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _soak_main(count: int, seed: int) -> None:
    """Serve `count` chaotic servers until stdin closes; print their ports as one JSON line."""
    rng = random.Random(seed)
    servers = [FaultServer(FakeLlama.draft(tokens=8) if i % 2 else FakeLlama.plain(tokens=8)) for i in range(count)]
    for server in servers:
        server.play(Chaos(random.Random(rng.random()))).start()
    print(json.dumps([s.port for s in servers]), flush=True)
    sys.stdin.read()
    for server in servers:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run chaotic fake llama-servers on loopback (for the soak test).")
    parser.add_argument("--soak", type=int, required=True, help="number of servers")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    _soak_main(options.soak, options.seed)
