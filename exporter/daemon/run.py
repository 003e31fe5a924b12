"""`specwatch run`: wires config, watcher, schedule and web endpoint together, with reload on SIGHUP."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from ..core import reference
from ..core.peers import Reference
from ..core.state import Fleet
from ..probe.http.client import new_client
from ..probe.http.fetch import Fetcher
from ..problems import ConfigError
from ..settings.loading import load_settings
from ..settings.schema import Settings, parse_shard
from ..settings.targets import ServerConfig
from ..version import __version__
from . import api, landing, memory
from .discovery import Discovery, SourceStatus, targets_out
from .exposition.samples import ExporterStatus
from .exposition.serve import Exposition
from .schedule import Schedule
from .shard import select, shard_key
from .watch import Watcher
from .web import WebApp

log = structlog.get_logger("specwatch")
SWITCH_SECONDS = 0.001
"""How long a thread holds the interpreter before another that waits may have it (Python's default is 5 ms)."""


def read_references(settings: Settings) -> dict[str, Reference]:
    """The configured peer groups' reference files, read; one that cannot be used refuses the configuration."""
    try:
        return reference.read_all(settings.peer_references)
    except reference.ReferenceFileError as err:
        raise ConfigError([f"peer_references: {err}"]) from None


def configured_servers(settings: Settings, discovery: Discovery) -> list[ServerConfig]:
    """Every server of the config: the static ones, then the discovered ones (a name already taken is skipped)."""
    static = list(settings.servers)
    return static + discovery.servers(taken=(s.name for s in static))


def shard_of(servers: list[ServerConfig], shard: str | None) -> list[ServerConfig]:
    """The servers this replica watches: all of them, or its hash-based share when sharded."""
    if shard is None:
        return list(servers)
    index, count = parse_shard(shard)
    return select(servers, lambda s: shard_key(s.name, s.peer_group), index, count)


async def preview(settings: Settings) -> tuple[list[ServerConfig], tuple[SourceStatus, ...]]:
    """What a daemon would find with these settings, before sharding: the static servers and one read of every discovery
    source."""
    discovery = Discovery()
    discovery.configure(settings)
    try:
        await discovery.refresh_all()
        return configured_servers(settings, discovery), discovery.status()
    finally:
        await discovery.close()


class Daemon:
    """`specwatch run`: the static servers and the discovered ones, watched, exported, reloadable."""

    def __init__(
        self,
        config_path: Path | None,
        settings: Settings,
        *,
        shard: str | None = None,
        overrides: dict[str, Any] | None = None,
        references: dict[str, Reference] | None = None,
    ) -> None:
        self.config_path = config_path
        self.shard = shard
        self.overrides = overrides or {}
        self.settings = settings
        self.discovery = Discovery(on_change=self._discovered)
        self.discovery.configure(settings)
        servers = self._watched()
        self.fleet = Fleet(servers, settings.canary_endpoints)
        self.client = new_client()
        self.references = references if references is not None else read_references(settings)
        self.watcher = Watcher(settings, self.fleet, Fetcher(self.client, settings.max_response_bytes),
                               references=self.references)
        self.watcher.peers.configured_only = self._sharded()
        self.schedule = Schedule(self.watcher)
        self.status = self._status(reload_successful=True)
        # Discovery sources refresh on their own: each scrape reads their state as it is.
        self.exposition = Exposition(self.fleet, lambda: replace(self.status, discovery=self.discovery.status()))
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._reload_lock = asyncio.Lock()

    def _configured(self) -> list[ServerConfig]:
        return configured_servers(self.settings, self.discovery)

    def _watched(self) -> list[ServerConfig]:
        return shard_of(self._configured(), self.shard or self.settings.shard)

    def _sharded(self) -> bool:
        shard = self.shard or self.settings.shard
        return shard is not None and parse_shard(shard)[1] > 1

    def _status(self, *, reload_successful: bool) -> ExporterStatus:
        return ExporterStatus(
            poll_interval=self.settings.poll_interval,
            canary_interval=self.settings.canary_interval,
            reload_successful=reload_successful,
            last_reload_success_timestamp=time.time(),
            configured_servers=len(self._configured()),
            discovery=self.discovery.status(),
        )

    def _apply(self) -> list[ServerConfig]:
        """Bring watcher, schedule and status in step with the current settings and discovered servers."""
        servers = self._watched()
        self.watcher.peers.configured_only = self._sharded()
        self.watcher.apply(self.settings, servers, references=self.references)
        self.schedule.sync(servers)
        self.status = replace(self.status, configured_servers=len(self._configured()), discovery=self.discovery.status(),
                              poll_interval=self.settings.poll_interval, canary_interval=self.settings.canary_interval)
        return servers

    def _discovered(self) -> None:
        servers = self._apply()
        log.info("discovery_applied", servers=len(servers), configured=self.status.configured_servers)

    def web_app(self, authorise: Any = None) -> WebApp:
        return WebApp(
            self.exposition.scrape,
            page=self.landing_page,
            reload=self.reload_from_thread,
            authorise=authorise,
            sd=self.sd,
            verdicts=self.verdicts,
        )

    def landing_page(self) -> str:
        now = time.time()
        return landing.render([row for state in self.fleet.snapshot() for row in landing.rows(state, now)])

    def sd(self, verdict: str | None) -> list[dict[str, Any]]:
        """GET /sd: the watched llama-servers as Prometheus http_sd target groups."""
        return targets_out(self.fleet.snapshot(), verdict)

    def verdicts(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """GET /api/v1/verdicts: the selected servers' verdicts, ages and freshness."""
        return api.verdicts(self.fleet.snapshot(), self.settings, api.parse_selection(query), time.time())

    async def reload(self) -> str | None:
        """Load the config again; a bad one is refused and the running one stays. Returns the error, if any."""
        async with self._reload_lock:
            try:
                settings = load_settings(self.config_path, **self.overrides)
                if self.shard is None and settings.shard is not None:
                    parse_shard(settings.shard)
                references = read_references(settings)
            except (ConfigError, ValueError) as err:
                self.status = replace(self.status, reload_successful=False)
                log.error("reload_failed", error=str(err))
                return str(err)
            # Key names only: a value may be a secret.
            changed = [key for key in type(settings).model_fields if getattr(settings, key) != getattr(self.settings, key)]
            before = {server.name for server in self._watched()}
            self.settings, self.references = settings, references
            self.discovery.configure(settings)
            await self.discovery.refresh_all()
            if self.loop is not None:
                self.discovery.start()
            servers = self._apply()
            self.status = self._status(reload_successful=True)
            after = {server.name for server in servers}
            log.info("reloaded", servers=len(servers), added=len(after - before), removed=len(before - after),
                     changed=changed)
            for warning in settings.warnings:
                log.warning("config_warning", warning=warning)
            return None

    def reload_from_thread(self) -> str | None:
        if self.loop is None:
            return "the daemon is not running"
        return asyncio.run_coroutine_threadsafe(self.reload(), self.loop).result(timeout=60)

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    async def run(self, host: str, port: int, *, web: WebApp | None = None, wrap_socket: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web or self.web_app()
        bound_host, bound_port = app.start(host, port, wrap_socket)
        # Discovered targets are watched from the start: read every source once before the schedule begins.
        await self.discovery.refresh_all()
        servers = self._apply()
        self.status = self._status(reload_successful=True)
        log.info(
            "started", version=__version__, listen=f"{bound_host}:{bound_port}", servers=len(servers),
            poll_interval=self.settings.poll_interval, canary_interval=self.settings.canary_interval,
        )
        for sig, handler in ((signal.SIGHUP, lambda: asyncio.ensure_future(self.reload())),
                             (signal.SIGTERM, self.stop), (signal.SIGINT, self.stop)):
            try:
                self.loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError):
                pass  # not the main thread (tests): signals are not ours to take
        self.discovery.start()
        self.schedule.start(servers)
        memory.tune()
        # The scrape threads and the preparer wait for the interpreter while the probes hold it; with a 1 ms switch
        # interval (5 ms by default) they have it sooner (docs/operating.md, Fleet scale, has what it was measured to do).
        sys.setswitchinterval(SWITCH_SECONDS)
        try:
            await self._stopping.wait()
        finally:
            log.info("stopping")
            self.schedule.shutdown()
            await self.watcher.close()
            await self.discovery.close()
            app.stop()
            await self.client.aclose()
