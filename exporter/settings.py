"""Configuration: a YAML file plus SPECWATCH_* environment overrides, validated all at once."""

from __future__ import annotations

import difflib
import os
import re
import threading
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from exporter.probe.canary import Endpoint

log = structlog.get_logger("specwatch")

DEFAULT_SERVER_URL = "http://127.0.0.1:8080"
DEFAULT_SERVER_NAME = "local"
ENV_PREFIX = "SPECWATCH_"
CONFIG_FILE_ENV = "SPECWATCH_CONFIG_FILE"
INTERVAL_FLOOR = 1.0
TIMEOUT_FLOOR = 0.1
DEFAULT_POLL_INTERVAL, DEFAULT_CANARY_INTERVAL = 15.0, 60.0
DEFAULT_POLL_TIMEOUT, DEFAULT_CANARY_TIMEOUT = 5.0, 30.0
# Labels specwatch's own series carry, and the target labels the alert rules aggregate away (instance, pod).
RESERVED_LABELS = frozenset({"server", "model", "endpoint", "source", "reason", "outcome", "verdict", "build", "version",
                             "job", "instance", "pod"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# What a pasted endpoint URL ends in; specwatch needs the server's root and adds these itself.
_ENDPOINT_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/completion", "/v1", "/health", "/props", "/slots")
NO_SERVERS = (
    "lists no servers: put the fleet under servers:, e.g. servers: [{name: eval-a, url: 'http://10.0.0.5:8080'}] "
    f"(a config that watches nothing is refused, so a truncated file cannot unwatch a fleet; without any config "
    f"specwatch watches {DEFAULT_SERVER_URL})"
)


class ConfigError(Exception):
    """Every problem found in one configuration, reported together, with warnings that may explain them."""

    def __init__(self, problems: list[str], source: str = "configuration", warnings: Iterable[str] = ()) -> None:
        self.problems = problems
        self.source = source
        self.warnings = tuple(warnings)
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  - {p}" for p in problems)
        notes = "".join(f"\n  note: {w}" for w in self.warnings)
        super().__init__(f"invalid {source} ({count}):\n{lines}{notes}")


def parse_duration(value: Any) -> float:
    """Seconds from '15s', '1m30s', '500ms' or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration such as '15s' is required")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"{value!r} is not a duration (use e.g. 500ms, 15s, 1m30s)") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError("a duration such as '15s' is required")
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"duration must be positive and finite, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """'10ms', '1.5s', '2m', '1h': how a duration reads back in a message."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _at_least_interval_floor(seconds: float) -> float:
    if seconds < INTERVAL_FLOOR:
        raise ValueError(
            f"{format_duration(seconds)} is below the {format_duration(INTERVAL_FLOOR)} floor: a llama-server is probed "
            f"at most once a second; use {format_duration(INTERVAL_FLOOR)} or more"
        )
    return seconds


def parse_timeout(value: Any) -> float:
    """A duration no shorter than the timeout floor (a request cannot finish in less)."""
    seconds = parse_duration(value)
    if seconds < TIMEOUT_FLOOR:
        raise ValueError(
            f"{format_duration(seconds)} is below the {format_duration(TIMEOUT_FLOOR)} floor for timeouts: "
            "no llama-server answers that fast"
        )
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
Interval = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_at_least_interval_floor)]
Timeout = Annotated[float, BeforeValidator(parse_timeout)]


@dataclass
class _KeyFile:
    stamp: tuple[int, int, int, int]
    key: SecretStr
    problem: str | None = None


def _file_stamp(path: Path) -> tuple[int, int, int, int]:
    status = os.stat(path)
    return status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size


def _checked_key(key: str, source: str) -> str:
    if not key:
        raise ValueError(f"{source} is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(f"{source}: the API key contains whitespace or control characters")
    return key


def _read_key_file(path: Path) -> str:
    where = f"api_key_file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    return _checked_key(text, where)


class KeyFiles:
    """API keys read from files and read again when a file changes, as Prometheus does with credentials files.

    A file's (device, inode, mtime, size) decides whether it changed, so a thousand servers sharing one key file
    cost a stat each per request, and a rotated key (written in place or swapped in by a symlink, as Kubernetes
    does) is used from the next request. While a rotation leaves the file missing or empty, the last good key stays
    in use and one line says so. No key ever reaches a log.
    """

    def __init__(self) -> None:
        self._files: dict[Path, _KeyFile] = {}
        self._lock = threading.Lock()

    def load(self, path: Path) -> None:
        """Read `path` now; raises ValueError saying what is wrong with it (a config naming it is then refused)."""
        try:
            stamp = _file_stamp(path)
        except OSError as err:
            raise ValueError(f"api_key_file {str(path)!r} cannot be read: {err.strerror}") from None
        known = self._files.get(path)
        if known is not None and known.stamp == stamp and known.problem is None:
            return  # a thousand servers sharing one file read it once
        key = SecretStr(_read_key_file(path))
        with self._lock:
            self._files[path] = _KeyFile(stamp, key)

    def get(self, path: Path) -> SecretStr | None:
        """The current key of `path`, or the last good one while the file is missing, empty or unreadable."""
        known = self._files.get(path)
        try:
            stamp = _file_stamp(path)
        except OSError as err:
            return self._keep(path, known, None, f"cannot be read: {err.strerror}")
        if known is not None and known.stamp == stamp:
            return known.key
        try:
            key = SecretStr(_read_key_file(path))
        except ValueError as err:
            return self._keep(path, known, stamp, str(err).removeprefix(f"api_key_file {str(path)!r}").strip(" :"))
        with self._lock:
            self._files[path] = _KeyFile(stamp, key)
        if known is not None and (known.problem is not None or known.key != key):
            log.info("api_key_file_changed", file=str(path), why="the file changed; its key is used from now on")
        return key

    def _keep(
        self, path: Path, known: _KeyFile | None, stamp: tuple[int, int, int, int] | None, problem: str
    ) -> SecretStr | None:
        if known is None:
            return None
        if known.problem != problem:
            log.warning("api_key_file_unusable", file=str(path), problem=problem,
                        action="still sending the last key read from it until the file holds a key again")
        with self._lock:
            # The bad file's stamp is remembered, so it is not read again until it changes.
            self._files[path] = _KeyFile(stamp or known.stamp, known.key, problem)
        return known.key


KEY_FILES = KeyFiles()


def _server_root(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def checked_key_env(name: str | None, info: ValidationInfo) -> str | None:
    """An api_key_env that names a set, usable variable, and comes without api_key_file."""
    if name is None:
        return None
    if info.data.get("api_key_file") is not None:
        raise ValueError("set api_key_file or api_key_env, not both")
    key = os.environ.get(name, "").strip()
    if not key:
        raise ValueError(f"environment variable {name!r} (api_key_env) is unset or empty")
    _checked_key(key, f"environment variable {name!r} (api_key_env)")
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
    # (a bad URL) fails, so one message lists a missing key file too.
    @field_validator("api_key_file")
    @classmethod
    def _check_key_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            KEY_FILES.load(path)
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

    _env_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        # Errors name only scheme, host and port: a pasted URL may carry a key in its path, query or userinfo.
        text = url.strip()
        if "://" not in text:
            guess = urlsplit(f"http://{text}")
            if guess.hostname and not (guess.username or guess.password):
                bare = _server_root(f"http://{text}").removeprefix("http://")
                raise ValueError(f"{bare!r} has no scheme: add http:// (or https://), e.g. 'http://{bare}'")
            raise ValueError("not a URL: use http://HOST:PORT, e.g. 'http://10.0.0.5:8080'")
        parts = urlsplit(text)
        shown = f"{parts.scheme}://{parts.hostname or ''}"
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{shown!r} is not an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError(f"{shown!r} has no host")
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
                f"{_server_root(text)!r} ends in {ending}: give the server's root ({root}); specwatch calls "
                "/health, /props, /slots, /completion and /v1/chat/completions itself"
            )
        return text.rstrip("/")

    @model_validator(mode="after")
    def _keep_env_key(self) -> ServerConfig:
        if self.api_key_env is not None:
            self._env_key = SecretStr(os.environ.get(self.api_key_env, "").strip())
        return self

    @property
    def api_key(self) -> SecretStr | None:
        """The key to send: a key file's current content (re-read when it changes), or the api_key_env value."""
        if self.api_key_file is not None:
            return KEY_FILES.get(self.api_key_file)
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


@dataclass
class _Loading:
    """What load_settings knows while Settings validates: the file's mapping and the keys passed in directly."""

    file_data: dict[str, Any] | None = None
    init_keys: frozenset[str] = frozenset()
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)


_loading: ContextVar[_Loading | None] = ContextVar("specwatch_loading", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The config file's mapping, parsed once by load_settings: a pipe (--config /dev/stdin) cannot be read twice."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def env_variables_for(key: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The SPECWATCH_* variables that set top-level `key`, whole or nested (SPECWATCH_SERVERS__...)."""
    environ = os.environ if environ is None else environ
    name = f"{ENV_PREFIX}{key}".upper()
    return sorted(v for v in environ if v.upper() == name or v.upper().startswith(f"{name}__"))


def _origin(key: str) -> str:
    """`key`, followed by the environment variable that set it when one did: an override is not the file's fault."""
    loading = _loading.get()
    if loading is None or key in loading.init_keys:
        return key
    variables = env_variables_for(key, loading.environ)
    return f"{key} (from environment variable {', '.join(variables)})" if variables else key


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
        origin = _origin("servers")
        return NO_SERVERS if origin == "servers" else f"{origin}: {NO_SERVERS}"
    return None


def _lenient_duration(value: Any) -> float | None:
    try:
        return parse_duration(value)
    except ValueError:
        return None


# (timeout, its interval, the timeout's default, the interval's default)
_TIMED = (
    ("poll_timeout", "poll_interval", DEFAULT_POLL_TIMEOUT, DEFAULT_POLL_INTERVAL),
    ("canary_timeout", "canary_interval", DEFAULT_CANARY_TIMEOUT, DEFAULT_CANARY_INTERVAL),
)


def _timeouts(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` with default timeouts capped by their intervals, and the explicit timeouts longer than theirs.

    As in Prometheus: a timeout left unset is its default capped by its interval, so `poll_interval: 2s` alone is
    valid; only a timeout the user set longer than its interval is an error.
    """
    data = dict(data)
    problems = []
    intervals: dict[str, float | None] = {}
    for timeout_key, interval_key, default_timeout, default_interval in _TIMED:
        interval = _lenient_duration(data.get(interval_key, default_interval))
        intervals[interval_key] = interval
        if timeout_key not in data:
            if interval is not None and interval >= INTERVAL_FLOOR:
                data[timeout_key] = min(default_timeout, interval)
            continue
        timeout = _lenient_duration(data[timeout_key])
        if timeout is not None and interval is not None and timeout > interval:
            problems.append(
                f"{_origin(timeout_key)}: {format_duration(timeout)} is longer than {_origin(interval_key)} "
                f"{format_duration(interval)}: a probe must end before the next one is due; shorten {timeout_key} "
                f"(or leave it unset: it defaults to {format_duration(default_timeout)}, capped by {interval_key})"
            )
    servers = data.get("servers")
    for index, server in enumerate(servers if isinstance(servers, list) else []):
        if not isinstance(server, dict) or "timeout" not in server:
            continue
        timeout = _lenient_duration(server["timeout"])
        # A server's timeout replaces both poll_timeout and canary_timeout: it must fit both intervals.
        longer = [(k, i) for k, i in intervals.items() if timeout is not None and i is not None and timeout > i]
        if longer:
            where = _server_where(index, server)
            shortest = min(longer, key=lambda pair: pair[1])
            problems.append(
                f"{where}.timeout: {format_duration(timeout)} is longer than {_origin(shortest[0])} "  # type: ignore[arg-type]
                f"{format_duration(shortest[1])}: it replaces poll_timeout and canary_timeout for this server, so it "
                "must end before the next poll is due"
            )
    return data, problems


def _server_where(index: int, server: Any) -> str:
    name = server.get("name") if isinstance(server, dict) else getattr(server, "name", None)
    return f"{_origin('servers')}[{index}]" + (f" ({name})" if isinstance(name, str) else "")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

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
    def _report_everything(cls, data: Any, handler: Any) -> Settings:
        # Field errors stop pydantic before cross-field checks; run those on the raw input so one
        # message lists every problem.
        loading = _loading.get()
        problems = _duplicate_names(data)
        empty = missing_fleet(data, config_file=loading is not None and loading.file_data is not None)
        if empty:
            problems.append(empty)
        if isinstance(data, dict):
            data, timing = _timeouts(data)
            problems += timing
            if "servers" not in data and (data.get("file_sd_configs") or data.get("http_sd_configs")):
                data = {**data, "servers": []}  # discovery alone: no default target beside it
        try:
            settings = handler(data)
        except ValidationError as err:
            raise ConfigError(_describe(err, data) + problems) from None
        if problems:
            raise ConfigError(problems)
        settings._default_target = isinstance(data, dict) and "servers" not in data and not settings.discovers
        return settings

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: arguments, then the environment, then the file.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        loading = _loading.get()
        if loading is not None and loading.file_data is not None:
            sources.append(_FileSource(settings_cls, loading.file_data))
        return tuple(sources)

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


def _duplicate_names(data: Any) -> list[str]:
    servers = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(servers, list):
        return []
    seen: dict[str, int] = {}
    problems = []
    for index, server in enumerate(servers):
        name = server.get("name") if isinstance(server, dict) else getattr(server, "name", None)
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                f"{_origin('servers')}[{index}].name: {name!r} is already used by servers[{seen[name]}]; names must be unique"
            )
        else:
            seen[name] = index
    return problems


# Key problems already name their key ("api_key_file '/x' cannot be read"): they are shown at the server's level.
_SELF_NAMING = frozenset({"api_key_file", "api_key_env"})


# Settings that only the command line sets: a config file naming one is told where it goes.
_COMMAND_LINE_ONLY = {"listen": "--listen", "web_config": "--web-config", "log_level": "--log-level",
                      "log_format": "--log-format", "config": "--config"}


def _unknown_key_hint(loc: tuple[Any, ...]) -> str:
    key = str(loc[-1])
    if len(loc) == 1 and key in _COMMAND_LINE_ONLY:
        return f": it is a command-line flag ({_COMMAND_LINE_ONLY[key]}), not a config key"
    if key == "api_key":
        return ": a key is never written in the config; use api_key_file or api_key_env"
    known = (Settings.model_fields if len(loc) == 1 else
             ServerConfig.model_fields if len(loc) == 3 and loc[0] == "servers" else None)
    guess = difflib.get_close_matches(key, list(known or ()), n=1, cutoff=0.75)
    return f" (did you mean {guess[0]}?)" if guess else ""


def _describe(err: ValidationError, data: Any) -> list[str]:
    servers = data.get("servers") if isinstance(data, dict) else None
    problems = []
    for item in err.errors(include_url=False, include_input=False):
        loc = item["loc"]
        if item["type"] == "value_error" and len(loc) == 3 and loc[0] == "servers" and loc[2] in _SELF_NAMING:
            loc = loc[:2]
        where = ""
        for position, part in enumerate(loc):
            if isinstance(part, int):
                where += f"[{part}]"
                if position == 1 and loc[0] == "servers" and isinstance(servers, list) and part < len(servers):
                    name = servers[part].get("name") if isinstance(servers[part], dict) else None
                    if isinstance(name, str):
                        where += f" ({name})"
            elif position == 0:
                where = _origin(str(part))
            else:
                where += f".{part}"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key" + _unknown_key_hint(loc)
        problems.append(f"{where or 'config'}: {message}")
    return problems


def environment_warnings(api_key_envs: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> list[str]:
    """A line for each SPECWATCH_* variable that sets nothing (a misspelling is otherwise silently ignored)."""
    environ = os.environ if environ is None else environ
    settings = {f"{ENV_PREFIX}{name}".upper() for name in Settings.model_fields}
    known = settings | {CONFIG_FILE_ENV}
    # A server's api_key_env may be any name, SPECWATCH_LLAMA_KEY included.
    exempt = {name.upper() for name in api_key_envs}
    warnings = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in exempt:
            continue
        if any(upper.startswith(f"{name}__") for name in settings):
            continue
        # Matched without the shared prefix, which would make every name look alike.
        suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
        guess = difflib.get_close_matches(upper.split("__")[0].removeprefix(ENV_PREFIX), suffixes, n=1, cutoff=0.75)
        hint = (f"did you mean {ENV_PREFIX}{guess[0]}?" if guess
                else "settings are SPECWATCH_ and a config key, e.g. SPECWATCH_POLL_INTERVAL")
        warnings.append(f"environment variable {variable} is not a specwatch setting and is ignored; {hint}")
    return warnings


def yaml_problem(err: yaml.YAMLError) -> str:
    """What and where, without PyYAML's quote of the offending line: that line may hold a secret."""
    problem = getattr(err, "problem", None) or "syntax error"
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml(path: Path, source: str) -> Any:
    """The parsed YAML file, or a ConfigError that names `source` and never quotes the file."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError([f"cannot read: {err.strerror}"], source) from None
    except UnicodeDecodeError:
        raise ConfigError(["not UTF-8 text"], source) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"not valid YAML: {yaml_problem(err)}"], source) from None


def _key_envs(data: Any) -> list[str]:
    servers = data.get("servers") if isinstance(data, dict) else None
    return [s["api_key_env"] for s in servers or [] if isinstance(s, dict) and isinstance(s.get("api_key_env"), str)]


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from `path` (YAML, read once) and the environment; raises ConfigError listing every problem.

    The environment overrides the file. With neither a file nor SPECWATCH_SERVERS, the default target is watched
    (Settings.default_target says so); a file that lists no servers is refused.
    """
    source = "configuration"
    data: dict[str, Any] | None = None
    if path is not None:
        source = f"config file {str(path)!r}"
        raw = read_yaml(path, source)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(["the top level must be a mapping of keys such as servers:, poll_interval:"], source)
        data = raw or {}
    warnings = environment_warnings(_key_envs(data) + _key_envs(overrides))
    token = _loading.set(_Loading(file_data=data, init_keys=frozenset(overrides)))
    try:
        settings = Settings(**overrides)
    except ConfigError as err:
        raise ConfigError(err.problems, _described_source(source, err.problems), warnings) from None
    except ValueError as err:
        # pydantic-settings' own error for a SPECWATCH_ value that is not JSON where a list or mapping is expected.
        match = re.search(r'field "(\w+)"', str(err))
        key = match[1] if match else "?"
        variables = ", ".join(env_variables_for(key)) or f"{ENV_PREFIX}{key.upper()}"
        problem = (f"{key} (from environment variable {variables}): not valid JSON; lists and mappings are given as "
                   f"JSON, e.g. SPECWATCH_SERVERS='[{{\"name\": \"a\", \"url\": \"http://10.0.0.5:8080\"}}]'")
        raise ConfigError([problem], _described_source(source, [problem]), warnings) from None
    finally:
        _loading.reset(token)
    settings._warnings = tuple(warnings)
    return settings


def _described_source(source: str, problems: list[str]) -> str:
    if any("(from environment variable" in p for p in problems):
        return f"{source} and SPECWATCH_* environment" if source != "configuration" else "SPECWATCH_* environment"
    return source
