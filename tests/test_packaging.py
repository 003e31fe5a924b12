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


def test_run_and_check_never_import_the_demo(tmp_path: Path) -> None:
    """The container image leaves exporter/demo out: nothing `run` or `check` loads may need it."""
    config = tmp_path / "specwatch.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://127.0.0.1:9'}\n")
    script = (
        "import sys\n"
        "sys.modules['exporter.demo'] = None  # as in the image: importing it fails\n"
        "from exporter import cli\n"
        f"assert cli.main(['run', '--config', {str(config)!r}, '--check-config']) == 0\n"
        "assert cli.main(['check', 'http://127.0.0.1:9', '--timeout', '1']) == 2\n"
        "import exporter.daemon.run, exporter.check\n"
        "print(sorted(m for m in sys.modules if m.startswith('exporter.demo')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['exporter.demo']"  # only the None placeholder


def test_demo_without_the_demo_package_says_how_to_get_it() -> None:
    script = "import sys\nsys.modules['exporter.demo'] = None\nfrom exporter import cli\nsys.exit(cli.main(['demo']))\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    assert "pip install 'specwatch[demo]'" in result.stderr and "Traceback" not in result.stderr


def test_the_image_leaves_the_demo_out_of_its_wheel(tmp_path: Path) -> None:
    """Follow the Dockerfile's build stage: copy what it copies, run its RUN line, and look inside the wheel."""
    import shutil
    import zipfile

    lines = (ROOT / "Dockerfile").read_text().splitlines()
    stages = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    build = lines[stages[0]: stages[1]]
    for line in build:
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                target = tmp_path / source
                (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, target)
    [run] = [line.removeprefix("RUN ") for line in build if line.startswith("RUN ")]
    run = run.replace("--wheel-dir /wheels", f"--no-deps --wheel-dir {tmp_path / 'wheels'}")
    result = subprocess.run(["sh", "-c", run], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = (tmp_path / "wheels").glob("specwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "exporter/cli.py" in names and "exporter/daemon/run.py" in names and "exporter/probe/canary.py" in names
    assert not [n for n in names if n.startswith("exporter/demo")]
