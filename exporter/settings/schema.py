"""The configuration's schema: servers, discovery sources, timings; every problem of one config is reported at once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..apikey import checked_key, read_key_file
from ..durations import INTERVAL_FLOOR, Interval, Timeout, format_duration, lenient_duration
from ..endpoints import Endpoint
from ..peers import DEFAULT_CONFIRMATIONS, DEFAULT_TOLERANCE
from ..problems import Loc, NamesItsKey, refusing_also

DEFAULT_SERVER_URL = "http://127.0.0.1:8080"
DEFAULT_SERVER_NAME = "local"
DEFAULT_POLL_INTERVAL, DEFAULT_CANARY_INTERVAL = 15.0, 60.0
DEFAULT_POLL_TIMEOUT, DEFAULT_CANARY_TIMEOUT = 5.0, 30.0
# Labels specwatch's own series carry, and the target labels the alert rules aggregate away (instance, pod).
RESERVED_LABELS = frozenset({"server", "model", "endpoint", "source", "reason", "outcome", "verdict", "build", "version",
                             "job", "instance", "pod", "peer_group", "file", "ftype", "size", "n_params", "n_vocab",
                             "n_ctx_train", "n_embd"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HOST = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")
"""A host name, an IPv4 address, or an IPv6 one (urlsplit has taken its brackets off), with its zone."""
# What a pasted endpoint URL ends in; specwatch needs the server's root and adds these itself.
_ENDPOINT_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/completion", "/v1", "/health", "/props", "/slots")
NO_SERVERS = (
    "lists no servers: put the fleet under servers:, e.g. servers: [{name: eval-a, url: 'http://10.0.0.5:8080'}] "
    f"(a config that watches nothing is refused, so a truncated file cannot unwatch a fleet; without any config "
    f"specwatch watches {DEFAULT_SERVER_URL})"
)


@dataclass(frozen=True)
class Provenance:
    """Where the mapping Settings validates came from, passed as pydantic's validation context by load_settings.

    Without it (Settings(**kw), model_validate without a context) the mapping is taken as given in code: no file,
    no environment.
    """

    config_file: bool = False
    """Whether a config file was read: one that lists no servers is refused rather than watching the default."""
    from_env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The top-level keys SPECWATCH_* variables set, with those variables: an override is not the file's fault."""

    def origin(self, key: str) -> str:
        """`key`, followed by the environment variables that set it when some did."""
        variables = self.from_env.get(key)
        return f"{key} (from environment variable {', '.join(variables)})" if variables else key


def _provenance(info: ValidationInfo) -> Provenance:
    return info.context if isinstance(info.context, Provenance) else Provenance()


def _server_root(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _as_given(url: str) -> str:
    """The URL as given, for an error; a path other than an endpoint's (it may carry a key) is shown as /...."""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.query or parts.fragment:
        return _server_root(url)
    path = parts.path.rstrip("/")
    if not path or path in _ENDPOINT_SUFFIXES:
        return url
    return _server_root(url) + "/..." + next((s for s in _ENDPOINT_SUFFIXES if path.endswith(s)), "")


def checked_key_env(name: str | None, info: ValidationInfo) -> str | None:
    """An api_key_env that names a set, usable variable, and comes without api_key_file."""
    if name is None:
        return None
    if info.data.get("api_key_file") is not None:
        raise NamesItsKey("set api_key_file or api_key_env, not both")
    key = os.environ.get(name, "").strip()
    if not key:
        raise NamesItsKey(f"environment variable {name!r} (api_key_env) is unset or empty")
    try:
        checked_key(key, f"environment variable {name!r} (api_key_env)")
    except ValueError as err:
        raise NamesItsKey(str(err)) from None
    return name


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Static labels as specwatch accepts them: valid Prometheus names, not internal, not one of specwatch's own."""
    problems = []
    internal = sorted(k for k in labels if k.startswith("__"))
    if internal:
        problems.append(f"label name(s) {internal} start with '__', which Prometheus reserves for its own labels")
    invalid = sorted(k for k in labels if not _LABEL_NAME.match(k))
    if invalid:
        problems.append(f"invalid label name(s) {invalid}: use [a-zA-Z_][a-zA-Z0-9_]*")
    reserved = sorted(set(labels) & RESERVED_LABELS)
    if reserved:
        problems.append(f"label name(s) {reserved} are reserved by specwatch")
    if problems:
        raise ValueError("; ".join(problems))
    return labels


class _KeyedTargets(BaseModel):
    """What watching a server needs beside its address: static labels, an API key source, a timeout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    labels: dict[str, str] = Field(default_factory=dict)
    api_key_file: Path | None = None
    api_key_env: str | None = None
    timeout: Timeout | None = None

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)

    # The key sources are checked by field validators, not after the model: those run even when another field
    # (a bad URL) fails, so one message lists a missing key file too. The key read is dropped: the runner's KeyFiles
    # reads the file when a probe needs it, so validating a config changes nothing outside it.
    @field_validator("api_key_file")
    @classmethod
    def _check_key_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                read_key_file(path)
            except ValueError as err:
                raise NamesItsKey(str(err)) from None
        return path

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, name: str | None, info: ValidationInfo) -> str | None:
        return checked_key_env(name, info)


class ServerConfig(_KeyedTargets):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    url: str
    model: str | None = None
    peer_group: str | None = Field(default=None, min_length=1, max_length=200)
    """The replicas this server's model is compared with; by default those reporting the same model name. "none" opts
    out (specwatch.peers.OPT_OUT)."""

    _env_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        # Errors quote the URL as given, but for what may carry a key: a path of its own, a query, userinfo.
        text = url.strip()
        if "://" not in text:
            guess = urlsplit(f"http://{text}")
            if guess.hostname and not (guess.username or guess.password):
                bare = _server_root(f"http://{text}").removeprefix("http://")
                given = _as_given(f"http://{text}").removeprefix("http://")
                raise ValueError(f"{given!r} has no scheme: add http:// (or https://), e.g. 'http://{bare}'")
            raise ValueError("not a URL: use http://HOST:PORT, e.g. 'http://10.0.0.5:8080'")
        parts = urlsplit(text)
        shown = f"{parts.scheme}://{parts.hostname or ''}"
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{shown!r} is not an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError(f"{shown!r} has no host")
        if not _HOST.fullmatch(parts.hostname):
            raise ValueError(f"{shown!r}: {parts.hostname[:80]!r} is not a host name or address")
        if parts.username or parts.password:
            raise ValueError("credentials in the URL are not allowed; use api_key_file or api_key_env")
        if parts.query or parts.fragment:
            raise ValueError(f"{shown!r} must not carry a query or fragment; use api_key_file or api_key_env for keys")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as err:
            raise ValueError(f"{shown!r}: {err}") from None
        path = parts.path.rstrip("/")
        ending = next((s for s in _ENDPOINT_SUFFIXES if path.endswith(s)), None)
        if ending is not None:
            root = _server_root(text) if path == ending else f"the URL without its {ending} ending"
            raise ValueError(
                f"{_as_given(text)!r} ends in {ending}: give the server's root ({root}); specwatch calls "
                "/props, /slots, /completion, /v1/completions and /v1/chat/completions itself"
            )
        return text.rstrip("/")

    @model_validator(mode="after")
    def _keep_env_key(self) -> ServerConfig:
        if self.api_key_env is not None:
            self._env_key = SecretStr(os.environ.get(self.api_key_env, "").strip())
        return self

    @property
    def env_key(self) -> SecretStr | None:
        """The api_key_env variable's value when this config was loaded; a key file is read by the runner's KeyFiles."""
        return self._env_key


class _DiscoveredServers(_KeyedTargets):
    """What every target a discovery source finds is watched with: scheme, static labels, API key, timeout."""

    scheme: Literal["http", "https"] = "http"


class FileSDConfig(_DiscoveredServers):
    """Prometheus file_sd target files (JSON or YAML lists of {targets, labels}), re-read when they change."""

    files: list[str] = Field(min_length=1)
    """Paths or globs (`*` in the file name), as in Prometheus' file_sd_configs."""
    refresh_interval: Interval = 10.0
    """How often the files are checked for changes (a stat each): cheap, so short."""


class HttpSDConfig(_DiscoveredServers):
    """A Prometheus http_sd endpoint (a JSON list of {targets, labels}), fetched every refresh_interval."""

    url: str
    refresh_interval: Interval = 60.0

    @field_validator("url")
    @classmethod
    def _check_sd_url(cls, url: str) -> str:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{_server_root(url)!r} is not an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("credentials in the URL are not allowed")
        return url.strip()


def missing_fleet(data: Any, *, config_file: bool) -> str | None:
    """Why a configuration watches nothing, or None: the one place that decides whether a fleet is configured.

    Static `servers` and discovery sources (file_sd_configs, http_sd_configs) count. With no configuration at all the
    default target is watched; a config file, or SPECWATCH_SERVERS, that lists neither servers nor a discovery
    source is refused, so an emptied or truncated file never unwatches a fleet on reload.
    """
    if not isinstance(data, dict):
        return None
    if data.get("file_sd_configs") or data.get("http_sd_configs"):
        return None  # discovery supplies the servers; an empty discovery result is a ticket, not a refusal
    if "servers" not in data:
        return NO_SERVERS if config_file else None
    servers = data["servers"]
    if servers is None or (isinstance(servers, list | tuple) and not servers):
        return NO_SERVERS
    return None


# (timeout, its interval, the timeout's default, the interval's default)
_TIMED = (
    ("poll_timeout", "poll_interval", DEFAULT_POLL_TIMEOUT, DEFAULT_POLL_INTERVAL),
    ("canary_timeout", "canary_interval", DEFAULT_CANARY_TIMEOUT, DEFAULT_CANARY_INTERVAL),
)


def _timeouts(data: dict[str, Any], provenance: Provenance) -> tuple[dict[str, Any], list[tuple[Loc, str]]]:
    """`data` with default timeouts capped by their intervals, and the explicit timeouts longer than theirs.

    As in Prometheus: a timeout left unset is its default capped by its interval, so `poll_interval: 2s` alone is
    valid; only a timeout the user set longer than its interval is an error.
    """
    data = dict(data)
    origin = provenance.origin
    problems: list[tuple[Loc, str]] = []
    intervals: dict[str, float | None] = {}
    for timeout_key, interval_key, default_timeout, default_interval in _TIMED:
        interval = lenient_duration(data.get(interval_key, default_interval))
        intervals[interval_key] = interval
        if timeout_key not in data:
            if interval is not None and interval >= INTERVAL_FLOOR:
                data[timeout_key] = min(default_timeout, interval)
            continue
        timeout = lenient_duration(data[timeout_key])
        if timeout is not None and interval is not None and timeout > interval:
            problems.append(((timeout_key,),
                f"{format_duration(timeout)} is longer than {origin(interval_key)} {format_duration(interval)}: a probe "
                f"must end before the next one is due; shorten {timeout_key} (or leave it unset: it defaults to "
                f"{format_duration(default_timeout)}, capped by {interval_key})"
            ))
    servers = data.get("servers")
    for index, server in enumerate(servers if isinstance(servers, list) else []):
        if not isinstance(server, dict) or "timeout" not in server:
            continue
        timeout = lenient_duration(server["timeout"])
        # A server's timeout replaces both poll_timeout and canary_timeout: it must fit both intervals.
        longer = [(k, i) for k, i in intervals.items() if timeout is not None and i is not None and timeout > i]
        if longer:
            key, interval = min(longer, key=lambda pair: pair[1])
            problems.append((("servers", index, "timeout"),
                f"{format_duration(timeout)} is longer than {origin(key)} {format_duration(interval)}: it replaces "  # type: ignore[arg-type]
                "poll_timeout and canary_timeout for this server, so it must end before the next poll is due"
            ))
    return data, problems


def _duplicate_names(data: Any) -> list[tuple[Loc, str]]:
    servers = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(servers, list):
        return []
    seen: dict[str, int] = {}
    problems: list[tuple[Loc, str]] = []
    for index, server in enumerate(servers):
        name = server.get("name") if isinstance(server, dict) else getattr(server, "name", None)
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append((("servers", index, "name"),
                             f"{name!r} is already used by servers[{seen[name]}]; names must be unique"))
        else:
            seen[name] = index
    return problems


class Settings(BaseModel):
    """The whole configuration. load_settings builds it from the file and the environment; Settings(**kw) is just kw."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: list[ServerConfig] = Field(
        default_factory=lambda: [ServerConfig(name=DEFAULT_SERVER_NAME, url=DEFAULT_SERVER_URL)]
    )
    poll_interval: Interval = DEFAULT_POLL_INTERVAL
    canary_interval: Interval = DEFAULT_CANARY_INTERVAL
    poll_timeout: Timeout = DEFAULT_POLL_TIMEOUT
    """Defaults to 5s capped by poll_interval."""
    canary_timeout: Timeout = DEFAULT_CANARY_TIMEOUT
    """Defaults to 30s capped by canary_interval."""
    canary_tokens: int = Field(default=8, ge=4, le=512)
    """Tokens per canary on a model that does not speculate (per /slots): enough for a draft model to show fill-ins."""
    canary_tokens_speculating: int = Field(default=32, ge=4, le=512)
    """Tokens per canary on a model that speculates, or may (/slots off): n-gram types draft only in longer answers."""
    canary_endpoints: list[Endpoint] = Field(default_factory=lambda: list(Endpoint))
    max_concurrency: int = Field(default=64, ge=1, le=10_000)
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    peer_tolerance: float = Field(default=DEFAULT_TOLERANCE, gt=0, le=100)
    """How far a real token's logprob, or an alternative's, may move between peers with the same tokens."""
    peer_confirmations: int = Field(default=DEFAULT_CONFIRMATIONS, ge=1, le=100)
    """Fresh canary answers in a row that must disagree with the peers' before it counts (a fingerprint counts at once)."""
    shard: str | None = None
    file_sd_configs: list[FileSDConfig] = Field(default_factory=list)
    http_sd_configs: list[HttpSDConfig] = Field(default_factory=list)

    _default_target: bool = PrivateAttr(default=False)
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def default_target(self) -> bool:
        """True when nothing configured a fleet and the default target (llama-server's default address) is watched."""
        return self._default_target

    @property
    def warnings(self) -> tuple[str, ...]:
        """Things worth a line in the log that do not make the configuration invalid (a misspelled variable)."""
        return self._warnings

    @field_validator("canary_endpoints")
    @classmethod
    def _some_endpoints(cls, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not endpoints:
            raise ValueError("at least one canary endpoint is required")
        return list(dict.fromkeys(endpoints))

    @field_validator("shard")
    @classmethod
    def _check_shard(cls, shard: str | None) -> str | None:
        if shard is not None:
            parse_shard(shard)
        return shard

    @model_validator(mode="wrap")
    @classmethod
    def _report_everything(cls, data: Any, handler: Any, info: ValidationInfo) -> Settings:
        # Field errors stop pydantic before cross-field checks; run those on the raw input so one
        # error lists every problem.
        provenance = _provenance(info)
        problems = _duplicate_names(data)
        empty = missing_fleet(data, config_file=provenance.config_file)
        if empty:
            problems.append((("servers",) if "servers" in provenance.from_env else (), empty))
        if isinstance(data, dict):
            data, timing = _timeouts(data, provenance)
            problems += timing
            if "servers" not in data and (data.get("file_sd_configs") or data.get("http_sd_configs")):
                data = {**data, "servers": []}  # discovery alone: no default target beside it
        settings = refusing_also(handler, data, problems, cls.__name__)
        settings._default_target = isinstance(data, dict) and "servers" not in data and not settings.discovers
        return settings

    @property
    def discovers(self) -> bool:
        """Whether discovery sources supply servers beside (or instead of) the static ones."""
        return bool(self.file_sd_configs or self.http_sd_configs)

    def timeout_for(self, server: ServerConfig, *, canary: bool) -> float:
        """The one place a probe gets its timeout: the server's own `timeout`, else poll_timeout or canary_timeout."""
        if server.timeout is not None:
            return server.timeout
        return self.canary_timeout if canary else self.poll_timeout


def parse_shard(text: str) -> tuple[int, int]:
    """(index, count) from 'INDEX/COUNT' with 0 <= INDEX < COUNT."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"shard {text!r} must look like INDEX/COUNT, e.g. 0/3")
    index, count = int(match[1]), int(match[2])
    if count < 1 or index >= count:
        raise ValueError(f"shard {text!r}: need 0 <= INDEX < COUNT")
    return index, count
