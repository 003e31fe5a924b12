"""The configuration's schema: the fleet's sources, timings, limits; every problem of one config is reported at once."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..durations import INTERVAL_FLOOR, Interval, Timeout, format_duration, lenient_duration
from ..endpoints import Endpoint
from ..problems import Loc, refusing_also
from .targets import (
    LLAMA_SERVER_PORT,
    LLAMA_SERVER_PORT_BEFORE,
    PORTS_BY_BUILD,
    FileSDConfig,
    HttpSDConfig,
    ServerConfig,
)

DEFAULT_SERVERS = tuple((f"local-{port}", f"http://127.0.0.1:{port}") for port in (LLAMA_SERVER_PORT, LLAMA_SERVER_PORT_BEFORE))
"""(name, url) of what is watched with no config at all: llama-server's default address of either build, since a
build from PORT_CHANGED_IN_BUILD listens on LLAMA_SERVER_PORT and one before on LLAMA_SERVER_PORT_BEFORE."""
DEFAULT_SERVER_URLS = tuple(url for _, url in DEFAULT_SERVERS)
DEFAULT_SERVERS_SAID = f"{' and '.join(DEFAULT_SERVER_URLS)}: started without --port, {PORTS_BY_BUILD}"
"""The default targets and why, as the help, the warnings and the refusal of an empty config say them."""
DEFAULT_POLL_INTERVAL, DEFAULT_CANARY_INTERVAL = 15.0, 60.0
DEFAULT_POLL_TIMEOUT, DEFAULT_CANARY_TIMEOUT = 5.0, 30.0
RETIRED = {
    "peer_tolerance": "replicas' answers are compared by a sequential test against the noise measured on the group",
    "peer_confirmations": "replicas' answers are compared by a sequential test against the noise measured on the group",
}
"""Keys of an older release that are read and ignored, each with why (a warning in the log, never a refusal)."""
NO_SERVERS = (
    "lists no servers: put the fleet under servers:, e.g. "
    f"servers: [{{name: eval-a, url: 'http://10.0.0.5:{LLAMA_SERVER_PORT}'}}] (a config that watches nothing is refused, so "
    f"a truncated file cannot unwatch a fleet; without any config specwatch watches {DEFAULT_SERVERS_SAID})"
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
        default_factory=lambda: [ServerConfig(name=name, url=url) for name, url in DEFAULT_SERVERS]
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
    peer_tolerance: float | None = None
    """Retired (RETIRED says why): accepted, ignored."""
    peer_confirmations: int | None = None
    """Retired (RETIRED says why): accepted, ignored."""
    shard: str | None = None
    peer_references: dict[str, Path] = Field(default_factory=dict)
    """Peer group -> a reference file (`specwatch reference`): the group is held to a trusted server's recorded answers,
    which names the odd member of a pair and catches a group that is all wrong alike."""
    peer_uniform: list[str] = Field(default_factory=list)
    """Peer groups whose replicas are deployed alike (one build, backend, KV cache type and set of numeric flags; slots,
    threads and load may differ): held to a lower noise floor (core.evidence.UNIFORM_FLOOR) while every member reports
    one build, so a weight change worth 0.03 nats to an eval is reported within a few answers; a replica deployed
    otherwise (a q8_0 KV cache) is reported too, in some tens of answers."""
    file_sd_configs: list[FileSDConfig] = Field(default_factory=list)
    http_sd_configs: list[HttpSDConfig] = Field(default_factory=list)

    _default_target: bool = PrivateAttr(default=False)
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def default_target(self) -> bool:
        """True when nothing configured a fleet and the default targets (DEFAULT_SERVERS) are watched."""
        return self._default_target

    @property
    def warnings(self) -> tuple[str, ...]:
        """Things worth a line in the log that do not make the configuration invalid (a misspelled variable)."""
        retired = tuple(f"{key} is no longer used ({why}): remove it" for key, why in RETIRED.items()
                        if getattr(self, key) is not None)
        return self._warnings + retired

    @field_validator("canary_endpoints")
    @classmethod
    def _some_endpoints(cls, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not endpoints:
            raise ValueError("at least one canary endpoint is required")
        return list(dict.fromkeys(endpoints))

    @field_validator("peer_uniform", mode="before")
    @classmethod
    def _uniform_is_a_list(cls, groups: Any) -> Any:
        if isinstance(groups, str):
            raise ValueError(f"a list of peer groups, e.g. peer_uniform: [{groups}]")
        return groups

    @field_validator("peer_uniform")
    @classmethod
    def _check_uniform(cls, groups: list[str]) -> list[str]:
        for group in groups:
            if not group.strip():
                raise ValueError("a peer group's name is not empty: list the groups as peer_group or the model name "
                                 "names them, e.g. peer_uniform: [gemma]")
        return list(dict.fromkeys(groups))

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
