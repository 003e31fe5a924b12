"""Promises about packaging: README set-up commands, CI running the same test command, the Dockerfile."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_readme_gives_exactly_two_setup_commands_demo_and_tests() -> None:
    commands = _setup_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    assert commands[0].endswith("specwatch demo")
    assert commands[1].endswith("python -m pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _setup_commands()[1] in ci.splitlines()
    assert "set -euo pipefail" in ci


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(["hadolint", "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_specwatch_as_a_non_root_user() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0", "USER 0:0")
    assert 'ENTRYPOINT ["specwatch", "run"]' in lines


def test_console_script_and_python_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["specwatch"] == "exporter.cli:main"
    assert project["requires-python"] == ">=3.11"


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
