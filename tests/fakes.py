"""A llama-server look-alike for httpx.MockTransport, answering in the shapes of llama-server build 11434 (docs/llama-server-behaviour.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import httpx

WORDS = ["▁the", "▁cat", "▁sat", "▁on", "▁mat"]


@dataclass
class FakeLlama:
    """`fill_ins` marks token positions answered with the placeholder; `drafts` sets timings.draft_n."""

    speculative: bool = False
    fill_ins: set[int] = field(default_factory=set)
    drafts: int | None = None
    api_key: str | None = None
    slots_enabled: bool = True
    props_types: str = "none"
    tokens: int = 32
    real_zero_at: set[int] = field(default_factory=set)
    model_alias: str = "tiny.gguf"
    requests: list[httpx.Request] = field(default_factory=list)

    @classmethod
    def plain(cls, **kw: object) -> FakeLlama:
        return cls(**kw)

    @classmethod
    def draft(cls, **kw: object) -> FakeLlama:
        n = int(kw.pop("tokens", 32))  # type: ignore[arg-type]
        return cls(speculative=True, fill_ins=set(range(1, n)), drafts=n, tokens=n, **kw)

    @classmethod
    def future_fixed(cls, **kw: object) -> FakeLlama:
        """A build that drafts yet returns real probabilities (what upstream PR #27196 aims at)."""
        return cls(speculative=True, fill_ins=set(), drafts=24, **kw)

    def _entry(self, position: int, *, post: bool) -> dict:
        token = WORDS[position % len(WORDS)]
        text = token.replace("▁", " ")
        if position in self.fill_ins:
            value, alternatives = (1.0, []) if post else (0.0, [])
        else:
            logprob = 0.0 if position in self.real_zero_at else math.log(0.7)
            alternatives = [
                {"id": i, "token": t.replace("▁", " "), "bytes": list(t.encode()), ("prob" if post else "logprob"): p}
                for i, (t, p) in enumerate([(token, 0.7), ("▁dog", 0.2), ("▁hat", 0.1)])
            ]
            value = math.exp(logprob) if post else logprob
        key, list_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
        return {"id": position, "token": text, "bytes": list(text.encode()), key: value, list_key: alternatives}

    def _timings(self) -> dict:
        timings: dict = {"predicted_n": self.tokens}
        if self.drafts is not None:
            timings.update(draft_n=self.drafts, draft_n_accepted=max(0, self.drafts - 2))
        return timings

    def _json(self, status: int, body: object) -> httpx.Response:
        return httpx.Response(status, json=body)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/health":
            return self._json(200, {"status": "ok"})
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return self._json(401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
        if path == "/props":
            return self._json(200, {
                "default_generation_settings": {"params": {"speculative.types": self.props_types}, "n_ctx": 2048},
                "total_slots": 1, "model_path": f"/models/{self.model_alias}", "model_alias": self.model_alias,
                "build_info": "b0-unknown", "endpoint_slots": self.slots_enabled, "is_sleeping": False,
            })
        if path == "/slots":
            if not self.slots_enabled:
                return self._json(501, {"error": {"code": 501, "message": "This server does not support slots endpoint.",
                                                  "type": "not_supported_error"}})
            return self._json(200, [{"id": 0, "n_ctx": 2048, "speculative": self.speculative, "is_processing": False,
                                     "next_token": [{"has_next_token": True}]}])
        body = json.loads(request.content or b"{}")
        stream = bool(body.get("stream"))
        if path == "/v1/chat/completions":
            return self._chat(body, stream)
        if path == "/completion":
            return self._completion(body, stream)
        return self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def _chat(self, body: dict, stream: bool) -> httpx.Response:
        entries = [self._entry(i, post=False) for i in range(self.tokens)]
        if not stream:
            text = "".join(e["token"] for e in entries)
            return self._json(200, {
                "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": text},
                             "logprobs": {"content": entries}}],
                "model": self.model_alias, "timings": self._timings(),
            })
        chunks = []
        for i, entry in enumerate(entries):
            choice: dict = {"index": 0, "delta": {"content": entry["token"]}, "finish_reason": None}
            if not (self.speculative and i in self.fill_ins):
                choice["logprobs"] = {"content": [entry]}
            chunks.append({"choices": [choice], "object": "chat.completion.chunk"})
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": self._timings()})
        return self._sse(chunks)

    def _completion(self, body: dict, stream: bool) -> httpx.Response:
        post = bool(body.get("post_sampling_probs"))
        entries = [self._entry(i, post=post) for i in range(self.tokens)]
        if not stream:
            return self._json(200, {
                "content": "".join(e["token"] for e in entries), "completion_probabilities": entries,
                "timings": self._timings(), "stop": True,
            })
        chunks = []
        for i, entry in enumerate(entries):
            chunk: dict = {"content": entry["token"], "stop": False}
            if not (self.speculative and i in self.fill_ins):
                chunk["completion_probabilities"] = [entry]
            chunks.append(chunk)
        chunks.append({"content": "", "stop": True, "timings": self._timings()})
        return self._sse(chunks)

    @staticmethod
    def _sse(chunks: list[dict]) -> httpx.Response:
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=text.encode(), headers={"Content-Type": "text/event-stream"})


def fleet_transport(servers: dict[str, FakeLlama]) -> httpx.MockTransport:
    """One transport that routes by host, so a test can run several fake servers side by side."""

    def handler(request: httpx.Request) -> httpx.Response:
        fake = servers.get(request.url.host)
        if fake is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return fake(request)

    return httpx.MockTransport(handler)
