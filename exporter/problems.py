"""Configuration problems: ConfigError, and YAML and pydantic errors as "where: message" lines that never quote the input."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails

Loc = tuple[str | int, ...]
"""A place in a configuration, as pydantic gives it: ("servers", 0, "url")."""


class ConfigError(Exception):
    """Every problem found in one configuration, reported together, with warnings that may explain them."""

    def __init__(self, problems: list[str], source: str = "configuration", warnings: Iterable[str] = ()) -> None:
        self.problems = problems
        self.source = source
        self.warnings = tuple(warnings)
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  - {p}" for p in problems)
        notes = "".join(f"\n  note: {w}" for w in self.warnings)
        super().__init__(f"invalid {source} ({count}):\n{lines}{notes}")


class NamesItsKey(ValueError):
    """A problem whose message names its key already ("api_key_file '/x' cannot be read"): shown at the key's parent."""


def refusal(problems: Iterable[tuple[Loc, str]], title: str = "configuration") -> ValidationError:
    """`problems` as one ValidationError; raised in a validator, each place is put under the validated field's."""
    return ValidationError.from_exception_data(title, [_detail(loc, message) for loc, message in problems])


def _detail(loc: Loc, message: str) -> InitErrorDetails:
    return InitErrorDetails(type="value_error", loc=loc, input=None, ctx={"error": ValueError(message)})


def _again(error: ErrorDetails) -> InitErrorDetails:
    """A raised error as one to raise again: its type, place, input and context (pydantic writes its message anew)."""
    again = InitErrorDetails(type=error["type"], loc=error["loc"], input=error["input"])
    if "ctx" in error:
        again["ctx"] = error["ctx"]
    return again


def refusing_also(handler: Callable[[Any], Any], data: Any, problems: list[tuple[Loc, str]], title: str) -> Any:
    """handler(data), refused with `problems` beside whatever the handler refuses.

    For the checks that span fields: run on the raw input in a wrap validator, they are reported even when a field
    fails (pydantic would skip an after-validator then), so one message lists every problem.
    """
    try:
        result = handler(data)
    except ValidationError as err:
        if not problems:
            raise
        found = [_again(e) for e in err.errors(include_url=False)]
        added = [_detail(loc, message) for loc, message in problems]
        raise ValidationError.from_exception_data(err.title, found + added) from None
    if problems:
        raise refusal(problems, title)
    return result


def problem_lines(
    err: ValidationError,
    schema: Any,
    *,
    data: Any = None,
    at: Loc = (),
    origin: Callable[[str], str] = str,
    unknown: Callable[[Loc], str | None] = lambda loc: None,
) -> list[str]:
    """Each error of `err` as "where: message", where reads as the config is written: servers[0] (eval-a).url.

    `schema` is the validated model or type: an unknown key is told the key it was close to, else the keys allowed
    there. `data` is the validated input: a list item with a `name` is named after its index. `at` is where that input
    sits in a larger config. `origin` says how a top-level key reads (with the environment variable that set it);
    `unknown` gives the whole message for an unknown key that deserves its own (a command-line flag, a key never
    written in a config). Inputs are never quoted.
    """
    lines = []
    for item in err.errors(include_url=False, include_input=False):
        loc = tuple(item["loc"])
        if loc and loc[-1] == "[key]":
            loc = loc[:-2]  # a mapping's key is the mapping's problem
        if isinstance(item.get("ctx", {}).get("error"), NamesItsKey):
            loc = loc[:-1]
        if item["type"] == "extra_forbidden":
            message = unknown(loc) or "unknown key" + _unknown_key_hint(schema, loc)
        else:
            message = item["msg"].removeprefix("Value error, ")
        where = _where(at, loc, data, origin)
        lines.append(f"{where}: {message}" if where else message)
    return lines


def _where(at: Loc, loc: Loc, data: Any, origin: Callable[[str], str]) -> str:
    where = ""
    full = (*at, *loc)
    nodes = [None] * len(at) + _walk(data, loc)  # `loc` walks `data`; `at` only places it
    for position, (part, node) in enumerate(zip(full, nodes, strict=True)):
        if isinstance(part, int):
            where += f"[{part}]"
            name = node.get("name") if isinstance(node, Mapping) else None
            if isinstance(name, str) and full[position + 1:position + 2] != ("name",):  # not when the name is the problem
                where += f" ({name})"
        elif position == 0:
            where = origin(part)
        else:
            where += f".{part}"
    return where


def _walk(data: Any, loc: Loc) -> list[Any]:
    """The input at each step of `loc` (None where it has no such place)."""
    nodes = []
    for part in loc:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list | tuple) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            data = None
        nodes.append(data)
    return nodes


def _unknown_key_hint(schema: Any, loc: Loc) -> str:
    keys = _keys_at(schema, loc[:-1])
    guess = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.75)
    if guess:
        return f" (did you mean {guess[0]}?)"
    return f" (allowed: {', '.join(keys)})" if keys else ""


def _keys_at(schema: Any, path: Loc) -> list[str]:
    """The keys the model at `path` of `schema` takes, or [] where no model is."""
    node: Any = schema
    for part in path:
        node = _inner(node, part)
    model = _model(node)
    return list(model.model_fields) if model is not None else []


def _model(node: Any) -> type[BaseModel] | None:
    if isinstance(node, type) and issubclass(node, BaseModel):
        return node
    if typing.get_origin(node) in (typing.Union, types.UnionType, typing.Annotated):
        return next((m for m in map(_model, typing.get_args(node)) if m is not None), None)
    return None


def _inner(node: Any, part: str | int) -> Any:
    model = _model(node)
    if model is not None:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    args = typing.get_args(node)
    if typing.get_origin(node) in (list, tuple) and isinstance(part, int) and args:
        return args[0]
    if typing.get_origin(node) is dict and len(args) == 2:
        return args[1]
    return None


def yaml_problem(err: yaml.YAMLError) -> str:
    """What and where, without PyYAML's quote of the offending line: that line may hold a secret."""
    problem = getattr(err, "problem", None) or "syntax error"
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping, as Prometheus' loaders do: the second would win unseen."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges keys on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: the constructor below says so
            if seen is not key_node.start_mark:
                where = f"line {seen.line + 1}, column {seen.column + 1}"
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice (first at {where})",
                                                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str) -> Any:
    """YAML (or JSON) text parsed as safe_load does, but a key given twice in a mapping is a yaml.YAMLError."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects


def read_yaml(path: Path, source: str) -> Any:
    """The parsed YAML file, or a ConfigError that names `source` and never quotes the file."""
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError([f"cannot read: {err.strerror}"], source) from None
    except UnicodeDecodeError:
        raise ConfigError(["not UTF-8 text"], source) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"not valid YAML: {yaml_problem(err)}"], source) from None
