"""The eval tools the README's recipes run in, installed from their registries into a cache of their own, once.

Each recipe runs against a real llama-server drafting with draft-simple (the recipe must stop the eval before it
reaches the server) and a plain one (the eval runs and scores what the server answered): conftest's recipe_servers.
Each tool has a test file of its own (tests/test_recipe_*.py), so that their installs run side by side on a fresh
machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tests.support.filelock import held
from tests.support.llamabuild import cache_root

ROOT = Path(__file__).resolve().parent.parent.parent
PROMPTFOO = "0.121.20"
"""The last promptfoo whose engines take Node.js 20 (`^20.20.0 || >=22.22.0`); 0.122 and later need 22.22."""
PROMPTFOO_LEFT_OUT = ("@openai/codex", "@anthropic-ai/claude-agent-sdk")
"""promptfoo's coding-agent providers, which an eval of an HTTP server never loads: their native binaries are 590 MB
of its 1.4 GB, and leaving them out took its install from 84 to 60 CPU seconds."""
DEEPEVAL = "4.3.1"
INSPECT_AI = "0.3.285"
OPENAI = "3.57.0"
"""inspect_ai's openai-api provider needs the OpenAI SDK, which inspect_ai does not require itself."""
INSTALL_TIMEOUT = 1800.0


def cache() -> Path:
    return cache_root() / "recipes"


@contextlib.contextmanager
def _held(home: Path) -> Iterator[Path]:
    """`home`, held (through `home`.lock beside it) against another process making or using it at the same time."""
    with held(home.parent / f"{home.name}.lock"):
        yield home


def locked(name: str) -> contextlib.AbstractContextManager[Path]:
    """The cache entry `name`, held against another test run making or using it at the same time."""
    return _held(cache() / name)


def _run(command: Sequence[str | Path], what: str, **kw: object) -> None:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=INSTALL_TIMEOUT, **kw)
    if result.returncode != 0:
        raise AssertionError(f"{what} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def _made_once(home: Path, make: Callable[[Path], None]) -> Path:
    """`home` as `make` leaves it; a half-made one (an interrupted run) is made again."""
    ready = home / ".ready"
    if not ready.exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        make(home)
        ready.write_text("ok\n")
    return home


def runtime_requirements() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def python_tool(home: Path, requirements: Sequence[str]) -> Path:
    """A virtual environment at `home` with `requirements` from PyPI; its python."""

    def make(where: Path) -> None:
        _run([sys.executable, "-m", "venv", where / "venv"], "creating a virtual environment")
        # --no-compile: pip would compile every module of every package (about 10 s of CPU per tool on a fresh machine,
        # beside the other tests); the tool's first run compiles the ones it imports, and keeps them.
        _run([where / "venv" / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", "--no-compile",
              *requirements], f"pip install {' '.join(requirements)}")

    return _made_once(home, make) / "venv" / "bin" / "python"


def npm_tool(home: Path, package: str, *, left_out: Sequence[str] = ()) -> Path:
    """`package` installed from the npm registry into `home`, its dependencies `left_out` replaced by an empty package;
    its node_modules/.bin."""

    def make(where: Path) -> None:
        (where / "empty").mkdir()
        (where / "empty" / "package.json").write_text('{"name": "empty", "version": "0.0.0"}\n')
        overrides = dict.fromkeys(left_out, "file:./empty")
        (where / "package.json").write_text(json.dumps({"private": True, "overrides": overrides}) + "\n")
        _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", package], f"npm install {package}", cwd=where)

    return _made_once(home, make) / "node_modules" / ".bin"


def specwatch_wheel(work: Path) -> Path:
    """This checkout built as a wheel under `work`, from a copy: the build leaves no egg-info in the checkout, where
    pytest would find its entry points."""
    source = work / "source"
    shutil.copytree(ROOT / "exporter", source / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    wheels = work / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", "-w", wheels, source],
         "building the specwatch wheel")
    (wheel,) = wheels.glob("specwatch-*.whl")
    return wheel


def specwatch_install(target: Path) -> Path:
    """This checkout built as a wheel and installed into `target` (for PYTHONPATH): its code, and its entry points."""
    wheel = specwatch_wheel(target.parent)
    _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--target", target, wheel],
         "installing the specwatch wheel")
    return target


def shared_specwatch(run: Path) -> tuple[Path, Path]:
    """This checkout installed once per test run under `run` (a directory its workers share): the site for PYTHONPATH,
    and a directory holding a `specwatch` command for it."""
    def make(where: Path) -> None:
        specwatch_command(where / "bin", specwatch_install(where / "site"))

    with _held(run / "specwatch") as home:
        _made_once(home, make)
    return home / "site", home / "bin"


def recipe(title: str, language: str) -> list[str]:
    """The code blocks in `language` of docs/gating.md's recipe `title`, verbatim."""
    from tests.support import markdown

    return markdown.blocks(markdown.section(markdown.DOCS / "gating.md", title), language)


RUN_TIMEOUT = 600


def run(command: Sequence[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A recipe's command, as its user runs it."""
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def said(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}"


def specwatch_command(bin_dir: Path, site: Path) -> Path:
    """A `specwatch` command in `bin_dir` that runs this checkout's code, for recipes that call it by name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    command = bin_dir / "specwatch"
    command.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" -m specwatch "$@"\n')
    command.chmod(0o755)
    return command


def environment(path: Sequence[Path], **variables: str) -> dict[str, str]:
    """This process's environment with `path` first on PATH and no PYTHONPATH of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([*(str(p) for p in path), env.get("PATH", "")])
    env.update(variables)
    return env
