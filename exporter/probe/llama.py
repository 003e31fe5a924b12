"""Parsers for llama-server's /props and /slots answers, strict about the fields specwatch reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from exporter.reasons import ProbeFailure, Reason

# Values from a server become label values and samples on every scrape: one hostile server must not
# be able to make them unencodable, unbounded or beyond a float, which would fail the scrape for all.
MAX_LABEL_CHARS = 256
MAX_SLOTS = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Props:
    speculation_types: str | None
    """`speculative.types` as /props reports it ("none" on every build seen so far), None if absent."""
    total_slots: int | None
    model: str
    build: str

    @property
    def speculative(self) -> bool | None:
        if self.speculation_types is None:
            return None
        return self.speculation_types.strip().lower() not in ("", "none")


@dataclass(frozen=True)
class Slots:
    count: int
    speculative: bool
    """True when any slot reports `speculative: true`: the slots are what actually decode."""


def _shape_error(what: str) -> ProbeFailure:
    return ProbeFailure(Reason.INVALID_RESPONSE, what)


def _optional_str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _shape_error(f"/props {key} is {type(value).__name__}, not a string")
    return value


def label_safe(text: str) -> str:
    """`text` cut to a sane label length, with lone surrogates (which UTF-8 cannot encode) replaced."""
    return _SURROGATE.sub("\ufffd", text[:MAX_LABEL_CHARS])


def parse_props(data: Any) -> Props:
    if not isinstance(data, dict):
        raise _shape_error(f"/props is a JSON {type(data).__name__}, not an object")
    settings = data.get("default_generation_settings")
    if not isinstance(settings, dict):
        raise _shape_error("/props has no default_generation_settings object")
    params = settings.get("params", {})
    if not isinstance(params, dict):
        raise _shape_error("/props default_generation_settings.params is not an object")
    types = params.get("speculative.types")
    if types is not None and not isinstance(types, str):
        raise _shape_error("/props speculative.types is not a string")
    total_slots = data.get("total_slots")
    if total_slots is not None and (
        isinstance(total_slots, bool) or not isinstance(total_slots, int) or not 0 <= total_slots <= MAX_SLOTS
    ):
        raise _shape_error(f"/props total_slots is not an integer from 0 to {MAX_SLOTS}")
    alias = _optional_str(data, "model_alias")
    path = _optional_str(data, "model_path")
    return Props(
        speculation_types=types,
        total_slots=total_slots,
        model=label_safe(alias or (PurePath(path).name if path else "")),
        build=label_safe(_optional_str(data, "build_info")),
    )


def model_names(data: Any) -> set[str]:
    """Every name a /props answer goes by: alias, file name and file stem."""
    if not isinstance(data, dict):
        return set()
    names = set()
    for key in ("model_alias", "model_path"):
        value = data.get(key)
        if isinstance(value, str) and value:
            names.add(value)
            names.add(PurePath(value).name)
            names.add(PurePath(value).stem)
    return names


def parse_slots(data: Any) -> Slots:
    if not isinstance(data, list):
        raise _shape_error(f"/slots is a JSON {type(data).__name__}, not a list")
    speculative = False
    for index, slot in enumerate(data):
        if not isinstance(slot, dict):
            raise _shape_error(f"/slots[{index}] is not an object")
        flag = slot.get("speculative")
        if not isinstance(flag, bool):
            raise _shape_error(f"/slots[{index}].speculative is missing or not a boolean")
        speculative = speculative or flag
    return Slots(count=len(data), speculative=speculative)
