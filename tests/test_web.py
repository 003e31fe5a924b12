"""The exporter's own endpoint as scrapers and orchestrators meet it: keep-alive, gzip, open health checks, mTLS."""

from __future__ import annotations

import gzip
import http.client
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import bcrypt
import httpx
import pytest

from specwatch.daemon.exposition.serve import TEXT_FORMAT, Scrape, accepts_gzip
from specwatch.daemon.web import WebApp
from tests.support import dockerfile
from tests.support.certs import Certs, client_certs, make_certs
from tests.support.loopback import FaultServer
from tests.support.net import HOST
from tests.support.process import ExporterProcess

BODY = b"".join(b'specwatch_up{server="s%d"} 1\n' % i for i in range(2000))
USER, PASSWORD = "prometheus", "scrape-secret"


def _metrics(accept: str | None, encoding: str | None) -> Scrape:
    """A large body, gzipped as the exposition would: the web app only carries what it is given."""
    zipped = accepts_gzip(encoding)
    return Scrape(gzip.compress(BODY) if zipped else BODY, TEXT_FORMAT, zipped)


@pytest.fixture
def app():
    accepted: list[socket.socket] = []
    web = WebApp(_metrics, page=lambda: "", reload=lambda: None)
    host, port = web.start("127.0.0.1", 0)
    original = web._httpd.get_request  # type: ignore[union-attr]

    def counted():
        request = original()
        accepted.append(request[0])
        return request

    web._httpd.get_request = counted  # type: ignore[union-attr]
    web.accepted = accepted  # type: ignore[attr-defined]
    web.address = (host, port)  # type: ignore[attr-defined]
    yield web
    web.stop()


def test_two_requests_share_one_connection(app: WebApp) -> None:
    connection = http.client.HTTPConnection(*app.address, timeout=5)  # type: ignore[attr-defined]
    try:
        for path in ("/metrics", "/-/healthy", "/metrics"):
            connection.request("GET", path)
            response = connection.getresponse()
            assert response.status == 200 and response.version == 11
            assert response.getheader("Content-Length") is not None
            response.read()
        # A HEAD carries the length but no body: the next answer on the connection must parse cleanly.
        connection.request("HEAD", "/metrics")
        head = connection.getresponse()
        assert head.status == 200 and int(head.getheader("Content-Length")) == len(BODY)
        assert head.read() == b""
        connection.request("POST", "/-/reload", body=b"x" * 100)  # a body is read past, not taken for the next request
        assert connection.getresponse().read() == b"configuration reloaded\n"
        connection.request("GET", "/-/ready")
        assert connection.getresponse().read() == b"OK\n"
    finally:
        connection.close()
    assert len(app.accepted) == 1  # type: ignore[attr-defined]


def test_metrics_are_gzipped_when_the_client_accepts_it(app: WebApp) -> None:
    host, port = app.address  # type: ignore[attr-defined]
    with httpx.Client(timeout=5) as client:
        zipped = client.get(f"http://{host}:{port}/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip" and zipped.headers["vary"] == "Accept-Encoding"
        assert int(zipped.headers["content-length"]) < len(BODY) / 5
        assert zipped.content == BODY  # httpx decodes it
        plain = client.get(f"http://{host}:{port}/metrics", headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.headers["vary"] == "Accept-Encoding"
        assert plain.content == BODY
    raw = socket.create_connection((host, port), timeout=5)
    raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
    answer = b""
    while chunk := raw.recv(65536):
        answer += chunk
    raw.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head and gzip.decompress(body) == BODY


@pytest.mark.parametrize(("header", "gzipped"), [
    (None, False), ("", False), ("gzip", True), ("gzip, deflate, br", True), ("deflate", False), ("*", True),
    ("gzip;q=0", False), ("*;q=0.5, gzip;q=0", False), ("GZIP;Q=0.8", True), ("identity", False), ("gzip;q=bogus", False),
])
def test_accept_encoding(header: str | None, gzipped: bool) -> None:
    assert accepts_gzip(header) is gzipped


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def watched(tmp_path: Path):
    with FaultServer() as server:
        config = tmp_path / "specwatch.yml"
        config.write_text(f"servers:\n  - name: a\n    url: {server.url}\npoll_interval: 1s\n")
        yield config


@pytest.mark.real
def test_health_endpoints_need_no_credentials_the_rest_does(tmp_path: Path, watched: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: {certs.cert}, key_file: {certs.key}}}\n"
                   f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        url = process.wait_started().url("https")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(certs.ca)), timeout=5) as client:
            for path in ("/-/healthy", "/-/ready"):
                assert client.get(f"{url}{path}").status_code == 200
                assert client.head(f"{url}{path}").status_code == 200
            for path in ("/metrics", "/"):
                assert client.get(f"{url}{path}").status_code == 401
                assert client.get(f"{url}{path}", auth=(USER, PASSWORD)).status_code == 200
            assert client.post(f"{url}/-/reload").status_code == 401


def healthcheck_command(pid: int) -> list[str]:
    """The Dockerfile's HEALTHCHECK command, looking at process `pid` only (here, no container holds it alone)."""
    command = dockerfile.healthcheck_command()
    assert command[0] == "python"
    return [sys.executable, *command[1:], "--pid", str(pid)]


@pytest.mark.real
@pytest.mark.parametrize("tls", [False, True])
def test_the_docker_healthcheck_passes_with_and_without_tls(tmp_path: Path, watched: Path, tls: bool) -> None:
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text((f"tls_server_config: {{cert_file: {certs.cert}, key_file: {certs.key}}}\n" if tls else "")
                   + f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        pid = process.wait_started().process.pid
        assert subprocess.run(healthcheck_command(pid), timeout=30).returncode == 0
    assert subprocess.run(healthcheck_command(pid), timeout=30, capture_output=True).returncode == 1


@pytest.fixture
def mtls(tmp_path: Path, watched: Path):
    server_certs = make_certs(tmp_path / "server")
    allowed = client_certs(tmp_path / "allowed", san="prometheus.example")
    web = tmp_path / "web.yml"
    web.write_text(f"""\
tls_server_config:
  cert_file: {server_certs.cert}
  key_file: {server_certs.key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {allowed.ca}
  min_version: TLS12
  max_version: TLS13
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
""")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        yield process.wait_started(), server_certs, allowed


def client_context(server_ca: Path, client: Certs | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(server_ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


@pytest.mark.real
def test_client_certificates_are_required_and_verified(mtls, tmp_path: Path) -> None:
    process, server_certs, allowed = mtls
    url = process.url("https")
    with httpx.Client(verify=client_context(server_certs.ca, allowed), timeout=5) as client:
        answer = client.get(f"{url}/metrics")
        assert answer.status_code == 200 and "specwatch_build_info" in answer.text
        assert answer.headers["x-frame-options"] == "deny"
        assert answer.headers["strict-transport-security"] == "max-age=31536000"
        assert answer.headers["x-content-type-options"] == "nosniff"
    stranger = client_certs(tmp_path / "stranger", san="prometheus.example")  # signed by a CA the exporter does not trust
    for client in (None, stranger):
        with httpx.Client(verify=client_context(server_certs.ca, client), timeout=5) as refused, \
                pytest.raises(httpx.HTTPError):
            refused.get(f"{url}/-/healthy")
    assert process.process.poll() is None


@pytest.mark.real
def test_client_allowed_sans_admits_only_the_named_clients(tmp_path: Path, watched: Path) -> None:
    server_certs = make_certs(tmp_path / "server")
    allowed = client_certs(tmp_path / "allowed", san="prometheus.example")
    # A client of a second CA the exporter trusts too: its certificate verifies, its name is not allowed.
    outsider = client_certs(tmp_path / "other", san="intruder.example")
    bundle = tmp_path / "cas.pem"
    bundle.write_bytes(allowed.ca.read_bytes() + outsider.ca.read_bytes())
    web = tmp_path / "web.yml"
    web.write_text(f"""\
tls_server_config:
  cert_file: {server_certs.cert}
  key_file: {server_certs.key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {bundle}
  client_allowed_sans: [prometheus.example]
""")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        url = process.wait_started().url("https")
        with httpx.Client(verify=client_context(server_certs.ca, allowed), timeout=5) as client:
            assert client.get(f"{url}/metrics").status_code == 200
        with httpx.Client(verify=client_context(server_certs.ca, outsider), timeout=5) as client, \
                pytest.raises(httpx.HTTPError):
            client.get(f"{url}/metrics")
        assert process.process.poll() is None


@pytest.mark.real
def test_inline_pem_and_a_blank_header_are_accepted(tmp_path: Path, watched: Path) -> None:
    certs = make_certs(tmp_path / "certs")

    def indented(path: Path) -> str:
        return "".join(f"    {line}\n" for line in path.read_text().splitlines())

    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert: |\n{indented(certs.cert)}  key: |\n{indented(certs.key)}"
                   "http_server_config:\n  headers:\n    X-Content-Type-Options: ''\n")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        url = process.wait_started().url("https")
        answer = httpx.get(f"{url}/-/healthy", verify=ssl.create_default_context(cafile=str(certs.ca)), timeout=5)
        assert answer.status_code == 200 and "x-content-type-options" not in answer.headers
    assert HOST == "127.0.0.1"
