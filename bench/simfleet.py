"""A simulated llama-server fleet: N look-alikes on loopback ports, all served by one asyncio process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BUILD_INFO = "b0-unknown"
STATS_PATH = "/_sim/stats"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
# What the canary's repeated line tokenises to in the cycle model, with made-up but stable ids.
CYCLE = [(" the", 290), (" cat", 291), (" sat", 296), (" on", 298), (" the", 290), (" mat", 302), (".", 15)]
OTHER_TOKENS = [(" dog", 340), (" hat", 341), (" a", 299), (" sun", 342)]

# default_generation_settings.params as build 11434 reports it; /slots repeats it per slot.
GENERATION_PARAMS: dict[str, Any] = {
    "seed": 4294967295, "temperature": 0.800000011920929, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": 40,
    "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "top_n_sigma": -1.0, "xtc_probability": 0.0,
    "xtc_threshold": 0.10000000149011612, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": 64, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.10000000149011612,
    "adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421, "max_tokens": -1, "n_predict": -1, "n_keep": 0,
    "n_discard": 0, "ignore_eos": False, "stream": False, "n_probs": 0, "min_keep": 0, "chat_format": "Content-only",
    "reasoning_format": "none", "reasoning_in_content": False, "generation_prompt": "",
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": False, "backend_sampling": False,
    "lora": [],
}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           413: "Payload Too Large", 501: "Not Implemented", 503: "Service Unavailable"}


def is_speculating(index: int, share: float) -> bool:
    """Whether server `index` speculates: a `share` of the fleet, evenly spread and stable."""
    return math.floor((index + 1) * share + 1e-9) > math.floor(index * share + 1e-9)


def server_name(index: int) -> str:
    return f"sim-{index:05d}"


@dataclass(frozen=True)
class FleetOptions:
    servers: int = 100
    base_port: int = 0
    """First port; 0 lets the kernel pick a free port for every server."""
    host: str = HOST
    spec_share: float = 0.2
    latency_ms: float = 5.0
    token_ms: float = 0.0
    """Delay between streamed chunks, as a real server generating tokens would have."""
    slots_per_server: int = 1
    keepalive_timeout: float = 5.0
    """llama-server closes an idle kept-alive connection after 5 s."""
    api_key: str | None = None


@dataclass(frozen=True)
class SimServer:
    index: int
    name: str
    host: str
    port: int
    speculative: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "speculative": self.speculative}


@dataclass
class FleetStats:
    requests: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": sum(self.requests.values()),
            "by_path": dict(self.requests),
            "connections": self.connections,
            "cpu_seconds": time.process_time(),
            "uptime_seconds": time.monotonic() - self.started,
        }


def _json_bytes(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _head(status: int, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", "Server: llama.cpp", "Access-Control-Allow-Origin: "]
    lines += [f"{key}: {value}" for key, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _error_body(status: int, message: str, kind: str) -> bytes:
    return _json_bytes({"error": {"code": status, "message": message, "type": kind}})


class Responses:
    """Answers in the shapes of llama-server build 11434; bodies that do not depend on the request are built once."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self._cache: dict[tuple, tuple[int, str, list[bytes]]] = {}

    def model_path(self, server: SimServer) -> str:
        return f"/models/{server.name}.gguf"

    def props(self, server: SimServer) -> bytes:
        return _json_bytes({
            "default_generation_settings": {"params": GENERATION_PARAMS, "n_ctx": 4096},
            "total_slots": self.options.slots_per_server,
            "model_alias": self.model_path(server),
            "model_ftype": "Q4_K - Medium",
            "model_path": self.model_path(server),
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": "<__media_ZRefuJL0mt442eTQzb1VegzIir8TBBOg__>",
            "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": False, "ui": True, "ui_settings": {},
            "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": {"supports_string_content": True, "supports_system_role": True, "supports_tools": False},
            "bos_token": "<s>", "eos_token": "</s>", "build_info": BUILD_INFO, "is_sleeping": False,
            "cors_proxy_enabled": False,
        })

    def slots(self, server: SimServer) -> bytes:
        types = "none,draft-simple" if server.speculative else "none"
        slots = []
        for slot_id in range(self.options.slots_per_server):
            slots.append({
                "id": slot_id, "n_ctx": 4096, "speculative": server.speculative, "is_processing": False, "id_task": 9,
                "n_prompt_tokens": 10, "n_prompt_tokens_processed": 0, "n_prompt_tokens_cache": 0,
                "params": {**GENERATION_PARAMS, "speculative.types": types},
                "next_token": [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}],
            })
        return _json_bytes(slots)

    def completion(self, server: SimServer, path: str, body: dict[str, Any]) -> tuple[int, str, list[bytes]]:
        """(status, content type, chunks): one chunk for a JSON answer, one per event for a stream."""
        chat = path == "/v1/chat/completions"
        stream = bool(body.get("stream"))
        if chat:
            wanted = body.get("max_tokens", body.get("n_predict", 16))
            alternatives = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
            with_logprobs = bool(body.get("logprobs"))
        else:
            wanted = body.get("n_predict", body.get("max_tokens", 16))
            alternatives = int(body.get("n_probs") or 0)
            with_logprobs = alternatives > 0
        if not isinstance(wanted, int) or wanted < 0:
            wanted = 16
        tokens = max(1, min(wanted, 512))
        post = bool(body.get("post_sampling_probs")) and not chat
        key = (server.speculative, chat, stream, tokens, alternatives, with_logprobs, post)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._build(server.speculative, chat, stream, tokens, alternatives, with_logprobs, post)
            self._cache[key] = cached
        return cached

    def _entry(self, position: int, *, fill_in: bool, alternatives: int, post: bool) -> dict[str, Any]:
        text, token_id = CYCLE[position % len(CYCLE)]
        value_key, list_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
        if fill_in:
            # What the speculative path emits: probability 1.0 and no alternatives.
            return {"id": token_id, "token": text, "bytes": list(text.encode()), value_key: 1.0 if post else 0.0, list_key: []}
        probability = 0.7
        candidates = [(text, token_id, probability)] + [
            (other, other_id, (1 - probability) / (alternatives or 1)) for other, other_id in OTHER_TOKENS
        ]
        listed = [
            {"id": cid, "token": ctext, "bytes": list(ctext.encode()), value_key: p if post else math.log(p)}
            for ctext, cid, p in candidates[:alternatives]
        ]
        value = probability if post else math.log(probability)
        return {"id": token_id, "token": text, "bytes": list(text.encode()), value_key: value, list_key: listed}

    def _timings(self, speculative: bool, tokens: int) -> dict[str, Any]:
        timings: dict[str, Any] = {
            "cache_n": 0, "prompt_n": 49, "prompt_ms": 4.3, "prompt_per_token_ms": 0.088, "prompt_per_second": 11395.3,
            "predicted_n": tokens, "predicted_ms": 0.3 * tokens, "predicted_per_token_ms": 0.3, "predicted_per_second": 3333.3,
        }
        if speculative:
            timings.update(draft_n=max(0, tokens - 1), draft_n_accepted=max(0, tokens - 3))
        return timings

    def _build(
        self, speculative: bool, chat: bool, stream: bool, tokens: int, alternatives: int, with_logprobs: bool, post: bool
    ) -> tuple[int, str, list[bytes]]:
        # A draft-model server sends every token after the first through the speculative path.
        entries = [self._entry(i, fill_in=speculative and i > 0, alternatives=alternatives, post=post) for i in range(tokens)]
        content = "".join(e["token"] for e in entries)
        timings = self._timings(speculative, tokens)
        created, completion_id = 1795940179, "chatcmpl-fXecv6ikJjz1p2owyVZ8IKhOCsTJyK3J"
        model = "/models/sim.gguf"
        if chat and not stream:
            choice: dict[str, Any] = {"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": content}}
            if with_logprobs:
                choice["logprobs"] = {"content": entries}
            answer = {
                "choices": [choice], "created": created, "model": model, "system_fingerprint": BUILD_INFO,
                "object": "chat.completion",
                "usage": {"completion_tokens": tokens, "prompt_tokens": 49, "total_tokens": 49 + tokens},
                "id": completion_id, "timings": timings,
            }
            return 200, "application/json; charset=utf-8", [_json_bytes(answer)]
        if not stream:
            answer = {
                "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": model,
                "tokens_predicted": tokens, "tokens_evaluated": 49, "generation_settings": GENERATION_PARAMS,
                "prompt": "<s> the cat", "has_new_line": False, "truncated": False, "stop_type": "limit", "stopping_word": "",
                "tokens_cached": 49 + tokens, "timings": timings,
            }
            if with_logprobs:
                answer["completion_probabilities"] = entries
            return 200, "application/json; charset=utf-8", [_json_bytes(answer)]
        events: list[Any] = []
        common = {"created": created, "id": completion_id, "model": model, "system_fingerprint": BUILD_INFO,
                  "object": "chat.completion.chunk"}
        if chat:
            events.append({"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
                           **common})
        for position, entry in enumerate(entries):
            # Streaming drops the logprobs key altogether on every speculated chunk.
            carries = with_logprobs and not (speculative and position > 0)
            if chat:
                chunk_choice: dict[str, Any] = {"finish_reason": None, "index": 0, "delta": {"content": entry["token"]}}
                if carries:
                    chunk_choice["logprobs"] = {"content": [entry]}
                events.append({"choices": [chunk_choice], **common})
            else:
                chunk = {"index": 0, "content": entry["token"], "tokens": [entry["id"]], "stop": False, "id_slot": -1,
                         "tokens_predicted": position + 1, "tokens_evaluated": 49}
                if carries:
                    chunk["completion_probabilities"] = [entry]
                events.append(chunk)
        if chat:
            events.append({"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], **common, "timings": timings})
        else:
            events.append({"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": model,
                           "tokens_predicted": tokens, "tokens_evaluated": 49, "stop_type": "limit", "timings": timings})
        chunks = [b"data: " + _json_bytes(e) + b"\n\n" for e in events]
        if chat:
            chunks.append(b"data: [DONE]\n\n")
        return 200, "text/event-stream", chunks


class _Connection(asyncio.Protocol):
    """One client connection to one simulated server: HTTP/1.1 with keep-alive, one request at a time."""

    def __init__(self, fleet: SimFleet, server: SimServer) -> None:
        self.fleet = fleet
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.fleet.stats.connections += 1
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _arm_idle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        timeout = self.fleet.options.keepalive_timeout
        self.idle_timer = self.fleet.loop.call_later(timeout, self._close) if timeout > 0 else None

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._reject(400, "header too large")
            return
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = head[0].split(" ", 2)
        except ValueError:
            self._reject(400, "bad request line")
            return
        headers = {}
        for line in head[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        length_text = headers.get("content-length", "0")
        if "chunked" in headers.get("transfer-encoding", "").lower() or not length_text.isdigit():
            self._reject(400, "send a Content-Length")
            return
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self._reject(413, "body too large")
            return
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        self.busy = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        status, content_type, chunks = self._answer(method, target, headers, body)
        delay = self.fleet.options.latency_ms / 1000.0
        if delay > 0:
            self.fleet.loop.call_later(delay, self._send_now, status, content_type, chunks, close)
        else:
            self._send_now(status, content_type, chunks, close)

    def _reject(self, status: int, message: str) -> None:
        self._send_now(status, "application/json", [_error_body(status, message, "invalid_request_error")], close=True)

    def _answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, str, list[bytes]]:
        path = target.split("?", 1)[0]
        responses = self.fleet.responses
        if path == STATS_PATH:
            return 200, "application/json", [_json_bytes(self.fleet.stats.as_dict())]
        self.fleet.stats.requests[path] += 1
        json_type = "application/json; charset=utf-8"
        if path == "/health" and method in ("GET", "HEAD"):
            return 200, json_type, [b'{"status":"ok"}']
        key = self.fleet.options.api_key
        if key is not None and headers.get("authorization") != f"Bearer {key}":
            return 401, json_type, [_error_body(401, "Invalid API Key", "authentication_error")]
        if path == "/props" and method in ("GET", "HEAD"):
            return 200, json_type, [self.fleet.props_body[self.server.index]]
        if path == "/slots" and method in ("GET", "HEAD"):
            return 200, json_type, [self.fleet.slots_body[self.server.speculative]]
        if path in ("/completion", "/completions", "/v1/chat/completions") and method == "POST":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                return 400, json_type, [_error_body(400, "invalid JSON", "invalid_request_error")]
            if not isinstance(request, dict):
                return 400, json_type, [_error_body(400, "expected a JSON object", "invalid_request_error")]
            canonical = "/completion" if path == "/completions" else path
            return responses.completion(self.server, canonical, request)
        return 404, json_type, [_error_body(404, "File Not Found", "not_found_error")]

    def _send_now(self, status: int, content_type: str, chunks: list[bytes], close: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        connection = [("Connection", "close")] if close else [
            ("Keep-Alive", f"timeout={self.fleet.options.keepalive_timeout:g}, max=100")]
        if content_type == "text/event-stream":
            head = _head(status, [("Content-Type", content_type), ("X-Accel-Buffering", "no"),
                                  ("Transfer-Encoding", "chunked"), *connection])
            framed = [b"%x\r\n%b\r\n" % (len(c), c) for c in chunks] + [b"0\r\n\r\n"]
            token_delay = self.fleet.options.token_ms / 1000.0
            if token_delay > 0:
                transport.write(head)
                self._trickle(framed, token_delay, close)
                return
            transport.write(head + b"".join(framed))
        else:
            payload = b"".join(chunks)
            head = _head(status, [("Content-Type", content_type), ("Content-Length", str(len(payload))), *connection])
            transport.write(head + payload)
        self._finish(close)

    def _trickle(self, framed: list[bytes], delay: float, close: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(framed[0])
        if len(framed) == 1:
            self._finish(close)
        else:
            self.fleet.loop.call_later(delay, self._trickle, framed[1:], delay, close)

    def _finish(self, close: bool) -> None:
        self.busy = False
        if close:
            self._close()
            return
        self._arm_idle()
        if self.buffer:
            self._next_request()


class SimFleet:
    """The whole fleet on the running event loop: `await start()`, then `await stop()`."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.responses = Responses(options)
        self.stats = FleetStats()
        self.servers: list[SimServer] = []
        self.props_body: list[bytes] = []
        self.slots_body: dict[bool, bytes] = {}
        self._listeners: list[asyncio.Server] = []
        self.loop: asyncio.AbstractEventLoop

    async def start(self) -> list[SimServer]:
        self.loop = asyncio.get_running_loop()
        raise_fd_limit()
        options = self.options
        try:
            for index in range(options.servers):
                port = options.base_port + index if options.base_port else 0
                provisional = SimServer(index, server_name(index), options.host, port, is_speculating(index, options.spec_share))
                listener = await self.loop.create_server(
                    lambda server=provisional: _Connection(self, self.servers[server.index]),
                    options.host, port, reuse_address=True, backlog=256,
                )
                self._listeners.append(listener)
                bound_port = listener.sockets[0].getsockname()[1]
                server = SimServer(index, provisional.name, options.host, bound_port, provisional.speculative)
                self.servers.append(server)
                self.props_body.append(self.responses.props(server))
        except BaseException:
            await self.stop()
            raise
        for speculative in (False, True):
            self.slots_body[speculative] = self.responses.slots(SimServer(0, "", options.host, 0, speculative))
        return self.servers

    async def stop(self) -> None:
        for listener in self._listeners:
            listener.close()
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.wait_closed(), 1.0)

    def manifest(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "servers": [s.as_dict() for s in self.servers]}


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one: a thousand listeners and their connections need it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class SimFleetThread:
    """The fleet on its own event loop in a background thread, for tests in one process."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.fleet = SimFleet(options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="simfleet", daemon=True)

    @property
    def servers(self) -> list[SimServer]:
        return self.fleet.servers

    def start(self) -> SimFleetThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fleet.start(), self._loop).result(timeout=120)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.fleet.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SimFleetThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def cli_args(options: FleetOptions) -> list[str]:
    args = [
        "--servers", str(options.servers), "--base-port", str(options.base_port), "--host", options.host,
        "--spec-share", repr(options.spec_share), "--latency-ms", repr(options.latency_ms), "--token-ms", repr(options.token_ms),
        "--slots", str(options.slots_per_server), "--keepalive-timeout", repr(options.keepalive_timeout),
    ]
    if options.api_key is not None:
        args += ["--api-key-env", "SIMFLEET_API_KEY"]
    return args


class SimFleetProcess:
    """The fleet in a child process (its CPU stays out of the measured process); stop() ends its process group."""

    def __init__(self, options: FleetOptions, *, start_timeout: float = 120.0) -> None:
        self.options = options
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.servers: list[SimServer] = []

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> SimFleetProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                         os.environ.get("PYTHONPATH")]))}
        if self.options.api_key is not None:
            env["SIMFLEET_API_KEY"] = self.options.api_key
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.simfleet", *cli_args(self.options), "--manifest", "-"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(self.start_timeout)
        if not line or not line[0].strip():
            error = ""
            self.stop()
            if self.process.stderr is not None:
                with contextlib.suppress(Exception):
                    error = self.process.stderr.read()[-2000:]
            raise RuntimeError(f"the simulated fleet did not start: {error.strip() or 'no manifest'}")
        manifest = json.loads(line[0])
        self.servers = [
            SimServer(i, s["name"], s["url"].rsplit(":", 1)[0].removeprefix("http://"), int(s["url"].rsplit(":", 1)[1]),
                      s["speculative"])
            for i, s in enumerate(manifest["servers"])
        ]
        return self

    def stats(self) -> dict[str, Any]:
        """The fleet's request and connection counters, read from its stats path."""
        import urllib.request

        with urllib.request.urlopen(f"{self.servers[0].url}{STATS_PATH}", timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def __enter__(self) -> SimFleetProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.simfleet", description=__doc__)
    parser.add_argument("--servers", type=int, default=100, help="how many llama-server look-alikes (default 100)")
    parser.add_argument("--base-port", type=int, default=20000,
                        help="port of the first server; 0 picks free ports (default 20000)")
    parser.add_argument("--host", default=HOST, help=f"address to bind (default {HOST})")
    parser.add_argument("--spec-share", type=float, default=0.2, help="share of servers that speculate (default 0.2)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="delay before every answer (default 5)")
    parser.add_argument("--token-ms", type=float, default=0.0, help="delay between streamed chunks (default 0)")
    parser.add_argument("--slots", type=int, default=1, help="slots per server (default 1)")
    parser.add_argument("--keepalive-timeout", type=float, default=5.0,
                        help="idle keep-alive timeout in seconds (default 5, as llama-server)")
    parser.add_argument("--api-key-env", help="require this environment variable's value as a Bearer key (not on /health)")
    parser.add_argument("--manifest", help="write the servers as one JSON line to this file ('-' for stdout) once all listen")
    return parser


async def _serve(options: FleetOptions, manifest_to: str | None, announce: Callable[[str], None]) -> None:
    fleet = SimFleet(options)
    await fleet.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    manifest = json.dumps(fleet.manifest())
    if manifest_to == "-":
        sys.stdout.write(manifest + "\n")
        sys.stdout.flush()
    elif manifest_to:
        Path(manifest_to).write_text(manifest + "\n", encoding="utf-8")
    speculating = sum(s.speculative for s in fleet.servers)
    first, last = fleet.servers[0], fleet.servers[-1]
    announce(f"simfleet: {len(fleet.servers)} servers ({speculating} speculating) on {first.url} .. {last.url}, "
             f"latency {options.latency_ms:g} ms; Ctrl-C to stop")
    await stopping.wait()
    await fleet.stop()
    announce(f"simfleet: stopped; {json.dumps(fleet.stats.as_dict())}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        print(f"simfleet: environment variable {args.api_key_env} is empty", file=sys.stderr)
        return 2
    if not 0.0 <= args.spec_share <= 1.0:
        print("simfleet: --spec-share must be within [0, 1]", file=sys.stderr)
        return 2
    if args.base_port and args.base_port + args.servers - 1 > 65535:
        print("simfleet: --base-port + --servers runs past port 65535", file=sys.stderr)
        return 2
    options = FleetOptions(
        servers=args.servers, base_port=args.base_port, host=args.host, spec_share=args.spec_share, latency_ms=args.latency_ms,
        token_ms=args.token_ms, slots_per_server=args.slots, keepalive_timeout=args.keepalive_timeout, api_key=api_key,
    )
    limit = raise_fd_limit()
    if limit < 2 * options.servers + 64:
        print(f"simfleet: open-files limit {limit} is too low for {options.servers} servers (raise ulimit -n)", file=sys.stderr)
        return 2
    asyncio.run(_serve(options, args.manifest, lambda text: print(text, file=sys.stderr, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
