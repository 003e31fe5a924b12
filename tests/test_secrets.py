"""API keys never leave: every failure path runs with a recognisable key and all output is searched for it."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from specwatch import cli
from specwatch.core.state import Fleet
from specwatch.daemon.watch import Watcher
from specwatch.endpoints import Endpoint
from specwatch.probe import probes
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.keyfiles import KeyFiles
from specwatch.reasons import ProbeFailure
from specwatch.settings.schema import Settings
from tests.support.certs import make_certs, server_tls
from tests.support.faults import Hang, Respond, Seen
from tests.support.loopback import FaultServer
from tests.support.net import UNRESOLVABLE_URL, refused_url
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

FILE_KEY = "sk-SPECWATCH-CANARY-0123456789"
ENV_KEY = "sk-SPECWATCH-CANARY-ENV-9876543210"
ENV_NAME = "SPECWATCH_TEST_LLAMA_KEY"
ENDPOINTS = ["chat", "chat_stream"]
CHAT = "/v1/chat/completions"


def leaks(text: str) -> list[str]:
    """Every 10-character piece of either key found in `text`: a cut-off key is a leak too."""
    return sorted({key[i:i + 10] for key in (FILE_KEY, ENV_KEY) for i in range(len(key) - 9) if key[i:i + 10] in text})


def echoed(request: Seen) -> str:
    return request.headers.get("authorization", "")


def _props_with(alias: str) -> bytes:
    return json.dumps({"default_generation_settings": {"params": {"speculative.types": "none"}}, "total_slots": 1,
                       "model_alias": alias, "build_info": alias, "model_path": f"/models/{alias}"}).encode()


def _models_with(value: str) -> bytes:
    return json.dumps({"data": [{"id": "tiny.gguf", "meta": {"ftype": value, "size": 1, "n_vocab": 320}}]}).encode()


def _chat_with_logprob(value: str) -> bytes:
    entry = {"token": " the", "logprob": value, "top_logprobs": []}
    return json.dumps({"choices": [{"index": 0, "logprobs": {"content": [entry]}}]}).encode()


# Hostile or broken servers (and proxies that echo request headers into error pages) put the key everywhere a
# failure detail could carry it; each entry is (path, answer).
ECHOES: dict[str, tuple[str, Callable[[Seen], tuple[int, dict[str, str], bytes]]]] = {
    "html-page": ("/props", lambda r: (200, {"Content-Type": "text/html"}, f"<p>{echoed(r)}</p>".encode())),
    "html-cut-mid-key": ("/props", lambda r: (200, {"Content-Type": "text/html"}, ("x" * 41 + echoed(r)).encode())),
    "redirect": ("/props", lambda r: (302, {"Location": f"http://elsewhere.invalid/?auth={echoed(r)}"}, b"")),
    "error-body": ("/props", lambda r: (401, {}, json.dumps({"error": {"message": f"bad key {echoed(r)}"}}).encode())),
    "model-alias": ("/props", lambda r: (200, {}, _props_with(echoed(r)))),
    "models-meta": ("/v1/models", lambda r: (200, {}, _models_with(echoed(r)))),
    "truncated-json": ("/slots", lambda r: (200, {}, f'[{{"speculative": "{echoed(r)}'.encode())),
    "logprob-value": (CHAT, lambda r: (200, {}, _chat_with_logprob(echoed(r)))),
    "stream-error-line": (CHAT, lambda r: (200, {"Content-Type": "text/event-stream"}, f"error: {echoed(r)}\n\n".encode())),
    "stream-error-event": (
        CHAT, lambda r: (200, {"Content-Type": "text/event-stream"}, f'data: {{"error": "{echoed(r)}"}}\n\n'.encode())
    ),
}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "llama.key"
    path.write_text(FILE_KEY + "\n")
    return path


@pytest.fixture
def key_env(monkeypatch) -> dict[str, str]:
    monkeypatch.setenv(ENV_NAME, ENV_KEY)
    return {ENV_NAME: ENV_KEY}


@pytest.fixture
def echo_servers() -> Iterator[dict[str, FaultServer]]:
    servers = {name: FaultServer(FakeLlama.plain(tokens=8)).play(Respond(answer), path)
               for name, (path, answer) in ECHOES.items()}
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def other_failures(tmp_path) -> Iterator[dict[str, str]]:
    """URLs for the transport failures: refused, DNS, untrusted TLS, TLS to plain HTTP, timeout."""
    with FaultServer(tls=server_tls(make_certs(tmp_path / "certs"))) as untrusted, FaultServer() as plain, \
            FaultServer().play(Hang()) as hanging:
        yield {"refused": refused_url(), "dns": UNRESOLVABLE_URL, "tls-untrusted": untrusted.url,
               "tls-to-plain": plain.url_as("https"), "timeout": hanging.url}


def fleet_config(echo_servers: dict[str, FaultServer], other_failures: dict[str, str], key_file: Path) -> list[dict]:
    servers = []
    urls = {name: server.url for name, server in echo_servers.items()} | other_failures
    for name, url in urls.items():
        servers.append({"name": f"{name}-file", "url": url, "api_key_file": str(key_file)})
        servers.append({"name": f"{name}-env", "url": url, "api_key_env": ENV_NAME})
    # A configured model makes a server reporting another one a model_mismatch, whose detail names both.
    servers.append({"name": "model-mismatch-file", "url": echo_servers["model-alias"].url, "api_key_file": str(key_file),
                    "model": "qwen3-8b"})
    return servers


# These answer validly, only with the key as their model name (and file) or their file's quantization, so they never
# fail; the labels must not carry the key.
ALIAS_ECHOES = {"model-alias-file", "model-alias-env"}
HEALTHY_ECHOES = {*ALIAS_ECHOES, "models-meta-file", "models-meta-env"}


def assert_keys_reached(echo_servers: dict[str, FaultServer]) -> None:
    """The test means something only if the echoing servers really got both keys to echo."""
    for name, server in echo_servers.items():
        sent = {s.headers.get("authorization") for s in list(server.seen)}
        assert {f"Bearer {FILE_KEY}", f"Bearer {ENV_KEY}"} <= sent, name


@pytest.mark.slow
async def test_probe_failures_and_logs_carry_no_key(echo_servers, other_failures, key_file, key_env) -> None:
    # The watcher's timeouts leave room for a loaded machine: a healthy echo server must not fail by timing out.
    settings = Settings(servers=fleet_config(echo_servers, other_failures, key_file), canary_endpoints=ENDPOINTS,
                        poll_timeout=3.0, canary_timeout=3.0, canary_tokens=8)
    client = new_client()
    fetcher = Fetcher(client, settings.max_response_bytes)
    try:
        details, keys = [], KeyFiles()
        for server in settings.servers:
            key = keys.key_of(server)
            canaries = [lambda s=server, e=e, k=key: probes.canary(fetcher, s, Endpoint(e), tokens=8, timeout=1.0, api_key=k)
                        for e in ENDPOINTS]
            for probe in (lambda s=server, k=key: probes.poll(fetcher, s, timeout=1.0, api_key=k), *canaries):
                try:
                    await probe()
                except ProbeFailure as failure:
                    details.append(f"{server.name}: {failure!s} {failure.detail} {failure!r}")
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), fetcher)
        with structlog.testing.capture_logs() as logs:
            names = [s.name for s in settings.servers]
            await asyncio.gather(*(watcher.poll(n) for n in names), *(watcher.canary(n) for n in names))
            await asyncio.gather(*(watcher.ask_meta(n) for n in names))
    finally:
        await client.aclose()
    assert_keys_reached(echo_servers)
    assert len(details) >= len(settings.servers), details
    assert leaks("\n".join(details)) == [], details
    failed = {e["server"] for e in logs if e["event"] in ("poll_failed", "canary_failed")}
    assert failed == {s.name for s in settings.servers} - HEALTHY_ECHOES
    assert leaks(repr(logs)) == []
    labels = {s.config.name: s.model().poll.props for s in watcher.fleet.snapshot() if s.model().poll is not None}
    assert [labels[name].model for name in sorted(ALIAS_ECHOES)] == ["Bearer [REDACTED]"] * 2
    assert [labels[name].file for name in sorted(ALIAS_ECHOES)] == ["Bearer [REDACTED]"] * 2
    assert leaks(repr(labels)) == []
    fingerprints = {s.config.name: s.model().fingerprint for s in watcher.fleet.snapshot()}
    assert [fingerprints[f"models-meta-{k}"].ftype for k in ("file", "env")] == ["Bearer [REDACTED]"] * 2
    assert leaks(repr(fingerprints)) == []


@pytest.mark.slow
def test_check_command_output_carries_no_key(echo_servers, other_failures, key_file, key_env, capsys) -> None:
    urls = [s.url for s in echo_servers.values()] + list(other_failures.values())
    output = []
    for url in urls:
        for key_args, extra in ((["--api-key-file", str(key_file)], []), (["--api-key-env", ENV_NAME], ["--json"]),
                                (["--api-key-file", str(key_file), "--model", "qwen3-8b"], ["--json"])):
            code = cli.main(["check", url, *key_args, *extra, "--timeout", "1", "--tokens", "8",
                             *(arg for e in ENDPOINTS for arg in ("--endpoint", e))])
            captured = capsys.readouterr()
            assert code in (0, 2) and captured.out, (url, captured.out)
            output.append(captured.out + captured.err)
    assert_keys_reached(echo_servers)
    assert leaks("\n".join(output)) == []


def write_config(path: Path, servers: list[dict], **extra: object) -> Path:
    import yaml

    # Generous timeouts: a loaded test machine must not turn a TLS or redirect answer into a timeout.
    path.write_text(yaml.safe_dump({"servers": servers, "poll_interval": "1s", "poll_timeout": "900ms",
                                    "canary_interval": "2s", "canary_timeout": "1500ms", "canary_tokens": 8,
                                    "canary_endpoints": ENDPOINTS, **extra}))
    return path


@pytest.mark.real
def test_a_running_exporter_never_shows_the_key(echo_servers, other_failures, key_file, key_env, tmp_path) -> None:
    servers = fleet_config(echo_servers, other_failures, key_file)
    config = write_config(tmp_path / "specwatch.yml", servers)
    seen: list[str] = []
    with ExporterProcess("--config", str(config), "--log-level", "debug", env=key_env) as exporter:
        exporter.wait_started()
        names = {s["name"] for s in servers} - HEALTHY_ECHOES

        def every_server_failed() -> bool:
            failed = {e.get("server") for e in exporter.events() if e.get("event") in ("poll_failed", "canary_failed")}
            return names <= failed

        wait_until("a failure logged for every server", every_server_failed, timeout=30, alive=exporter.process)
        with httpx.Client(timeout=10) as client:
            metrics = client.get(f"{exporter.url()}/metrics").text
            seen += [metrics, client.get(exporter.url() + "/").text]
            assert 'reason="tls"' in metrics and 'reason="dns"' in metrics and 'reason="redirect"' in metrics

            # A key pasted into the config by mistake, and a missing key file: both refused without echoing the key.
            write_config(config, [{**servers[0], "api_key": FILE_KEY}])
            refused = client.post(f"{exporter.url()}/-/reload")
            assert refused.status_code == 500 and "unknown key" in refused.text
            seen.append(refused.text)
            write_config(config, [{**servers[0], "api_key_file": str(tmp_path / "missing.key")}])
            exporter.signal(signal.SIGHUP)
            wait_until("the SIGHUP reload", lambda: sum(e.get("event") == "reload_failed" for e in exporter.events()) >= 2, timeout=10)
            assert "specwatch_config_last_reload_successful 0.0" in client.get(f"{exporter.url()}/metrics").text
    seen.append(exporter.output())
    assert_keys_reached(echo_servers)
    assert sum(e.get("level") == "debug" for e in exporter.events()) > 0
    assert leaks("\n".join(seen)) == []


@pytest.mark.real
def test_check_config_output_carries_no_key(key_file, key_env, tmp_path) -> None:
    servers = [{"name": "a", "url": refused_url(), "api_key_file": str(key_file)},
               {"name": "b", "url": refused_url(), "api_key_env": ENV_NAME}]
    with ExporterProcess("--config", str(write_config(tmp_path / "ok.yml", servers)), "--check-config",
                         env=key_env) as good:
        assert good.process.wait(20) == 0
    assert "a: http://127.0.0.1:" in good.output() and "api key from env" in good.output()
    with ExporterProcess("--config", str(write_config(tmp_path / "bad.yml", [{**servers[0], "api_key": FILE_KEY}, servers[1],
                                                                             {**servers[1], "name": "a"}])),
                         "--check-config", env=key_env) as bad:
        assert bad.process.wait(20) == 2
    assert "unknown key" in bad.output() and "already used" in bad.output()
    assert leaks(good.output() + bad.output()) == []


SSO_TOKEN = "SSO-STATE-0f9e8d7c6b5a"
SSO_LOCATION = f"https://sso.example/oauth2/authorize?state={SSO_TOKEN}&redirect_uri=%2Fprops#{SSO_TOKEN}"


@pytest.mark.real
def test_a_redirects_query_reaches_no_output(tmp_path: Path, capsys) -> None:
    """A front end that sends specwatch to its single sign-on puts a token in the query: named by scheme, host and path."""
    with FaultServer(FakeLlama.plain(tokens=8)).play(Respond(lambda r: (302, {"Location": SSO_LOCATION}, b""))) as sso:
        seen = []
        for extra in ([], ["--json"]):
            code = cli.main(["check", sso.url, *extra, "--timeout", "2", "--tokens", "8", "--endpoint", "chat"])
            captured = capsys.readouterr()
            assert code == 2 and "redirect" in captured.out, captured.out
            seen.append(captured.out + captured.err)
        assert "https://sso.example/oauth2/authorize" in seen[0]
        config = write_config(tmp_path / "specwatch.yml", [{"name": "behind-sso", "url": sso.url}])
        with ExporterProcess("--config", str(config), "--log-level", "debug") as exporter:
            exporter.wait_started()
            wait_until("the redirect logged", lambda: any(e.get("event") == "poll_failed" for e in exporter.events()),
                       timeout=30, alive=exporter.process)
            with httpx.Client(timeout=10) as client:
                metrics = client.get(f"{exporter.url()}/metrics").text
                verdicts = client.get(f"{exporter.url()}/api/v1/verdicts").text
                page = client.get(f"{exporter.url()}/").text
        seen += [metrics, verdicts, page, exporter.output()]
    assert 'reason="redirect"' in metrics
    assert "https://sso.example/oauth2/authorize" in verdicts and "https://sso.example/oauth2/authorize" in exporter.output()
    assert [text for text in seen if SSO_TOKEN in text or "redirect_uri" in text] == []
