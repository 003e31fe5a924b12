"""API key files are read again when they change, so a rotated key works without a reload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog
import yaml

from specwatch.daemon.exposition.text import PREPARED_FOR
from specwatch.probe.keyfiles import KeyFiles
from specwatch.settings.targets import ServerConfig
from tests.support.loopback import FaultServer
from tests.support.metrics import scrape, value
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama


def rotate(path: Path, key: str) -> None:
    """Write the key next to the file and rename it over, as a secret manager does: readers never see half a file."""
    fresh = path.with_suffix(".new")
    fresh.write_text(key + "\n")
    os.replace(fresh, path)


def test_a_rotated_key_is_used_from_the_next_request(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-first\n")
    server, keys = ServerConfig(name="a", url="http://h:1", api_key_file=key_file), KeyFiles()
    assert keys.key_of(server).get_secret_value() == "sk-first"
    rotate(key_file, "sk-second")
    assert keys.key_of(server).get_secret_value() == "sk-second"
    key_file.write_text("sk-third-and-longer")  # written in place: a new size and mtime
    assert keys.key_of(server).get_secret_value() == "sk-third-and-longer"


def test_servers_sharing_a_file_cost_a_stat_each_not_a_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-shared")
    reads = 0
    real = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        nonlocal reads
        reads += 1
        return real(self, *args, **kwargs)

    servers = [ServerConfig(name=f"s{i}", url=f"http://h:{i + 1}", api_key_file=key_file) for i in range(1000)]
    monkeypatch.setattr(Path, "read_text", counted)  # validating each config checked the file; probes cost a stat
    keys = KeyFiles()
    assert all(keys.key_of(s).get_secret_value() == "sk-shared" for s in servers)
    assert reads == 1
    rotate(key_file, "sk-rotated")
    assert all(keys.key_of(s).get_secret_value() == "sk-rotated" for s in servers)
    assert reads == 2


def test_an_env_key_is_the_value_the_config_was_loaded_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_TEST_KEY", "sk-env-one")
    server = ServerConfig(name="a", url="http://h:1", api_key_env="SPECWATCH_TEST_KEY")
    monkeypatch.setenv("SPECWATCH_TEST_KEY", "sk-env-two")  # a reload reads it again
    assert KeyFiles().key_of(server).get_secret_value() == "sk-env-one"
    assert KeyFiles().key_of(ServerConfig(name="b", url="http://h:2")) is None


@pytest.mark.parametrize("gap", ["missing", "empty"])
def test_a_rotation_gap_keeps_the_last_good_key_and_says_so_once(tmp_path: Path, gap: str) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-good-key")
    server, keys = ServerConfig(name="a", url="http://h:1", api_key_file=key_file), KeyFiles()
    assert keys.key_of(server).get_secret_value() == "sk-good-key"  # a probe sent it
    with structlog.testing.capture_logs() as logged:
        if gap == "missing":
            key_file.unlink()
        else:
            key_file.write_text("")
        for _ in range(5):
            assert keys.key_of(server).get_secret_value() == "sk-good-key"
        rotate(key_file, "sk-next-key")
        assert keys.key_of(server).get_secret_value() == "sk-next-key"
    assert [e["event"] for e in logged] == ["api_key_file_unusable", "api_key_file_changed"]
    assert logged[0]["problem"] == ("cannot be read: No such file or directory" if gap == "missing" else "is empty")
    assert logged[0]["log_level"] == "warning"
    assert "sk-" not in repr(logged)


@pytest.mark.real
def test_a_key_rotated_on_a_real_server_needs_no_reload(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-rotation-one\n")
    fake = FakeLlama.plain(api_key="sk-rotation-one", tokens=8)
    with FaultServer(fake) as llama:
        config = tmp_path / "specwatch.yml"
        config.write_text(yaml.safe_dump({
            "servers": [{"name": "a", "url": llama.url, "api_key_file": str(key_file)}],
            "poll_interval": "1s", "canary_interval": "1h", "canary_endpoints": ["chat"], "canary_tokens": 8,
        }))
        with ExporterProcess("--config", str(config)) as exporter:
            exporter.wait_started()

            def up() -> bool:
                return value(scrape(f"{exporter.url()}/metrics"), "specwatch_up", server="a") == 1

            def answered_with(key: str) -> bool:
                seen = [s for s in list(llama.seen) if s.path == "/props"]
                return bool(seen) and seen[-1].headers.get("authorization") == f"Bearer {key}" and up()

            wait_until("a poll with the first key", lambda: answered_with("sk-rotation-one"), timeout=15, alive=exporter.process)
            fake.api_key = "sk-rotation-two"
            rotate(key_file, "sk-rotation-two")
            wait_until("a poll with the rotated key", lambda: answered_with("sk-rotation-two"), timeout=15, alive=exporter.process)

            key_file.unlink()  # mid-rotation: the file is briefly gone
            before = llama.count("/props")
            wait_until("two polls without the file", lambda: llama.count("/props") >= before + 2, timeout=15, alive=exporter.process)
            # Every poll while the file is gone carries the last key; a scrape may serve a body up to PREPARED_FOR old.
            wait_until("up on the last key while the file is gone", lambda: answered_with("sk-rotation-two"),
                       timeout=PREPARED_FOR + 3, alive=exporter.process)

            fake.api_key = "sk-rotation-three"
            rotate(key_file, "sk-rotation-three")
            wait_until("a poll with the third key", lambda: answered_with("sk-rotation-three"), timeout=15, alive=exporter.process)

            events = [e["event"] for e in exporter.events()]
            assert "reloaded" not in events
            assert events.count("api_key_file_unusable") == 1
            assert events.count("api_key_file_changed") == 2
            assert "sk-rotation" not in exporter.output()
