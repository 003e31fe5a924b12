"""TLS and basic auth for the exporter's own endpoint, configured like Prometheus' --web.config.file."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import socket
import ssl
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import bcrypt

from exporter.settings import ConfigError, read_yaml

TOP_KEYS = ("tls_server_config", "basic_auth_users")
TLS_KEYS = ("cert_file", "key_file")
CACHE_SIZE = 256
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


class WebSecurity:
    """Checks basic-auth headers against bcrypt hashes and wraps the listening socket in TLS; both optional."""

    def __init__(self, users: dict[str, bytes] | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._users = dict(users or {})
        self.tls = tls
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

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """The listening socket in TLS, or unchanged when TLS is not configured."""
        if self.tls is None:
            return sock
        # No handshake in accept(): it happens on the first read, in the thread serving that connection,
        # so a client that stalls its handshake holds up only itself, not the accept loop.
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


def _unknown(keys: Any, allowed: tuple[str, ...], where: str) -> list[str]:
    return [
        f"{where}{key}: unknown key (allowed: {', '.join(allowed)})"
        for key in keys
        if key not in allowed
    ]


def _tls_context(config: Any, base: Path, problems: list[str]) -> ssl.SSLContext | None:
    where = "tls_server_config"
    if not isinstance(config, dict):
        problems.append(f"{where}: must be a mapping with cert_file and key_file")
        return None
    problems.extend(_unknown(config, TLS_KEYS, f"{where}."))
    paths: dict[str, Path] = {}
    for key in TLS_KEYS:
        value = config.get(key)
        if value is None or value == "":
            problems.append(f"{where}.{key}: required")
        elif not isinstance(value, str):
            problems.append(f"{where}.{key}: must be a file path")
        else:
            path = Path(value) if Path(value).is_absolute() else base / value
            try:
                path.read_bytes()
            except OSError as err:
                problems.append(f"{where}.{key}: {str(path)!r} cannot be read: {err.strerror}")
            else:
                paths[key] = path
    if len(paths) != len(TLS_KEYS):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(paths["cert_file"], paths["key_file"])
    except ssl.SSLError as err:
        problems.append(
            f"{where}: cert_file and key_file are not a matching PEM certificate and private key ({err.reason or err})"
        )
        return None
    return context


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
        raise ConfigError([f"the top level must be a mapping with {' and/or '.join(TOP_KEYS)}"], source)
    problems = _unknown(raw, TOP_KEYS, "")
    tls = _tls_context(raw["tls_server_config"], path.parent, problems) if "tls_server_config" in raw else None
    users = _users(raw["basic_auth_users"], problems) if "basic_auth_users" in raw else {}
    if problems:
        raise ConfigError(problems, source)
    return WebSecurity(users, tls)
