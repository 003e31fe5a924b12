"""The llama-server builds a real test runs on, each a test parameter whose id names it: test_x[b11549-draft].

A verdict-deciding test runs on the build held here (b11434, compiled) and on the next one (b11549, the prebuilt
wheel), so that a fact that changes between them fails the suite under the build's name:

    @pytest.mark.parametrize("kind", KINDS)
    @builds.each
    def test_x(build, kind): ... LlamaServer.of_kind(kind, model, build=builds.get(build))

`each` goes nearest the function, so the build leads the id; it refuses to go anywhere else.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

import pytest

from specwatch.demo.llamaserver import BUILDS, Build

NAMES = tuple(BUILDS)
"""Every build, by name: b11434 (compiled from source), b11549 (prebuilt)."""
SOURCE, PREBUILT = NAMES

F = TypeVar("F", bound=Callable[..., object])


def params(*names: str) -> list:
    """pytest.param(name, id=name) for each of `names` (every build when none is named)."""
    unknown = set(names) - set(NAMES)
    if unknown:
        raise ValueError(f"no such build: {', '.join(sorted(unknown))}; one of {', '.join(NAMES)}")
    return [pytest.param(name, id=name) for name in names or NAMES]


def each(test: F, *, names: tuple[str, ...] = ()) -> F:
    """Parametrize `test`'s `build` argument over the builds; placed nearest the function, so its id comes first."""
    if any(mark.name == "parametrize" for mark in getattr(test, "pytestmark", [])):
        raise TypeError(f"{test.__name__}: put @builds.each nearest the function, under every other parametrize, so the "
                        "test id starts with the build")
    return pytest.mark.parametrize("build", params(*names))(test)


def only(*names: str) -> Callable[[F], F]:
    """`each`, over these builds alone: for a test whose rig one build cannot run (a flag its launcher lacks)."""
    return functools.partial(each, names=names)


@functools.cache
def get(name: str) -> Build:
    """The build of this name, found once per process (LlamaServerNotFound when it is not installed)."""
    try:
        return BUILDS[name]()
    except KeyError:
        raise ValueError(f"no such build: {name}; one of {', '.join(NAMES)}") from None


ROUTER_REFUSAL = """\
import sys, xllamacpp
params = xllamacpp.CommonParams()
params.models_preset = sys.argv[1]
try:
    xllamacpp.Server(params)
except ValueError as err:
    print(f"ValueError: {err}")
else:
    print("started a router")
"""
"""The prebuilt wheel asked to run as a router, as llama-server is (a --models-preset and no model): what it answers."""


def prebuilt_router(preset: os.PathLike[str] | str) -> str:
    """What build 11549's wheel answers when asked to start a router on `preset`, in a process of its own."""
    done = subprocess.run([sys.executable, "-c", ROUTER_REFUSAL, str(preset)], capture_output=True, text=True, timeout=120,
                          check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the prebuilt router probe exited {done.returncode}:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return lines[-1]
