"""The image's health check on real exporter processes: it finds their port, speaks HTTP or TLS, and fails on a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwatch.daemon.healthcheck import TIMEOUT, _address, listen_addresses
from specwatch.daemon.web import DEFAULT_PORT
from tests.support.certs import make_certs
from tests.support.dockerfile import healthcheck_options
from tests.support.net import refused_url
from tests.support.process import ExporterProcess

REPO = Path(__file__).resolve().parent.parent


def healthcheck(*pids: int) -> subprocess.CompletedProcess[str]:
    args = [arg for pid in pids for arg in ("--pid", str(pid))]
    return subprocess.run([sys.executable, "-m", "specwatch.daemon.healthcheck", *args], capture_output=True, text=True,
                          timeout=30, cwd=REPO)


def accept_queue(port: int) -> int:
    """Connections the kernel completed on a listening port that its process has not accepted (yet)."""
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN; rx_queue is the backlog
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "specwatch.yml"
    path.write_text(f"servers:\n  - {{name: a, url: '{refused_url()}'}}\n")
    return path


@pytest.mark.parametrize(("line", "address"), [
    ("0100007F:2660", ("127.0.0.1", 9824)),
    ("00000000:1F90", ("0.0.0.0", 8080)),
    ("00000000000000000000000001000000:2660", ("::1", 9824)),
    ("00000000000000000000000000000000:0050", ("::", 80)),
])
def test_proc_net_tcp_addresses_are_decoded(line: str, address: tuple[str, int]) -> None:
    assert _address(line) == address


@pytest.mark.real
def test_a_running_exporter_is_found_on_its_own_port_and_healthy(config: Path) -> None:
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        assert exporter.port != DEFAULT_PORT
        assert listen_addresses(pids=[exporter.process.pid]) == [("127.0.0.1", exporter.port)]
        result = healthcheck(exporter.process.pid)
        assert result.returncode == 0, result.stderr


@pytest.mark.real
def test_a_tls_endpoint_is_asked_over_tls(config: Path, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n")
    with ExporterProcess("--config", str(config), "--web-config", str(web)) as exporter:
        exporter.wait_started()
        result = healthcheck(exporter.process.pid)
        assert result.returncode == 0, result.stderr


@pytest.mark.real
def test_a_stopped_exporter_gets_no_answer_and_is_unhealthy(config: Path) -> None:
    """The kernel still accepts connections for a SIGSTOPped process: only the timeout can tell."""
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        pid = exporter.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            queued = accept_queue(exporter.port)
            started = time.monotonic()
            result = healthcheck(pid)
            took = time.monotonic() - started
            asked = accept_queue(exporter.port) - queued
        finally:
            os.kill(pid, signal.SIGCONT)
        assert result.returncode == 1
        assert f"127.0.0.1:{exporter.port}/-/healthy: no answer within {TIMEOUT:g}s" in result.stderr
        # It fails within the HEALTHCHECK's --timeout, not killed: it gave up by itself after one wait of TIMEOUT (one
        # connection, no retry, no TLS attempt after it), and that wait leaves at least as long again for the
        # interpreter to start. A count and the check's own timer, so a busy machine's slow start cannot fail it.
        limit = float(healthcheck_options()["timeout"].removesuffix("s"))
        assert asked == 1 and TIMEOUT <= took, (asked, took)
        assert 2 * TIMEOUT <= limit, f"the check's {TIMEOUT:g}s wait leaves the HEALTHCHECK's --timeout ({limit:g}s) no room"
        assert healthcheck(pid).returncode == 0, "healthy again once it runs"


@pytest.mark.real
def test_a_process_that_does_not_listen_is_unhealthy() -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = healthcheck(idle.pid)
    finally:
        idle.kill()
        idle.wait()
    assert result.returncode == 1
    assert "no listening TCP socket found" in result.stderr


@pytest.mark.real
def test_a_process_that_is_gone_is_unhealthy_not_looked_for_elsewhere() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    result = healthcheck(gone.pid)
    assert result.returncode == 1
    assert f"cannot look at process {gone.pid}" in result.stderr
