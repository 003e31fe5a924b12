"""The web config file's schema (Prometheus' --web.config.file): TLS, headers, basic auth, each refusal with its reason."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import bcrypt
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator

from ..problems import Loc, refusal, refusing_also

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
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")
_PEM_SOURCES = (("cert_file", "cert"), ("key_file", "key"), ("client_ca_file", "client_ca"))


def unsupported(loc: Loc) -> str | None:
    """Why a key Prometheus knows is refused here, or None for a key nobody knows."""
    return UNSUPPORTED.get(".".join(map(str, loc)))


def _mapping(message: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(message)
        return value
    return BeforeValidator(check)


def _given(value: Any) -> bool:
    return value not in (None, "")


def _file(value: Any, info: ValidationInfo) -> Path | None:
    """A readable file; relative to the web config file's directory, which validation gets as its context."""
    if not _given(value):
        return None
    if not isinstance(value, str):
        raise ValueError("must be a file path")
    base = info.context if isinstance(info.context, Path) else Path()
    path = Path(value) if Path(value).is_absolute() else base / value
    try:
        path.read_bytes()
    except OSError as err:
        raise ValueError(f"{str(path)!r} cannot be read: {err.strerror}") from None
    return path


def _pem(value: Any) -> str | None:
    if not _given(value):
        return None
    if not isinstance(value, str) or "-----BEGIN" not in value:
        raise ValueError("must be PEM text (-----BEGIN ...)")
    return value


def _client_auth(value: Any) -> Any:
    if value in UNVERIFIED_CLIENT_AUTH:
        raise ValueError(
            f"{value} is not supported: it accepts certificates nobody verified, which Python's TLS cannot do (and "
            "exporter-toolkit calls insecure); use RequireAndVerifyClientCert with client_ca_file"
        )
    if value not in CLIENT_AUTH:
        raise ValueError(f"{value!r} is not one of {', '.join([*CLIENT_AUTH, *UNVERIFIED_CLIENT_AUTH])}")
    return value


def _names(value: Any) -> Any:
    value = value or []
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ValueError("must be a list of names")
    return value


def _tls_version(value: Any) -> Any:
    if value is None:
        return None
    if value in OLD_TLS_VERSIONS:
        raise ValueError(f"{value} is not offered: TLS 1.0 and 1.1 are deprecated (RFC 8996); use TLS12 or TLS13")
    if value not in TLS_VERSIONS:
        raise ValueError(f"{value!r} is not a TLS version (use TLS12 or TLS13)")
    return value


def _true_or_false(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _http2(value: Any) -> Any:
    if value is True:
        raise ValueError("true is not supported: this endpoint speaks HTTP/1.1 (with keep-alive); set http2: false or remove it")
    return _true_or_false(value)


def _headers(value: Any) -> Any:
    """The headers by their canonical names; each refused one is a problem of its own."""
    value = value or {}
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of header name to value")
    chosen: dict[str, str] = {}
    problems: list[tuple[Loc, str]] = []
    canonical = {name.lower(): name for name in HEADERS}
    for name, given in value.items():
        known = canonical.get(str(name).lower())
        if known is None:
            problems.append(((str(name),), f"not a header a web config may set (allowed: {', '.join(HEADERS)})"))
            continue
        text = "" if given is None else str(given)
        allowed = HEADERS[known]
        if text and allowed is not None and text.lower() not in allowed:
            problems.append(((known,), f"{text!r} is not one of {', '.join(allowed)}"))
        elif any(ch in text for ch in "\r\n"):
            problems.append(((known,), "must be one line"))
        else:
            chosen[known] = text
    if problems:
        raise refusal(problems, "headers")
    return chosen


def _user(value: Any) -> Any:
    if not isinstance(value, str) or not value or ":" in value:
        raise ValueError(f"user name {value!r} must be a non-empty string without ':'")
    return value


def _bcrypt_hash(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a bcrypt hash string such as $2b$12$...")
    encoded = value.strip().encode("utf-8", "replace")
    valid = encoded.startswith(_BCRYPT_PREFIXES) and len(encoded) == 60 and encoded[4:6].isdigit()
    if valid:
        try:
            bcrypt.checkpw(b"", encoded)
        except ValueError:
            valid = False
    if not valid:
        # The value itself is never echoed: a password pasted in by mistake must not reach a log.
        raise ValueError("not a bcrypt hash (expected 60 characters starting with $2b$, $2a$ or $2y$)")
    return encoded


PemFile = Annotated[Path | None, BeforeValidator(_file)]
PemText = Annotated[str | None, BeforeValidator(_pem)]
TLSVersionName = Annotated[str | None, BeforeValidator(_tls_version)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Strict):
    """tls_server_config: the certificate and key (files or inline PEM), client certificates, TLS versions."""

    cert_file: PemFile = None
    key_file: PemFile = None
    cert: PemText = None
    key: PemText = None
    client_auth_type: Annotated[str, BeforeValidator(_client_auth)] = "NoClientCert"
    client_ca_file: PemFile = None
    client_ca: PemText = None
    client_allowed_sans: Annotated[list[str], BeforeValidator(_names)] = Field(default_factory=list)
    min_version: TLSVersionName = None
    max_version: TLSVersionName = None
    prefer_server_cipher_suites: Annotated[bool, BeforeValidator(_true_or_false)] = True

    @model_validator(mode="wrap")
    @classmethod
    def _report_everything(cls, data: Any, handler: Callable[[Any], Any]) -> TLSServerConfig:
        # The checks that span keys, on the raw input: a bad key_file must not hide that cert_file is missing.
        return refusing_also(handler, data, _tls_cross_problems(data) if isinstance(data, dict) else [], cls.__name__)


def _tls_cross_problems(config: dict[str, Any]) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    for file_key, inline_key in _PEM_SOURCES:
        if _given(config.get(file_key)) and _given(config.get(inline_key)):
            problems.append(((), f"set {file_key} or {inline_key}, not both"))
        elif file_key != "client_ca_file" and not _given(config.get(file_key)) and not _given(config.get(inline_key)):
            problems.append(((file_key,), f"required (or {inline_key}: inline PEM)"))
    auth = config.get("client_auth_type", "NoClientCert")
    client_ca = _given(config.get("client_ca_file")) or _given(config.get("client_ca"))
    if auth in CLIENT_AUTH and auth != "NoClientCert" and not client_ca:
        problems.append((("client_ca_file",), f"required by client_auth_type {auth} (the CA that signs client certificates)"))
    elif auth == "NoClientCert" and client_ca:
        problems.append((("client_auth_type",),
                         "client_ca_file is set but client_auth_type is NoClientCert (the default), so no client "
                         "certificate would be asked for; set client_auth_type: RequireAndVerifyClientCert"))
    sans = config.get("client_allowed_sans")
    names = isinstance(sans, list) and all(isinstance(n, str) and n for n in sans)
    if sans and names and auth != "RequireAndVerifyClientCert":
        problems.append((("client_allowed_sans",), "needs client_auth_type: RequireAndVerifyClientCert (a client without "
                                                   "a certificate has no name to match)"))
    low, high = config.get("min_version"), config.get("max_version")
    if low in TLS_VERSIONS and high in TLS_VERSIONS and TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        problems.append(((), f"min_version {low} is above max_version {high}"))
    return problems


class HTTPServerConfig(_Strict):
    """http_server_config: HTTP/2 (refused: this endpoint speaks HTTP/1.1) and the headers of every answer."""

    http2: Annotated[bool, BeforeValidator(_http2)] = False
    headers: Annotated[dict[str, str], BeforeValidator(_headers)] = Field(default_factory=dict)
    """By canonical name; an empty value removes a header specwatch would send."""


class WebConfig(_Strict):
    """A web config file; validate it with its directory as context, as relative paths are relative to the file."""

    tls_server_config: Annotated[TLSServerConfig | None, _mapping("must be a mapping with cert_file and key_file")] = None
    http_server_config: Annotated[HTTPServerConfig | None, _mapping("must be a mapping with http2 and/or headers")] = None
    basic_auth_users: Annotated[
        dict[Annotated[str, BeforeValidator(_user)], Annotated[bytes, BeforeValidator(_bcrypt_hash)]] | None,
        _mapping("must be a mapping of user name to bcrypt hash"),
    ] = None
