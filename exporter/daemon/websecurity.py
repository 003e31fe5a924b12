"""TLS, headers and basic auth at the exporter's own endpoint, from a web config file (its schema is webconfig.py)."""

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

import bcrypt
from pydantic import ValidationError

from ..problems import ConfigError, problem_lines, read_yaml
from .webconfig import CLIENT_AUTH, TLS_VERSIONS, TLSServerConfig, WebConfig, unsupported

CACHE_SIZE = 256
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


def tls_context(config: TLSServerConfig) -> ssl.SSLContext:
    """The server's TLS context; raises ValueError when the certificate, key or client CA do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[config.min_version] if config.min_version else ssl.TLSVersion.TLSv1_2
    if config.max_version is not None:
        context.maximum_version = TLS_VERSIONS[config.max_version]
    if config.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        # The schema requires a certificate and a key, each as a file or inline.
        _load_chain(context, config.cert_file or config.cert or "", config.key_file or config.key or "")
    except ssl.SSLError as err:
        reason = err.reason or err
        raise ValueError(f"cert_file and key_file are not a matching PEM certificate and private key ({reason})") from None
    try:
        if config.client_ca_file is not None:
            context.load_verify_locations(cafile=config.client_ca_file)
        elif config.client_ca is not None:
            context.load_verify_locations(cadata=config.client_ca)
    except ssl.SSLError as err:
        raise ValueError(f"client CA is not a PEM certificate ({err.reason or err})") from None
    context.verify_mode = CLIENT_AUTH[config.client_auth_type]
    return context


def load_web_config(path: Path | str) -> WebSecurity:
    """WebSecurity from a YAML file; raises ConfigError listing every problem. Relative paths are relative to the file."""
    path = Path(path)
    source = f"web config file {str(path)!r}"
    raw = read_yaml(path, source)
    if raw is None:
        return WebSecurity()
    if not isinstance(raw, dict):
        raise ConfigError([f"the top level must be a mapping with {', '.join(WebConfig.model_fields)}"], source)
    try:
        config = WebConfig.model_validate(raw, context=path.parent)
    except ValidationError as err:
        raise ConfigError(problem_lines(err, WebConfig, data=raw, unknown=unsupported), source) from None
    tls, sans = None, frozenset[str]()
    if config.tls_server_config is not None:
        try:
            tls = tls_context(config.tls_server_config)
        except ValueError as err:
            raise ConfigError([f"tls_server_config: {err}"], source) from None
        sans = frozenset(config.tls_server_config.client_allowed_sans)
    headers = config.http_server_config.headers if config.http_server_config is not None else {}
    return WebSecurity(config.basic_auth_users, tls, headers=headers, allowed_sans=sans)
