"""The gate in Python: check a server, or ask a running specwatch, as `specwatch check` does, in the caller's process."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .. import loop
from ..endpoints import Endpoint
from ..settings.targets import ServerConfig
from .ask import AskReport, Exporter
from .ask import ask as ask_exporters
from .check import CheckReport, run_check
from .options import (
    API,
    DEFAULT_TIMEOUT,
    DEFAULT_TOKENS,
    check_server,
    duration_argument,
    endpoint_argument,
    exporter_flags_problem,
    label_argument,
    tokens_argument,
)

__all__ = ["aask", "acheck", "ask", "check"]

T = TypeVar("T")
PathLike = str | os.PathLike[str]


def check(
    url: str, *, api_key_file: PathLike | None = None, api_key_env: str | None = None, model: str | None = None,
    endpoints: Iterable[str] | None = None, tokens: int = DEFAULT_TOKENS, timeout: float | str = DEFAULT_TIMEOUT,
    load: bool = False,
) -> CheckReport:
    """`specwatch check URL`: the report `--json` prints (`.as_json()`), from plain code or inside a running event loop."""
    return run_to_end(_Check.of(url, api_key_file, api_key_env, model, endpoints, tokens, timeout, load).run())


async def acheck(
    url: str, *, api_key_file: PathLike | None = None, api_key_env: str | None = None, model: str | None = None,
    endpoints: Iterable[str] | None = None, tokens: int = DEFAULT_TOKENS, timeout: float | str = DEFAULT_TIMEOUT,
    load: bool = False,
) -> CheckReport:
    """`check` for a harness that already runs an event loop."""
    return await _Check.of(url, api_key_file, api_key_env, model, endpoints, tokens, timeout, load).run()


def ask(
    exporter_url: str | Iterable[str], *, labels: Mapping[str, str] | None = None, servers: Iterable[str] = (),
    model: str | None = None, username: str | None = None, password_file: PathLike | None = None,
    ca_file: PathLike | None = None, cert_file: PathLike | None = None, key_file: PathLike | None = None,
    timeout: float | str = DEFAULT_TIMEOUT,
) -> AskReport:
    """`specwatch check --exporter URL...` (one URL or several): the verdicts daemons hold for the selection, no canary."""
    return run_to_end(_Ask.of(exporter_url, labels, servers, model, username, (password_file, ca_file, cert_file, key_file),
                        timeout).run())


async def aask(
    exporter_url: str | Iterable[str], *, labels: Mapping[str, str] | None = None, servers: Iterable[str] = (),
    model: str | None = None, username: str | None = None, password_file: PathLike | None = None,
    ca_file: PathLike | None = None, cert_file: PathLike | None = None, key_file: PathLike | None = None,
    timeout: float | str = DEFAULT_TIMEOUT,
) -> AskReport:
    """`ask` for a harness that already runs an event loop."""
    return await _Ask.of(exporter_url, labels, servers, model, username, (password_file, ca_file, cert_file, key_file),
                         timeout).run()


@dataclass(frozen=True)
class _Check:
    """A check's arguments as `specwatch check` takes them, refused (before anything is sent) as it refuses them, naming the
    arguments."""

    server: ServerConfig
    endpoints: list[Endpoint]
    tokens: int
    timeout: float
    load: bool

    @classmethod
    def of(cls, url: str, api_key_file: PathLike | None, api_key_env: str | None, model: str | None,
           endpoints: str | Iterable[str] | None, tokens: int, timeout: float | str, load: bool) -> _Check:
        server = check_server(url, api_key_file=Path(api_key_file) if api_key_file is not None else None,
                              api_key_env=api_key_env, model=model)
        return cls(server, _endpoints(endpoints), _argument("tokens", tokens_argument, tokens),
                   _argument("timeout", duration_argument, timeout), load)

    def run(self) -> Coroutine[Any, Any, CheckReport]:
        return run_check(self.server, endpoints=self.endpoints, tokens=self.tokens, timeout=self.timeout, load=self.load,
                         spelling=API)


@dataclass(frozen=True)
class _Ask:
    """What `check --exporter` asks, refused (before anything is sent) as `check` refuses it, naming the arguments."""

    exporters: list[Exporter]
    servers: list[str]
    labels: list[tuple[str, str]]
    model: str | None
    timeout: float

    @classmethod
    def of(cls, urls: str | Iterable[str], labels: Mapping[str, str] | None, servers: str | Iterable[str],
           model: str | None, username: str | None, files: tuple[PathLike | None, ...], timeout: float | str) -> _Ask:
        exporters = _texts(urls)
        if not exporters:
            raise ValueError("give the URL of at least one specwatch daemon, e.g. 'http://specwatch:9824'")
        password_file, ca_file, cert_file, key_file = (Path(f) if f is not None else None for f in files)
        given = {"exporter_username": username, "exporter_password_file": password_file, "exporter_cert_file": cert_file,
                 "exporter_key_file": key_file}
        problem = exporter_flags_problem(given, API)
        if problem is not None:
            raise ValueError(problem)
        selected = [_argument("labels", label_argument, f"{key}={value}") for key, value in (labels or {}).items()]
        return cls([Exporter(url, username, password_file, ca_file, cert_file, key_file) for url in exporters],
                   _texts(servers), selected, model, _argument("timeout", duration_argument, timeout))

    def run(self) -> Coroutine[Any, Any, AskReport]:
        return ask_exporters(self.exporters, servers=self.servers, labels=self.labels, model=self.model,
                             timeout=self.timeout, spelling=API)


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a check to its end from plain code, or from code inside a running event loop (in a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return loop.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="specwatch") as pool:
        return pool.submit(loop.run, coroutine).result()


def _argument(name: str, parse: Callable[[str], T], value: object) -> T:
    """`check`'s parser of a flag on a value given in Python: its refusal as a ValueError, after the argument's name as
    argparse puts the flag's."""
    try:
        return parse(value if isinstance(value, str) else str(value))
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"{name}: {err}") from None


def _texts(value: str | Iterable[str]) -> list[str]:
    """One name or several: a lone string is one, not its characters."""
    return [value] if isinstance(value, str) else list(value)


def _endpoints(names: str | Iterable[str] | None) -> list[Endpoint]:
    """The endpoints asked for by name, every one when none is."""
    wanted = _texts(names) if names is not None else []
    return [Endpoint(_argument("endpoints", endpoint_argument, name)) for name in wanted] or list(Endpoint)
