"""Network faults for real-server tests: iptables rules on the loopback, a namespace behind a veth, an exporter in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import specwatch.probe.http.fetch
from specwatch.daemon.run import Daemon
from specwatch.demo.llamaserver import LlamaServer
from specwatch.settings.loading import load_settings
from tests.support.metrics import Samples, parse
from tests.support.net import HOST


def sh(*command: str) -> str:
    """Run a command; its stdout, or an AssertionError with what it printed."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


_LOOPBACK = ("-s", HOST, "-d", HOST)


def _iptables(*args: str) -> str:
    return sh("iptables", "-w", "5", *args)


class Firewall:
    """A chain of this test's own, jumped to from OUTPUT for loopback packets only; every rule in it names one port.

    On the loopback every packet, a server's answers included, is sent locally and so passes OUTPUT once: one chain
    there sees both directions. The jump and the chain go away on exit, whatever happened, and exit checks that.
    """

    def __init__(self, name: str) -> None:
        if len(name) > 28:
            raise ValueError(f"iptables chain names are at most 28 characters: {name!r}")
        self.chain = name
        self._jump = ("OUTPUT", "-o", "lo", "-j", name)

    @staticmethod
    def sweep(prefix: str) -> list[str]:
        """Remove the chains `prefix`PID left by runs that were killed before their finalizers ran (PID gone)."""
        removed = []
        for line in _iptables("-S").splitlines():
            words = line.split()
            if words[:1] != ["-N"] or not words[1].startswith(prefix) or not words[1][len(prefix):].isdigit():
                continue
            if _alive(int(words[1][len(prefix):])):
                continue
            with contextlib.suppress(AssertionError):
                _iptables("-D", "OUTPUT", "-o", "lo", "-j", words[1])
            _iptables("-F", words[1])
            _iptables("-X", words[1])
            removed.append(words[1])
        return removed

    def __enter__(self) -> Firewall:
        _iptables("-N", self.chain)
        try:
            _iptables("-I", *self._jump)
        except BaseException:
            _iptables("-X", self.chain)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        problems = []
        for args in (("-D", *self._jump), ("-F", self.chain), ("-X", self.chain)):
            try:
                _iptables(*args)
            except AssertionError as err:
                problems.append(str(err))
        left = [line for line in _iptables("-S").splitlines() if self.chain in line]
        if left or problems:
            raise AssertionError(f"the test's iptables rules were not all removed: {left} {problems}")

    def rules(self) -> list[str]:
        return [line for line in _iptables("-S", self.chain).splitlines() if line.startswith("-A")]

    def blackhole(self, port: int) -> None:
        """Every packet to and from `port` on 127.0.0.1 vanishes: SYNs, requests and answers alike."""
        _iptables("-A", self.chain, *_LOOPBACK, "-p", "tcp", "--dport", str(port), "-j", "DROP")
        _iptables("-A", self.chain, *_LOOPBACK, "-p", "tcp", "--sport", str(port), "-j", "DROP")

    def reset(self, port: int) -> None:
        """Every packet sent to `port` on 127.0.0.1 is answered with a TCP reset: a connection in use is reset, a new one
        refused."""
        _iptables("-A", self.chain, *_LOOPBACK, "-p", "tcp", "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset")

    def clear(self) -> None:
        _iptables("-F", self.chain)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _link(name: str) -> bool:
    return any(line.split(":")[1].strip().split("@")[0] == name for line in sh("ip", "-o", "link").splitlines())


def _routes() -> list[ipaddress.IPv4Network]:
    found = []
    for line in sh("ip", "-4", "route", "show", "table", "all").splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("unreachable", "blackhole", "prohibit", "local", "broadcast", "unicast"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            found.append(ipaddress.ip_network(word, strict=False))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.231.0.0/16 that no route of this machine touches."""
    taken = _routes()
    start = os.getpid() % 16384
    for step in range(16384):
        index = (start + step) % 16384
        candidate = ipaddress.ip_network(f"10.231.{index // 64}.{(index % 64) * 4}/30")
        if not any(candidate.overlaps(route) for route in taken if route.prefixlen > 0):
            return candidate
    raise AssertionError("no free /30 in 10.231.0.0/16 for the test's namespace")


class Namespace:
    """A network namespace with a veth pair to this one: the server side's link can be taken down and brought back.

    The subnet gets an `unreachable` route of low priority as well: were the host side's own route ever gone, packets
    for the namespace would fail here instead of following the default route off this machine.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        suffix = name.rsplit("-", 1)[-1][-8:]
        self.host_link, self.peer_link = f"swh{suffix}", f"swn{suffix}"  # at most 15 characters
        subnet = _free_subnet()
        self.subnet = str(subnet)
        self.host_address, self.address = (str(a) for a in subnet.hosts())
        self._safety = ("unreachable", self.subnet, "metric", "4096")

    def run(self, *command: str) -> str:
        return sh("ip", "netns", "exec", self.name, *command)

    @staticmethod
    def sweep(prefix: str) -> list[str]:
        """Remove the namespaces `prefix`PID (their veth pairs and routes) left by runs killed before their finalizers."""
        removed = []
        for line in sh("ip", "netns", "list").splitlines():
            name = line.split()[0] if line.split() else ""
            if not name.startswith(prefix) or not name[len(prefix):].isdigit() or _alive(int(name[len(prefix):])):
                continue
            host_link = f"swh{name[len(prefix):][-8:]}"
            for address in sh("ip", "-o", "-4", "addr", "show", "dev", host_link).split() if _link(host_link) else []:
                if "/" in address:
                    with contextlib.suppress(AssertionError):
                        sh("ip", "route", "del", "unreachable", str(ipaddress.ip_network(address, strict=False)),
                           "metric", "4096")
            for command in (("ip", "link", "del", host_link), ("ip", "netns", "del", name)):
                with contextlib.suppress(AssertionError):
                    sh(*command)
            removed.append(name)
        return removed

    def __enter__(self) -> Namespace:
        sh("ip", "netns", "add", self.name)
        try:
            sh("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", self.peer_link)
            sh("ip", "link", "set", self.peer_link, "netns", self.name)
            sh("ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            sh("ip", "link", "set", self.host_link, "up")
            sh("ip", "route", "add", *self._safety)
            self.run("ip", "addr", "add", f"{self.address}/30", "dev", self.peer_link)
            self.run("ip", "link", "set", "lo", "up")
            self.run("ip", "link", "set", self.peer_link, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def link(self, up: bool) -> None:
        """The server side's link up or down, as when its cable is pulled and plugged back."""
        self.run("ip", "link", "set", self.peer_link, "up" if up else "down")

    def __exit__(self, *exc: object) -> None:
        # The caller stopped the processes it started in the namespace. Deleting one end of the veth pair deletes
        # both at once; the namespace's own deletion frees its links only later, in the kernel's own time.
        for command in (("ip", "link", "del", self.host_link), ("ip", "route", "del", *self._safety),
                        ("ip", "netns", "del", self.name)):
            with contextlib.suppress(AssertionError):
                sh(*command)
        deadline = time.monotonic() + 10
        while True:
            left = [line for line in sh("ip", "netns", "list").splitlines() if line.split()[:1] == [self.name]]
            links = [line.split(":")[1].strip() for line in sh("ip", "-o", "link").splitlines() if self.host_link in line]
            routes = [line for line in sh("ip", "-4", "route").splitlines() if line.startswith(self.subnet)]
            if not (left or links or routes):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the test's namespace was not all removed: {left} {links} {routes}")
            time.sleep(0.1)


class NamespacedLlamaServer(LlamaServer):
    """A llama-server started inside a Namespace, listening on the namespace's address."""

    def __init__(self, namespace: Namespace, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.namespace = namespace
        self.host = namespace.address

    @property
    def command(self) -> list[str]:
        # `ip netns exec` execs the server, so the pid (and process group) stop() signals is the server's.
        return ["ip", "netns", "exec", self.namespace.name, *super().command]


class Frozen:
    """SIGSTOP and SIGCONT for a server's process group; on exit it is always continued, whatever happened."""

    def __init__(self, server: LlamaServer) -> None:
        if server.pid is None:
            raise AssertionError(f"{server!r} is not running")
        self.group = server.pid

    def stop(self) -> None:
        os.killpg(self.group, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group, signal.SIGCONT)

    def __enter__(self) -> Frozen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.resume()


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    return socket.inet_ntoa(struct.pack("<I", int(host, 16))), int(port, 16)


TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def connections(peers: set[tuple[str, int]]) -> dict[tuple[str, int], list[str]]:
    """This process's TCP sockets (open file descriptors) to each of `peers`, by state."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: dict[tuple[str, int], list[str]] = {peer: [] for peer in peers}
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            remote = _address(fields[2])
            if remote in found and fields[9] in inodes:
                found[remote].append(TCP_STATES.get(fields[3], fields[3]))
    return found


class StreamTap:
    """Follows the streaming answers the exporter reads, per server port: a test waits on it to strike mid-stream.

    It wraps the fetcher's line reader and changes nothing it yields.
    """

    def __init__(self) -> None:
        self._streams: dict[int, tuple[int, int, bool]] = {}
        """port -> (streams begun, lines of the latest, whether it ended)."""
        self._cut: set[tuple[int, int]] = set()
        """(port, stream number) of every stream that ended in an error (a reset, a timeout) before its answer's end."""
        self._changed = threading.Condition()

    def install(self, monkeypatch: Any) -> None:
        original = specwatch.probe.http.fetch.Fetcher._lines
        tap = self

        async def followed(fetcher: Any, response: Any) -> Any:
            port = response.url.port
            number = tap._note(port, lambda begun, lines, ended: (begun + 1, 0, False))[0]
            try:
                async for line in original(fetcher, response):
                    tap._note(port, lambda begun, lines, ended: (begun, lines + 1, False))
                    yield line
            except GeneratorExit:
                raise  # the reader stopped at the answer's end ([DONE]): not cut
            except BaseException:
                with tap._changed:
                    tap._cut.add((port, number))
                raise
            finally:
                tap._note(port, lambda begun, lines, ended: (begun, lines, True))

        monkeypatch.setattr(specwatch.probe.http.fetch.Fetcher, "_lines", followed)

    def _note(self, port: int, change: Callable[[int, int, bool], tuple[int, int, bool]]) -> tuple[int, int, bool]:
        with self._changed:
            now = self._streams[port] = change(*self._streams.get(port, (0, 0, False)))
            self._changed.notify_all()
            return now

    def next_stream(self, port: int, lines: int, timeout: float) -> int:
        """Until a stream from `port` that begins after this call has brought `lines` lines and goes on; its number."""
        with self._changed:
            begun = self._streams.get(port, (0, 0, False))[0]

            def under_way() -> bool:
                now, read, ended = self._streams.get(port, (0, 0, False))
                return now > begun and read >= lines and not ended

            if not self._changed.wait_for(under_way, timeout):
                raise AssertionError(f"no new streaming canary to port {port} got {lines} lines within {timeout:g}s")
            return self._streams[port][0]

    def cut(self, port: int, number: int) -> bool:
        """Whether stream `number` from `port` ended in an error before its answer's end."""
        with self._changed:
            return (port, number) in self._cut


@dataclass(frozen=True)
class Probe:
    server: str
    endpoint: str
    """The canary's endpoint; empty for a poll."""
    started: float
    ended: float
    ok: bool
    verdict: str | None
    """The server's verdict once this probe was recorded: every verdict it passes through is in the record."""


class ProbeRecord:
    """Every poll and canary the watcher records, as it records it: cadence read from here misses none, nor a verdict."""

    def __init__(self) -> None:
        self.probes: list[Probe] = []

    def install(self, monkeypatch: Any) -> None:
        from specwatch.daemon.watch import Watcher

        polled, canaried, record = Watcher._polled, Watcher._canaried, self.probes

        def note(server: Any, endpoint: str, measured: Any, change: Any) -> None:
            ended = time.time()
            model = change[1].model() if change is not None else None
            verdict = model.decision.verdict.value if model is not None else None
            record.append(Probe(server.name, endpoint, ended - measured.duration, ended, measured.reason is None, verdict))

        def on_poll(watcher: Any, server: Any, measured: Any, change: Any) -> None:
            note(server, "", measured, change)
            polled(watcher, server, measured, change)

        def on_canary(watcher: Any, server: Any, key: str, endpoint: Any, measured: Any, change: Any) -> None:
            note(server, endpoint.value, measured, change)
            canaried(watcher, server, key, endpoint, measured, change)

        monkeypatch.setattr(Watcher, "_polled", on_poll)
        monkeypatch.setattr(Watcher, "_canaried", on_canary)

    def between(self, server: str, start: float, end: float) -> list[Probe]:
        return [p for p in list(self.probes) if p.server == server and start <= p.ended <= end]

    def successes(self, server: str, start: float, end: float, *, canary: bool) -> list[Probe]:
        return [p for p in self.between(server, start, end) if p.ok and bool(p.endpoint) == canary and start <= p.started]


class LogFile:
    """The exporter's log lines, as JSON objects, from a file it writes to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stream = path.open("w", buffering=1, encoding="utf-8")

    def events(self) -> list[dict[str, Any]]:
        import json

        found = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    def close(self) -> None:
        self.stream.close()


class DaemonThread:
    """`specwatch run` in-process, on an event loop of its own thread: a test can block, count its tasks, and stop it."""

    def __init__(self, config: Path, port: int) -> None:
        self.config = config
        self.port = port
        self.daemon: Daemon | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="specwatch-daemon", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.daemon = Daemon(self.config, load_settings(self.config))
            running = asyncio.ensure_future(self.daemon.run(HOST, self.port))
            await asyncio.sleep(0)
            self._started.set()
            await running

        try:
            asyncio.run(main())
        except BaseException as err:  # noqa: BLE001 - reported by stop()
            self._error = err
            self._started.set()

    def start(self) -> DaemonThread:
        self._thread.start()
        if not self._started.wait(30) or self._error is not None:
            raise AssertionError(f"the exporter did not start: {self._error!r}")
        return self

    def call(self, make: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 30) -> Any:
        """Run a coroutine on the exporter's loop and return its result."""
        assert self.loop is not None
        future: Future[Any] = asyncio.run_coroutine_threadsafe(make(), self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        if self.daemon is not None and self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.daemon.stop)
        self._thread.join(30)
        if self._thread.is_alive():
            raise AssertionError("the exporter did not stop within 30 s")
        if self._error is not None:
            raise AssertionError(f"the exporter failed: {self._error!r}") from self._error

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass
class Scrape:
    at: float
    samples: Samples


@dataclass
class Sampler:
    """Scrapes an exporter's /metrics every `every` seconds on a thread of its own, keeping every exposition parsed."""

    url: str
    keep: Callable[[str], bool] = lambda name: True
    """Which families to keep of each scrape: a long run keeps every scrape."""
    every: float = 0.1
    scrapes: list[Scrape] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._paused = threading.Event()
        self._idle = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specwatch-sampler", daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            if self._paused.is_set():
                self._idle.set()
                time.sleep(0.02)
                continue
            started = time.time()
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as answer:
                    samples = parse(answer.read().decode())
                self.scrapes.append(Scrape(started, {key: v for key, v in samples.items() if self.keep(key[0])}))
            except OSError as err:
                self.errors.append(f"{started:.3f} {err}")
            time.sleep(max(0.0, self.every - (time.time() - started)))

    def start(self) -> Sampler:
        self._thread.start()
        return self

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._idle.clear()
        self._paused.set()
        self._idle.wait(10)
        try:
            yield
        finally:
            self._paused.clear()

    def between(self, start: float, end: float) -> list[Scrape]:
        return [s for s in self.scrapes if start <= s.at <= end]

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)
