"""The gate's options and their rules, worded once for `specwatch check` and the pytest plugin."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from specwatch.durations import parse_timeout
from specwatch.problems import problem_lines
from specwatch.settings.schema import ServerConfig

DEFAULT_TOKENS = 48
DEFAULT_TIMEOUT = 60.0
# Each flag that only one way of checking takes: its destination, its spelling and its default.
CANARY_ONLY = {"api_key_file": ("--api-key-file", None), "api_key_env": ("--api-key-env", None), "load": ("--load", False),
               "endpoints": ("--endpoint", None), "tokens": ("--tokens", DEFAULT_TOKENS)}
EXPORTER_ONLY = {"servers": ("--server", []), "labels": ("--label", []), "exporter_username": ("--exporter-username", None),
                 "exporter_password_file": ("--exporter-password-file", None),
                 "exporter_ca_file": ("--exporter-ca-file", None), "exporter_cert_file": ("--exporter-cert-file", None),
                 "exporter_key_file": ("--exporter-key-file", None)}


def duration_argument(text: str) -> float:
    try:
        return parse_timeout(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def label_argument(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} must look like KEY=VALUE, e.g. pool=eval")
    return key.strip(), value


def tokens_argument(text: str) -> int:
    if not text.strip().isdigit() or not 4 <= int(text) <= 512:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 4 to 512")
    return int(text)


def exporter_flags_problem(*, key_file: object, cert_file: object, password_file: object, username: object) -> str | None:
    """A flag for asking the exporter given without the one it needs, in `check`'s words."""
    if key_file and not cert_file:
        return "--exporter-key-file needs --exporter-cert-file"
    if password_file and not username:
        return "--exporter-password-file needs --exporter-username"
    return None


def check_server(url: str, *, api_key_file: Path | None = None, api_key_env: str | None = None,
                 model: str | None = None) -> ServerConfig:
    """The server `specwatch check URL` canaries; a ValueError in the project's words when the URL or a key option is
    wrong."""
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
