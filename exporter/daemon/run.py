"""`specwatch run`: wires config, watcher, schedule and web endpoint together, with reload on SIGHUP."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from exporter import __version__
from exporter.daemon import landing
from exporter.daemon.collector import ExporterStatus, Exposition
from exporter.daemon.schedule import Schedule
from exporter.daemon.shard import select
from exporter.daemon.state import Fleet
from exporter.daemon.watch import Watcher
from exporter.daemon.web import WebApp
from exporter.probe.fetch import Fetcher, new_client
from exporter.settings import ConfigError, ServerConfig, Settings, load_settings, parse_shard

log = structlog.get_logger("specwatch")


def watched_servers(settings: Settings, shard: str | None = None) -> list[ServerConfig]:
    """The servers this replica watches: all of them, or its hash-based share when sharded."""
    chosen = shard or settings.shard
    if chosen is None:
        return list(settings.servers)
    index, count = parse_shard(chosen)
    return select(settings.servers, lambda s: s.name, index, count)


class Daemon:
    def __init__(
        self,
        config_path: Path | None,
        settings: Settings,
        *,
        shard: str | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.config_path = config_path
        self.shard = shard
        self.overrides = overrides or {}
        self.settings = settings
        servers = watched_servers(settings, shard)
        self.fleet = Fleet(servers, settings.canary_endpoints)
        self.client = new_client()
        self.watcher = Watcher(settings, self.fleet, Fetcher(self.client, settings.max_response_bytes))
        self.schedule = Schedule(self.watcher)
        self.status = ExporterStatus(
            poll_interval=settings.poll_interval,
            canary_interval=settings.canary_interval,
            last_reload_success_timestamp=time.time(),
            configured_servers=len(settings.servers),
        )
        self.exposition = Exposition(self.fleet, lambda: self.status)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._reload_lock = asyncio.Lock()

    def web_app(self, authorise: Any = None) -> WebApp:
        return WebApp(
            self.exposition.render,
            page=self.landing_page,
            reload=self.reload_from_thread,
            authorise=authorise,
        )

    def landing_page(self) -> str:
        now = time.time()
        return landing.render([row for state in self.fleet.snapshot() for row in landing.rows(state, now)])

    async def reload(self) -> str | None:
        """Load the config again; a bad one is refused and the running one stays. Returns the error, if any."""
        async with self._reload_lock:
            try:
                settings = load_settings(self.config_path, **self.overrides)
                servers = watched_servers(settings, self.shard)
            except (ConfigError, ValueError) as err:
                self.status = replace(self.status, reload_successful=False)
                log.error("reload_failed", error=str(err))
                return str(err)
            self.settings = settings
            self.watcher.apply(settings, servers)
            self.schedule.sync(servers)
            self.status = ExporterStatus(
                poll_interval=settings.poll_interval,
                canary_interval=settings.canary_interval,
                reload_successful=True,
                last_reload_success_timestamp=time.time(),
                configured_servers=len(settings.servers),
            )
            log.info("reloaded", servers=len(servers))
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
        servers = [s.config for s in self.fleet.snapshot()]
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
        self.schedule.start(servers)
        try:
            await self._stopping.wait()
        finally:
            log.info("stopping")
            self.schedule.shutdown()
            await self.watcher.close()
            app.stop()
            await self.client.aclose()
