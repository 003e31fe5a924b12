"""The pytest plugin: `pytest --specwatch URL` runs no test unless the servers an eval reads have real logprobs."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only pytest loads this module (the `pytest11` entry point), so pytest is importable here; nothing else of
# specwatch imports it. Everything of specwatch itself is imported when asked for: an installed plugin that is not
# asked for costs a suite nothing but its options.
import pytest

if TYPE_CHECKING:
    from specwatch.gate.ask import AskReport
    from specwatch.gate.check import CheckReport
    from specwatch.settings.schema import ServerConfig

EXIT_NOT_REAL = 11
"""The session did not start: a selected server serves fill-ins or speculates unproven (`specwatch check` exits 1)."""
EXIT_UNCHECKED = 12
"""The session did not start: a selected server could not be checked (`specwatch check` exits 2)."""
# `check`'s codes plus ten: pytest's own run from 0 to 6 (6, too many warnings, came with pytest 9) and mean tests
# failed (1) or a session interrupted (2); these say a gate refused, and keep "not real" apart from "could not tell".

GROUP = "specwatch"


@dataclass(frozen=True)
class _Option:
    flag: str
    ini: str
    kind: str
    """One of: list (a repeatable flag; whitespace-separated in the ini), text, path (relative to the ini's folder)."""
    metavar: str
    help: str

    @property
    def dest(self) -> str:
        return self.ini


OPTIONS = (
    _Option("--specwatch", "specwatch", "list", "URL",
            "canary this llama-server before the session (repeatable); no test runs unless it is clean"),
    _Option("--specwatch-exporter", "specwatch_exporter", "list", "URL",
            "ask this running specwatch for the verdicts it holds instead (repeatable: shards and replicas)"),
    _Option("--specwatch-server", "specwatch_server", "list", "NAME",
            "with --specwatch-exporter: a server the suite reads from, by its configured name (repeatable: any of them)"),
    _Option("--specwatch-label", "specwatch_label", "list", "KEY=VALUE",
            "with --specwatch-exporter: select servers by label (repeatable: all must match)"),
    _Option("--specwatch-model", "specwatch_model", "text", "ID", "one model of a router (default: every loaded model)"),
    _Option("--specwatch-api-key-env", "specwatch_api_key_env", "text", "VAR",
            "environment variable holding the servers' API key (never give a key on the command line)"),
    _Option("--specwatch-api-key-file", "specwatch_api_key_file", "path", "FILE", "file holding the servers' API key"),
    _Option("--specwatch-endpoint", "specwatch_endpoint", "list", "NAME",
            "endpoint to canary (repeatable; default: all); fewer endpoints check less of what an eval may read"),
    _Option("--specwatch-tokens", "specwatch_tokens", "text", "N",
            "tokens per canary, 4 to 512 (default 48, as check); shorter proves less: see specwatch check --help"),
    _Option("--specwatch-timeout", "specwatch_timeout", "text", "DURATION", "per request, e.g. 30s (default 60s)"),
    _Option("--specwatch-exporter-username", "specwatch_exporter_username", "text", "USER",
            "basic auth user of the exporter's --web-config"),
    _Option("--specwatch-exporter-password-file", "specwatch_exporter_password_file", "path", "FILE",
            "file holding that user's password"),
    _Option("--specwatch-exporter-ca-file", "specwatch_exporter_ca_file", "path", "FILE",
            "CA that signed the exporter's TLS certificate"),
    _Option("--specwatch-exporter-cert-file", "specwatch_exporter_cert_file", "path", "FILE",
            "client certificate, when the exporter asks for one"),
    _Option("--specwatch-exporter-key-file", "specwatch_exporter_key_file", "path", "FILE", "its key"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "specwatch: run no test against servers that serve fill-in logprobs")
    for option in OPTIONS:
        if option.kind == "list":
            group.addoption(option.flag, action="append", dest=option.dest, metavar=option.metavar, help=option.help)
        else:
            group.addoption(option.flag, dest=option.dest, metavar=option.metavar, help=option.help)
        parser.addini(option.ini, f"{option.help} (as {option.flag})", type="args" if option.kind == "list" else "string",
                      default=[] if option.kind == "list" else "")


@dataclass(frozen=True)
class Defaults:
    """What the command line and the ini asked for: the session gate's targets, and every check's defaults."""

    urls: tuple[str, ...] = ()
    exporters: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    model: str | None = None
    api_key_env: str | None = None
    api_key_file: Path | None = None
    endpoints: tuple[str, ...] = ()
    tokens: int = 48
    timeout: float = 60.0
    exporter_username: str | None = None
    exporter_password_file: Path | None = None
    exporter_ca_file: Path | None = None
    exporter_cert_file: Path | None = None
    exporter_key_file: Path | None = None


def _given(config: pytest.Config) -> dict[str, Any]:
    """Each option given, on the command line (which wins) or in the ini; nothing for an option given in neither."""
    found: dict[str, Any] = {}
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    for option in OPTIONS:
        value = config.getoption(option.dest)
        from_ini = value in (None, [])
        if from_ini:
            value = config.getini(option.ini)
        if value in (None, "", []):
            continue
        if option.kind == "list":
            found[option.dest] = [str(v) for v in value]
        elif option.kind == "path":
            found[option.dest] = base / value if from_ini else Path(value)
        else:
            found[option.dest] = str(value).strip()
    return found


class GateError(Exception):
    """Options or a check that cannot be used: a bad URL, an unreadable key file, an unknown endpoint."""


def server_config(url: str, defaults: Defaults) -> ServerConfig:
    """The server `specwatch check URL` would canary with these options; the same refusals, as a GateError."""
    from specwatch.gate.options import check_server

    try:
        return check_server(url, api_key_file=defaults.api_key_file, api_key_env=defaults.api_key_env, model=defaults.model)
    except ValueError as err:
        raise GateError(f"cannot check {url}: {err}") from None


def defaults_of(given: Mapping[str, Any]) -> Defaults:
    """The options as `specwatch check` would take them, or a GateError saying what is wrong."""
    from specwatch.gate.options import (
        DEFAULT_TIMEOUT,
        DEFAULT_TOKENS,
        duration_argument,
        exporter_flags_problem,
        label_argument,
        tokens_argument,
    )
    from specwatch.probe.canary import Endpoint

    try:
        tokens = tokens_argument(given["specwatch_tokens"]) if "specwatch_tokens" in given else DEFAULT_TOKENS
        timeout = duration_argument(given["specwatch_timeout"]) if "specwatch_timeout" in given else DEFAULT_TIMEOUT
        labels = tuple(label_argument(text) for text in given.get("specwatch_label", []))
    except (ValueError, argparse.ArgumentTypeError) as err:
        raise GateError(str(err)) from None
    endpoints = tuple(given.get("specwatch_endpoint", []))
    unknown = [e for e in endpoints if e not in {m.value for m in Endpoint}]
    if unknown:
        raise GateError(f"unknown endpoint {', '.join(unknown)}; choose from {', '.join(e.value for e in Endpoint)}")
    exporters = tuple(given.get("specwatch_exporter", []))
    selecting = [o.flag for o in OPTIONS if o.dest in ("specwatch_server", "specwatch_label") and o.dest in given]
    if selecting and not exporters:
        raise GateError(f"{', '.join(selecting)} select what --specwatch-exporter reports: give --specwatch-exporter URL too")
    problem = exporter_flags_problem(
        key_file=given.get("specwatch_exporter_key_file"), cert_file=given.get("specwatch_exporter_cert_file"),
        password_file=given.get("specwatch_exporter_password_file"), username=given.get("specwatch_exporter_username"))
    if problem is not None:
        raise GateError(_flags_named_here(problem))
    return Defaults(
        urls=tuple(given.get("specwatch", [])), exporters=exporters, servers=tuple(given.get("specwatch_server", [])),
        labels=labels, model=given.get("specwatch_model"), api_key_env=given.get("specwatch_api_key_env"),
        api_key_file=given.get("specwatch_api_key_file"), endpoints=endpoints, tokens=tokens, timeout=timeout,
        exporter_username=given.get("specwatch_exporter_username"),
        exporter_password_file=given.get("specwatch_exporter_password_file"),
        exporter_ca_file=given.get("specwatch_exporter_ca_file"),
        exporter_cert_file=given.get("specwatch_exporter_cert_file"),
        exporter_key_file=given.get("specwatch_exporter_key_file"),
    )


@dataclass
class Outcome:
    """One check's result: what was checked, its report (a CheckReport or an AskReport), and the text people read."""

    target: str
    report: CheckReport | AskReport
    text: str

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def clean(self) -> bool:
        return self.report.exit_code == 0


_CHECK_FLAGS = re.compile(r"(?<![\w-])--(?=(?:api-key-file|api-key-env|exporter|model|tokens|endpoint|server|label)\b)")


def _flags_named_here(text: str) -> str:
    """`specwatch check`'s words with this plugin's flags: "give --api-key-file" becomes "give --specwatch-api-key-file"."""
    return _CHECK_FLAGS.sub("--specwatch-", text)


def _run(coro: Any) -> Any:
    """Run a check to its end, from a plain test or fixture or from one inside a running event loop (pytest-asyncio)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass
class Gate:
    """The checks of one session, each made once: the same target with the same options gets the same outcome."""

    defaults: Defaults
    done: dict[tuple[Any, ...], Outcome] = field(default_factory=dict)

    def canary(self, url: str, defaults: Defaults) -> Outcome:
        """`specwatch check URL`: poll the server and canary it on every endpoint asked for."""
        key = ("canary", url, defaults.model, defaults.api_key_env, defaults.api_key_file, defaults.endpoints,
               defaults.tokens, defaults.timeout)
        if key not in self.done:
            self.done[key] = self._canary(url, defaults)
        return self.done[key]

    def _canary(self, url: str, defaults: Defaults) -> Outcome:
        from specwatch.gate.check import render_text, run_check
        from specwatch.gate.options import logs_to_stderr
        from specwatch.probe.canary import Endpoint

        server = server_config(url, defaults)
        endpoints = [Endpoint(e) for e in defaults.endpoints] if defaults.endpoints else list(Endpoint)
        with logs_to_stderr():
            report = _run(run_check(server, endpoints=endpoints, tokens=defaults.tokens, timeout=defaults.timeout))
        return Outcome(url, report, _flags_named_here(render_text(report)))

    def ask(self, exporters: Sequence[str], defaults: Defaults) -> Outcome:
        """`specwatch check --exporter URL`: the verdicts a running specwatch holds for the selection; no canary."""
        key = ("ask", tuple(exporters), defaults.servers, defaults.labels, defaults.model, defaults.exporter_username,
               defaults.exporter_password_file, defaults.exporter_ca_file, defaults.exporter_cert_file,
               defaults.exporter_key_file, defaults.timeout)
        if key not in self.done:
            self.done[key] = self._ask(exporters, defaults)
        return self.done[key]

    def _ask(self, urls: Sequence[str], defaults: Defaults) -> Outcome:
        from specwatch.gate.ask import Exporter, ask, render_text
        from specwatch.gate.options import logs_to_stderr

        exporters = [Exporter(url, defaults.exporter_username, defaults.exporter_password_file, defaults.exporter_ca_file,
                              defaults.exporter_cert_file, defaults.exporter_key_file) for url in urls]
        with logs_to_stderr():
            report = _run(ask(exporters, servers=list(defaults.servers), labels=list(defaults.labels), model=defaults.model,
                              timeout=defaults.timeout))
        selection = [f"server={s}" for s in defaults.servers] + [f"label={k}={v}" for k, v in defaults.labels]
        if defaults.model:
            selection.append(f"model={defaults.model}")
        target = f"{', '.join(urls)} ({', '.join(selection) or 'everything it watches'})"
        return Outcome(target, report, _flags_named_here(render_text(report)))

    def session(self) -> list[Outcome]:
        """Every check the command line and the ini ask for before the session."""
        outcomes = [self.canary(url, self.defaults) for url in self.defaults.urls]
        if self.defaults.exporters:
            outcomes.append(self.ask(self.defaults.exporters, self.defaults))
        return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """The session's exit code: the worst verdict decides, as it does for `specwatch check`."""
    from specwatch.verdict import Decision, Verdict, worst

    _, decision = worst((o.target, Decision(Verdict(o.verdict), "")) for o in outcomes)
    return {0: 0, 1: EXIT_NOT_REAL}.get(decision.verdict.exit_code, EXIT_UNCHECKED)


GATE_KEY = pytest.StashKey["Gate"]()


def pytest_configure(config: pytest.Config) -> None:
    given = _given(config)
    # Inert unless asked: with no specwatch option, nothing of specwatch is imported and nothing is checked.
    defaults = Defaults()
    if given:
        try:
            defaults = defaults_of(given)
            for url in defaults.urls:
                server_config(url, defaults)
        except GateError as err:
            raise pytest.UsageError(f"specwatch: {err}") from None
    config.stash[GATE_KEY] = Gate(defaults)


def pytest_report_header(config: pytest.Config) -> list[str]:
    defaults = config.stash[GATE_KEY].defaults
    targets = list(defaults.urls) + [f"exporter {url}" for url in defaults.exporters]
    return [f"specwatch: checks before the session: {', '.join(targets)}"] if targets else []


# Before collection, in pytest_sessionstart: a suite's test modules may load data sets or models when they are
# collected, and none of that should happen against a server whose logprobs are not real. A wrapper, so pytest's own
# header is printed first. The gate is skipped where no test runs: an xdist worker (its controller gates the session
# once) and --collect-only (editors list tests with it, and must not canary servers or fail while one is down).
@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session) -> Iterator[None]:
    yield
    config = session.config
    gate = config.stash[GATE_KEY]
    if not (gate.defaults.urls or gate.defaults.exporters) or hasattr(config, "workerinput"):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(text: str) -> None:
        if reporter is not None:
            for line in text.splitlines():
                reporter.write_line(line)

    if config.option.collectonly:
        say("specwatch: not checked: --collect-only runs no test")
        return
    try:
        outcomes = gate.session()
    except GateError as err:  # a key file or variable that went away since pytest_configure
        raise pytest.UsageError(f"specwatch: {err}") from None
    code = exit_code(outcomes)
    for outcome in outcomes:
        say(f"specwatch: {outcome.target}: {outcome.text if not outcome.clean else outcome.text.splitlines()[0]}")
    if code:
        refused = ", ".join(f"{o.target} is {o.verdict}" for o in outcomes if not o.clean)
        why = "logprobs are not real" if code == EXIT_NOT_REAL else "could not check"
        pytest.exit(f"specwatch: no test ran (exit {code}): {why}: {refused}", returncode=code)


class SpecwatchGate:
    """The `specwatch` fixture: check a server (or ask an exporter) from a fixture; a verdict other than clean fails.

    Each target is checked once per session with the same options; the options on the command line and in the ini
    (API key, endpoints, tokens, timeout, exporter credentials) are the defaults.
    """

    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    def __call__(
        self, url: str | None = None, *, exporter: str | Sequence[str] | None = None, servers: Sequence[str] = (),
        labels: Mapping[str, str] | None = None, model: str | None = None, api_key_env: str | None = None,
        api_key_file: str | Path | None = None, endpoints: Sequence[str] | None = None, tokens: int | None = None,
    ) -> CheckReport | AskReport:
        """Canary `url`, or ask `exporter` about `servers` and `labels`; the report when clean, else pytest.fail."""
        if (url is None) == (exporter is None):
            raise TypeError("specwatch fixture: give a server's URL to canary it, or exporter=URL to ask a running specwatch")
        base = self._gate.defaults
        changes: dict[str, Any] = {"model": model if model is not None else base.model}
        try:
            if url is not None:
                if servers or labels:
                    raise TypeError("specwatch fixture: servers and labels select what an exporter reports: give exporter=URL")
                if api_key_env is not None or api_key_file is not None:
                    changes.update(api_key_env=api_key_env, api_key_file=Path(api_key_file) if api_key_file else None)
                if endpoints is not None:
                    changes["endpoints"] = tuple(defaults_of({"specwatch_endpoint": list(endpoints)}).endpoints)
                if tokens is not None:
                    changes["tokens"] = defaults_of({"specwatch_tokens": str(tokens)}).tokens
                outcome = self._gate.canary(url, replace(base, **changes))
            else:
                urls = [exporter] if isinstance(exporter, str) else list(exporter or ())
                changes.update(servers=tuple(servers), labels=tuple((labels or {}).items()))
                outcome = self._gate.ask(urls, replace(base, **changes))
        except GateError as err:
            problem = str(err)
        else:
            problem = None
        if problem is not None:  # failed outside the except clause: the error is the message, not a chain of two
            pytest.fail(f"specwatch fixture: {problem}", pytrace=False)
        if not outcome.clean:
            pytest.fail(f"specwatch: {outcome.target} is {outcome.verdict}: do not score against it\n{outcome.text}",
                        pytrace=False)
        return outcome.report


# Named after the plugin, as pytest-mock's `mocker` or pytest-httpserver's `httpserver` are.
@pytest.fixture(scope="session")
def specwatch(pytestconfig: pytest.Config) -> SpecwatchGate:
    """Check servers from a fixture: `specwatch("http://judge:8080")` returns the report, or fails when not clean."""
    return SpecwatchGate(pytestconfig.stash[GATE_KEY])
