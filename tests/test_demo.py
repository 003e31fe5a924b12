"""The demo's last words suggest only what still works once it has finished."""

from __future__ import annotations

from specwatch.demo import closing_hint

URL = "http://127.0.0.1:9824/metrics"


def test_without_keep_running_the_hint_does_not_send_the_user_to_a_stopped_exporter() -> None:
    hint = closing_hint(URL, keep_running=False)
    assert "curl -s" not in hint and URL not in hint
    assert "stopped" in hint and "--keep-running" in hint


def test_with_keep_running_the_hint_shows_the_curl_and_the_page() -> None:
    hint = closing_hint(URL, keep_running=True)
    assert f"curl -s {URL} | grep -E 'specwatch_verdict|contradiction'" in hint
    assert "http://127.0.0.1:9824/ " in hint and "Ctrl-C" in hint


def test_the_demo_config_is_valid(tmp_path) -> None:
    from specwatch.demo import demo_config
    from specwatch.settings.loading import load_settings

    path = tmp_path / "specwatch.yml"
    path.write_text(demo_config({"plain": "http://127.0.0.1:8001", "draft": "http://127.0.0.1:8002"}))
    settings = load_settings(path)
    assert [s.name for s in settings.servers] == ["plain", "draft"]
    assert settings.canary_timeout <= settings.canary_interval
