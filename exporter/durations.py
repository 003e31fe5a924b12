"""Durations as config and command line take them ('15s', '1m30s', '500ms'), and the floors of intervals and timeouts."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

INTERVAL_FLOOR = 1.0
TIMEOUT_FLOOR = 0.1
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


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


def lenient_duration(value: Any) -> float | None:
    """parse_duration's seconds, or None where it refuses `value` (its own error is reported elsewhere)."""
    try:
        return parse_duration(value)
    except ValueError:
        return None


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


Interval = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_at_least_interval_floor)]
Timeout = Annotated[float, BeforeValidator(parse_timeout)]
