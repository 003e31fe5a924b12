"""Loading: the YAML file, SPECWATCH_* variables and keyword overrides, merged into one mapping and validated once."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.exceptions import SettingsError

from ..problems import ConfigError, Loc, problem_lines, read_yaml
from .schema import Provenance, Settings
from .targets import LLAMA_SERVER_PORT

ENV_PREFIX = "SPECWATCH_"
CONFIG_FILE_ENV = "SPECWATCH_CONFIG_FILE"
# Settings that only the command line sets: a config file naming one is told where it goes.
_COMMAND_LINE_ONLY = {"listen": "--listen", "web_config": "--web-config", "log_level": "--log-level",
                      "log_format": "--log-format", "config": "--config"}


def environment_values() -> dict[str, Any]:
    """What SPECWATCH_* variables set, by top-level key: lists and mappings as JSON, nested keys after `__`.

    Raises pydantic-settings' SettingsError for a list or mapping that is not JSON.
    """
    source = EnvSettingsSource(Settings, env_prefix=ENV_PREFIX, env_nested_delimiter="__")  # type: ignore[arg-type]
    return source()


def env_variables_for(key: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The SPECWATCH_* variables that set top-level `key`, whole or nested (SPECWATCH_SERVERS__...)."""
    environ = os.environ if environ is None else environ
    name = f"{ENV_PREFIX}{key}".upper()
    return sorted(v for v in environ if v.upper() == name or v.upper().startswith(f"{name}__"))


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


def _unknown_key(loc: Loc) -> str | None:
    key = str(loc[-1])
    if len(loc) == 1 and key in _COMMAND_LINE_ONLY:
        return f"unknown key: it is a command-line flag ({_COMMAND_LINE_ONLY[key]}), not a config key"
    if key == "api_key":
        return "unknown key: a key is never written in the config; use api_key_file or api_key_env"
    return None


def _key_envs(data: Any) -> list[str]:
    servers = data.get("servers") if isinstance(data, dict) else None
    return [s["api_key_env"] for s in servers or [] if isinstance(s, dict) and isinstance(s.get("api_key_env"), str)]


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from `path` (YAML, read once), the environment and `overrides`; raises ConfigError listing every problem.

    Each wins over the one before, key by key: the file, then SPECWATCH_* variables, then `overrides`. With neither a
    file nor SPECWATCH_SERVERS, the default targets are watched (Settings.default_target says so); a file that lists
    no servers is refused.
    """
    source = "configuration"
    file_data: dict[str, Any] | None = None
    if path is not None:
        source = f"config file {str(path)!r}"
        raw = read_yaml(path, source)  # once: a pipe (--config /dev/stdin) cannot be read twice
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(["the top level must be a mapping of keys such as servers:, poll_interval:"], source)
        file_data = raw or {}
    warnings = environment_warnings(_key_envs(file_data) + _key_envs(overrides))
    try:
        environment = environment_values()
    except SettingsError as err:
        match = re.search(r'field "(\w+)"', str(err))
        key = match[1] if match else "?"
        variables = ", ".join(env_variables_for(key)) or f"{ENV_PREFIX}{key.upper()}"
        problem = (f"{key} (from environment variable {variables}): not valid JSON; lists and mappings are given as "
                   f"JSON, e.g. SPECWATCH_SERVERS='[{{\"name\": \"a\", \"url\": \"http://10.0.0.5:{LLAMA_SERVER_PORT}\"}}]'")
        raise ConfigError([problem], _described_source(source, [problem]), warnings) from None
    data = {**(file_data or {}), **environment, **overrides}
    provenance = Provenance(
        config_file=file_data is not None,
        from_env={key: tuple(env_variables_for(key)) for key in environment if key not in overrides},
    )
    try:
        settings = Settings.model_validate(data, context=provenance)
    except ValidationError as err:
        problems = problem_lines(err, Settings, data=data, origin=provenance.origin, unknown=_unknown_key)
        raise ConfigError(problems, _described_source(source, problems), warnings) from None
    settings._warnings = tuple(warnings)
    return settings


def _described_source(source: str, problems: list[str]) -> str:
    if any("(from environment variable" in p for p in problems):
        return f"{source} and SPECWATCH_* environment" if source != "configuration" else "SPECWATCH_* environment"
    return source
