"""A simulated llama-server fleet: N look-alikes of the wire model on loopback ports, all served by one asyncio process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.loopback import STATS_PATH, LoopThread, Site, Stats, close
from tests.support.net import HOST
from tests.support.wire import FakeLlama

ROOT = Path(__file__).resolve().parents[2]


def is_speculating(index: int, share: float) -> bool:
    """Whether server `index` speculates: a `share` of the fleet, evenly spread and stable."""
    return math.floor((index + 1) * share + 1e-9) > math.floor(index * share + 1e-9)


def server_name(index: int) -> str:
    return f"sim-{index:05d}"


@dataclass(frozen=True)
class FleetOptions:
    servers: int = 100
    base_port: int = 0
    """First port; 0 lets the kernel pick a free port for every server."""
    host: str = HOST
    spec_share: float = 0.2
    latency_ms: float = 5.0
    token_ms: float = 0.0
    """Delay between streamed chunks, as a real server generating tokens would have."""
    slots_per_server: int = 1
    keepalive_timeout: float = 5.0
    """llama-server closes an idle kept-alive connection after 5 s."""
    api_key: str | None = None
    pool_size: int = 1
    """Servers per pool: the servers of a pool report one model, so they are each other's peers (1: every server its
    own model, compared with nothing)."""


@dataclass(frozen=True)
class SimServer:
    index: int
    name: str
    host: str
    port: int
    speculative: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "speculative": self.speculative}


def lookalike(index: int, options: FleetOptions) -> FakeLlama:
    """Server `index`: a draft-model server (every token after the first a fill-in) or a plain one."""
    path = f"/models/{server_name(index) if options.pool_size <= 1 else f'pool-{index // options.pool_size:05d}'}.gguf"
    kind = FakeLlama.draft if is_speculating(index, options.spec_share) else FakeLlama.plain
    # Without --alias, llama-server reports the model path as its alias. Each answers a little apart from the others
    # (batching noise, as many-slot GPU servers give): no two peer-probe answers alike, none compared for free.
    return kind(tokens=None, api_key=options.api_key, model_alias=path, model_path=path, n_ctx=4096,
                total_slots=options.slots_per_server, token_probability=0.7 - 0.00001 * (index % 997))


class SimFleet:
    """The whole fleet on the running event loop: `await start()`, then `await stop()`."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.stats = Stats()
        self.servers: list[SimServer] = []
        self.sites: list[Site] = []
        self._listeners: list[asyncio.Server] = []

    async def start(self) -> list[SimServer]:
        raise_fd_limit()
        options = self.options
        try:
            for index in range(options.servers):
                site = Site(lookalike(index, options), latency=options.latency_ms / 1000, token_delay=options.token_ms / 1000,
                            keepalive_timeout=options.keepalive_timeout, record=False, stats=self.stats, serve_stats=True)
                listener = await site.listen(options.host, options.base_port + index if options.base_port else 0)
                self.sites.append(site)
                self._listeners.append(listener)
                port = listener.sockets[0].getsockname()[1]
                self.servers.append(SimServer(index, server_name(index), options.host, port, is_speculating(index, options.spec_share)))
        except BaseException:
            await self.stop()
            raise
        return self.servers

    async def stop(self) -> None:
        listeners, self._listeners = self._listeners, []
        for listener, site in zip(listeners, self.sites, strict=False):
            await close(listener, [site])

    def manifest(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "servers": [s.as_dict() for s in self.servers]}


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one: a thousand listeners and their connections need it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class SimFleetThread:
    """The fleet on its own event loop in a background thread, for tests in one process."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.fleet = SimFleet(options)
        self._loop: LoopThread | None = None

    @property
    def servers(self) -> list[SimServer]:
        return self.fleet.servers

    def start(self) -> SimFleetThread:
        self._loop = LoopThread("simfleet")
        try:
            self._loop.run(self.fleet.start(), timeout=120)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            loop.run(self.fleet.stop(), timeout=10)
        loop.close()

    def __enter__(self) -> SimFleetThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def cli_args(options: FleetOptions) -> list[str]:
    args = [
        "--servers", str(options.servers), "--base-port", str(options.base_port), "--host", options.host,
        "--spec-share", repr(options.spec_share), "--latency-ms", repr(options.latency_ms), "--token-ms", repr(options.token_ms),
        "--slots", str(options.slots_per_server), "--keepalive-timeout", repr(options.keepalive_timeout),
        "--pool-size", str(options.pool_size),
    ]
    if options.api_key is not None:
        args += ["--api-key-env", "SIMFLEET_API_KEY"]
    return args


class SimFleetProcess:
    """The fleet in a child process (its CPU stays out of the measured process); stop() ends its process group."""

    def __init__(self, options: FleetOptions, *, start_timeout: float = 120.0) -> None:
        self.options = options
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.servers: list[SimServer] = []

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> SimFleetProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        if self.options.api_key is not None:
            env["SIMFLEET_API_KEY"] = self.options.api_key
        self.process = process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.simfleet", *cli_args(self.options), "--manifest", "-"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        assert process.stdout is not None and process.stderr is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(self.start_timeout)
        if not line or not line[0].strip():
            self._end()
            error = ""
            with contextlib.suppress(Exception):
                error = process.stderr.read()[-2000:]
            self.stop()
            raise RuntimeError(f"the simulated fleet did not start: {error.strip() or 'no manifest'}")
        self.servers = [
            SimServer(i, s["name"], s["url"].rsplit(":", 1)[0].removeprefix("http://"), int(s["url"].rsplit(":", 1)[1]),
                      s["speculative"])
            for i, s in enumerate(json.loads(line[0])["servers"])
        ]
        return self

    def stats(self) -> dict[str, Any]:
        """The fleet's request and connection counters, read from its stats path."""
        import urllib.request

        with urllib.request.urlopen(f"{self.servers[0].url}{STATS_PATH}", timeout=10) as answer:
            return json.loads(answer.read())

    def _end(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def stop(self) -> None:
        self._end()
        if self.process is not None:
            for pipe in (self.process.stdout, self.process.stderr):
                if pipe is not None:
                    pipe.close()

    def __enter__(self) -> SimFleetProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# ---- a specwatch config for the fleet ----------------------------------------------------------------------------


def servers_from_layout(count: int, base_port: int, host: str = HOST, spec_share: float = 0.2) -> list[dict[str, Any]]:
    """The fleet `python -m tests.support.simfleet --servers COUNT --base-port BASE_PORT` serves."""
    return [
        {"name": server_name(i), "url": f"http://{host}:{base_port + i}", "speculative": is_speculating(i, spec_share)}
        for i in range(count)
    ]


def servers_from_manifest(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["servers"])


def build_config(
    servers: Iterable[dict[str, Any]],
    *,
    poll_interval: str = "15s",
    canary_interval: str = "60s",
    max_concurrency: int | None = None,
    api_key_env: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A specwatch config mapping; the `kind` label says what the simulated server is, so a dashboard can check verdicts."""
    entries = []
    for server in servers:
        entry: dict[str, Any] = {
            "name": server["name"],
            "url": server["url"],
            "labels": {"pool": "sim", "kind": "speculating" if server.get("speculative") else "plain"},
        }
        if api_key_env:
            entry["api_key_env"] = api_key_env
        entries.append(entry)
    config: dict[str, Any] = {"servers": entries, "poll_interval": poll_interval, "canary_interval": canary_interval}
    if max_concurrency is not None:
        config["max_concurrency"] = max_concurrency
    config.update(extra or {})
    return config


def write_config(path: Path, config: dict[str, Any]) -> None:
    import yaml  # only here: the fleet's own process never writes a config

    path.write_text(yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=200), encoding="utf-8")


# ---- the command line --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.support.simfleet", description=__doc__)
    parser.add_argument("--servers", type=int, default=100, help="how many llama-server look-alikes (default 100)")
    parser.add_argument("--base-port", type=int, default=20000,
                        help="port of the first server; 0 picks free ports (default 20000)")
    parser.add_argument("--host", default=HOST, help=f"address to bind (default {HOST})")
    parser.add_argument("--spec-share", type=float, default=0.2, help="share of servers that speculate (default 0.2)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="delay before every answer (default 5)")
    parser.add_argument("--token-ms", type=float, default=0.0, help="delay between streamed chunks (default 0)")
    parser.add_argument("--slots", type=int, default=1, help="slots per server (default 1)")
    parser.add_argument("--pool-size", type=int, default=1,
                        help="servers per pool reporting one model, each other's peers (default 1: none)")
    parser.add_argument("--keepalive-timeout", type=float, default=5.0,
                        help="idle keep-alive timeout in seconds (default 5, as llama-server)")
    parser.add_argument("--api-key-env", help="require this environment variable's value as a Bearer key (not on /health)")
    parser.add_argument("--manifest", help="write the servers as one JSON line to this file ('-' for stdout) once all listen")
    return parser


async def _serve(options: FleetOptions, manifest_to: str | None, announce: Callable[[str], None]) -> None:
    fleet = SimFleet(options)
    await fleet.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    manifest = json.dumps(fleet.manifest())
    if manifest_to == "-":
        sys.stdout.write(manifest + "\n")
        sys.stdout.flush()
    elif manifest_to:
        Path(manifest_to).write_text(manifest + "\n", encoding="utf-8")
    speculating = sum(s.speculative for s in fleet.servers)
    first, last = fleet.servers[0], fleet.servers[-1]
    announce(f"simfleet: {len(fleet.servers)} servers ({speculating} speculating) on {first.url} .. {last.url}, "
             f"latency {options.latency_ms:g} ms; Ctrl-C to stop")
    await stopping.wait()
    await fleet.stop()
    announce(f"simfleet: stopped; {json.dumps(fleet.stats.as_dict())}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        print(f"simfleet: environment variable {args.api_key_env} is empty", file=sys.stderr)
        return 2
    if not 0.0 <= args.spec_share <= 1.0:
        print("simfleet: --spec-share must be within [0, 1]", file=sys.stderr)
        return 2
    if args.base_port and args.base_port + args.servers - 1 > 65535:
        print("simfleet: --base-port + --servers runs past port 65535", file=sys.stderr)
        return 2
    options = FleetOptions(
        servers=args.servers, base_port=args.base_port, host=args.host, spec_share=args.spec_share, latency_ms=args.latency_ms,
        token_ms=args.token_ms, slots_per_server=args.slots, keepalive_timeout=args.keepalive_timeout, api_key=api_key,
        pool_size=args.pool_size,
    )
    limit = raise_fd_limit()
    if limit < 2 * options.servers + 64:
        print(f"simfleet: open-files limit {limit} is too low for {options.servers} servers (raise ulimit -n)", file=sys.stderr)
        return 2
    asyncio.run(_serve(options, args.manifest, lambda text: print(text, file=sys.stderr, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
