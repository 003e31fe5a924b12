"""The pytest plugin: `pytest --specwatch URL` runs no test unless the servers an eval reads have real logprobs."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only pytest loads this module (the `pytest11` entry point), so pytest is importable here; nothing else of
# specwatch imports it. Of specwatch, only the table of options is imported when pytest loads the plugin (it is kept
# cheap to import); the rest when a check is asked for: an installed plugin that is not asked for costs a suite nothing
# but its options.
import pytest

from .options import (
    ASKING,
    DEFAULT_TIMEOUT,
    DEFAULT_TOKENS,
    OPTIONS,
    PLUGIN,
    Mode,
    Option,
    check_server,
    exporter_flags_problem,
    logs_to_stderr,
    selection_problem,
)

if TYPE_CHECKING:
    from ..settings.targets import ServerConfig
    from .ask import AskReport
    from .check import CheckReport

EXIT_NOT_REAL = 11
"""The session did not start: a selected server serves fill-ins or speculates unproven (`specwatch check` exits 1)."""
EXIT_UNCHECKED = 12
"""The session did not start: a selected server could not be checked (`specwatch check` exits 2)."""
# `check`'s codes plus ten: pytest's own run from 0 to 6 (6, too many warnings, came with pytest 9) and mean tests
# failed (1) or a session interrupted (2); these say a gate refused, and keep "not real" apart from "could not tell".

GROUP = "specwatch"
TARGETS = "specwatch"
"""The plugin's own option, `--specwatch URL`: the rest are the gate's, from the table that makes check's flags."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "specwatch: run no test against servers that serve fill-in logprobs")
    targets = "canary this llama-server before the session (repeatable); no test runs unless it is clean"
    group.addoption(f"--{TARGETS}", action="append", dest=TARGETS, metavar="URL", help=targets)
    parser.addini(TARGETS, f"{targets} (as --{TARGETS})", type="args", default=[])
    asking = parser.getgroup(f"{GROUP}-exporter", f"specwatch: {PLUGIN.say(ASKING)}")
    for option in OPTIONS:
        text = PLUGIN.say(option.help)
        where = asking if option.mode is Mode.EXPORTER else group
        if option.kind == "switch":
            where.addoption(option.plugin_flag, action="store_true", default=None, dest=option.ini, help=text)
            parser.addini(option.ini, f"{text} (as {option.plugin_flag})", type="bool", default=False)
            continue
        # No type and no choices here: the values are checked as `specwatch check` checks them, command line and ini
        # alike, in pytest_configure, so that a bad one is a specwatch usage error that says which option it was.
        metavar = option.metavar or "{" + ",".join(option.choices) + "}"
        where.addoption(option.plugin_flag, action="append" if option.repeatable else "store", dest=option.ini,
                        metavar=metavar, help=text)
        parser.addini(option.ini, f"{text} (as {option.plugin_flag})", type="args" if option.repeatable else "string",
                      default=[] if option.repeatable else "")


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
    load: bool = False
    endpoints: tuple[str, ...] = ()
    tokens: int = DEFAULT_TOKENS
    timeout: float = DEFAULT_TIMEOUT
    exporter_username: str | None = None
    exporter_password_file: Path | None = None
    exporter_ca_file: Path | None = None
    exporter_cert_file: Path | None = None
    exporter_key_file: Path | None = None


def _given(config: pytest.Config) -> dict[str, Any]:
    """Each option given, on the command line (which wins) or in the ini; nothing for an option given in neither."""
    found: dict[str, Any] = {}
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    for ini, kind in [(TARGETS, "list"), *((o.ini, o.kind) for o in OPTIONS)]:
        value = config.getoption(ini)
        from_ini = value in (None, [])
        if from_ini:
            value = config.getini(ini)
        if value in (None, "", [], False):
            continue
        if kind == "list":
            found[ini] = [str(v) for v in value]
        elif kind == "path":
            found[ini] = base / value if from_ini else Path(value)
        elif kind == "switch":
            found[ini] = True
        else:
            found[ini] = str(value).strip()
    return found


class GateError(Exception):
    """Options or a check that cannot be used: a bad URL, an unreadable key file, an unknown endpoint."""


def server_config(url: str, defaults: Defaults) -> ServerConfig:
    """The server `specwatch check URL` would canary with these options; the same refusals, as a GateError."""
    try:
        return check_server(url, api_key_file=defaults.api_key_file, api_key_env=defaults.api_key_env, model=defaults.model)
    except ValueError as err:
        raise GateError(f"cannot check {url}: {err}") from None


def _parsed(option: Option, value: Any) -> Any:
    """A value as `specwatch check` takes it: each of a repeatable option's values parsed, as a tuple."""
    if option.parse is None:
        return bool(value)
    if option.repeatable:
        return tuple(option.parse(v) for v in value)
    return option.parse(value)


def defaults_of(given: Mapping[str, Any]) -> Defaults:
    """The options as `specwatch check` would take them, or a GateError saying what is wrong."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.ini in given:
            try:
                values[option.dest] = _parsed(option, given[option.ini])
            except (ValueError, argparse.ArgumentTypeError) as err:
                raise GateError(str(err)) from None
    problem = selection_problem(values, PLUGIN) or exporter_flags_problem(values, PLUGIN)
    if problem is not None:
        raise GateError(problem)
    return Defaults(urls=tuple(given.get(TARGETS, [])), **values)


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


@dataclass
class Gate:
    """The checks of one session, each made once: the same target with the same options gets the same outcome."""

    defaults: Defaults
    done: dict[tuple[Any, ...], Outcome] = field(default_factory=dict)

    def canary(self, url: str, defaults: Defaults) -> Outcome:
        """`specwatch check URL`: poll the server and canary it on every endpoint asked for."""
        key = ("canary", url, defaults.model, defaults.api_key_env, defaults.api_key_file, defaults.load,
               defaults.endpoints, defaults.tokens, defaults.timeout)
        if key not in self.done:
            self.done[key] = self._canary(url, defaults)
        return self.done[key]

    def _canary(self, url: str, defaults: Defaults) -> Outcome:
        from ..endpoints import Endpoint
        from .api import run_to_end
        from .check import render_text, run_check

        server = server_config(url, defaults)
        endpoints = [Endpoint(e) for e in defaults.endpoints] if defaults.endpoints else list(Endpoint)
        with logs_to_stderr():
            report = run_to_end(run_check(server, endpoints=endpoints, tokens=defaults.tokens, timeout=defaults.timeout,
                                    load=defaults.load, spelling=PLUGIN))
        return Outcome(url, report, render_text(report))

    def ask(self, exporters: Sequence[str], defaults: Defaults) -> Outcome:
        """`specwatch check --exporter URL`: the verdicts a running specwatch holds for the selection; no canary."""
        key = ("ask", tuple(exporters), defaults.servers, defaults.labels, defaults.model, defaults.exporter_username,
               defaults.exporter_password_file, defaults.exporter_ca_file, defaults.exporter_cert_file,
               defaults.exporter_key_file, defaults.timeout)
        if key not in self.done:
            self.done[key] = self._ask(exporters, defaults)
        return self.done[key]

    def _ask(self, urls: Sequence[str], defaults: Defaults) -> Outcome:
        from .api import run_to_end
        from .ask import Exporter, ask, render_text

        exporters = [Exporter(url, defaults.exporter_username, defaults.exporter_password_file, defaults.exporter_ca_file,
                              defaults.exporter_cert_file, defaults.exporter_key_file) for url in urls]
        with logs_to_stderr():
            report = run_to_end(ask(exporters, servers=list(defaults.servers), labels=list(defaults.labels), model=defaults.model,
                              timeout=defaults.timeout, spelling=PLUGIN))
        selection = [f"server={s}" for s in defaults.servers] + [f"label={k}={v}" for k, v in defaults.labels]
        if defaults.model:
            selection.append(f"model={defaults.model}")
        target = f"{', '.join(urls)} ({', '.join(selection) or 'everything it watches'})"
        return Outcome(target, report, render_text(report))

    def session(self) -> list[Outcome]:
        """Every check the command line and the ini ask for before the session."""
        outcomes = [self.canary(url, self.defaults) for url in self.defaults.urls]
        if self.defaults.exporters:
            outcomes.append(self.ask(self.defaults.exporters, self.defaults))
        return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """The session's exit code: the worst verdict decides, as it does for `specwatch check`."""
    from ..core.verdict import Decision, Verdict, worst

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
        """Canary `url` (a CheckReport), or ask `exporter` about `servers` and `labels` (an AskReport); returned when clean."""
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
    """specwatch(url) returns its CheckReport, (exporter=url) its AskReport, if clean: .as_json() is what check --json prints."""
    return SpecwatchGate(pytestconfig.stash[GATE_KEY])
