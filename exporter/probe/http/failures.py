"""Every way an exchange can fail, mapped to the closed set of reasons in one place; no detail quotes a query string."""

from __future__ import annotations

import errno
import re
import socket
import ssl
from urllib.parse import urlsplit

import aiohttp

from ...reasons import ProbeFailure, Reason

_NO_ROUTE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})
_QUERY = re.compile(r"(?<=[\w/.\-%])[?#][^\s'\"<>]+")
"""A query string or fragment right after a URL's path: what a detail must never carry (it may hold a token)."""


def without_query(text: str) -> str:
    """`text` with every URL's query and fragment cut off."""
    return _QUERY.sub("", text)


def _chain(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def reason_of(err: BaseException) -> Reason:
    """The closed-set reason for an exchange that raised `err` (aiohttp's errors, the OSErrors behind them, a timeout)."""
    if isinstance(err, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors too
        return Reason.TIMEOUT
    chain = _chain(err)
    oserrors = [e.os_error if isinstance(e, aiohttp.ClientConnectorError) else e for e in chain]
    # A server whose link is down first looks like a timeout (packets vanish), then, once the neighbour entry has
    # failed, the kernel says "No route to host": not a reset, which would send on-call to the server.
    if any(isinstance(e, OSError) and e.errno in _NO_ROUTE for e in oserrors):
        return Reason.UNREACHABLE
    if any(isinstance(e, aiohttp.ClientConnectorDNSError | socket.gaierror) for e in [*chain, *oserrors]):
        return Reason.DNS
    if any(isinstance(e, aiohttp.ClientSSLError | ssl.SSLError | ssl.CertificateError) for e in [*chain, *oserrors]):
        return Reason.TLS
    if any(isinstance(e, ConnectionRefusedError) or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED)
           for e in oserrors):
        return Reason.CONNECTION_REFUSED
    # Closed or reset before or while answering, a body cut short, framing the parser refuses: the connection failed.
    return Reason.CONNECTION_RESET


def _words(err: BaseException) -> str:
    if isinstance(err, aiohttp.ClientResponseError):
        return err.message  # its str() quotes the URL, query and all
    return str(err)


def failure_of(err: BaseException) -> ProbeFailure:
    """`err` as a ProbeFailure: its reason, and a detail that names the error without any URL's query."""
    reason = reason_of(err)
    words = without_query(_words(err))[:200]
    return ProbeFailure(reason, f"{err.__class__.__name__}: {words or reason.value}")


def status_reason(status: int) -> Reason | None:
    """The reason an HTTP status fails a probe with; None for a success."""
    if status < 300:
        return None
    if status < 400:
        return Reason.REDIRECT
    if status in (401, 403):
        return Reason.UNAUTHORIZED
    if status == 404:
        return Reason.NOT_FOUND
    if status == 501:
        return Reason.NOT_SUPPORTED
    if status == 503:
        return Reason.LOADING
    if status >= 500:
        return Reason.SERVER_ERROR
    return Reason.CLIENT_ERROR


def location(value: str) -> str:
    """Where a redirect points, by scheme, host and path only: an SSO redirect's query carries its state or a token."""
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return "an unreadable location"
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.scheme and parts.netloc else ""
    return (origin + parts.path)[:100]
