"""The command line as a user meets it: help that teaches, clear errors, --check-config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.cli import main


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", *args], capture_output=True, text=True, timeout=60, env=env)


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
    assert "/metrics, /, /sd, /api/v1/verdicts and /-/reload need the configured credentials" in " ".join(out.split())


def test_help_says_where_llama_server_listens_on_each_build(capsys: pytest.CaptureFixture[str]) -> None:
    """9931 from build 11521 (upstream PR 26508), 8080 before: each help that shows a server's URL says both."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    run = " ".join(capsys.readouterr().out.split())
    assert ("watches http://127.0.0.1:9931 (local-9931) and http://127.0.0.1:8080 (local-8080), where a llama-server "
            "started without --port listens: on 9931 from build 11521, on 8080 before") in run
    assert "url: http://10.0.0.5:9931 # its port: llama-server's default from build 11521; 8080 before" in run
    assert "an http:// URL without one is refused, and an https:// one without one means 443 (a TLS front end)" in run
    assert "(default: $SPECWATCH_CONFIG_FILE, else llama-server's default address of either build: 127.0.0.1:9931 " \
           "from build 11521, 127.0.0.1:8080 before)" in run
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    check = " ".join(capsys.readouterr().out.split())
    assert "e.g. http://127.0.0.1:9931 (its default port from build 11521; 8080 before)" in check
    assert "llama-server listens on 9931 from build 11521 and on 8080 before, unless started with --port" in check
    assert "specwatch check http://127.0.0.1:9931 && python score.py" in check
    assert "8080 " not in run.replace("8080 before", "").replace("8080 (local-8080)", "")


def test_check_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    assert "0  logprobs are real" in out and "1  the server serves fill-in" in out and "2  could not check" in out
    assert "64 command-line usage error" in out


@pytest.mark.real
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


@pytest.mark.usefixtures("restored_logging")
def test_check_config_prints_the_labels_a_gate_selects_by(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://h:1', labels: {zone: eu-1, pool: eval}}\n"
                      "  - {name: b, url: 'http://h:2', model: m.gguf, labels: {team: 'ml eval'}}\n"
                      "  - {name: c, url: 'http://h:3'}\n")
    assert main(["run", "--config", str(config), "--check-config"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  a: http://h:1 (no api key, labels pool=eval zone=eu-1)",  # as `check --exporter URL --label pool=eval` takes them
        "  b: http://h:2 (no api key, model m.gguf, labels 'team=ml eval')",
        "  c: http://h:3 (no api key)",
    ]


@pytest.mark.real
def test_check_config_refuses_a_bad_config_listing_every_problem(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'gopher://h'}\n  - {name: a, url: 'http://h'}\nfoo: 1\n")
    result = _run("run", "--config", str(config), "--check-config")
    assert result.returncode == 2
    assert "(4 problems)" in result.stderr and "gopher://h" in result.stderr and "foo: unknown key" in result.stderr
    assert "servers[1] (a).url: 'http://h' gives no port" in result.stderr


PORTLESS = ("'http://10.0.0.5' gives no port: llama-server listens on 9931 from build 11521 and on 8080 before; give the "
            "port, e.g. 'http://10.0.0.5:9931' (an explicit ':80' for a front end on port 80)")


@pytest.mark.parametrize("check_config", [True, False])
def test_a_server_given_as_a_host_alone_is_refused_as_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                     check_config: bool) -> None:
    """Never port 80 unseen: `run` refuses it as it refuses any bad config (exit 2), before it watches anything."""
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: eval-a, url: 'http://10.0.0.5'}\n  - {name: eval-b, url: 'http://10.0.0.6:9931'}\n")
    assert main(["run", "--config", str(config), *(["--check-config"] if check_config else [])]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"specwatch: invalid config file {str(config)!r} (1 problem):\n  - servers[0] (eval-a).url: {PORTLESS}\n"


@pytest.mark.real
def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    result = _run("run", "--config", str(tmp_path / "nope.yml"), "--check-config")
    assert result.returncode == 2 and "cannot read: No such file or directory" in result.stderr


@pytest.mark.real
@pytest.mark.parametrize("listen", ["nonsense", ":99999", "host:port"])
def test_bad_listen_address(listen: str) -> None:
    result = _run("run", "--listen", listen, "--check-config")
    assert result.returncode == 64 and "listen address" in result.stderr


@pytest.mark.usefixtures("restored_logging")
def test_check_config_of_a_shard_says_of_how_many(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's share can be empty; the count of the whole config beside it says that is the arithmetic."""
    from specwatch.daemon.shard import hashmod

    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://h:1'}\n  - {name: b, url: 'http://h:2'}\n")
    for index in range(3):
        assert main(["run", "--config", str(config), "--check-config", "--shard", f"{index}/3"]) == 0
        share = [name for name in "ab" if hashmod(name, 3) == index]
        assert capsys.readouterr().out.splitlines() == [
            f"config OK: {len(share)} server(s) to watch in shard {index}/3 (of 2 configured), poll every 15s, canary every 60s",
            *(f"  {name}: http://h:{'ab'.index(name) + 1} (no api key)" for name in share)]
    monkeypatch.setenv("SPECWATCH_SHARD", "1/3")  # the config's shard, as the daemon takes it
    assert main(["run", "--config", str(config), "--check-config"]) == 0
    assert "in shard 1/3 (of 2 configured)" in capsys.readouterr().out


@pytest.mark.real
def test_bad_shard() -> None:
    result = _run("run", "--shard", "5/2", "--check-config")
    assert result.returncode == 64 and "need 0 <= INDEX < COUNT" in result.stderr


@pytest.mark.real
def test_check_rejects_a_bad_url() -> None:
    result = _run("check", "ftp://x")
    assert result.returncode == 64 and "is not an http:// or https:// URL" in result.stderr


@pytest.mark.real
def test_check_config_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n" + "".join(f"  - {{name: s{i}, url: 'http://h:{1000 + i}'}}\n" for i in range(5000)))
    result = subprocess.run(
        f"{sys.executable} -m specwatch run --config {config} --check-config | head -1", shell=True,
        capture_output=True, text=True, timeout=60,
    )
    assert result.stdout.startswith("config OK: 5000 server(s)")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


@pytest.mark.real
def test_config_file_from_the_environment(tmp_path: Path) -> None:
    import os

    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: from-env, url: 'http://h:1'}\n")
    result = _run("run", "--check-config", env={**os.environ, "SPECWATCH_CONFIG_FILE": str(config)})
    assert result.returncode == 0 and "  from-env: http://h:1 (no api key)" in result.stdout


@pytest.mark.real
@pytest.mark.parametrize("args", [
    ("run", "--bogus"), ("check",), ("check", "http://h:1", "--endpoint", "telepathy"), ("demo", "--bogus"), ("nonsense",),
    ("check", "http://h:1", "--timeout", "soon"), ("check", "http://h:1", "--timeout", "10ms"), ("check", "http://h:1", "--tokens", "2"),
])
def test_usage_errors_exit_64_never_2(args: tuple[str, ...]) -> None:
    # 2 is `specwatch check`'s "could not check": a typo in a harness must not read as a verdict.
    result = _run(*args)
    assert result.returncode == 64, result.stderr
    assert "error:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.real
@pytest.mark.parametrize(("args", "message"), [
    (("check", "127.0.0.1:8080"), "'127.0.0.1:8080' has no scheme: add http:// (or https://), e.g. 'http://127.0.0.1:8080'"),
    (("check", "http://127.0.0.1:8080/v1"), "'http://127.0.0.1:8080/v1' ends in /v1: give the server's root (http://127.0.0.1:8080)"),
    (("check", "http://127.0.0.1"), "url: 'http://127.0.0.1' gives no port: llama-server listens on 9931 from build 11521 "
     "and on 8080 before; give the port, e.g. 'http://127.0.0.1:9931' (an explicit ':80' for a front end on port 80)"),
    (("check", "http://10.0.0.5:9931", "http://10.0.0.5"), f"url: {PORTLESS}"),
    (("check", "127.0.0.1"), "'127.0.0.1' has no scheme: add http:// (or https://), e.g. 'http://127.0.0.1:9931'"),
    (("check", "http://h:1", "--api-key-file", "/nonexistent/key"),
     "api_key_file '/nonexistent/key' cannot be read: No such file or directory"),
    (("check", "http://h:1", "--api-key-env", "SPECWATCH_TEST_UNSET_KEY"),
     "environment variable 'SPECWATCH_TEST_UNSET_KEY' (api_key_env) is unset or empty"),
])
def test_check_refuses_bad_input_as_a_usage_error(args: tuple[str, ...], message: str) -> None:
    result = _run(*args)
    assert result.returncode == 64 and message in result.stderr, result.stderr


@pytest.mark.real
def test_check_timeout_takes_a_duration() -> None:
    from tests.support.net import refused_url

    result = _run("check", refused_url(), "--timeout", "1s", "--json")
    assert result.returncode == 2, result.stderr  # unchecked: nothing listens there
    assert '"verdict": "unchecked"' in result.stdout and "connection_refused" in result.stdout


def test_an_unknown_endpoint_is_named_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["check", "http://h:1", "--endpoint", "telepathy"])
    assert caught.value.code == 64
    assert "argument --endpoint: unknown endpoint telepathy; choose from completion, completion_stream," in capsys.readouterr().err


def test_main_help_documents_the_usage_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "64 for a command-line usage error" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "64  command-line usage error" in out and "2   the config or web config is invalid" in out
    assert "/-/healthy and /-/ready" in out


@pytest.mark.real
def test_a_config_from_a_pipe_is_read_once_and_the_environment_wins(tmp_path: Path) -> None:
    env = {**os.environ, "SPECWATCH_POLL_INTERVAL": "30s"}
    env.pop("SPECWATCH_CONFIG_FILE", None)
    result = subprocess.run(
        [sys.executable, "-m", "specwatch", "run", "--config", "/dev/stdin", "--check-config"],
        input="servers:\n  - {name: piped, url: 'http://h:1'}\npoll_interval: 10s\ncanary_interval: 2m\n",
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "config OK: 1 server(s) to watch, poll every 30s, canary every 120s", "  piped: http://h:1 (no api key)",
    ]


@pytest.mark.real
@pytest.mark.parametrize("text", ["", "servers: []\n", "poll_interval: 30s\n"])
def test_a_config_without_servers_does_not_start(tmp_path: Path, text: str) -> None:
    config = tmp_path / "c.yml"
    config.write_text(text)
    result = _run("run", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.startswith(f"specwatch: invalid config file {str(config)!r} (1 problem):\n  - lists no servers: ")


@pytest.mark.real
def test_no_config_at_all_watches_the_default_target_and_says_so() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SPECWATCH_")}
    result = _run("run", "--check-config", env=env)
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "config OK: 2 server(s) to watch, poll every 15s, canary every 60s",
        "  local-9931: http://127.0.0.1:9931 (no api key)",
        "  local-8080: http://127.0.0.1:8080 (no api key)",
    ]
    assert "specwatch: note: no config given (--config, $SPECWATCH_CONFIG_FILE or SPECWATCH_SERVERS): watching " \
           "http://127.0.0.1:9931 and http://127.0.0.1:8080: started without --port, llama-server listens on 9931 from " \
           "build 11521 and on 8080 before (the one no llama-server listens on stays unchecked); list your fleet" \
           in result.stderr


@pytest.mark.real
def test_an_environment_override_is_blamed_not_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://h:1'}\n")
    result = _run("run", "--config", str(config), "--check-config", env={**os.environ, "SPECWATCH_POLL_INTERVAL": "banana"})
    assert result.returncode == 2
    assert "poll_interval (from environment variable SPECWATCH_POLL_INTERVAL): 'banana' is not a duration" in result.stderr


@pytest.mark.real
def test_a_misspelled_variable_is_warned_about_never_fatal(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://h:1'}\n")
    result = _run("run", "--config", str(config), "--check-config", env={**os.environ, "SPECWATCH_POLL_INTERVALL": "30s"})
    assert result.returncode == 0
    assert "specwatch: warning: environment variable SPECWATCH_POLL_INTERVALL is not a specwatch setting and is ignored; " \
           "did you mean SPECWATCH_POLL_INTERVAL?" in result.stderr
