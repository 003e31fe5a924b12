"""Configuration: each bad config maps to its exact error, and every problem is listed at once."""

from __future__ import annotations

import gc
import secrets
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from specwatch.probe.keyfiles import KeyFiles
from specwatch.problems import ConfigError
from specwatch.settings import targets
from specwatch.settings.loading import load_settings
from specwatch.settings.schema import NO_SERVERS, Settings, parse_shard


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
    ("servers:\n  - {name: a, url: 'http://h:1', colour: red}\n",
     "servers[0] (a).colour: unknown key (allowed: labels, api_key_file, api_key_env, timeout, name, url, model, "
     "peer_group)"),
    ("servers:\n  - {name: a, url: 'http://h:1', peer_group: ''}\n",
     "servers[0] (a).peer_group: String should have at least 1 character"),
    ("servers:\n  - {name: a, url: 'http://h:1', labels: {peer_group: x}}\n",
     "servers[0] (a).labels: label name(s) ['peer_group'] are reserved by specwatch"),
    (OK_SERVER + "peer_tolerance: lots\n", "peer_tolerance: Input should be a valid number, unable to parse string as a number"),
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
    (OK_SERVER + "pol_interval: 15s\n", "pol_interval: unknown key (did you mean poll_interval?)"),
    (OK_SERVER + "log_format: json\n", "log_format: unknown key: it is a command-line flag (--log-format), not a config key"),
    ("servers:\n  - {name: a, url: 'http://h:1', api_key: sk-zzz}\n",
     "servers[0] (a).api_key: unknown key: a key is never written in the config; use api_key_file or api_key_env"),
    (OK_SERVER + "canary_endpoints: [chat, telepathy]\n",
     "canary_endpoints[1]: Input should be 'completion', 'completion_stream', 'completion_post_sampling', 'v1_completion', 'v1_completion_stream', 'chat' or 'chat_stream'"),
    (OK_SERVER + "shard: 3/3\n", "shard: shard '3/3': need 0 <= INDEX < COUNT"),
    (OK_SERVER + "poll_interval: 5s\npoll_timeout: 10s\n",
     "poll_timeout: 10s is longer than poll_interval 5s: a probe must end before the next one is due; shorten poll_timeout "
     "(or leave it unset: it defaults to 5s, capped by poll_interval)"),
    (OK_SERVER + "canary_interval: 20s\ncanary_timeout: 21s\n",
     "canary_timeout: 21s is longer than canary_interval 20s: a probe must end before the next one is due; shorten "
     "canary_timeout (or leave it unset: it defaults to 30s, capped by canary_interval)"),
    (OK_SERVER + "canary_interval: 10ms\n",
     "canary_interval: 10ms is below the 1s floor: a llama-server is probed at most once a second; use 1s or more"),
    (OK_SERVER + "poll_interval: 999ms\n",
     "poll_interval: 999ms is below the 1s floor: a llama-server is probed at most once a second; use 1s or more"),
    (OK_SERVER + "poll_timeout: 50ms\n", "poll_timeout: 50ms is below the 100ms floor for timeouts: no llama-server answers that fast"),
    ("servers:\n  - {name: a, url: 'http://h:1', timeout: 20s}\n",
     "servers[0] (a).timeout: 20s is longer than poll_interval 15s: it replaces poll_timeout and canary_timeout for this "
     "server, so it must end before the next poll is due"),
    ("servers:\n  - {name: a, url: 'http://h:1', timeout: 10ms}\n",
     "servers[0] (a).timeout: 10ms is below the 100ms floor for timeouts: no llama-server answers that fast"),
    ("", NO_SERVERS),
    ("# every server was removed by mistake\n", NO_SERVERS),
    ("servers: []\n", NO_SERVERS),
    ("servers:\n", NO_SERVERS),
    ("poll_interval: 30s\n", NO_SERVERS),
    ("servers:\n  - {name: a, url: '127.0.0.1:8080'}\n",
     "servers[0] (a).url: '127.0.0.1:8080' has no scheme: add http:// (or https://), e.g. 'http://127.0.0.1:8080'"),
    ("servers:\n  - {name: a, url: 'localhost:8080'}\n",
     "servers[0] (a).url: 'localhost:8080' has no scheme: add http:// (or https://), e.g. 'http://localhost:8080'"),
    # A host alone: the example gives llama-server's port, since 'http://HOST' is refused in its turn.
    ("servers:\n  - {name: a, url: '10.0.0.5'}\n",
     "servers[0] (a).url: '10.0.0.5' has no scheme: add http:// (or https://), e.g. 'http://10.0.0.5:9931'"),
    ("servers:\n  - {name: a, url: 'localhost'}\n",
     "servers[0] (a).url: 'localhost' has no scheme: add http:// (or https://), e.g. 'http://localhost:9931'"),
    # http:// without a port would be port 80, where no llama-server listens by default: never assumed.
    ("servers:\n  - {name: a, url: 'http://10.0.0.5'}\n",
     "servers[0] (a).url: 'http://10.0.0.5' gives no port: llama-server listens on 9931 from build 11521 and on 8080 "
     "before; give the port, e.g. 'http://10.0.0.5:9931' (an explicit ':80' for a front end on port 80)"),
    ("servers:\n  - {name: a, url: 'http://10.0.0.5/'}\n",
     "servers[0] (a).url: 'http://10.0.0.5/' gives no port: llama-server listens on 9931 from build 11521 and on 8080 "
     "before; give the port, e.g. 'http://10.0.0.5:9931' (an explicit ':80' for a front end on port 80)"),
    ("servers:\n  - {name: a, url: 'http://10.0.0.5:'}\n",
     "servers[0] (a).url: 'http://10.0.0.5:' gives no port: llama-server listens on 9931 from build 11521 and on 8080 "
     "before; give the port, e.g. 'http://10.0.0.5:9931' (an explicit ':80' for a front end on port 80)"),
    ("servers:\n  - {name: a, url: 'http://LLAMA.internal'}\n",
     "servers[0] (a).url: 'http://LLAMA.internal' gives no port: llama-server listens on 9931 from build 11521 and on "
     "8080 before; give the port, e.g. 'http://llama.internal:9931' (an explicit ':80' for a front end on port 80)"),
    ("servers:\n  - {name: a, url: 'http://[fd00::5]'}\n",
     "servers[0] (a).url: 'http://[fd00::5]' gives no port: llama-server listens on 9931 from build 11521 and on 8080 "
     "before; give the port, e.g. 'http://[fd00::5]:9931' (an explicit ':80' for a front end on port 80)"),
    # A path of its own may carry a key: it is left out of the message and the example.
    ("servers:\n  - {name: a, url: 'http://gateway/sk-in-path/llama'}\n",
     "servers[0] (a).url: 'http://gateway/...' gives no port: llama-server listens on 9931 from build 11521 and on 8080 "
     "before; give the port, e.g. 'http://gateway:9931/...' (an explicit ':80' for a front end on port 80)"),
    ("servers:\n  - {name: a, url: 'http://10.0.0.5:8080/v1'}\n",
     "servers[0] (a).url: 'http://10.0.0.5:8080/v1' ends in /v1: give the server's root (http://10.0.0.5:8080); specwatch "
     "calls /props, /slots, /completion, /v1/completions and /v1/chat/completions itself"),
    ("servers:\n  - {name: a, url: 'http://10.0.0.5:8080/v1/chat/completions'}\n",
     "servers[0] (a).url: 'http://10.0.0.5:8080/v1/chat/completions' ends in /v1/chat/completions: give the server's root "
     "(http://10.0.0.5:8080); specwatch calls /props, /slots, /completion, /v1/completions and /v1/chat/completions itself"),
    # A path of its own may carry a key: it is left out of the message.
    ("servers:\n  - {name: a, url: 'http://10.0.0.5:8080/gw/sk-in-path/v1/'}\n",
     "servers[0] (a).url: 'http://10.0.0.5:8080/.../v1' ends in /v1: give the server's root (the URL without its /v1 "
     "ending); specwatch calls /props, /slots, /completion, /v1/completions and /v1/chat/completions itself"),
    ("servers:\n  - {name: a, url: '10.0.0.5:8080/v1'}\n",
     "servers[0] (a).url: '10.0.0.5:8080/v1' has no scheme: add http:// (or https://), e.g. 'http://10.0.0.5:8080'"),
    ("servers:\n  - {name: a, url: '10.0.0.5:8080/gw?key=sk-in-query'}\n",
     "servers[0] (a).url: '10.0.0.5:8080' has no scheme: add http:// (or https://), e.g. 'http://10.0.0.5:8080'"),
    ("servers:\n  - {name: a, url: 'http://h:1', labels: {__x: y}}\n",
     "servers[0] (a).labels: label name(s) ['__x'] start with '__', which Prometheus reserves for its own labels"),
    ("servers:\n  - {name: a, url: 'http://h:1', api_key_file: /nonexistent/key, api_key_env: HOME}\n",
     "servers[0] (a): api_key_file '/nonexistent/key' cannot be read: No such file or directory"),
    ("- just\n- a list\n", "the top level must be a mapping of keys such as servers:, poll_interval:"),
    ("servers: [\n", "not valid YAML: expected the node content, but found '<stream end>' at line 2, column 1"),
    ("servers:\n  - {name: a, url: 'http://h:1'}\napi_key: \"sk-pasted-secret\n", "not valid YAML: found unexpected end of stream at line 4, column 1"),
    # An override appended to the file would otherwise win unseen (Prometheus refuses it too); merges are meant.
    ("servers:\n  - {name: a, url: 'http://h:1'}\ncanary_interval: 60s\ncanary_interval: 0s\n",
     "not valid YAML: key 'canary_interval' given twice (first at line 3, column 1) at line 4, column 1"),
    ("servers:\n  - {name: a, url: 'http://h:1', name: b}\n",
     "not valid YAML: key 'name' given twice (first at line 2, column 6) at line 2, column 34"),
    ("servers:\n  - {name: a, url: 'http://h:1'}\npeer_uniform: ['']\n",
     "peer_uniform: a peer group's name is not empty: list the groups as peer_group or the model name names them, e.g. "
     "peer_uniform: [gemma]"),
    ("servers:\n  - {name: a, url: 'http://h:1'}\npeer_uniform: gemma\n", "peer_uniform: a list of peer groups, e.g. peer_uniform: [gemma]"),
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


def test_no_config_watches_llama_servers_default_address_of_either_build() -> None:
    settings = load_settings(None)
    # 9931 from build 11521 (upstream PR 26508), 8080 before: one of the two is where llama-server listens.
    assert [(s.name, s.url) for s in settings.servers] == [
        ("local-9931", "http://127.0.0.1:9931"), ("local-8080", "http://127.0.0.1:8080")]
    assert (settings.poll_interval, settings.canary_interval) == (15.0, 60.0)
    assert Settings().servers == settings.servers


def test_the_default_ports_have_one_home() -> None:
    from specwatch.settings import schema

    assert (targets.LLAMA_SERVER_PORT, targets.PORT_CHANGED_IN_BUILD, targets.LLAMA_SERVER_PORT_BEFORE) == (9931, 11521, 8080)
    assert schema.DEFAULT_SERVER_URLS == ("http://127.0.0.1:9931", "http://127.0.0.1:8080")
    assert targets.PORTS_BY_BUILD == "llama-server listens on 9931 from build 11521 and on 8080 before"
    assert targets.PORTS_BY_BUILD in NO_SERVERS and "http://127.0.0.1:9931 and http://127.0.0.1:8080" in NO_SERVERS


@pytest.mark.parametrize(("url", "why"), [
    ("http://10.0.0.5:80", "an explicit port 80: a front end"),
    ("http://gateway:80/llama", "a front end on port 80 under a path prefix"),
    ("https://10.0.0.5", "https without a port is 443: a TLS front end"),
    ("https://llama.internal/llama", "the same under a path prefix"),
    ("http://10.0.0.5:9931", "llama-server's default from build 11521"),
    ("http://10.0.0.5:8080", "its default before"),
])
def test_a_port_given_or_implied_by_https_is_accepted(tmp_path: Path, url: str, why: str) -> None:
    settings = _load(tmp_path, f"servers:\n  - {{name: a, url: '{url}'}}\n")
    assert [s.url for s in settings.servers] == [url], why


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
    sent = KeyFiles().key_of(server)
    assert sent.get_secret_value() == "sk-abc"
    assert "sk-abc" not in repr(settings) and "sk-abc" not in str(sent)


@pytest.mark.parametrize("text", ["0/1", "2/3"])
def test_shards(text: str) -> None:
    assert parse_shard(text)[1] >= 1


def test_a_bad_url_does_not_hide_a_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "servers:\n  - {name: a, url: 'ftp://h', api_key_file: /nonexistent/key, labels: {__x: y}}\n")
    assert sorted(caught.value.problems) == [
        "servers[0] (a).labels: label name(s) ['__x'] start with '__', which Prometheus reserves for its own labels",
        "servers[0] (a).url: 'ftp://h' is not an http:// or https:// URL",
        "servers[0] (a): api_key_file '/nonexistent/key' cannot be read: No such file or directory",
    ]


def test_a_bad_environment_override_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_POLL_INTERVAL", "banana")
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, OK_SERVER + "poll_interval: 15s\n")
    assert caught.value.problems == [
        "poll_interval (from environment variable SPECWATCH_POLL_INTERVAL): 'banana' is not a duration (use e.g. 500ms, 15s, 1m30s)"
    ]
    assert str(caught.value).startswith(f"invalid config file '{tmp_path / 'specwatch.yml'}' and SPECWATCH_* environment (1 problem)")


@pytest.mark.parametrize(("value", "expected"), [
    ("nonsense", "servers (from environment variable SPECWATCH_SERVERS): not valid JSON; lists and mappings are given as JSON, "
                 "e.g. SPECWATCH_SERVERS='[{\"name\": \"a\", \"url\": \"http://10.0.0.5:9931\"}]'"),
    ("[]", f"servers (from environment variable SPECWATCH_SERVERS): {NO_SERVERS}"),
    ('[{"name": "a", "url": "10.0.0.5:8080"}]',
     "servers (from environment variable SPECWATCH_SERVERS)[0] (a).url: '10.0.0.5:8080' has no scheme: add http:// "
     "(or https://), e.g. 'http://10.0.0.5:8080'"),
    ('[{"name": "a", "url": "http://10.0.0.5"}]',
     "servers (from environment variable SPECWATCH_SERVERS)[0] (a).url: 'http://10.0.0.5' gives no port: llama-server "
     "listens on 9931 from build 11521 and on 8080 before; give the port, e.g. 'http://10.0.0.5:9931' (an explicit ':80' "
     "for a front end on port 80)"),
])
def test_bad_servers_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    monkeypatch.setenv("SPECWATCH_SERVERS", value)
    with pytest.raises(ConfigError) as caught:
        load_settings(None)
    assert caught.value.problems == [expected]
    assert str(caught.value).startswith("invalid SPECWATCH_* environment (1 problem)")


def test_only_no_configuration_at_all_means_the_default_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(None).default_target
    assert not _load(tmp_path, OK_SERVER).default_target
    monkeypatch.setenv("SPECWATCH_SERVERS", '[{"name": "env", "url": "http://e:1"}]')
    assert not load_settings(None).default_target
    # The environment can fill a server-less file, as it overrides any key of it.
    assert [s.name for s in _load(tmp_path, "poll_interval: 30s\n").servers] == ["env"]


@pytest.mark.parametrize(("text", "poll", "canary"), [
    ("poll_interval: 2s\n", 2.0, 30.0),
    ("poll_interval: 1s\ncanary_interval: 1s\n", 1.0, 1.0),
    ("canary_interval: 10s\n", 5.0, 10.0),
    ("poll_interval: 2s\npoll_timeout: 2s\n", 2.0, 30.0),
    ("poll_interval: 2s\npoll_timeout: 100ms\ncanary_timeout: 45s\n", 0.1, 45.0),
    ("", 5.0, 30.0),
])
def test_default_timeouts_are_capped_by_their_intervals(tmp_path: Path, text: str, poll: float, canary: float) -> None:
    settings = _load(tmp_path, OK_SERVER + text)
    server = settings.servers[0]
    assert (settings.timeout_for(server, canary=False), settings.timeout_for(server, canary=True)) == (poll, canary)


def test_a_server_timeout_within_the_intervals_applies_to_both_probes(tmp_path: Path) -> None:
    settings = _load(tmp_path, "servers:\n  - {name: a, url: 'http://h:1', timeout: 12s}\n")
    assert settings.timeout_for(settings.servers[0], canary=False) == settings.timeout_for(settings.servers[0], canary=True) == 12


def test_misspelled_environment_variables_are_warned_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SPECWATCH_POLL_INTERVALL": "30s", "SPECWATCH_CANARY_TOKEN": "8", "SPECWATCH_WHATEVER": "1",
                        "SPECWATCH_CONFIG_FILE": "x.yml", "SPECWATCH_SERVERS__0__NAME": "a", "SPECWATCH_LLAMA_KEY": "k",
                        "SPECWATCH_CANARY_TOKENS": "8"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SPECWATCH_SERVERS__0__NAME")
    settings = _load(tmp_path, "servers:\n  - {name: a, url: 'http://h:1', api_key_env: SPECWATCH_LLAMA_KEY}\n")
    assert settings.poll_interval == 15.0 and settings.canary_tokens == 8
    assert list(settings.warnings) == [
        "environment variable SPECWATCH_CANARY_TOKEN is not a specwatch setting and is ignored; did you mean SPECWATCH_CANARY_TOKENS?",
        "environment variable SPECWATCH_POLL_INTERVALL is not a specwatch setting and is ignored; did you mean SPECWATCH_POLL_INTERVAL?",
        "environment variable SPECWATCH_WHATEVER is not a specwatch setting and is ignored; settings are SPECWATCH_ and a config "
        "key, e.g. SPECWATCH_POLL_INTERVAL",
    ]


def test_warnings_come_with_a_refused_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_SERVER", '[{"name": "a", "url": "http://h:1"}]')
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "")
    assert caught.value.warnings == (
        "environment variable SPECWATCH_SERVER is not a specwatch setting and is ignored; did you mean SPECWATCH_SERVERS?",
    )
    assert str(caught.value).endswith("\n  note: " + caught.value.warnings[0])


def test_nested_environment_forms_are_not_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.settings.loading import environment_warnings

    environ = {"SPECWATCH_SERVERS__0__NAME": "a", "specwatch_poll_interval": "3s", "SPECWATCH_CONFIG_FILE": "x", "PATH": "/bin"}
    assert environment_warnings(environ=environ) == []


def _outcome(build) -> object:
    try:
        return build()
    except ValidationError as err:
        return [(e["loc"], e["msg"]) for e in err.errors(include_url=False, include_input=False)]


def test_settings_are_the_same_inside_and_outside_load_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No hidden state: Settings(**kw) validates kw alone; only load_settings reads the file and the environment.
    monkeypatch.setenv("SPECWATCH_POLL_INTERVAL", "30s")
    key = tmp_path / "key"
    key.write_text("sk-inside")
    builds = {"default": lambda: Settings(), "bad": lambda: Settings(servers=[], poll_interval="banana"),
              "some": lambda: Settings(servers=[{"name": "x", "url": "http://x:1"}], poll_timeout="20s")}
    inside: dict[str, object] = {}
    real_read = targets.read_key_file

    def read_and_build(path: Path) -> str:  # runs while load_settings validates
        inside.update({name: _outcome(build) for name, build in builds.items()})
        return real_read(path)

    monkeypatch.setattr(targets, "read_key_file", read_and_build)
    loaded = _load(tmp_path, f"servers:\n  - {{name: a, url: 'http://h:1', api_key_file: {key}}}\npoll_interval: 10s\n")
    assert loaded.poll_interval == 30.0 and not loaded.default_target
    outside = {name: _outcome(build) for name, build in builds.items()}
    assert inside == outside
    assert outside["default"].poll_interval == 15.0 and outside["default"].default_target
    assert outside["bad"] == [(("poll_interval",), "Value error, 'banana' is not a duration (use e.g. 500ms, 15s, 1m30s)"),
                              ((), f"Value error, {NO_SERVERS}")]


def _globals() -> dict[tuple[str, str], int]:
    """Every global of every loaded specwatch module, by the identity of its value."""
    return {(name, key): id(value) for name, module in list(sys.modules.items()) if name.startswith("specwatch")
            for key, value in vars(module).items()}


def _holding(secret: str) -> list[str]:
    """The type of every live object that holds `secret`: a SecretStr of it, or a container with it among its strings."""
    gc.collect()
    found = []
    for obj in gc.get_objects():
        # Exact types and the base classes' own methods: a lazy object's __class__ or __iter__ may start work of its own.
        kind = type(obj)
        if issubclass(kind, SecretStr):
            values = [obj.get_secret_value()]
        elif issubclass(kind, dict):
            values = list(dict.values(obj))
        elif kind in (list, tuple, set, frozenset):
            values = list(obj)
        else:
            continue
        if any(isinstance(v, str) and secret in v for v in values):
            found.append(type(obj).__name__)
    return found


def test_validating_a_key_file_changes_no_state_outside_the_settings(tmp_path: Path) -> None:
    """The reverse of the test above: validation checks the key file and keeps its key nowhere; a runner's KeyFiles reads it."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-" + secrets.token_hex(12))
    before = _globals()
    settings = _load(tmp_path, f"servers:\n  - {{name: a, url: 'http://h:1', api_key_file: {key_file}}}\n")
    also = Settings(servers=[{"name": "b", "url": "http://h:2", "api_key_file": str(key_file)}])
    with pytest.raises(ConfigError):
        _load(tmp_path, f"servers:\n  - {{name: a, url: 'ftp://h', api_key_file: {key_file}}}\n")
    after = _globals()
    loaded = {module for module, _ in before}
    assert sorted(k for k, v in after.items() if k[0] in loaded and before.get(k) != v) == []
    secret = key_file.read_text()
    assert _holding(secret) == []
    keys = KeyFiles()
    assert keys.key_of(settings.servers[0]) == keys.key_of(also.servers[0]) == SecretStr(secret)
    assert _holding(secret) != [], "the search finds a key that is held"


@pytest.mark.real
def test_settings_import_no_http_nor_probes_and_probes_import_no_settings() -> None:
    import subprocess

    script = ("import sys; import specwatch.settings.loading; print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('httpx', 'httpcore', 'h11') or m.startswith('specwatch.probe'))); "
              "[sys.modules.pop(m) for m in list(sys.modules) if m.startswith('specwatch')]; "
              "import specwatch.probe.probes, specwatch.probe.keyfiles, specwatch.probe.http.fetch; "
              "print(sorted(m for m in sys.modules if m.startswith('specwatch.settings')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == ["[]", "[]"]


def test_a_retired_key_is_read_and_said_to_be_ignored(tmp_path: Path) -> None:
    settings = _load(tmp_path, OK_SERVER + "peer_tolerance: 0.5\npeer_confirmations: 3\n")
    assert list(settings.warnings) == [
        "peer_tolerance is no longer used (replicas' answers are compared by a sequential test against the noise "
        "measured on the group): remove it",
        "peer_confirmations is no longer used (replicas' answers are compared by a sequential test against the noise "
        "measured on the group): remove it",
    ]
    assert list(_load(tmp_path, OK_SERVER).warnings) == []
