"""TLS and basic auth on the exporter's own endpoint: the web config file, and a real TLS client against `specwatch run`."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from pathlib import Path

import bcrypt
import httpx
import pytest

from specwatch.daemon.websecurity import WebSecurity, load_web_config
from specwatch.problems import ConfigError
from tests.support.certs import make_certs
from tests.support.loopback import FaultServer
from tests.support.net import HOST, refused_url
from tests.support.process import ExporterProcess

USER, PASSWORD = "prometheus", "correct horse battery staple"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def bcrypt_hash(password: str) -> str:
    # Cost 4 keeps the tests fast; the cost is read from the hash, so real configs use 10-12.
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")


@pytest.fixture
def web_config(tmp_path, certs) -> Path:
    return write(tmp_path / "web.yml", f"""\
tls_server_config:
  cert_file: certs/{certs.cert.name}
  key_file: certs/{certs.key.name}
basic_auth_users:
  {USER}: {bcrypt_hash(PASSWORD)}
""")


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    assert str(path) in str(caught.value)
    return caught.value.problems


def test_full_config_loads(web_config: Path) -> None:
    security = load_web_config(web_config)
    assert security.requires_auth and security.tls is not None
    assert security.tls.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_empty_config_turns_nothing_on(tmp_path) -> None:
    security = load_web_config(write(tmp_path / "web.yml", "# nothing yet\n"))
    assert not security.requires_auth and security.tls is None
    assert security.authorise(None) is True
    with socket.socket() as sock:
        assert security.wrap_socket(sock) is sock


def test_unknown_keys_are_named(tmp_path, certs) -> None:
    path = write(tmp_path / "web.yml", f"""\
tls_config: {{}}
tls_server_config:
  cert_file: {certs.cert}
  key_file: {certs.key}
  client_certificate: {certs.ca}
basic_auth_users: {{}}
""")
    assert problems(path) == [
        "tls_server_config.client_certificate: unknown key (allowed: cert_file, key_file, cert, key, client_auth_type, "
        "client_ca_file, client_ca, client_allowed_sans, min_version, max_version, prefer_server_cipher_suites)",
        "tls_config: unknown key (allowed: tls_server_config, http_server_config, basic_auth_users)",
    ]


def test_every_problem_is_listed_at_once(tmp_path, certs) -> None:
    path = write(tmp_path / "web.yml", f"""\
tls_server_config:
  cert_file: {tmp_path}/missing.pem
basic_auth_users:
  alice: hunter2
  "bob:x": {bcrypt_hash("x")}
  carol: 42
""")
    assert problems(path) == [
        f"tls_server_config.cert_file: {str(tmp_path / 'missing.pem')!r} cannot be read: No such file or directory",
        "tls_server_config.key_file: required (or key: inline PEM)",
        "basic_auth_users.alice: not a bcrypt hash (expected 60 characters starting with $2b$, $2a$ or $2y$)",
        "basic_auth_users: user name 'bob:x' must be a non-empty string without ':'",
        "basic_auth_users.carol: must be a bcrypt hash string such as $2b$12$...",
    ]


def test_a_plain_password_is_never_echoed(tmp_path) -> None:
    path = write(tmp_path / "web.yml", "basic_auth_users:\n  alice: my-plain-password-123\n")
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    assert "my-plain-password-123" not in str(caught.value)


def test_mismatched_certificate_and_key(tmp_path, certs) -> None:
    other = make_certs(tmp_path / "other")
    path = write(tmp_path / "web.yml", f"tls_server_config: {{cert_file: {certs.cert}, key_file: {other.key}}}\n")
    [problem] = problems(path)
    assert problem.startswith("tls_server_config: cert_file and key_file are not a matching PEM certificate and private key (")


def test_a_client_ca_that_is_not_a_certificate(tmp_path, certs) -> None:
    path = write(tmp_path / "web.yml", _tls(certs, "  client_auth_type: RequireAndVerifyClientCert\n"
                                                   "  client_ca: \"-----BEGIN CERTIFICATE-----\\nbm90IGEgY2VydA==\\n-----END CERTIFICATE-----\\n\"\n"))
    [problem] = problems(path)
    assert problem.startswith("tls_server_config: client CA is not a PEM certificate (")


@pytest.mark.parametrize(("text", "problem"), [
    ("- a\n- b\n", "the top level must be a mapping with tls_server_config, http_server_config, basic_auth_users"),
    ("tls_server_config: yes\n", "tls_server_config: must be a mapping with cert_file and key_file"),
    ("basic_auth_users: [alice]\n", "basic_auth_users: must be a mapping of user name to bcrypt hash"),
    ("basic_auth_users:\n", "basic_auth_users: must be a mapping of user name to bcrypt hash"),
    ("http_server_config: yes\n", "http_server_config: must be a mapping with http2 and/or headers"),
    ("tls_server_config:\n  cert_file: 42\n  key: '-----BEGIN PRIVATE KEY-----'\n", "tls_server_config.cert_file: must be a file path"),
    ("tls_server_config:\n  cert: pasted\n  key: '-----BEGIN PRIVATE KEY-----'\n",
     "tls_server_config.cert: must be PEM text (-----BEGIN ...)"),
])
def test_wrong_shapes(tmp_path, text: str, problem: str) -> None:
    assert problems(write(tmp_path / "web.yml", text)) == [problem]


def test_unreadable_and_invalid_yaml(tmp_path) -> None:
    assert problems(tmp_path / "absent.yml") == ["cannot read: No such file or directory"]
    assert problems(write(tmp_path / "web.yml", 'basic_auth_users:\n  alice: "$2b$04$secret-ish\n')) == [
        "not valid YAML: found unexpected end of stream at line 3, column 1"
    ]
    assert problems(write(tmp_path / "twice.yml", "basic_auth_users:\n  alice: x\n  alice: y\n")) == [
        "not valid YAML: key 'alice' given twice (first at line 2, column 3) at line 3, column 3"
    ]


class CountingBcrypt:
    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = bcrypt.checkpw

        def counted(password: bytes, hashed: bytes) -> bool:
            self.calls += 1
            return real(password, hashed)

        monkeypatch.setattr("specwatch.daemon.websecurity.bcrypt.checkpw", counted)


def test_authorise(monkeypatch) -> None:
    security = WebSecurity({USER: bcrypt_hash(PASSWORD).encode()})
    counter = CountingBcrypt(monkeypatch)
    assert security.authorise(basic(USER, PASSWORD)) is True
    assert security.authorise(basic(USER, "wrong")) is False
    assert security.authorise(basic("mallory", PASSWORD)) is False
    for header in (None, "", "Bearer abc", "Basic", "Basic !!!not-base64!!!", "Basic " + base64.b64encode(b"nocolon").decode(),
                   "Basic " + base64.b64encode(b"\xff\xfe:x").decode(), basic(USER, "x" * 100)):
        assert security.authorise(header) is False, header
    # Unknown users cost a bcrypt like wrong passwords do, so timing does not reveal which names exist.
    assert counter.calls == 4


def test_successful_checks_are_cached_failures_are_not(monkeypatch) -> None:
    security = WebSecurity({USER: bcrypt_hash(PASSWORD).encode()})
    counter = CountingBcrypt(monkeypatch)
    for _ in range(5):
        assert security.authorise(basic(USER, PASSWORD)) is True
    assert counter.calls == 1
    for _ in range(3):
        assert security.authorise(basic(USER, PASSWORD + "!")) is False
    assert counter.calls == 4


def test_the_cache_is_bounded(monkeypatch) -> None:
    from specwatch.daemon import websecurity

    monkeypatch.setattr(websecurity, "CACHE_SIZE", 2)
    security = WebSecurity({"a": bcrypt_hash("1").encode(), "b": bcrypt_hash("2").encode(), "c": bcrypt_hash("3").encode()})
    counter = CountingBcrypt(monkeypatch)
    for user, password in (("a", "1"), ("b", "2"), ("c", "3"), ("a", "1")):
        assert security.authorise(basic(user, password))
    assert counter.calls == 4  # "a" was evicted by "c" and checked again


@pytest.fixture
def watched(tmp_path) -> Path:
    with FaultServer() as server:
        config = f"servers:\n  - name: a\n    url: {server.url}\npoll_interval: 1s\npoll_timeout: 500ms\n"
        yield write(tmp_path / "specwatch.yml", config)


@pytest.fixture
def exporter(watched: Path, web_config: Path):
    with ExporterProcess("--config", str(watched), "--web-config", str(web_config)) as process:
        yield process.wait_started()


def trusting(certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


@pytest.mark.real
def test_tls_and_basic_auth_on_a_real_exporter(exporter: ExporterProcess, certs) -> None:
    url = exporter.url("https")
    with httpx.Client(verify=trusting(certs), timeout=5) as client:
        ok = client.get(f"{url}/metrics", auth=(USER, PASSWORD))
        assert ok.status_code == 200 and "specwatch_build_info" in ok.text
        refused = client.get(f"{url}/metrics")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == 'Basic realm="specwatch"'
        assert "specwatch_" not in refused.text
        assert client.get(f"{url}/metrics", auth=(USER, "wrong")).status_code == 401
        assert client.get(f"{url}/", auth=("nobody", PASSWORD)).status_code == 401
        # Every page that tells about the fleet, as `specwatch run --help` lists them.
        for path in ("/", "/sd", "/api/v1/verdicts"):
            assert (client.get(f"{url}{path}").status_code, client.get(f"{url}{path}", auth=(USER, PASSWORD)).status_code) \
                == (401, 200), path
        assert client.post(f"{url}/-/reload").status_code == 401
        assert client.post(f"{url}/-/reload", auth=(USER, PASSWORD)).status_code == 200


@pytest.mark.real
def test_a_client_that_does_not_trust_the_certificate_is_refused(exporter: ExporterProcess) -> None:
    with httpx.Client(timeout=5) as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(f"{exporter.url('https')}/metrics", auth=(USER, PASSWORD))


@pytest.mark.real
def test_plain_http_gets_nothing_and_tls_keeps_working(exporter: ExporterProcess, certs) -> None:
    with httpx.Client(timeout=5) as plain, pytest.raises(httpx.HTTPError):
        plain.get(f"{exporter.url('http')}/metrics", auth=(USER, PASSWORD))
    with httpx.Client(verify=trusting(certs), timeout=5) as client:
        assert client.get(f"{exporter.url('https')}/metrics", auth=(USER, PASSWORD)).status_code == 200


@pytest.mark.real
def test_a_stalled_handshake_does_not_block_other_clients(exporter: ExporterProcess, certs) -> None:
    stalled = [socket.create_connection((HOST, exporter.port)) for _ in range(3)]  # connect, then never say hello
    try:
        time.sleep(0.2)
        started = time.monotonic()
        with httpx.Client(verify=trusting(certs), timeout=5) as client:
            assert client.get(f"{exporter.url('https')}/-/healthy", auth=(USER, PASSWORD)).status_code == 200
        assert time.monotonic() - started < 2
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.real
def test_basic_auth_without_tls(tmp_path, watched: Path) -> None:
    web = write(tmp_path / "auth-only.yml", f"basic_auth_users:\n  {USER}: {bcrypt_hash(PASSWORD)}\n")
    with ExporterProcess("--config", str(watched), "--web-config", str(web)) as process:
        url = process.wait_started().url()
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 401
        assert httpx.get(f"{url}/metrics", auth=(USER, PASSWORD), timeout=5).status_code == 200


@pytest.mark.real
def test_a_bad_web_config_stops_the_exporter_with_the_problems(tmp_path) -> None:
    web = write(tmp_path / "web.yml", "tls_server_config:\n  cert_file: nope.pem\n  key_file: nope-key.pem\nbasic_auth: {}\n")
    config = write(tmp_path / "specwatch.yml", f"servers:\n  - name: a\n    url: {refused_url()}\n")
    with ExporterProcess("--config", str(config), "--web-config", str(web)) as process:
        assert process.process.wait(20) == 2
    errors = "".join(process.stderr)
    assert errors == (
        f"specwatch: invalid web config file {str(web)!r} (3 problems):\n"
        f"  - tls_server_config.cert_file: {str(tmp_path / 'nope.pem')!r} cannot be read: No such file or directory\n"
        f"  - tls_server_config.key_file: {str(tmp_path / 'nope-key.pem')!r} cannot be read: No such file or directory\n"
        "  - basic_auth: unknown key (did you mean basic_auth_users?)\n"
    )


def test_the_shipped_example_loads_once_its_certificates_exist(tmp_path, certs) -> None:
    example = (Path(__file__).parent.parent / "examples" / "web-config.yml").read_text()
    text = example.replace("/etc/specwatch/tls/cert.pem", str(certs.cert)).replace("/etc/specwatch/tls/key.pem", str(certs.key))
    security = load_web_config(write(tmp_path / "web.yml", text))
    assert security.tls is not None
    assert security.authorise(basic("prometheus", "test")) and not security.authorise(basic("prometheus", "nope"))


def _tls(certs, extra: str) -> str:
    return f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n{extra}"


BAD_WEB_CONFIGS = [
    ("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "tls_server_config.cipher_suites: not supported: Go cipher suite names do not map onto Python's OpenSSL; remove it to "
     "use OpenSSL's default secure suites"),
    ("  curve_preferences: [X25519]\n",
     "tls_server_config.curve_preferences: not supported: Python's ssl module cannot set a curve preference list; remove it "
     "to use OpenSSL's defaults"),
    ("  client_auth_type: RequireAnyClientCert\n",
     "tls_server_config.client_auth_type: RequireAnyClientCert is not supported: it accepts certificates nobody verified, "
     "which Python's TLS cannot do (and exporter-toolkit calls insecure); use RequireAndVerifyClientCert with client_ca_file"),
    ("  client_auth_type: RequestClientCert\n",
     "tls_server_config.client_auth_type: RequestClientCert is not supported: it accepts certificates nobody verified, "
     "which Python's TLS cannot do (and exporter-toolkit calls insecure); use RequireAndVerifyClientCert with client_ca_file"),
    ("  client_auth_type: Mandatory\n",
     "tls_server_config.client_auth_type: 'Mandatory' is not one of NoClientCert, VerifyClientCertIfGiven, "
     "RequireAndVerifyClientCert, RequestClientCert, RequireAnyClientCert"),
    ("  client_auth_type: RequireAndVerifyClientCert\n",
     "tls_server_config.client_ca_file: required by client_auth_type RequireAndVerifyClientCert (the CA that signs client "
     "certificates)"),
    ("  client_ca_file: CA\n",
     "tls_server_config.client_auth_type: client_ca_file is set but client_auth_type is NoClientCert (the default), so no "
     "client certificate would be asked for; set client_auth_type: RequireAndVerifyClientCert"),
    ("  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: CA\n  client_allowed_sans: [a.example]\n",
     "tls_server_config.client_allowed_sans: needs client_auth_type: RequireAndVerifyClientCert (a client without a "
     "certificate has no name to match)"),
    ("  min_version: TLS10\n",
     "tls_server_config.min_version: TLS10 is not offered: TLS 1.0 and 1.1 are deprecated (RFC 8996); use TLS12 or TLS13"),
    ("  max_version: TLS1.3\n", "tls_server_config.max_version: 'TLS1.3' is not a TLS version (use TLS12 or TLS13)"),
    ("  min_version: TLS13\n  max_version: TLS12\n", "tls_server_config: min_version TLS13 is above max_version TLS12"),
    ("  cert: '-----BEGIN CERTIFICATE-----'\n", "tls_server_config: set cert_file or cert, not both"),
    ("http_server_config:\n  http2: true\n",
     "http_server_config.http2: true is not supported: this endpoint speaks HTTP/1.1 (with keep-alive); set http2: false "
     "or remove it"),
    ("http_server_config:\n  headers: {X-Powered-By: specwatch}\n",
     "http_server_config.headers.X-Powered-By: not a header a web config may set (allowed: Content-Security-Policy, "
     "X-Frame-Options, X-Content-Type-Options, X-XSS-Protection, Strict-Transport-Security)"),
    ("http_server_config:\n  headers: {X-Frame-Options: allow}\n",
     "http_server_config.headers.X-Frame-Options: 'allow' is not one of deny, sameorigin"),
    ("http_server_config:\n  grpc: true\n", "http_server_config.grpc: unknown key (allowed: http2, headers)"),
    ("http_server_config:\n  http2: maybe\n", "http_server_config.http2: must be true or false"),
    ("http_server_config:\n  headers: [X-Frame-Options]\n", "http_server_config.headers: must be a mapping of header name to value"),
    ("http_server_config:\n  headers: {X-XSS-Protection: \"1\\r\\nSet-Cookie: a=b\"}\n",
     "http_server_config.headers.X-XSS-Protection: must be one line"),
    ("  prefer_server_cipher_suites: 'yes'\n", "tls_server_config.prefer_server_cipher_suites: must be true or false"),
    ("  client_auth_type: RequireAndVerifyClientCert\n  client_ca: not-pem\n",
     "tls_server_config.client_ca: must be PEM text (-----BEGIN ...)"),
    ("  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: CA\n  client_allowed_sans: [a.example, '']\n",
     "tls_server_config.client_allowed_sans: must be a list of names"),
    ("  client_auth_type: RequireAndVerifyClientCert\n  client_ca: '-----BEGIN CERTIFICATE-----'\n  client_ca_file: CA\n",
     "tls_server_config: set client_ca_file or client_ca, not both"),
    ("rate_limit: {interval: 1s, burst: 10}\n",
     "rate_limit: not supported by specwatch; put a reverse proxy in front to rate-limit"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_WEB_CONFIGS, ids=[e[:50] for _, e in BAD_WEB_CONFIGS])
def test_each_bad_web_config_gives_its_exact_error(tmp_path, certs, extra: str, expected: str) -> None:
    text = _tls(certs, extra.replace(": CA", f": {certs.ca}")) if extra.startswith("  ") else _tls(certs, "") + extra
    assert problems(write(tmp_path / "web.yml", text)) == [expected]


def test_the_rest_of_prometheus_web_config_is_accepted(tmp_path, certs) -> None:
    security = load_web_config(write(tmp_path / "web.yml", _tls(certs, f"""\
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {certs.ca}
  client_allowed_sans: [prometheus.example]
  min_version: TLS13
  max_version: TLS13
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    Content-Security-Policy: default-src 'self'
    x-frame-options: sameorigin
    X-XSS-Protection: ''
""")))
    assert security.tls is not None and security.tls.verify_mode == ssl.CERT_REQUIRED
    assert security.tls.minimum_version == security.tls.maximum_version == ssl.TLSVersion.TLSv1_3
    assert security.allowed_sans == {"prometheus.example"}
    assert security.headers == {"Content-Security-Policy": "default-src 'self'", "X-Frame-Options": "sameorigin",
                                "X-XSS-Protection": ""}
