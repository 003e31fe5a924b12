"""Configuration problems as the project's lines: pydantic errors to their exact places, YAML that says a key twice."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from specwatch.problems import NamesItsKey, parse_yaml, problem_lines, refusing_also, yaml_problem


def _tag(value: Any) -> Any:
    if ":" in value:
        raise ValueError(f"tag {value!r} has a colon")
    return value


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    port: int = 0
    key_file: str | None = None

    @field_validator("key_file")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        if path is not None:
            raise NamesItsKey(f"key_file {path!r} cannot be read")
        return path


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[Item] = Field(default_factory=list)
    tags: dict[Annotated[str, BeforeValidator(_tag)], int] = Field(default_factory=dict)
    level: int = 0

    @model_validator(mode="wrap")
    @classmethod
    def _everything(cls, data: Any, handler: Any) -> Config:
        level = data.get("level", 0)
        problems = [(("level",), "must not exceed 3 with no items")] if isinstance(level, int) and level > 3 and not data.get("items") else []
        return refusing_also(handler, data, problems, cls.__name__)


LINES = [
    ({"items": [{"name": "a", "port": "x"}]}, ["items[0] (a).port: Input should be a valid integer, unable to parse string as an integer"]),
    ({"items": [{"port": 1}]}, ["items[0].name: Field required"]),
    ({"items": [{"name": 7}]}, ["items[0].name: Input should be a valid string"]),
    ({"items": [{"name": "a"}, {"name": "b", "prot": 1}]}, ["items[1] (b).prot: unknown key (did you mean port?)"]),
    ({"colour": "red"}, ["colour: unknown key (allowed: items, tags, level)"]),
    ({"items": [{"name": "a", "colour": "red"}]}, ["items[0] (a).colour: unknown key (allowed: name, port, key_file)"]),
    ({"items": [{"name": "a", "key_file": "/k"}]}, ["items[0] (a): key_file '/k' cannot be read"]),
    ({"tags": {"a:b": 1}}, ["tags: tag 'a:b' has a colon"]),
    ({"tags": {"ok": "sk-secret"}}, ["tags.ok: Input should be a valid integer, unable to parse string as an integer"]),
    ({"items": "sk-secret"}, ["items: Input should be a valid list"]),
    ({"level": 5}, ["level: must not exceed 3 with no items"]),
    ({"level": 5, "colour": 1, "items": []}, ["colour: unknown key (allowed: items, tags, level)", "level: must not exceed 3 with no items"]),
]


@pytest.mark.parametrize(("data", "lines"), LINES, ids=[lines[0] for _, lines in LINES])
def test_each_error_gives_its_exact_line(data: dict[str, Any], lines: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        Config.model_validate(data)
    assert problem_lines(caught.value, Config, data=data) == lines
    assert "sk-secret" not in repr(problem_lines(caught.value, Config, data=data))


def test_a_top_level_key_reads_with_its_origin_and_an_unknown_key_with_its_own_message() -> None:
    data = {"level": "high", "api_key": "x", "items": [{"name": "a", "port": "x"}]}
    with pytest.raises(ValidationError) as caught:
        Config.model_validate(data)
    lines = problem_lines(caught.value, Config, data=data, origin=lambda key: f"{key} (from LEVEL)" if key == "level" else key,
                          unknown=lambda loc: "a key is never written here" if loc[-1] == "api_key" else None)
    assert lines == [
        "items[0] (a).port: Input should be a valid integer, unable to parse string as an integer",
        "level (from LEVEL): Input should be a valid integer, unable to parse string as an integer",
        "api_key: a key is never written here",
    ]


def test_input_validated_alone_is_placed_where_it_sits() -> None:
    group = {"name": "g", "prot": 1}
    with pytest.raises(ValidationError) as caught:
        Item.model_validate(group)
    assert problem_lines(caught.value, Item, data=group, at=(3,)) == ["[3].prot: unknown key (did you mean port?)"]
    with pytest.raises(ValidationError) as caught:
        Item.model_validate({"key_file": "/k"})
    assert problem_lines(caught.value, Item) == ["name: Field required", "key_file '/k' cannot be read"]


def test_yaml_refuses_a_key_given_twice_but_keeps_merges_and_keys_that_differ_in_type() -> None:
    assert parse_yaml("base: &b {x: 1, y: 1}\nd: {<<: *b, x: 2}\n1: a\n'1': b\n") == {
        "base": {"x": 1, "y": 1}, "d": {"x": 2, "y": 1}, 1: "a", "1": "b"}
    with pytest.raises(yaml.YAMLError) as caught:
        parse_yaml("servers: []\npoll_interval: 15s\npoll_interval: 1s\n")
    assert yaml_problem(caught.value) == "key 'poll_interval' given twice (first at line 2, column 1) at line 3, column 1"
