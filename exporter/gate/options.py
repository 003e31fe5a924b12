"""The gate's options and their rules, in one table that makes both `specwatch check`'s flags and the pytest plugin's."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The pytest plugin builds its options from this module when pytest loads it, in every suite of a machine where
# specwatch is installed: what it imports at the top must stay cheap (the endpoints' names import nothing of specwatch).
from ..endpoints import Endpoint

if TYPE_CHECKING:
    from ..settings.targets import ServerConfig

ENDPOINTS = tuple(e.value for e in Endpoint)
DEFAULT_TOKENS = 48
DEFAULT_TIMEOUT = 60.0
ASKING = "asking a running specwatch instead (sends no canary; for servers behind a load balancer, {details})"
"""The options of the exporter form, as `specwatch check --help` and `pytest --help` group them (`Spelling.say` it)."""


class Mode(StrEnum):
    """Which way of checking an option belongs to: canarying a server, asking an exporter, or both."""

    CANARY = "canary"
    EXPORTER = "exporter"
    BOTH = "both"


@dataclass(frozen=True)
class Spelling:
    """How one front end names the gate's options: `specwatch check`'s flags (--tokens) or the plugin's."""

    prefix: str
    details: str
    """Where more is told (the cost of a shorter check, the gate behind a load balancer), as that front end's help says it."""
    separator: str = "-"
    names: Mapping[str, str] = field(default_factory=dict)
    """Options this front end names otherwise than prefix and name: the Python API's keyword arguments."""

    def flag(self, name: str) -> str:
        return self.names.get(name, self.prefix + name.replace("_", self.separator))

    def say(self, template: str, **values: str) -> str:
        """A message worded once, with this front end's flags: "{api_key_file}" becomes "--api-key-file" for check."""
        return template.format_map({**{o.name: self.flag(o.name) for o in OPTIONS}, "details": self.details, **values})


CHECK = Spelling("--", "see below")
PLUGIN = Spelling("--specwatch-", "see specwatch check --help")
API = Spelling("", "see specwatch check --help", "_", {
    "endpoint": "endpoints", "exporter": "exporter_url", "server": "servers", "label": "labels",
    "exporter_username": "username", "exporter_password_file": "password_file", "exporter_ca_file": "ca_file",
    "exporter_cert_file": "cert_file", "exporter_key_file": "key_file"})
"""specwatch.check's and specwatch.ask's keyword arguments: a refusal names what the caller passed."""


@dataclass(frozen=True)
class Option:
    """One option of the gate: `specwatch check --NAME` and the plugin's `--specwatch-NAME` and ini key `specwatch_NAME`."""

    name: str
    dest: str
    """Where `specwatch check` keeps its value (argparse's dest), and the field of the plugin's Defaults."""
    mode: Mode
    help: str
    """With {name} for another option's flag and {details}, filled by each front end's Spelling."""
    metavar: str | None = None
    parse: Callable[[str], Any] | None = str
    """Each value as the command line gives it, to what the check takes; None for a switch, which takes no value."""
    default: Any = None
    repeatable: bool = False
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return CHECK.flag(self.name)

    @property
    def plugin_flag(self) -> str:
        return PLUGIN.flag(self.name)

    @property
    def ini(self) -> str:
        return f"specwatch_{self.name}"

    @property
    def kind(self) -> str:
        """How the plugin reads it: switch, list (whitespace-separated in the ini), path (from the ini's folder), text."""
        if self.parse is None:
            return "switch"
        return "list" if self.repeatable else "path" if self.parse is Path else "text"


def duration_argument(text: str) -> float:
    from ..durations import parse_timeout

    try:
        return parse_timeout(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def label_argument(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} must look like KEY=VALUE, e.g. pool=eval")
    return key.strip(), value


def endpoint_argument(text: str) -> str:
    if text not in ENDPOINTS:
        raise argparse.ArgumentTypeError(f"unknown endpoint {text}; choose from {', '.join(ENDPOINTS)}")
    return text


def tokens_argument(text: str) -> int:
    if not text.strip().isdigit() or not 4 <= int(text) <= 512:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 4 to 512")
    return int(text)


OPTIONS = (
    Option("api_key_file", "api_key_file", Mode.CANARY, "file holding the server's API key (sent as a Bearer token)",
           "FILE", Path),
    Option("api_key_env", "api_key_env", Mode.CANARY, "environment variable holding the server's API key", "VAR"),
    Option("model", "model", Mode.BOTH,
           "check only this model of a router (default: every loaded model); never loads it unless {load}", "MODEL"),
    Option("load", "load", Mode.CANARY,
           "with {model}: ask the router to load the model first if it is not loaded (it may evict another one)",
           parse=None, default=False),
    Option("endpoint", "endpoints", Mode.CANARY,
           "endpoint to check (repeatable; default: all); fewer check less of what an eval may read",
           parse=endpoint_argument, repeatable=True, choices=ENDPOINTS),
    Option("tokens", "tokens", Mode.CANARY,
           f"tokens per canary, 4 to 512 (default {DEFAULT_TOKENS}); shorter proves less ({{details}})", "TOKENS",
           tokens_argument, DEFAULT_TOKENS),
    Option("timeout", "timeout", Mode.BOTH,
           f"per request, e.g. 30s, 2m, 1m30s or a number of seconds (default {DEFAULT_TIMEOUT:g}s)", "DURATION",
           duration_argument, DEFAULT_TIMEOUT),
    Option("exporter", "exporters", Mode.EXPORTER,
           "a specwatch daemon's URL, e.g. http://specwatch:9824 (repeatable: shards and replicas)", "URL",
           repeatable=True),
    Option("server", "servers", Mode.EXPORTER,
           "a server the eval reads from, by its configured name (repeatable: any of them)", "NAME", default=[],
           repeatable=True),
    Option("label", "labels", Mode.EXPORTER,
           "select servers by label, static or discovered (repeatable: all must match)", "KEY=VALUE", label_argument,
           default=[], repeatable=True),
    Option("exporter_username", "exporter_username", Mode.EXPORTER, "basic auth user of the exporter's --web-config",
           "USER"),
    Option("exporter_password_file", "exporter_password_file", Mode.EXPORTER, "file holding that user's password",
           "FILE", Path),
    Option("exporter_ca_file", "exporter_ca_file", Mode.EXPORTER, "CA that signed the exporter's TLS certificate",
           "FILE", Path),
    Option("exporter_cert_file", "exporter_cert_file", Mode.EXPORTER, "client certificate, when the exporter asks",
           "FILE", Path),
    Option("exporter_key_file", "exporter_key_file", Mode.EXPORTER, "its key", "FILE", Path),
)
SWITCH = "exporter"
"""The option that chooses the exporter form: every other option of its mode needs it."""
SELECTING = ("server", "label")
"""The exporter options that choose what it reports (the plugin's fixture takes its own, so they make no default)."""

EX_USAGE = 64
"""Every command: the command line itself is wrong (sysexits' EX_USAGE; `check` uses 1 and 2 for verdicts)."""

# Usage problems, worded once; each front end fills in its own flags.
ONE_WAY = "give a server's URL to canary it, or {exporter} URL to ask a running specwatch (one of the two)"
WITH_EXPORTER = "{flags} cannot be used with {exporter}: {exporter} sends no canary"
WITHOUT_EXPORTER = ("{flags} cannot be used without {exporter}: asking a running specwatch takes them, canarying a "
                    "server's URL does not")
SELECTION_ALONE = "{flags} select what {exporter} reports: give {exporter} URL too"
KEY_NEEDS_CERT = "{exporter_key_file} needs {exporter_cert_file}"
PASSWORD_NEEDS_USER = "{exporter_password_file} needs {exporter_username}"


def mode_problem(values: Mapping[str, Any], *, url: object, spelling: Spelling) -> str | None:
    """`specwatch check` canaries a URL or asks --exporter, never both: the other form's options are refused too."""
    asking = bool(values["exporters"])
    if bool(url) == asking:
        return spelling.say(ONE_WAY)
    other = Mode.CANARY if asking else Mode.EXPORTER
    wrong = [spelling.flag(o.name) for o in OPTIONS if o.mode is other and o.name != SWITCH and values[o.dest] != o.default]
    if not wrong:
        return None
    return spelling.say(WITH_EXPORTER if asking else WITHOUT_EXPORTER, flags=", ".join(wrong))


def selection_problem(values: Mapping[str, Any], spelling: Spelling) -> str | None:
    """A selection of what an exporter reports, with no exporter to ask."""
    selecting = [spelling.flag(o.name) for o in OPTIONS if o.name in SELECTING and values.get(o.dest)]
    if selecting and not values.get("exporters"):
        return spelling.say(SELECTION_ALONE, flags=", ".join(selecting))
    return None


def exporter_flags_problem(values: Mapping[str, Any], spelling: Spelling) -> str | None:
    """A flag for asking the exporter given without the one it needs."""
    if values.get("exporter_key_file") and not values.get("exporter_cert_file"):
        return spelling.say(KEY_NEEDS_CERT)
    if values.get("exporter_password_file") and not values.get("exporter_username"):
        return spelling.say(PASSWORD_NEEDS_USER)
    return None


def check_server(url: str, *, api_key_file: Path | None = None, api_key_env: str | None = None,
                 model: str | None = None) -> ServerConfig:
    """The server `specwatch check URL` canaries (or `specwatch reference URL` records); a ValueError in the project's
    words when the URL or a key option is wrong."""
    from pydantic import ValidationError

    from ..problems import problem_lines
    from ..settings.targets import ServerConfig

    try:
        return ServerConfig(name="check", url=url, api_key_file=api_key_file, api_key_env=api_key_env, model=model)
    except ValidationError as err:
        raise ValueError("; ".join(problem_lines(err, ServerConfig))) from None


@contextlib.contextmanager
def logs_to_stderr() -> Iterator[None]:
    """While a check runs, its log lines (a key file that changed mid-check) go to stderr: stdout, or a test's output,
    carries the verdict."""
    import structlog

    previous = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        yield
    finally:
        structlog.configure(**previous)
