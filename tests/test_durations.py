"""Durations: what config and command line accept, each refusal's exact message, and how a duration reads back."""

from __future__ import annotations

import pytest

from specwatch.durations import format_duration, parse_duration, parse_timeout


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200), (7, 7), ("2.5", 2.5),
                                               (" 1h30m ", 5400), ("0.5s", 0.5)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


BAD_DURATIONS = [
    ("15x", "'15x' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    ("-5s", "'-5s' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    ("1m 30s", "'1m 30s' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    ("", "'' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    (0, "duration must be positive and finite, got 0"),
    ("0s", "duration must be positive and finite, got '0s'"),
    (float("inf"), "duration must be positive and finite, got inf"),
    ("nan", "duration must be positive and finite, got 'nan'"),
    (True, "a duration such as '15s' is required"),
    (None, "a duration such as '15s' is required"),
    ([15], "a duration such as '15s' is required"),
]


@pytest.mark.parametrize(("value", "expected"), BAD_DURATIONS, ids=[repr(v) for v, _ in BAD_DURATIONS])
def test_each_bad_duration_gives_its_exact_error(value: object, expected: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(value)
    assert str(caught.value) == expected


def test_a_timeout_has_a_floor() -> None:
    assert parse_timeout("100ms") == 0.1
    with pytest.raises(ValueError) as caught:
        parse_timeout("99ms")
    assert str(caught.value) == "99ms is below the 100ms floor for timeouts: no llama-server answers that fast"


@pytest.mark.parametrize(("seconds", "text"), [(0.01, "10ms"), (1.5, "1.5s"), (120, "2m"), (90, "90s"), (3600, "1h"), (5400, "90m")])
def test_a_duration_reads_back_as_it_would_be_written(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
