"""The wire model behind httpx.MockTransport: look-alikes answer in-process, several side by side routed by host."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx

from tests.support.wire import Answer, Lookalike, Request


def to_wire(request: httpx.Request) -> Request:
    return Request(request.method, request.url.path, dict(request.url.params),
                   {name.lower(): value for name, value in request.headers.items()}, request.read())


def to_httpx(answer: Answer) -> httpx.Response:
    return httpx.Response(answer.status, headers=[("Content-Type", answer.content_type), *answer.headers], content=answer.body)


def respond(lookalike: Lookalike, request: httpx.Request) -> httpx.Response:
    """`lookalike`'s answer to `request`, which it keeps in its `requests` list."""
    requests = getattr(lookalike, "requests", None)
    if requests is not None:
        requests.append(request)
    return to_httpx(lookalike.answer(to_wire(request)))


def fleet_transport(servers: Mapping[str, Callable[[httpx.Request], httpx.Response]]) -> httpx.MockTransport:
    """One transport that routes by host, so a test can run several look-alikes side by side; unknown hosts refuse."""

    def handler(request: httpx.Request) -> httpx.Response:
        server = servers.get(request.url.host)
        if server is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return server(request)

    return httpx.MockTransport(handler)
