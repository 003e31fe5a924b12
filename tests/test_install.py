"""The wheel as a user installs it: one top-level package, `specwatch`, beside a project with its own `exporter` package.

Installing a monitor must never break the tests of the project that installs it. The wheel goes into a fresh virtual
environment next to a project whose package is called `exporter` (specwatch's own source folder is), and the project's
tests run with `pytest`, with `python -m pytest`, and behind the `--specwatch` gate against real llama-servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwatch import __version__
from tests.support import recipes

pytestmark = [pytest.mark.real, pytest.mark.slow]

TIMEOUT = 300

PROJECT = {
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\ntestpaths = ["tests"]\n',
    "exporter/__init__.py": '"""A project\'s own package, called as specwatch\'s source folder is."""\n',
    "exporter/core.py": "def rows():\n    return [('a', 1), ('b', 2)]\n",
    "tests/test_core.py": "from exporter.core import rows\n\n\ndef test_rows():\n    assert dict(rows()) == {'a': 1, 'b': 2}\n",
}
"""A project with its own `exporter` package and one test importing `exporter.core`."""

PYTEST_COMMAND = """#!{python}
import sys
from pytest import console_main
if __name__ == "__main__":
    sys.exit(console_main())
"""
"""The `pytest` command as pip writes pytest's console script, for the environment's own interpreter."""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    empty: Path
    """A folder with nothing in it, to run Python where no project's package can be found from the working directory."""

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        # No PYTHONPATH of the test run's own (it may point at a checkout), and pytest's plugins autoload as for a user.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run([str(c) for c in command], cwd=cwd or self.empty, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """This checkout's wheel installed into a fresh virtual environment.

    The dependencies come from this interpreter's site-packages, named in a .pth file as plain paths: their own .pth
    files do not run, so an editable install of specwatch there (a finder a .pth installs) cannot stand in for the wheel.
    """
    work = tmp_path_factory.mktemp("install")
    wheel = recipes.specwatch_wheel(work)
    venv, empty = work / "venv", work / "empty"
    empty.mkdir()
    _ok(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True, timeout=TIMEOUT))
    [site] = (venv / "lib").glob("python3.*/site-packages")
    dependencies = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in dependencies))
    (venv / "bin" / "pytest").write_text(PYTEST_COMMAND.format(python=venv / "bin" / "python"))
    (venv / "bin" / "pytest").chmod(0o755)
    here = Installed(wheel, venv, empty)
    _ok(here.run("python", "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--no-index", wheel))
    return here


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    for name, text in PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("models") / "cycle.gguf")
    with LlamaServer.of_kind("plain", model) as plain, LlamaServer.of_kind("draft", model) as draft:
        yield {"plain": plain.url, "draft": draft.url}


def test_the_wheel_holds_one_top_level_package_and_its_entry_points_point_into_it(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    info = f"specwatch-{__version__}.dist-info/"
    assert not [n for n in names if n.startswith("exporter/")]
    assert [n for n in names if not n.startswith(("specwatch/", info))] == []
    with zipfile.ZipFile(installed.wheel) as wheel:
        assert wheel.read(f"{info}top_level.txt").decode().split() == ["specwatch"]
        entry_points = wheel.read(f"{info}entry_points.txt").decode()
    assert "[console_scripts]\nspecwatch = specwatch.cli:main\n" in entry_points
    assert "[pytest11]\nspecwatch = specwatch.gate.pytest_plugin\n" in entry_points


def test_specwatch_imports_from_the_wheel_and_nothing_called_exporter_does(installed: Installed) -> None:
    script = ("import importlib.util, specwatch, specwatch.gate.pytest_plugin\n"
              "print(specwatch.__file__)\nprint(importlib.util.find_spec('exporter'))\n")
    where, exporter = _ok(installed.run("python", "-c", script)).stdout.splitlines()
    [site] = (installed.venv / "lib").glob("python3.*/site-packages")
    assert Path(where) == site / "specwatch" / "__init__.py"
    assert exporter == "None"


def test_the_command_and_python_m_run_the_installed_package(installed: Installed) -> None:
    for command in (["specwatch", "--version"], ["python", "-m", "specwatch", "--version"]):
        assert _ok(installed.run(*command)).stdout.strip() == f"specwatch {__version__}"
    # The console script is the one pip wrote into this environment, not another on the PATH.
    assert (installed.venv / "bin" / "specwatch").read_text().startswith(f"#!{installed.python}")


@pytest.mark.parametrize("command", [["pytest"], ["python", "-m", "pytest"]], ids=["pytest", "python -m pytest"])
def test_a_project_with_its_own_exporter_package_runs_its_tests(installed: Installed, project: Path, command: list[str]) -> None:
    result = _ok(installed.run(*command, cwd=project))
    plugins = next(line for line in result.stdout.splitlines() if line.startswith("plugins:"))
    assert f"specwatch-{__version__}" in plugins  # loaded through its pytest11 entry point, as in every run here
    assert "1 passed" in result.stdout


def test_the_gate_runs_in_that_project(installed: Installed, project: Path, servers: dict[str, str]) -> None:
    clean = _ok(installed.run("pytest", "--specwatch", servers["plain"], cwd=project))
    assert "CLEAN: logprobs are real" in clean.stdout and "1 passed" in clean.stdout
    refused = installed.run("python", "-m", "pytest", "--specwatch", servers["draft"], cwd=project)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 11, said
    assert "FILL_INS: the server serves fill-in logprobs" in said and "passed" not in said
