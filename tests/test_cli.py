"""The command line as a user meets it: help that teaches, clear errors, --check-config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import main


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", *args], capture_output=True, text=True, timeout=60, env=env)


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "check", "demo"):
        assert f"    {command}" in out


def test_run_help_teaches_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "http://127.0.0.1:8080" in out and "api_key_file" in out and "--check-config" in out and ":9824" in out


def test_check_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    assert "0  logprobs are real" in out and "1  the server serves fill-in" in out and "2  could not check" in out


def test_check_config_prints_servers_without_keys(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-never-print-me")
    config = tmp_path / "c.yml"
    config.write_text(f"servers:\n  - {{name: a, url: 'http://h:1', api_key_file: '{key}'}}\n  - {{name: b, url: 'http://h:2'}}\n")
    result = _run("run", "--config", str(config), "--check-config")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "config OK: 2 server(s) to watch, poll every 15s, canary every 60s"
    assert "  a: http://h:1 (api key from file)" in result.stdout
    assert "sk-never-print-me" not in result.stdout + result.stderr


def test_check_config_refuses_a_bad_config_listing_every_problem(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'gopher://h'}\n  - {name: a, url: 'http://h'}\nfoo: 1\n")
    result = _run("run", "--config", str(config), "--check-config")
    assert result.returncode == 2
    assert "(3 problems)" in result.stderr and "gopher://h" in result.stderr and "foo: unknown key" in result.stderr


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    result = _run("run", "--config", str(tmp_path / "nope.yml"), "--check-config")
    assert result.returncode == 2 and "cannot read: No such file or directory" in result.stderr


@pytest.mark.parametrize("listen", ["nonsense", ":99999", "host:port"])
def test_bad_listen_address(listen: str) -> None:
    result = _run("run", "--listen", listen, "--check-config")
    assert result.returncode == 2 and "listen address" in result.stderr


def test_bad_shard() -> None:
    result = _run("run", "--shard", "5/2", "--check-config")
    assert result.returncode == 2 and "need 0 <= INDEX < COUNT" in result.stderr


def test_check_rejects_a_bad_url() -> None:
    result = _run("check", "ftp://x")
    assert result.returncode == 2 and "is not an http:// or https:// URL" in result.stderr


def test_check_config_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n" + "".join(f"  - {{name: s{i}, url: 'http://h:{1000 + i}'}}\n" for i in range(5000)))
    result = subprocess.run(
        f"{sys.executable} -m exporter run --config {config} --check-config | head -1", shell=True,
        capture_output=True, text=True, timeout=60,
    )
    assert result.stdout.startswith("config OK: 5000 server(s)")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    import os

    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: from-env, url: 'http://h:1'}\n")
    result = _run("run", "--check-config", env={**os.environ, "SPECWATCH_CONFIG_FILE": str(config)})
    assert result.returncode == 0 and "  from-env: http://h:1 (no api key)" in result.stdout
