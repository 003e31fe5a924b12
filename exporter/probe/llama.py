"""Parsers for llama-server's /props, /slots and /models answers, strict about the fields specwatch reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from ..reasons import ProbeFailure, Reason

# Values from a server become label values and samples on every scrape: one hostile server must not
# be able to make them unencodable, unbounded or beyond a float, which would fail the scrape for all.
MAX_LABEL_CHARS = 256
MAX_SLOTS = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


ROUTER_ROLE = "router"
MAX_MODELS = 4096


@dataclass(frozen=True)
class Props:
    speculation_types: str | None
    """`speculative.types` as /props reports it, None if absent: "none" on every server of build 11434; a comma list of
    the types in use where /props tells the truth (upstream #28119), which can still hold "none" ("none,ngram-mod")."""
    total_slots: int | None
    model: str
    build: str
    n_ctx: int | None = None
    role: str | None = None
    """"router" for a llama-server started with --models-preset/--models-dir; absent on a server that runs a model."""
    media_marker: str | None = None
    """Random per process start (build 11434): a new one means the server restarted, whatever else stayed the same."""
    sleeping: bool = False
    """`is_sleeping`: the server unloaded its model after --sleep-idle-seconds; /slots or a completion would wake it."""
    file: str = ""
    """The base name of `model_path`: which file the process runs, whatever its alias."""

    @property
    def identity(self) -> tuple[object, ...]:
        """What tells one running process from another: a new identity is a restart or another setup."""
        return self.media_marker, self.model, self.build, self.n_ctx, self.total_slots, self.speculation_types

    @property
    def router(self) -> bool:
        return self.role == ROUTER_ROLE

    @property
    def speculation_type_names(self) -> tuple[str, ...]:
        """Each name of the comma list, as reported: a name specwatch does not know is kept, and counts as speculation."""
        if self.speculation_types is None:
            return ()
        return tuple(name for name in (part.strip() for part in self.speculation_types.split(",")) if name)

    @property
    def speculative(self) -> bool | None:
        if self.speculation_types is None:
            return None
        # "none" alongside another type is that type ("none,ngram-mod"); "none" twice is still none.
        return any(name.lower() != "none" for name in self.speculation_type_names)


@dataclass(frozen=True)
class Slots:
    count: int
    speculative: bool
    """True when any slot reports `speculative: true`: the slots are what actually decode."""


@dataclass(frozen=True)
class RouterModel:
    """One model a router lists in /models: its id and status ("loaded", "loading", "unloaded", "sleeping", ...)."""

    id: str
    status: str

    @property
    def loaded(self) -> bool:
        # Only a loaded model is probed: a request to any other would load or wake it.
        return self.status == "loaded"


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


def _count(value: Any, where: str, limit: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise _shape_error(f"{where} is not an integer from 0 to {limit}")
    return value


def parse_props(data: Any) -> Props:
    if not isinstance(data, dict):
        raise _shape_error(f"/props is a JSON {type(data).__name__}, not an object")
    role = data.get("role")
    if role is not None and not isinstance(role, str):
        raise _shape_error("/props role is not a string")
    settings = data.get("default_generation_settings")
    if not isinstance(settings, dict):
        raise _shape_error("/props has no default_generation_settings object")
    params = settings.get("params", {})
    if params is None and role == ROUTER_ROLE:
        params = {}  # a router runs no model itself: it has no generation settings
    if not isinstance(params, dict):
        raise _shape_error("/props default_generation_settings.params is not an object")
    types = params.get("speculative.types")
    if types is not None and not isinstance(types, str):
        raise _shape_error("/props speculative.types is not a string")
    total_slots = _count(data.get("total_slots"), "/props total_slots", MAX_SLOTS)
    n_ctx = _count(settings.get("n_ctx"), "/props default_generation_settings.n_ctx", 1 << 40)
    alias = _optional_str(data, "model_alias")
    path = _optional_str(data, "model_path")
    marker = data.get("media_marker")
    sleeping = data.get("is_sleeping")
    if sleeping is not None and not isinstance(sleeping, bool):
        raise _shape_error("/props is_sleeping is not a boolean")
    return Props(
        speculation_types=label_safe(types) if types is not None else None,
        total_slots=total_slots,
        model=label_safe(alias or (PurePath(path).name if path else "")),
        build=label_safe(_optional_str(data, "build_info")),
        n_ctx=n_ctx,
        role=label_safe(role) if role is not None else None,
        media_marker=marker[:MAX_LABEL_CHARS] if isinstance(marker, str) and marker else None,
        sleeping=bool(sleeping),
        file=label_safe(PurePath(path).name) if path and path != "none" else "",
    )


def names_of(*reported: str) -> set[str]:
    """Every name a model goes by, given what a server reports: each value, its file name and file stem."""
    names = set()
    for value in reported:
        if value:
            names.update((value, PurePath(value).name, PurePath(value).stem))
    return names


def model_names(data: Any) -> set[str]:
    """Every name a /props answer goes by: alias, file name and file stem."""
    if not isinstance(data, dict):
        return set()
    return names_of(*(v for v in (data.get("model_alias"), data.get("model_path")) if isinstance(v, str)))


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


def model_ids(data: Any) -> list[str]:
    """The model ids of an OpenAI-style /v1/models listing ({"data": [{"id": ...}, ...]}), statuses or not."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_MODELS:
        raise _shape_error("/v1/models has no data list")
    ids = []
    for index, entry in enumerate(entries):
        model_id = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(model_id, str) or not model_id or len(model_id) > MAX_LABEL_CHARS or _SURROGATE.search(model_id):
            raise _shape_error(f"/v1/models data[{index}].id is not a usable model name")
        ids.append(model_id)
    return list(dict.fromkeys(ids))


META_FIELDS = ("ftype", "size", "n_params", "n_vocab", "n_ctx_train", "n_embd")
"""What /v1/models' `data[].meta` says of a model's file that tells files apart (no endpoint gives a hash)."""


def parse_meta(data: Any, names: set[str]) -> dict[str, str]:
    """What a /v1/models listing says of one model's file (META_FIELDS, as label values): the entry one of `names`
    names, or the only one; {} when it says nothing."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_MODELS:
        raise _shape_error("/v1/models has no data list")
    listed = [e for e in entries if isinstance(e, dict)]
    chosen = next((e for e in listed if e.get("id") in names), listed[0] if len(listed) == 1 else None)
    meta = chosen.get("meta") if chosen is not None else None
    if not isinstance(meta, dict):
        return {}
    found = {}
    for key in META_FIELDS:
        value = meta.get(key)
        if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
            found[key] = label_safe(str(value))
    return found


def parse_models(data: Any) -> list[RouterModel]:
    """A router's /models (or /v1/models) listing: every model's id and status."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise _shape_error("/models has no data list")
    if len(entries) > MAX_MODELS:
        raise _shape_error(f"/models lists more than {MAX_MODELS} models")
    models: dict[str, RouterModel] = {}
    for index, entry in enumerate(entries):
        where = f"/models data[{index}]"
        if not isinstance(entry, dict):
            raise _shape_error(f"{where} is not an object")
        model_id = entry.get("id")
        if not isinstance(model_id, str) or not model_id or len(model_id) > MAX_LABEL_CHARS or _SURROGATE.search(model_id):
            raise _shape_error(f"{where}.id is not a usable model name")
        status = entry.get("status")
        value = status.get("value") if isinstance(status, dict) else status
        if not isinstance(value, str):
            raise _shape_error(f"{where}.status.value is not a string")
        models[model_id] = RouterModel(model_id, label_safe(value)[:32])
    return list(models.values())
