"""What a server, or a discovery source of servers, may say in the config: address, labels, key, timeout, peer group."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationInfo, field_validator, model_validator

from ..apikey import checked_key, read_key_file
from ..durations import Interval, Timeout
from ..problems import NamesItsKey

LLAMA_SERVER_PORT = 9931
"""Where llama-server listens when started without --port, from build PORT_CHANGED_IN_BUILD (upstream PR 26508,
common/common.h); LLAMA_SERVER_PORT_BEFORE before it. The one home of these numbers in the package."""
LLAMA_SERVER_PORT_BEFORE = 8080
"""Where llama-server listened when started without --port, up to build PORT_CHANGED_IN_BUILD - 1."""
PORT_CHANGED_IN_BUILD = 11521
"""The first llama.cpp build whose llama-server listens on LLAMA_SERVER_PORT by default."""
PORTS_BY_BUILD = (f"llama-server listens on {LLAMA_SERVER_PORT} from build {PORT_CHANGED_IN_BUILD} and on "
                  f"{LLAMA_SERVER_PORT_BEFORE} before")
"""Where llama-server listens by default, build by build, in the words every message and help text uses."""

# Labels specwatch's own series carry, and the target labels the alert rules aggregate away (instance, pod).
RESERVED_LABELS = frozenset({"server", "model", "endpoint", "source", "reason", "outcome", "verdict", "build", "version",
                             "job", "instance", "pod", "peer_group", "file", "ftype", "size", "n_params", "n_vocab",
                             "n_ctx_train", "n_embd"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HOST = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")
"""A host name, an IPv4 address, or an IPv6 one (urlsplit has taken its brackets off), with its zone."""
# What a pasted endpoint URL ends in; specwatch needs the server's root and adds these itself.
_ENDPOINT_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/completion", "/v1", "/health", "/props", "/slots")

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
    out (specwatch.core.peers.OPT_OUT)."""

    _env_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        # Errors quote the URL as given, but for what may carry a key: a path of its own, a query, userinfo.
        text = url.strip()
        if "://" not in text:
            guess = urlsplit(f"http://{text}")
            if guess.hostname and not (guess.username or guess.password):
                root = _server_root(f"http://{text}")
                if urlsplit(root).port is None:
                    root += f":{LLAMA_SERVER_PORT}"  # 'http://HOST' alone is refused: the example gives a port
                bare = root.removeprefix("http://")
                given = _as_given(f"http://{text}").removeprefix("http://")
                raise ValueError(f"{given!r} has no scheme: add http:// (or https://), e.g. 'http://{bare}'")
            raise ValueError(f"not a URL: use http://HOST:PORT, e.g. 'http://10.0.0.5:{LLAMA_SERVER_PORT}'")
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
        if parts.scheme == "http" and parts.port is None:  # a bad port was refused above
            # http's own default, 80, is where no llama-server listens unless told to: never assumed. An https:// URL
            # without a port is a TLS front end (443), so it stays accepted.
            example = _server_root(text) + f":{LLAMA_SERVER_PORT}" + ("/..." if path else "")
            raise ValueError(
                f"{_as_given(text)!r} gives no port: {PORTS_BY_BUILD}; give the port, e.g. {example!r} "
                "(an explicit ':80' for a front end on port 80)"
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
