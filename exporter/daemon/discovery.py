"""Discovery in (file_sd files, http_sd endpoints become watched servers) and out (the /sd target groups)."""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from ..core.state import ServerState
from ..filestamp import FileStamp, file_stamp
from ..probe.http.client import Client, new_client
from ..probe.http.fetch import Fetcher, HttpStatusFailure
from ..problems import ConfigError, parse_yaml, problem_lines, refusal, yaml_problem
from ..reasons import ProbeFailure, Reason
from ..settings.schema import Settings
from ..settings.targets import FileSDConfig, HttpSDConfig, ServerConfig

log = structlog.get_logger("specwatch")
MAX_SD_BYTES = 16 * 1024 * 1024
HTTP_SD_TIMEOUT = 10.0


@dataclass(frozen=True)
class SourceStatus:
    """One discovery source as /metrics shows it."""

    source: str
    """"file_sd[0]", "http_sd[1]": its place in the config (a URL could carry a secret in its query)."""
    targets: int
    ok: bool | None
    """Whether the last refresh succeeded; None before the first."""
    last_success_timestamp: float | None


def _host_ports(targets: Any) -> Any:
    if not isinstance(targets, list) or not all(isinstance(t, str) and t.strip() for t in targets):
        raise ValueError("must be a list of HOST:PORT strings")
    for target in targets:
        if "://" in target:
            raise ValueError(f"{target.split('://', 1)[0][:20]!r}:// in a target: a target is HOST:PORT, as in Prometheus; "
                             "set the source's scheme: https for TLS")
        if any(ch.isspace() for ch in target.strip()):
            raise ValueError("a target is HOST:PORT, with no spaces")
    return [t.strip() for t in targets]


def _string_labels(labels: Any) -> Any:
    labels = labels or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError("must map label names to string values")
    return labels


class TargetGroup(BaseModel):
    """One group of a file_sd file or an http_sd answer: targets and the labels they share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: Annotated[list[str], BeforeValidator(_host_ports)] = Field(default=None, validate_default=True)
    labels: Annotated[dict[str, str], BeforeValidator(_string_labels)] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("not a mapping with targets and labels")
        return data

    @model_validator(mode="after")
    def _server_names_one(self) -> TargetGroup:
        if "server" in self.labels and len(self.targets) != 1:
            raise refusal([(("labels", "server"), f"names one target, and this group has {len(self.targets)}")])
        return self


PEER_GROUP_LABEL = "__specwatch_peer_group"
"""The target label that sets a server's `peer_group`: a meta label, so Prometheus drops it and no series carries it."""


def servers_from_groups(data: Any, source: FileSDConfig | HttpSDConfig, where: str) -> list[ServerConfig]:
    """Target groups (`[{"targets": ["host:port"], "labels": {...}}]`) as servers; a ConfigError lists every problem.

    A group's `server` label names its one target; otherwise a target is named by its address. Labels that start
    with `__` are Prometheus' meta labels, meant for relabelling: they are left out, but for PEER_GROUP_LABEL.
    """
    if not isinstance(data, list):
        raise ConfigError(["must be a list of target groups: [{targets: [HOST:PORT, ...], labels: {...}}]"], where)
    problems: list[str] = []
    servers: dict[str, ServerConfig] = {}
    for index, item in enumerate(data):
        at = f"[{index}]"
        try:
            group = TargetGroup.model_validate(item)
        except ValidationError as err:
            problems += problem_lines(err, TargetGroup, data=item, at=(index,))
            continue
        name = group.labels.get("server")
        static = {k: v for k, v in group.labels.items() if not k.startswith("__") and k != "server"}
        for target in group.targets:
            try:
                server = ServerConfig(
                    name=name or target, url=f"{source.scheme}://{target}", labels={**source.labels, **static},
                    peer_group=group.labels.get(PEER_GROUP_LABEL) or None,  # empty is unset, as in Prometheus
                    api_key_file=source.api_key_file, api_key_env=source.api_key_env, timeout=source.timeout,
                )
            except ValidationError as err:
                problems += [f"{at} target {target!r}: {line}" for line in problem_lines(err, ServerConfig)]
                continue
            if server.name in servers:
                problems.append(f"{at} target {target!r}: the name {server.name!r} is already used in this source")
                continue
            servers[server.name] = server
    if problems:
        raise ConfigError(problems, where)
    return list(servers.values())


class _Source:
    """One discovery source and the servers it last gave; a refresh that fails keeps them."""

    def __init__(self, key: str, config: FileSDConfig | HttpSDConfig) -> None:
        self.key = key
        self.config = config
        self.ok: bool | None = None
        self.last_success: float | None = None

    @property
    def servers(self) -> list[ServerConfig]:
        raise NotImplementedError

    async def refresh(self) -> bool:
        """Read the source again; True when its servers changed."""
        raise NotImplementedError

    def status(self) -> SourceStatus:
        return SourceStatus(self.key, len(self.servers), self.ok, self.last_success)

    def _done(self, ok: bool) -> None:
        self.ok = ok
        if ok:
            self.last_success = time.time()


@dataclass(frozen=True)
class _File:
    stamp: FileStamp
    servers: list[ServerConfig]
    refused: bool
    """Its current content was refused: it keeps the targets it had before."""


class FileSource(_Source):
    """file_sd: every file the globs match, re-read when its stamp changes; a bad file keeps its old targets."""

    config: FileSDConfig

    def __init__(self, key: str, config: FileSDConfig) -> None:
        super().__init__(key, config)
        self._files: dict[Path, _File] = {}

    @property
    def servers(self) -> list[ServerConfig]:
        return [server for _, file in sorted(self._files.items()) for server in file.servers]

    def _paths(self) -> list[Path]:
        found: set[Path] = set()
        for pattern in self.config.files:
            found.update(Path(p) for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
        return sorted(found)

    async def refresh(self) -> bool:
        before = self.servers
        paths = self._paths()
        for gone in set(self._files) - set(paths):
            del self._files[gone]  # a file removed on purpose takes its targets with it
            log.info("discovery_file_removed", source=self.key, file=str(gone))
        for path in paths:
            try:
                stamp = file_stamp(path)
            except OSError:
                continue  # removed between the glob and the stat: the next refresh sees it gone
            known = self._files.get(path)
            if known is not None and known.stamp == stamp:
                continue  # unchanged: neither re-read nor logged again
            try:
                servers = servers_from_groups(self._read(path), self.config, f"{self.key} file {str(path)!r}")
            except ConfigError as err:
                kept = known.servers if known is not None else []
                log.warning("discovery_refused", source=self.key, file=str(path), error=str(err), kept_targets=len(kept))
                self._files[path] = _File(stamp, kept, refused=True)
                continue
            self._files[path] = _File(stamp, servers, refused=False)
            log.info("discovery_file_read", source=self.key, file=str(path), targets=len(servers))
        self._done(not any(file.refused for file in self._files.values()))
        return self.servers != before

    @staticmethod
    def _read(path: Path) -> Any:
        where = f"file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError([f"cannot read: {err.strerror}"], where) from None
        except UnicodeDecodeError:
            raise ConfigError(["not UTF-8 text"], where) from None
        if not text.strip():
            # Prometheus' target files are written whole: an empty one is a write in progress or a truncation,
            # never a wish to watch nothing ([] says that).
            raise ConfigError(["empty: a file that lists no targets says [] (keeping its previous targets)"], where)
        try:
            return parse_yaml(text)  # YAML reads JSON too
        except yaml.YAMLError as err:
            raise ConfigError([f"not valid JSON or YAML: {yaml_problem(err)}"], where) from None


class HttpSource(_Source):
    """http_sd: the endpoint fetched every refresh_interval; an answer that fails or is refused keeps the old targets."""

    config: HttpSDConfig

    def __init__(self, key: str, config: HttpSDConfig, client: Client) -> None:
        super().__init__(key, config)
        self._client = client
        self._servers: list[ServerConfig] = []

    @property
    def servers(self) -> list[ServerConfig]:
        return list(self._servers)

    async def refresh(self) -> bool:
        where = self.key  # never the URL: its query may carry a token
        try:
            servers = servers_from_groups(await self._fetch(where), self.config, where)
        except ConfigError as err:
            self._done(False)
            log.warning("discovery_refused", source=self.key, error=str(err), kept_targets=len(self._servers))
            return False
        changed = servers != self._servers
        self._servers = servers
        self._done(True)
        if changed:
            log.info("discovery_fetched", source=self.key, targets=len(servers))
        return changed

    async def _fetch(self, where: str) -> Any:
        timeout = self.config.timeout or HTTP_SD_TIMEOUT
        try:
            return await Fetcher(self._client, MAX_SD_BYTES).get_json(self.config.url, headers={}, timeout=timeout)
        except HttpStatusFailure as failure:
            raise ConfigError([f"HTTP {failure.status}"], where) from None
        except ProbeFailure as failure:
            problem = {Reason.BODY_TOO_LARGE: f"answer larger than {MAX_SD_BYTES} bytes", Reason.INVALID_JSON: "not JSON"}
            raise ConfigError([problem.get(failure.reason, f"cannot fetch: {failure.reason.value}")], where) from None


class Discovery:
    """Every discovery source of the config; `on_change` runs whenever the servers they give change."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._sources: list[_Source] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._client = new_client()

    def configure(self, settings: Settings) -> None:
        """Adopt a (re)loaded config; a source whose config is unchanged keeps its servers."""
        def kept(key: str, config: object) -> _Source | None:
            return next((s for s in self._sources if s.key == key and s.config == config), None)

        sources: list[_Source] = []
        for index, config in enumerate(settings.file_sd_configs):
            key = f"file_sd[{index}]"
            sources.append(kept(key, config) or FileSource(key, config))
        for index, http in enumerate(settings.http_sd_configs):
            key = f"http_sd[{index}]"
            sources.append(kept(key, http) or HttpSource(key, http, self._client))
        self._sources = sources

    def servers(self, taken: Iterable[str] = ()) -> list[ServerConfig]:
        """The discovered servers, in source order; a name already taken (a static server, an earlier source) is skipped."""
        seen = set(taken)
        found = []
        for source in self._sources:
            for server in source.servers:
                if server.name not in seen:
                    seen.add(server.name)
                    found.append(server)
        return found

    def status(self) -> tuple[SourceStatus, ...]:
        return tuple(source.status() for source in self._sources)

    async def refresh_all(self) -> bool:
        changed = False
        for source in self._sources:
            changed = await self._refresh(source) or changed
        return changed

    async def _refresh(self, source: _Source) -> bool:
        try:
            return await source.refresh()
        except Exception as err:  # noqa: BLE001 - a surprise in one source must not stop discovery
            source._done(False)
            log.error("discovery_failed", source=source.key, error=f"{err.__class__.__name__}: {str(err)[:200]}")
            return False

    def start(self) -> None:
        """Refresh each source on its own interval until stop()."""
        self._stop_tasks()
        self._tasks = [asyncio.ensure_future(self._loop(source)) for source in self._sources]

    async def _loop(self, source: _Source) -> None:
        while True:
            await asyncio.sleep(source.config.refresh_interval)
            if await self._refresh(source):
                self._on_change()

    def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()


def _target(url: str) -> tuple[str, dict[str, str]]:
    """("host:port", the labels a Prometheus job needs to scrape its /metrics) from a server's base URL."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    labels: dict[str, str] = {}
    if parts.scheme == "https":
        labels["__scheme__"] = "https"
    if parts.path.strip("/"):
        labels["__metrics_path__"] = parts.path.rstrip("/") + "/metrics"
    return f"{host}:{port}", labels


def targets_out(states: Iterable[ServerState], verdict: str | None = None) -> list[dict[str, Any]]:
    """Discovery out: the watched llama-servers as Prometheus http_sd target groups, so a job scrapes their own /metrics.

    A server gives one group with its `server` and static labels. A router gives one per loaded model, with `model`,
    `__param_model` and `__param_autoload: "false"`, so the scrape reaches that model and never loads one (a router's
    own /metrics needs a model). `verdict` keeps only the servers (router models) with that verdict.
    """
    groups = []
    for state in states:
        target, scrape = _target(state.config.url)
        base = {"server": state.config.name, **state.config.labels, **scrape}
        for key, model in state.models.items():
            if verdict is not None and model.decision.verdict.value != verdict:
                continue
            if state.router:
                if not model.loaded:
                    continue
                labels = {**base, "model": key, "__param_model": key, "__param_autoload": "false"}
            else:
                labels = {**base, **({"model": key} if key else {})}
            groups.append({"targets": [target], "labels": labels})
    return groups
