"""Configuration: each bad config maps to its exact error, and every problem is listed at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.settings import ConfigError, load_settings, parse_duration, parse_shard


def _load(tmp_path: Path, text: str):
    path = tmp_path / "specwatch.yml"
    path.write_text(text)
    return load_settings(path)


OK_SERVER = "servers:\n  - {name: a, url: 'http://10.0.0.5:8080'}\n"

BAD_CONFIGS = [
    ("servers:\n  - {name: a, url: 'ftp://h'}\n", "servers[0] (a).url: 'ftp://h' is not an http:// or https:// URL"),
    ("servers:\n  - {name: a, url: 'http://'}\n", "servers[0] (a).url: 'http://' has no host"),
    ("servers:\n  - {name: a, url: 'http://h:1/?api_key=sk-zzz'}\n",
     "servers[0] (a).url: 'http://h' must not carry a query or fragment; use api_key_file or api_key_env for keys"),
    ("servers:\n  - {name: a, url: 'http://u:p@h:1'}\n",
     "servers[0] (a).url: credentials in the URL are not allowed; use api_key_file or api_key_env"),
    ("servers:\n  - {name: a, url: 'http://h:99999'}\n", "servers[0] (a).url: 'http://h': Port out of range 0-65535"),
    ("servers:\n  - {name: a, url: 'http://h:1', colour: red}\n", "servers[0] (a).colour: unknown key"),
    ("servers:\n  - {url: 'http://h:1'}\n", "servers[0].name: Field required"),
    ("servers:\n  - {name: a, url: 'http://h:1'}\n  - {name: a, url: 'http://h:2'}\n",
     "servers[1].name: 'a' is already used by servers[0]; names must be unique"),
    ("servers:\n  - {name: a, url: 'http://h:1', api_key_file: /nonexistent/key}\n",
     "servers[0] (a): api_key_file '/nonexistent/key' cannot be read: No such file or directory"),
    ("servers:\n  - {name: a, url: 'http://h:1', api_key_env: SPECWATCH_TEST_UNSET_KEY}\n",
     "servers[0] (a): environment variable 'SPECWATCH_TEST_UNSET_KEY' (api_key_env) is unset or empty"),
    ("servers:\n  - {name: a, url: 'http://h:1', labels: {server: x}}\n",
     "servers[0] (a).labels: label name(s) ['server'] are reserved by specwatch"),
    ("servers:\n  - {name: a, url: 'http://h:1', labels: {'bad-name': x}}\n",
     "servers[0] (a).labels: invalid label name(s) ['bad-name']: use [a-zA-Z_][a-zA-Z0-9_]*"),
    (OK_SERVER + "poll_interval: 15x\n", "poll_interval: '15x' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    (OK_SERVER + "poll_interval: -5s\n", "poll_interval: '-5s' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
    (OK_SERVER + "canary_interval: 0\n", "canary_interval: duration must be positive and finite, got 0"),
    (OK_SERVER + "pol_interval: 15s\n", "pol_interval: unknown key"),
    (OK_SERVER + "canary_endpoints: [chat, telepathy]\n",
     "canary_endpoints[1]: Input should be 'completion', 'completion_stream', 'completion_post_sampling', 'chat' or 'chat_stream'"),
    (OK_SERVER + "shard: 3/3\n", "shard: shard '3/3': need 0 <= INDEX < COUNT"),
    (OK_SERVER + "poll_interval: 5s\npoll_timeout: 10s\n", "poll_timeout (10.0s) must be shorter than poll_interval (5.0s)"),
    ("- just\n- a list\n", "the top level must be a mapping of keys such as servers:, poll_interval:"),
    ("servers: [\n", "not valid YAML: expected the node content, but found '<stream end>' at line 2, column 1"),
    ("servers:\n  - {name: a, url: 'http://h:1'}\napi_key: \"sk-pasted-secret\n", "not valid YAML: found unexpected end of stream at line 4, column 1"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_CONFIGS, ids=[e[:40] for _, e in BAD_CONFIGS])
def test_each_bad_config_gives_its_exact_error(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert expected in caught.value.problems, caught.value.problems
    assert "sk-" not in str(caught.value)


def test_every_problem_is_listed_in_one_message(tmp_path: Path) -> None:
    text = (
        "servers:\n"
        "  - {name: a, url: 'http://h:1'}\n"
        "  - {name: a, url: 'ftp://h', bogus: 1}\n"
        "  - {name: c, url: 'http://h:3', api_key_file: /nonexistent}\n"
        "poll_interval: never\n"
    )
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert len(caught.value.problems) == 5
    message = str(caught.value)
    assert message.startswith(f"invalid config file '{tmp_path / 'specwatch.yml'}' (5 problems):")
    for fragment in ("ftp://h", "bogus: unknown key", "/nonexistent", "poll_interval", "already used"):
        assert fragment in message


def test_no_config_watches_llama_servers_default_address() -> None:
    settings = load_settings(None)
    assert [(s.name, s.url) for s in settings.servers] == [("local", "http://127.0.0.1:8080")]
    assert (settings.poll_interval, settings.canary_interval) == (15.0, 60.0)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_POLL_INTERVAL", "30s")
    monkeypatch.setenv("SPECWATCH_SERVERS", '[{"name": "env", "url": "http://e:1"}]')
    settings = _load(tmp_path, OK_SERVER + "poll_interval: 10s\ncanary_interval: 2m\n")
    assert (settings.poll_interval, settings.canary_interval) == (30.0, 120.0)
    assert [s.name for s in settings.servers] == ["env"]


def test_api_key_is_read_and_kept_secret(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-abc\n")
    settings = _load(tmp_path, f"servers:\n  - {{name: a, url: 'http://h:1', api_key_file: {key}}}\n")
    server = settings.servers[0]
    assert server.api_key.get_secret_value() == "sk-abc"
    assert "sk-abc" not in repr(settings) and "sk-abc" not in str(server.api_key)


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200), (7, 7), ("2.5", 2.5)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0/1", "2/3"])
def test_shards(text: str) -> None:
    assert parse_shard(text)[1] >= 1
