"""TLS and basic auth for the exporter's own endpoint, configured like Prometheus' --web.config.file."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import socket
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import bcrypt

from exporter.problems import ConfigError, read_yaml

TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
TLS_KEYS = (
    "cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca", "client_allowed_sans",
    "min_version", "max_version", "prefer_server_cipher_suites",
)
HTTP_KEYS = ("http2", "headers")
# What Prometheus' exporter-toolkit also accepts and this server cannot honour: refused with the reason, never ignored.
UNSUPPORTED = {
    "rate_limit": "not supported by specwatch; put a reverse proxy in front to rate-limit",
    "tls_server_config.cipher_suites": "not supported: Go cipher suite names do not map onto Python's OpenSSL; "
    "remove it to use OpenSSL's default secure suites",
    "tls_server_config.curve_preferences": "not supported: Python's ssl module cannot set a curve preference list; "
    "remove it to use OpenSSL's defaults",
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OLD_TLS_VERSIONS = ("TLS10", "TLS11")
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# The headers exporter-toolkit lets a web config set, with the values it accepts (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
CACHE_SIZE = 256
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")
# Python's names for a certificate's subject alternative names, as getpeercert() gives them.
_SAN_TYPES = ("DNS", "IP Address", "email", "URI")


class WebSecurity:
    """Checks basic-auth headers against bcrypt hashes and wraps the listening socket in TLS; both optional."""

    def __init__(
        self,
        users: dict[str, bytes] | None = None,
        tls: ssl.SSLContext | None = None,
        *,
        headers: dict[str, str] | None = None,
        allowed_sans: frozenset[str] = frozenset(),
    ) -> None:
        self._users = dict(users or {})
        self.tls = tls
        self.headers = dict(headers or {})
        """Headers for every answer; an empty value removes a header specwatch would send."""
        self.allowed_sans = allowed_sans
        # Unknown users are checked against this hash too, so the time taken does not tell which names exist.
        cost = min((int(h[4:6]) for h in self._users.values()), default=4)
        self._decoy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=max(4, cost)))
        # Successful headers are remembered under a keyed hash: Prometheus scrapes every few seconds and a
        # bcrypt each time would cost more than the scrape; the header itself is never kept.
        self._cache_key = os.urandom(32)
        self._accepted: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def requires_auth(self) -> bool:
        return bool(self._users)

    def authorise(self, header: str | None) -> bool:
        """True when no users are configured, or `header` is `Basic` with a configured user's password."""
        if not self._users:
            return True
        if not header:
            return False
        scheme, _, encoded = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        fingerprint = hmac.new(self._cache_key, header.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
        with self._lock:
            if fingerprint in self._accepted:
                self._accepted.move_to_end(fingerprint)
                return True
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, ValueError):
            return False
        if not sep:
            return False
        stored = self._users.get(user)
        try:
            matches = bcrypt.checkpw(password.encode(), stored if stored is not None else self._decoy)
        except ValueError:  # e.g. a password longer than bcrypt's 72 bytes: it cannot match any hash
            return False
        if not matches or stored is None:
            return False
        with self._lock:
            self._accepted[fingerprint] = None
            while len(self._accepted) > CACHE_SIZE:
                self._accepted.popitem(last=False)
        return True

    def admit(self, connection: socket.socket) -> bool:
        """Whether a connection's client certificate carries one of client_allowed_sans (True when none are set)."""
        if not self.allowed_sans or not isinstance(connection, ssl.SSLSocket):
            return True
        connection.do_handshake()  # deferred from accept() to this connection's thread; a bad handshake raises here
        certificate = connection.getpeercert() or {}
        names = {value for kind, value in certificate.get("subjectAltName", ()) if kind in _SAN_TYPES}
        return bool(names & self.allowed_sans)

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """The listening socket in TLS, or unchanged when TLS is not configured."""
        if self.tls is None:
            return sock
        # No handshake in accept(): it happens on the first read, in the thread serving that connection,
        # so a client that stalls its handshake holds up only itself, not the accept loop.
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


def _unknown(keys: Any, allowed: tuple[str, ...], where: str) -> list[str]:
    problems = []
    for key in keys:
        if key in allowed:
            continue
        reason = UNSUPPORTED.get(f"{where}{key}")
        problems.append(f"{where}{key}: {reason}" if reason else f"{where}{key}: unknown key (allowed: {', '.join(allowed)})")
    return problems


def _path(value: Any, base: Path, where: str, problems: list[str]) -> Path | None:
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: must be a file path")
        return None
    path = Path(value) if Path(value).is_absolute() else base / value
    try:
        path.read_bytes()
    except OSError as err:
        problems.append(f"{where}: {str(path)!r} cannot be read: {err.strerror}")
        return None
    return path


def _pem(config: dict[str, Any], file_key: str, inline_key: str, base: Path, where: str, problems: list[str]) -> Any:
    """A PEM source given as a file (`file_key`) or inline (`inline_key`): a Path, a str, or None when absent/bad."""
    given = [k for k in (file_key, inline_key) if config.get(k) not in (None, "")]
    if len(given) == 2:
        problems.append(f"{where}: set {file_key} or {inline_key}, not both")
        return None
    if not given:
        return None
    if given[0] == file_key:
        return _path(config[file_key], base, f"{where}.{file_key}", problems)
    value = config[inline_key]
    if not isinstance(value, str) or "-----BEGIN" not in value:
        problems.append(f"{where}.{inline_key}: must be PEM text (-----BEGIN ...)")
        return None
    return value


def _load_chain(context: ssl.SSLContext, cert: Path | str, key: Path | str) -> None:
    """load_cert_chain takes only files: inline PEM goes through a private temporary directory, removed at once."""
    with tempfile.TemporaryDirectory(prefix="specwatch-tls-") as private:
        paths = []
        for name, source in (("cert.pem", cert), ("key.pem", key)):
            if isinstance(source, Path):
                paths.append(source)
                continue
            path = Path(private) / name
            path.touch(mode=0o600)
            path.write_text(source)
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])


def _tls_version(config: dict[str, Any], key: str, where: str, problems: list[str]) -> ssl.TLSVersion | None:
    value = config.get(key)
    if value is None:
        return None
    if value in OLD_TLS_VERSIONS:
        problems.append(f"{where}.{key}: {value} is not offered: TLS 1.0 and 1.1 are deprecated (RFC 8996); use TLS12 or TLS13")
        return None
    if value not in TLS_VERSIONS:
        problems.append(f"{where}.{key}: {value!r} is not a TLS version (use TLS12 or TLS13)")
        return None
    return TLS_VERSIONS[value]


def _tls_context(config: Any, base: Path, problems: list[str]) -> tuple[ssl.SSLContext | None, frozenset[str]]:
    where = "tls_server_config"
    if not isinstance(config, dict):
        problems.append(f"{where}: must be a mapping with cert_file and key_file")
        return None, frozenset()
    before = len(problems)
    problems.extend(_unknown(config, TLS_KEYS, f"{where}."))
    cert = _pem(config, "cert_file", "cert", base, where, problems)
    key = _pem(config, "key_file", "key", base, where, problems)
    for name, source, inline in (("cert_file", cert, "cert"), ("key_file", key, "key")):
        if source is None and config.get(name) in (None, "") and config.get(inline) in (None, ""):
            problems.append(f"{where}.{name}: required (or {inline}: inline PEM)")
    client_ca = _pem(config, "client_ca_file", "client_ca", base, where, problems)
    auth = config.get("client_auth_type", "NoClientCert")
    if auth in UNVERIFIED_CLIENT_AUTH:
        problems.append(
            f"{where}.client_auth_type: {auth} is not supported: it accepts certificates nobody verified, which Python's "
            "TLS cannot do (and exporter-toolkit calls insecure); use RequireAndVerifyClientCert with client_ca_file"
        )
    elif auth not in CLIENT_AUTH:
        problems.append(f"{where}.client_auth_type: {auth!r} is not one of {', '.join([*CLIENT_AUTH, *UNVERIFIED_CLIENT_AUTH])}")
    elif auth != "NoClientCert" and client_ca is None and not any(f"{where}.client_ca" in p for p in problems[before:]):
        problems.append(f"{where}.client_ca_file: required by client_auth_type {auth} (the CA that signs client certificates)")
    elif auth == "NoClientCert" and client_ca is not None:
        problems.append(
            f"{where}.client_auth_type: client_ca_file is set but client_auth_type is NoClientCert (the default), so no "
            "client certificate would be asked for; set client_auth_type: RequireAndVerifyClientCert"
        )
    sans = config.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(n, str) and n for n in sans):
        problems.append(f"{where}.client_allowed_sans: must be a list of names")
        sans = []
    elif sans and auth != "RequireAndVerifyClientCert":
        problems.append(f"{where}.client_allowed_sans: needs client_auth_type: RequireAndVerifyClientCert (a client without "
                        "a certificate has no name to match)")
    minimum = _tls_version(config, "min_version", where, problems)
    maximum = _tls_version(config, "max_version", where, problems)
    if minimum is not None and maximum is not None and minimum > maximum:
        problems.append(f"{where}: min_version {config['min_version']} is above max_version {config['max_version']}")
    prefer = config.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append(f"{where}.prefer_server_cipher_suites: must be true or false")
    if len(problems) > before or cert is None or key is None:
        return None, frozenset()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = minimum or ssl.TLSVersion.TLSv1_2
    if maximum is not None:
        context.maximum_version = maximum
    if prefer:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        _load_chain(context, cert, key)
    except ssl.SSLError as err:
        problems.append(
            f"{where}: cert_file and key_file are not a matching PEM certificate and private key ({err.reason or err})"
        )
        return None, frozenset()
    if client_ca is not None:
        try:
            if isinstance(client_ca, Path):
                context.load_verify_locations(cafile=client_ca)
            else:
                context.load_verify_locations(cadata=client_ca)
        except ssl.SSLError as err:
            problems.append(f"{where}: client CA is not a PEM certificate ({err.reason or err})")
            return None, frozenset()
    context.verify_mode = CLIENT_AUTH[auth]
    return context, frozenset(sans)


def _http_config(config: Any, problems: list[str]) -> dict[str, str]:
    where = "http_server_config"
    if not isinstance(config, dict):
        problems.append(f"{where}: must be a mapping with http2 and/or headers")
        return {}
    problems.extend(_unknown(config, HTTP_KEYS, f"{where}."))
    http2 = config.get("http2", False)
    if http2 is True:
        problems.append(f"{where}.http2: true is not supported: this endpoint speaks HTTP/1.1 (with keep-alive); "
                        "set http2: false or remove it")
    elif not isinstance(http2, bool):
        problems.append(f"{where}.http2: must be true or false")
    headers = config.get("headers") or {}
    if not isinstance(headers, dict):
        problems.append(f"{where}.headers: must be a mapping of header name to value")
        return {}
    chosen: dict[str, str] = {}
    canonical = {name.lower(): name for name in HEADERS}
    for name, value in headers.items():
        known = canonical.get(str(name).lower())
        if known is None:
            problems.append(f"{where}.headers.{name}: not a header a web config may set (allowed: {', '.join(HEADERS)})")
            continue
        text = "" if value is None else str(value)
        allowed = HEADERS[known]
        if text and allowed is not None and text.lower() not in allowed:
            problems.append(f"{where}.headers.{known}: {text!r} is not one of {', '.join(allowed)}")
            continue
        if any(ch in text for ch in "\r\n"):
            problems.append(f"{where}.headers.{known}: must be one line")
            continue
        chosen[known] = text
    return chosen


def _users(config: Any, problems: list[str]) -> dict[str, bytes]:
    where = "basic_auth_users"
    if not isinstance(config, dict):
        problems.append(f"{where}: must be a mapping of user name to bcrypt hash")
        return {}
    users: dict[str, bytes] = {}
    for user, hashed in config.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"{where}: user name {user!r} must be a non-empty string without ':'")
            continue
        if not isinstance(hashed, str):
            problems.append(f"{where}.{user}: must be a bcrypt hash string such as $2b$12$...")
            continue
        encoded = hashed.strip().encode("utf-8", "replace")
        valid = encoded.startswith(_BCRYPT_PREFIXES) and len(encoded) == 60 and encoded[4:6].isdigit()
        if valid:
            try:
                bcrypt.checkpw(b"", encoded)
            except ValueError:
                valid = False
        if not valid:
            # The value itself is never echoed: a password pasted in by mistake must not reach a log.
            problems.append(f"{where}.{user}: not a bcrypt hash (expected 60 characters starting with $2b$, $2a$ or $2y$)")
            continue
        users[user] = encoded
    return users


def load_web_config(path: Path | str) -> WebSecurity:
    """WebSecurity from a YAML file; raises ConfigError listing every problem. Relative paths are relative to the file."""
    path = Path(path)
    source = f"web config file {str(path)!r}"
    raw = read_yaml(path, source)
    if raw is None:
        return WebSecurity()
    if not isinstance(raw, dict):
        raise ConfigError([f"the top level must be a mapping with {', '.join(TOP_KEYS)}"], source)
    problems = _unknown(raw, TOP_KEYS, "")
    tls, sans = (None, frozenset[str]())
    if "tls_server_config" in raw:
        tls, sans = _tls_context(raw["tls_server_config"], path.parent, problems)
    headers = _http_config(raw["http_server_config"], problems) if "http_server_config" in raw else {}
    users = _users(raw["basic_auth_users"], problems) if "basic_auth_users" in raw else {}
    if problems:
        raise ConfigError(problems, source)
    return WebSecurity(users, tls, headers=headers, allowed_sans=sans)
