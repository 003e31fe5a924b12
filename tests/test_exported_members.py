"""specwatch's public names, as httpx's tests/test_exported_members.py keeps its own: `__all__` is exactly the documented
API, every name resolves to its home's object, what type checkers read is what runs, and nothing private leaks."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

import specwatch

ROOT = Path(__file__).resolve().parent.parent


def documented() -> list[str]:
    """The names the table at the top of docs/api.md lists, one a row."""
    top = (ROOT / "docs" / "api.md").read_text().split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", top, flags=re.M)


def type_checked() -> dict[str, str]:
    """What exporter/__init__.py imports for type checkers, by name: the module each comes from."""
    tree = ast.parse((ROOT / "exporter" / "__init__.py").read_text())
    # The package imports itself relatively (`from .gate.api import check`): level 1 is specwatch itself.
    return {alias.asname or alias.name: f"specwatch.{node.module}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module for alias in node.names}


def test_all_is_exactly_the_documented_api() -> None:
    assert len(specwatch.__all__) == len(set(specwatch.__all__))
    assert sorted(specwatch.__all__) == sorted(documented())


@pytest.mark.parametrize("name", specwatch.__all__)
def test_each_name_resolves_to_its_homes_object(name: str) -> None:
    value = getattr(specwatch, name)
    assert name in dir(specwatch)
    if name == "__version__":
        assert isinstance(value, str) and re.fullmatch(r"\d+\.\d+\.\d+", value)
        return
    home = type_checked()[name]
    assert value is getattr(importlib.import_module(home), name)
    # The API is the eval side's and the core's: never the daemon's, whose import would start what a harness never needs.
    assert home.startswith(("specwatch.gate.", "specwatch.core.report")), home


def test_type_checkers_read_what_runs() -> None:
    assert set(type_checked()) == set(specwatch.__all__)


def test_nothing_private_leaks() -> None:
    for name in specwatch.__all__:
        getattr(specwatch, name)
    public = {name for name, value in vars(specwatch).items()
              if not name.startswith("_") and not isinstance(value, ModuleType)}  # subpackages are attributes once imported
    assert public == {name for name in specwatch.__all__ if not name.startswith("_")}
    assert {name for name in dir(specwatch) if not name.startswith("_")
            and not isinstance(getattr(specwatch, name), ModuleType)} == public
    star: dict[str, object] = {}
    exec("from specwatch import *", star)
    assert set(star) - {"__builtins__"} == set(specwatch.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'specwatch' has no attribute 'chekc'"):
        specwatch.chekc  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(specwatch, "_HOMES_OF_NOTHING")
