"""Logging: every line is one JSON object off a terminal, the libraries' standard-library records included."""

from __future__ import annotations

import io
import json
import logging
import signal
import socket
import time
from pathlib import Path

import pytest
import structlog

from specwatch.daemon import logs
from tests.support.net import HOST
from tests.support.process import ExporterProcess

pytestmark = pytest.mark.usefixtures("restored_logging")


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_library_records_become_json_lines_with_their_logger_name() -> None:
    stream = io.StringIO()
    logs.configure("info", json=True, stream=stream)
    structlog.get_logger("specwatch").warning("poll_failed", server="a", reason="timeout")
    logging.getLogger("apscheduler.scheduler").warning(
        'Execution of job "poll:a" skipped: maximum number of running instances reached (%d)', 1)
    logging.getLogger("apscheduler.executors.default").info("Running job %s", "poll:a")  # below the libraries' floor
    ours, library = _lines(stream)
    assert (ours["event"], ours["level"], ours["server"]) == ("poll_failed", "warning", "a")
    assert library["level"] == "warning" and library["logger"] == "apscheduler.scheduler"
    assert library["event"] == 'Execution of job "poll:a" skipped: maximum number of running instances reached (1)'
    assert "timestamp" in library and "timestamp" in ours


def test_debug_level_lets_library_info_through_only_as_json() -> None:
    stream = io.StringIO()
    logs.configure("debug", json=True, stream=stream)
    logging.getLogger("asyncio").info("a library line")
    logging.getLogger("asyncio").debug("a library debug line")
    assert [(e["event"], e["logger"]) for e in _lines(stream)] == [("a library line", "asyncio")]


def test_console_format_on_request() -> None:
    stream = io.StringIO()
    logs.configure("info", json=False, stream=stream)
    logging.getLogger("apscheduler.scheduler").warning("skipped")
    structlog.get_logger("specwatch").info("started", servers=3)
    text = stream.getvalue()
    assert "skipped" in text and "started" in text and "servers=3" in text
    assert not text.lstrip().startswith("{")


@pytest.mark.real
def test_sigterm_with_polls_in_flight_stops_quietly(tmp_path: Path) -> None:
    """A clean stop is not an error: polls cut short by SIGTERM leave no error line behind (one per server, before)."""
    silent = socket.socket()
    silent.bind((HOST, 0))
    silent.listen(64)  # connections complete in the kernel, and no answer ever comes: every poll stays in flight
    port = silent.getsockname()[1]
    config = tmp_path / "specwatch.yml"
    servers = "".join(f"  - {{name: s{i}, url: 'http://{HOST}:{port}'}}\n" for i in range(5))
    config.write_text(f"poll_interval: 30s\nservers:\n{servers}")
    try:
        with ExporterProcess("--config", str(config)) as exporter:
            exporter.wait_started()
            time.sleep(1.0)  # the first polls are sent at start and wait for their answers
            exporter.signal(signal.SIGTERM)
            assert exporter.process.wait(15) == 0
            exporter.stop()
            errors = [e for e in exporter.events() if e.get("level") in ("error", "critical")]
            assert errors == [], errors
            assert "Traceback" not in exporter.output()
            assert any(e.get("event") == "stopping" for e in exporter.events())
    finally:
        silent.close()
