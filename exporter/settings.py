"""Configuration: a YAML file plus SPECWATCH_* environment overrides, validated all at once."""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from exporter.probe.canary import Endpoint

DEFAULT_SERVER_URL = "http://127.0.0.1:8080"
RESERVED_LABELS = frozenset({"server", "endpoint", "source", "reason", "version", "job", "instance"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class ConfigError(Exception):
    """Every problem found in one configuration, reported together."""

    def __init__(self, problems: list[str], source: str = "configuration") -> None:
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid {source} ({count}):\n{lines}")


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


Duration = Annotated[float, BeforeValidator(parse_duration)]


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    url: str
    labels: dict[str, str] = Field(default_factory=dict)
    api_key_file: Path | None = None
    api_key_env: str | None = None
    model: str | None = None
    timeout: Duration | None = None

    _api_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        # Errors name only scheme and host: a pasted URL may carry a key in its query or userinfo.
        parts = urlsplit(url.strip())
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
        return url.strip().rstrip("/")

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        bad = [k for k in labels if not _LABEL_NAME.match(k) or k.startswith("__")]
        if bad:
            raise ValueError(f"invalid label name(s) {sorted(bad)}: use [a-zA-Z_][a-zA-Z0-9_]*")
        reserved = sorted(set(labels) & RESERVED_LABELS)
        if reserved:
            raise ValueError(f"label name(s) {reserved} are reserved by specwatch")
        return labels

    @model_validator(mode="after")
    def _load_key(self) -> ServerConfig:
        if self.api_key_file and self.api_key_env:
            raise ValueError("set api_key_file or api_key_env, not both")
        key: str | None = None
        if self.api_key_file is not None:
            try:
                key = self.api_key_file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise ValueError(f"api_key_file {str(self.api_key_file)!r} cannot be read: {err.strerror}") from None
            except UnicodeDecodeError:
                raise ValueError(f"api_key_file {str(self.api_key_file)!r} is not UTF-8 text") from None
            if not key:
                raise ValueError(f"api_key_file {str(self.api_key_file)!r} is empty")
        elif self.api_key_env is not None:
            key = os.environ.get(self.api_key_env, "").strip()
            if not key:
                raise ValueError(f"environment variable {self.api_key_env!r} (api_key_env) is unset or empty")
        if key is not None and any(ch.isspace() or not ch.isprintable() for ch in key):
            raise ValueError("the API key contains whitespace or control characters")
        self._api_key = SecretStr(key) if key is not None else None
        return self

    @property
    def api_key(self) -> SecretStr | None:
        return self._api_key


def _default_servers() -> list[ServerConfig]:
    return [ServerConfig(name="local", url=DEFAULT_SERVER_URL)]


_yaml_path: ContextVar[Path | None] = ContextVar("specwatch_yaml_path", default=None)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECWATCH_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    servers: list[ServerConfig] = Field(default_factory=_default_servers)
    poll_interval: Duration = 15.0
    canary_interval: Duration = 60.0
    poll_timeout: Duration = 5.0
    canary_timeout: Duration = 30.0
    canary_tokens: int = Field(default=8, ge=4, le=512)
    """Tokens per canary on a model that does not speculate (per /slots): enough for a draft model to show fill-ins."""
    canary_tokens_speculating: int = Field(default=32, ge=4, le=512)
    """Tokens per canary on a model that speculates, or may (/slots off): n-gram types draft only in longer answers."""
    canary_endpoints: list[Endpoint] = Field(default_factory=lambda: list(Endpoint))
    max_concurrency: int = Field(default=64, ge=1, le=10_000)
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    shard: str | None = None

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
        duplicates = _duplicate_names(data)
        try:
            settings = handler(data)
        except ValidationError as err:
            raise ConfigError(_describe(err, data) + duplicates) from None
        if duplicates:
            raise ConfigError(duplicates)
        if settings.poll_timeout >= settings.poll_interval:
            raise ConfigError([
                f"poll_timeout ({settings.poll_timeout}s) must be shorter than poll_interval ({settings.poll_interval}s)"
            ])
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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _yaml_path.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def timeout_for(self, server: ServerConfig, *, canary: bool) -> float:
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
            problems.append(f"servers[{index}].name: {name!r} is already used by servers[{seen[name]}]; names must be unique")
        else:
            seen[name] = index
    return problems


def _describe(err: ValidationError, data: Any) -> list[str]:
    servers = data.get("servers") if isinstance(data, dict) else None
    problems = []
    for item in err.errors(include_url=False, include_input=False):
        loc = item["loc"]
        where = ""
        for part in loc:
            if isinstance(part, int):
                where += f"[{part}]"
                if loc[:1] == ("servers",) and where.count("[") == 1 and isinstance(servers, list):
                    name = servers[part].get("name") if part < len(servers) and isinstance(servers[part], dict) else None
                    if isinstance(name, str):
                        where += f" ({name})"
            else:
                where += ("." if where else "") + str(part)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(f"{where or 'config'}: {message}")
    return problems


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


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from `path` (YAML) and the environment; raises ConfigError listing every problem."""
    source = "configuration"
    if path is not None:
        source = f"config file {str(path)!r}"
        raw = read_yaml(path, source)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(["the top level must be a mapping of keys such as servers:, poll_interval:"], source)
    token = _yaml_path.set(path)
    try:
        return Settings(**overrides)
    except ConfigError as err:
        raise ConfigError(err.problems, source) from None
    finally:
        _yaml_path.reset(token)
