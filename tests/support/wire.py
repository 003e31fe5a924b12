"""The one llama-server wire model: what build 11434 answers on each endpoint, as FACTS.md and docs/llama-server-behaviour.md record."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

BUILD_INFO = "b0-unknown"
JSON = "application/json; charset=utf-8"
SSE = "text/event-stream"
METRICS_TEXT = "text/plain; version=0.0.4"
GET = ("GET", "HEAD")
COMPLETION_PATHS = {"/completion": "native", "/completions": "native", "/v1/completions": "v1", "/v1/chat/completions": "chat"}
"""Each completion path and the answer shape it has: llama-server's own, OpenAI's completions, OpenAI's chat."""
MODELS_PATHS = ("/models", "/v1/models")
MAX_TOKENS = 512
DEFAULT_TOKENS = 16
PROMPT_TOKENS = 49
DRAFT_MAX = 16
"""Tokens a draft model proposes per round (llama-server's --draft-max default): /metrics counts rounds."""
CREATED = 1795940179
COMPLETION_ID = "chatcmpl-fXecv6ikJjz1p2owyVZ8IKhOCsTJyK3J"
# What the canary's repeated line tokenises to in the cycle model, with made-up but stable ids.
CYCLE = [(" the", 290), (" cat", 291), (" sat", 296), (" on", 298), (" the", 290), (" mat", 302), (".", 15)]
TOKEN_PROBABILITY = 0.7
# The alternatives listed after the generated token itself: (text, id, probability).
OTHERS = [(" dog", 340, 0.2), (" hat", 341, 0.05), (" a", 299, 0.03), (" sun", 342, 0.02)]
AFTER_FIRST = frozenset(range(1, MAX_TOKENS))
"""Every position a draft-model server fills in; a frozenset, so a request's cache key costs nothing to build."""

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


def dump(value: Any) -> bytes:
    """JSON as llama-server writes it: compact, UTF-8 unescaped."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(slots=True)
class Request:
    """One HTTP request as a server sees it; header names are lower-cased."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


class Answer(NamedTuple):
    """One answer: status, content type, extra headers, and the body as chunks (one for JSON, one per event for a stream)."""

    status: int
    content_type: str
    chunks: tuple[bytes, ...]
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def streaming(self) -> bool:
        return self.content_type == SSE

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def json_answer(status: int, value: Any) -> Answer:
    return Answer(status, JSON, (dump(value),))


def error(status: int, message: str, kind: str) -> Answer:
    return json_answer(status, {"error": {"code": status, "message": message, "type": kind}})


HEALTHY = json_answer(200, {"status": "ok"})
# The 401 body lists its keys in another order than every other error: as the server writes it.
UNAUTHORIZED = json_answer(401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
NOT_FOUND = error(404, "File Not Found", "not_found_error")
SLOTS_DISABLED = error(501, "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error")
METRICS_DISABLED = error(501, "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error")
INVALID_JSON = error(400, "invalid JSON", "invalid_request_error")
NOT_AN_OBJECT = error(400, "expected a JSON object", "invalid_request_error")
NOT_LOADED = error(400, "model is not loaded", "invalid_request_error")
LOADED = json_answer(200, {"success": True})
# Not measured on a real router (FACTS.md is silent): a request naming no model, or one the router does not know.
MODEL_MISSING = error(400, "model name is missing from the request", "invalid_request_error")
MODEL_UNKNOWN = error(400, "model not found", "invalid_request_error")


class Lookalike:
    """Anything that answers wire requests; callable with an httpx.Request, so `httpx.MockTransport(fake)` works."""

    _memo: dict[str, tuple[tuple, Any]]
    api_key: str | None

    def answer(self, request: Request) -> Answer:
        raise NotImplementedError

    def health_or_refusal(self, request: Request) -> Answer | None:
        """/health answers without a key, as llama-server's does; anything else is refused without the right key."""
        if request.path == "/health":
            return HEALTHY
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return UNAUTHORIZED
        return None

    def _memoised(self, kind: str, key: tuple, build: Callable[[], Any]) -> Any:
        """What `build` made for `key` last time; tests change a server's fields between requests, so the key is its state."""
        held = self._memo.get(kind)
        if held is None or held[0] != key:
            held = (key, build())
            self._memo[kind] = held
        return held[1]

    def __call__(self, request: Any) -> Any:
        # Imported here: the adapter imports this module, and the simulated fleet's process never needs httpx.
        from tests.support.fakes import respond

        return respond(self, request)


@dataclass
class Counters:
    """What a server's /metrics counts: every completion adds what it generated and drafted."""

    prompt_tokens: int = 0
    tokens_predicted: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, generated: int, draft_n: int | None, accepted: int | None) -> None:
        self.prompt_tokens += PROMPT_TOKENS
        self.tokens_predicted += generated
        if draft_n:
            self.drafts += math.ceil(draft_n / DRAFT_MAX)
            self.draft_tokens += draft_n
            self.accepted_tokens += accepted or 0


METRICS = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", "prompt_tokens"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed.", "tokens_predicted"),
    ("spec_decode_num_drafts_total", "counter", "Number of speculative decoding drafts.", "drafts"),
    ("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens proposed.", "draft_tokens"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Number of draft tokens accepted.", "accepted_tokens"),
    ("requests_processing", "gauge", "Number of requests processing.", None),
    ("requests_deferred", "gauge", "Number of requests deferred.", None),
)


@dataclass
class FakeLlama(Lookalike):
    """One llama-server. `fill_ins` marks token positions answered with the placeholder; `drafts` sets timings.draft_n."""

    speculative: bool = False
    fill_ins: set[int] | frozenset[int] = field(default_factory=set)
    drafts: int | None = None
    api_key: str | None = None
    slots_enabled: bool = True
    metrics_enabled: bool = True
    props_types: str = "none"
    tokens: int | None = 32
    """Tokens in every answer whatever the request asks; None answers as many as it asks, as a real server does."""
    real_zero_at: set[int] = field(default_factory=set)
    placeholder_field: str | None = None
    """A build that marks its placeholders in a field of their own: each fill-in carries `{placeholder_field: true}`."""
    fill_in_alternatives: bool = False
    """A build that lists alternatives even for its placeholders (only a placeholder_field then tells them apart)."""
    token_extra: tuple[tuple[str, Any], ...] = ()
    """Fields every token entry carries beside llama-server's own (a newer build's additions)."""
    fixed_but_post_sampling: bool = False
    """A build with upstream's fix (PR #27196): real probabilities for drafted tokens, but for post_sampling_probs."""
    pre_sampling_under_post: bool = False
    """A revision of that fix: with post_sampling_probs, drafted tokens (the `fill_ins` positions) carry pre-sampling
    probabilities and alternatives under `prob`/`top_probs` instead of placeholders."""
    model_alias: str = "tiny.gguf"
    model_path: str | None = None
    """None: /models/<model_alias>."""
    ftype: str = "Q4_K - Medium"
    """What /v1/models' meta says of the file's quantization."""
    cycle_shift: int = 0
    """Start the answers this many tokens further into the cycle: another text, as other weights give."""
    token_probability: float = TOKEN_PROBABILITY
    """Every real token's probability: another value moves the logprobs, with the same tokens."""
    build_info: str = BUILD_INFO
    n_ctx: int = 2048
    total_slots: int = 1
    sleeping: bool = False
    woken: int = 0
    """Times a request woke it from sleep: /slots and completions do on build 11434, /props and /metrics do not."""
    media_marker: str = "<__media_ZRefuJL0mt442eTQzb1VegzIir8TBBOg__>"
    """Random per process start on a real server: change it to restart this one."""
    requests: list[Any] = field(default_factory=list)
    """The httpx.Requests it answered as a mock transport handler."""
    counters: Counters = field(default_factory=Counters, compare=False)
    _memo: dict[str, tuple[tuple, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _model: tuple[str, bytes] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def plain(cls, **kw: Any) -> FakeLlama:
        return cls(**kw)

    @classmethod
    def draft(cls, **kw: Any) -> FakeLlama:
        """A draft-model server: every token after the first is a fill-in."""
        n = kw.pop("tokens", 32)
        if n is None:
            return cls(speculative=True, fill_ins=AFTER_FIRST, drafts=MAX_TOKENS, tokens=None, **kw)
        return cls(speculative=True, fill_ins=set(range(1, int(n))), drafts=int(n), tokens=int(n), **kw)

    @classmethod
    def fixed_build(cls, **kw: Any) -> FakeLlama:
        """Build 11434 patched as upstream's open fix does: drafts, real logprobs, fill-ins only with post_sampling_probs."""
        n = kw.pop("tokens", 32)
        return cls(speculative=True, fill_ins=AFTER_FIRST, drafts=24, tokens=n, fixed_but_post_sampling=True, **kw)

    @classmethod
    def future_fixed(cls, **kw: Any) -> FakeLlama:
        """A build that drafts yet returns real probabilities (what upstream PR #27196 aims at)."""
        return cls(speculative=True, fill_ins=set(), drafts=24, **kw)

    @property
    def path(self) -> str:
        return self.model_path or f"/models/{self.model_alias}"

    def answer(self, request: Request) -> Answer:
        if (before := self.health_or_refusal(request)) is not None:
            return before
        path, method = request.path, request.method
        if self.sleeping and (path == "/slots" or (method == "POST" and path in COMPLETION_PATHS)):
            self.sleeping = False
            self.woken += 1
        if method in GET:
            if path == "/props":
                return self._props()
            if path == "/slots":
                return _slots(self.speculative, self.total_slots, self.n_ctx) if self.slots_enabled else SLOTS_DISABLED
            if path == "/metrics":
                return self._metrics() if self.metrics_enabled else METRICS_DISABLED
            if path in MODELS_PATHS:
                return self._memoised("models", (self.model_alias, self.n_ctx, self.ftype), self._models)
        elif method == "POST" and path in COMPLETION_PATHS:
            try:
                body = request.json()
            except ValueError:
                return INVALID_JSON
            if not isinstance(body, dict):
                return NOT_AN_OBJECT
            return self.complete(COMPLETION_PATHS[path], body)
        return NOT_FOUND

    def _props(self) -> Answer:
        key = (self.props_types, self.model_alias, self.model_path, self.build_info, self.n_ctx, self.total_slots,
               self.slots_enabled, self.metrics_enabled, self.sleeping, self.media_marker)
        return self._memoised("props", key, lambda: json_answer(200, {
            "default_generation_settings": {"params": {**GENERATION_PARAMS, "speculative.types": self.props_types},
                                            "n_ctx": self.n_ctx},
            "total_slots": self.total_slots,
            "model_alias": self.model_alias,
            "model_ftype": "Q4_K - Medium",
            "model_path": self.path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": self.media_marker,
            "endpoint_slots": self.slots_enabled, "endpoint_props": False, "endpoint_metrics": self.metrics_enabled,
            "ui": True, "ui_settings": {},
            "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": {"supports_string_content": True, "supports_system_role": True, "supports_tools": False},
            "bos_token": "<s>", "eos_token": "</s>", "build_info": self.build_info, "is_sleeping": self.sleeping,
            "cors_proxy_enabled": False,
        }))

    def _models(self) -> Answer:
        alias = self.model_alias
        return json_answer(200, {
            "models": [{"name": alias, "model": alias, "modified_at": "", "size": "", "digest": "", "type": "model",
                        "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                        "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                                    "parameter_size": "", "quantization_level": ""}}],
            "object": "list",
            "data": [{"id": alias, "object": "model", "created": CREATED, "owned_by": "llamacpp",
                      "meta": {"vocab_type": 1, "n_vocab": 320, "n_ctx_train": self.n_ctx, "n_embd": 320,
                               "n_params": 409600, "size": 1638400, "ftype": self.ftype}}],
        })

    def _metrics(self) -> Answer:
        counters = self.counters
        lines = []
        for name, kind, text, attribute in METRICS:
            value = getattr(counters, attribute) if attribute else 0
            lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
        return Answer(200, METRICS_TEXT, (("\n".join(lines) + "\n").encode(),))

    def complete(self, kind: str, body: dict[str, Any]) -> Answer:
        """A completion ("native", "v1" or "chat") for a parsed request body; counts what it generated for /metrics."""
        if kind == "chat":
            wanted = body.get("max_tokens", body.get("n_predict"))
            with_logprobs = bool(body.get("logprobs"))
            alternatives = _count(body.get("top_logprobs")) if with_logprobs else 0
            post = False
        elif kind == "v1":
            # OpenAI's completions: `logprobs: N` asks for N alternatives (llama-server makes it n_probs).
            wanted = body.get("max_tokens", body.get("n_predict"))
            alternatives = _count(body.get("logprobs"))
            with_logprobs = alternatives > 0
            post = False
        else:
            wanted = body.get("n_predict", body.get("max_tokens"))
            alternatives = _count(body.get("n_probs"))
            with_logprobs = alternatives > 0
            post = bool(body.get("post_sampling_probs"))
        generated = self.tokens if self.tokens is not None else _generated(wanted)
        draft_n = None if self.drafts is None else min(self.drafts, generated)
        accepted = None if draft_n is None else max(0, draft_n - 2)
        self.counters.add(generated, draft_n, accepted)
        stream = bool(body.get("stream"))
        fill_ins = self.fill_ins if post or not self.fixed_but_post_sampling else frozenset()
        pre_at: frozenset[int] = frozenset()
        if post and self.pre_sampling_under_post:
            pre_at, fill_ins = frozenset(fill_ins), frozenset()
        # At temperature 0 sampling keeps one candidate: a real post-sampling token is prob 1.0 with one alternative.
        greedy = post and body.get("temperature") == 0
        key = (kind, stream, generated, alternatives, with_logprobs, post, self.speculative, frozenset(fill_ins),
               frozenset(self.real_zero_at), draft_n, accepted, self.build_info, self.placeholder_field,
               self.fill_in_alternatives, self.token_extra, self.cycle_shift, self.token_probability,
               greedy, pre_at)
        pieces = _COMPLETIONS.get(key)
        if pieces is None:
            if len(_COMPLETIONS) > 4096:  # property tests ask for thousands of distinct shapes
                _COMPLETIONS.clear()
            # Split where the model name goes once, so an answer costs a join per chunk, not a search.
            pieces = _COMPLETIONS[key] = tuple(chunk.split(MODEL_MARK) for chunk in _Shape(*key).build())
        alias, model = self._model or (None, b"")
        if alias != self.model_alias:
            alias, model = self._model = (self.model_alias, dump(self.model_alias))
        return Answer(200, SSE if stream else JSON, tuple([model.join(p) for p in pieces]))


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(value, 1 + len(OTHERS)))


def _generated(wanted: Any) -> int:
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
        return DEFAULT_TOKENS
    return max(1, min(wanted, MAX_TOKENS))


_SLOTS: dict[tuple, Answer] = {}


def _slots(speculative: bool, total: int, n_ctx: int) -> Answer:
    """The /slots list; the same for every server of a kind, so built once."""
    key = (speculative, total, n_ctx)
    found = _SLOTS.get(key)
    if found is None:
        types = "none,draft-simple" if speculative else "none"
        found = _SLOTS[key] = json_answer(200, [{
            "id": slot_id, "n_ctx": n_ctx, "speculative": speculative, "is_processing": False, "id_task": 9,
            "n_prompt_tokens": 10, "n_prompt_tokens_processed": 0, "n_prompt_tokens_cache": 0,
            "params": {**GENERATION_PARAMS, "speculative.types": types},
            "next_token": [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}],
        } for slot_id in range(total)])
    return found


# Completion bodies are shared by every server that answers alike; each server's model name goes in per answer.
MODEL_MARK = dump("\ue000model\ue000")
_COMPLETIONS: dict[tuple, tuple[list[bytes], ...]] = {}


@dataclass(frozen=True)
class _Shape:
    """Everything a completion answer depends on, but the model name; built once per distinct shape."""

    kind: str
    """"native" (/completion), "v1" (/v1/completions) or "chat" (/v1/chat/completions)."""
    stream: bool
    tokens: int
    alternatives: int
    with_logprobs: bool
    post: bool
    speculative: bool
    fill_ins: frozenset[int]
    real_zero_at: frozenset[int]
    draft_n: int | None
    accepted: int | None
    build_info: str
    placeholder_field: str | None = None
    fill_in_alternatives: bool = False
    token_extra: tuple[tuple[str, Any], ...] = ()
    shift: int = 0
    probability: float = TOKEN_PROBABILITY
    greedy: bool = False
    """Post-sampling at temperature 0: real tokens are prob 1.0 with the one candidate sampling kept."""
    pre_at: frozenset[int] = frozenset()
    """Positions that carry pre-sampling values although post-sampling ones were asked for."""

    @property
    def chat(self) -> bool:
        return self.kind == "chat"

    def entry(self, position: int) -> dict[str, Any]:
        text, token_id = CYCLE[(position + self.shift) % len(CYCLE)]
        value_key, list_key = ("prob", "top_probs") if self.post else ("logprob", "top_logprobs")
        entry: dict[str, Any] = {"id": token_id, "token": text, "bytes": list(text.encode()), **dict(self.token_extra)}
        if position in self.fill_ins:
            # What the speculative path emits: probability 1 and no alternatives, although they were asked for.
            entry[value_key], entry[list_key] = (1.0 if self.post else 0.0), []
            if self.placeholder_field:
                entry[self.placeholder_field] = True
            if not self.fill_in_alternatives:
                return entry
        probability = 1.0 if position in self.real_zero_at else self.probability

        def value(p: float) -> float:
            return p if self.post else math.log(p)

        # A replica less sure of its token is less sure of the runners-up listed too (the rest goes to the tail), as a
        # changed model's whole top-k moves: the listed alternatives scale with the token's probability.
        scale = probability / TOKEN_PROBABILITY if position not in self.real_zero_at else 1.0
        candidates = [(text, token_id, probability), *((o, i, p * scale) for o, i, p in OTHERS)][: self.alternatives]
        if self.greedy and position not in self.pre_at:
            probability, candidates = 1.0, [(text, token_id, 1.0)][: self.alternatives]
        entry[value_key] = value(probability)
        entry[list_key] = [{"id": cid, "token": ctext, "bytes": list(ctext.encode()), value_key: value(p)}
                           for ctext, cid, p in candidates]
        return entry

    def timings(self) -> dict[str, Any]:
        n = self.tokens
        timings: dict[str, Any] = {
            "cache_n": 0, "prompt_n": PROMPT_TOKENS, "prompt_ms": 4.3, "prompt_per_token_ms": 0.088,
            "prompt_per_second": 11395.3, "predicted_n": n, "predicted_ms": 0.3 * n, "predicted_per_token_ms": 0.3,
            "predicted_per_second": 3333.3,
        }
        if self.draft_n is not None:
            timings.update(draft_n=self.draft_n, draft_n_accepted=self.accepted)
        return timings

    def build(self) -> tuple[bytes, ...]:
        entries = [self.entry(i) for i in range(self.tokens)]
        content = "".join(e["token"] for e in entries)
        model = "\ue000model\ue000"
        if not self.stream:
            if self.kind == "v1":
                answer = {
                    "choices": [{"text": content, "index": 0,
                                 "logprobs": {"content": entries} if self.with_logprobs else None, "finish_reason": "length"}],
                    "created": CREATED, "model": model, "system_fingerprint": self.build_info, "object": "text_completion",
                    "usage": {"completion_tokens": self.tokens, "prompt_tokens": PROMPT_TOKENS,
                              "total_tokens": PROMPT_TOKENS + self.tokens, "prompt_tokens_details": {"cached_tokens": 0}},
                    "id": COMPLETION_ID, "timings": self.timings(),
                }
            elif self.chat:
                choice: dict[str, Any] = {"finish_reason": "length", "index": 0,
                                          "message": {"role": "assistant", "content": content}}
                if self.with_logprobs:
                    choice["logprobs"] = {"content": entries}
                answer: dict[str, Any] = {
                    "choices": [choice], "created": CREATED, "model": model, "system_fingerprint": self.build_info,
                    "object": "chat.completion",
                    "usage": {"completion_tokens": self.tokens, "prompt_tokens": PROMPT_TOKENS,
                              "total_tokens": PROMPT_TOKENS + self.tokens},
                    "id": COMPLETION_ID, "timings": self.timings(),
                }
            else:
                answer = {
                    "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": model,
                    "tokens_predicted": self.tokens, "tokens_evaluated": PROMPT_TOKENS, "generation_settings": GENERATION_PARAMS,
                    "prompt": "<s> the cat", "has_new_line": False, "truncated": False, "stop_type": "limit",
                    "stopping_word": "", "tokens_cached": PROMPT_TOKENS + self.tokens, "timings": self.timings(),
                }
                if self.with_logprobs:
                    answer["completion_probabilities"] = entries
            return (dump(answer),)
        return tuple(b"data: " + dump(event) + b"\n\n" for event in self._events(entries, model)) + (
            (b"data: [DONE]\n\n",) if self.kind in ("chat", "v1") else ())

    def _events(self, entries: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
        common = {"created": CREATED, "id": COMPLETION_ID, "model": model, "system_fingerprint": self.build_info,
                  "object": "chat.completion.chunk"}
        events: list[dict[str, Any]] = []
        if self.kind == "v1":
            v1 = {"created": CREATED, "model": model, "system_fingerprint": self.build_info, "object": "text_completion"}
            for position, entry in enumerate(entries):
                # A placeholder comes with "logprobs": null, where the chat stream drops the key.
                carries = self.with_logprobs and not (self.speculative and position in self.fill_ins)
                events.append({"choices": [{"text": entry["token"], "index": 0,
                                            "logprobs": {"content": [entry]} if carries else None, "finish_reason": None}],
                               **v1, "id": COMPLETION_ID})
            events.append({"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}], **v1,
                           "usage": {"completion_tokens": self.tokens, "prompt_tokens": PROMPT_TOKENS,
                                     "total_tokens": PROMPT_TOKENS + self.tokens,
                                     "prompt_tokens_details": {"cached_tokens": PROMPT_TOKENS - 1}},
                           "id": COMPLETION_ID, "timings": self.timings()})
            return events
        if self.chat:
            events.append({"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
                           **common})
        for position, entry in enumerate(entries):
            # A stream drops the logprobs key altogether on every speculated chunk: missing values, not zeros.
            carries = self.with_logprobs and not (self.speculative and position in self.fill_ins)
            if self.chat:
                choice: dict[str, Any] = {"finish_reason": None, "index": 0, "delta": {"content": entry["token"]}}
                if carries:
                    choice["logprobs"] = {"content": [entry]}
                events.append({"choices": [choice], **common})
            else:
                chunk = {"index": 0, "content": entry["token"], "tokens": [entry["id"]], "stop": False, "id_slot": -1,
                         "tokens_predicted": position + 1, "tokens_evaluated": PROMPT_TOKENS}
                if carries:
                    chunk["completion_probabilities"] = [entry]
                events.append(chunk)
        if self.chat:
            events.append({"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], **common,
                           "timings": self.timings()})
        else:
            events.append({"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": model,
                           "tokens_predicted": self.tokens, "tokens_evaluated": PROMPT_TOKENS, "stop_type": "limit",
                           "timings": self.timings()})
        return events


RESIDENT = ("loaded", "sleeping")
STATUSES = ("loaded", "unloaded", "loading", "sleeping")


@dataclass
class FakeRouter(Lookalike):
    """llama-server in router mode: named models (each a FakeLlama) that any request naming them loads, unless told not to."""

    models: dict[str, FakeLlama] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    """Each model's status; a model not named here starts `unloaded`."""
    models_max: int = 4
    """Resident models at most (the least recently used is evicted); 0 is no limit."""
    autoload: bool = True
    api_key: str | None = None
    build_info: str = BUILD_INFO
    loads: list[str] = field(default_factory=list)
    """Every model loaded since start, in order: a monitor must leave this empty."""
    evictions: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    _recent: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    _memo: dict[str, tuple[tuple, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    # FACTS.md does not say how `loading` and `sleeping` models answer; here a loading one is not loaded yet, and a
    # sleeping one stays resident: reading its /props leaves it asleep, a completion wakes it.

    def __post_init__(self) -> None:
        for name, model in self.models.items():
            self.status.setdefault(name, "unloaded")
            # A real router starts each model's server with --alias ID: /props and answers name the model by its id.
            model.model_alias = name
        unknown = {s for s in self.status.values() if s not in STATUSES} | (set(self.status) - set(self.models))
        if unknown:
            raise ValueError(f"unknown models or statuses: {sorted(unknown)}")
        self._recent = [name for name, status in self.status.items() if status in RESIDENT]

    def resident(self) -> list[str]:
        """Resident models, least recently used first."""
        return list(self._recent)

    def load(self, name: str) -> None:
        if self.status[name] in RESIDENT:
            self._recent.remove(name)
            self._recent.append(name)
            return
        self.status[name] = "loaded"
        self.loads.append(name)
        self._recent.append(name)
        while self.models_max > 0 and len(self._recent) > self.models_max:
            victim = self._recent.pop(0)
            self.status[victim] = "unloaded"
            self.evictions.append(victim)

    def unload(self, name: str) -> None:
        if name in self._recent:
            self._recent.remove(name)
        self.status[name] = "unloaded"

    def answer(self, request: Request) -> Answer:
        if (before := self.health_or_refusal(request)) is not None:
            return before
        path, method = request.path, request.method
        if method in GET:
            if path in MODELS_PATHS:
                return self._listing()
            if path == "/props" and "model" not in request.query:
                return self._props()
            name = request.query.get("model")
        elif method == "POST":
            try:
                body = request.json()
            except ValueError:
                return INVALID_JSON
            name = body.get("model") if isinstance(body, dict) else None
            if path in ("/models/load", "/models/unload"):
                if name not in self.models:
                    return MODEL_UNKNOWN
                (self.load if path == "/models/load" else self.unload)(name)
                return LOADED
        else:
            return NOT_FOUND
        if not isinstance(name, str) or not name:
            return MODEL_MISSING
        if name not in self.models:
            return MODEL_UNKNOWN
        if self.status[name] not in RESIDENT:
            if not self._autoload(request.query):
                return NOT_LOADED
        elif self.status[name] == "sleeping" and method == "POST":
            self.status[name] = "loaded"  # work wakes a sleeping model; reading its state does not
        self.load(name)
        model = self.models[name]
        model.sleeping = self.status[name] == "sleeping"
        query = {k: v for k, v in request.query.items() if k not in ("model", "autoload")}
        return model.answer(Request(method, path, query, request.headers, request.body))

    def _autoload(self, query: dict[str, str]) -> bool:
        value = query.get("autoload")
        return self.autoload if value is None else value.lower() not in ("false", "0", "no", "off")

    def _props(self) -> Answer:
        key = (self.models_max, self.autoload, self.build_info)
        return self._memoised("props", key, lambda: json_answer(200, {
            "role": "router", "max_instances": self.models_max, "models_autoload": self.autoload,
            "model_alias": "llama-server", "model_path": "none",
            "default_generation_settings": {"params": None, "n_ctx": 0}, "build_info": self.build_info,
        }))

    def _listing(self) -> Answer:
        key = tuple((name, self.status[name], model.path, model.speculative) for name, model in self.models.items())
        return self._memoised("models", key, lambda: json_answer(200, {"data": [self._entry(n, m) for n, m in self.models.items()]}))

    def _entry(self, name: str, model: FakeLlama) -> dict[str, Any]:
        args = ["llama-server", "--host", "127.0.0.1", "--port", "0", "--alias", name, "-m", model.path]
        preset = f"[{name}]\nmodel = {model.path}\n"
        if model.speculative:
            args += ["-md", model.path, "--spec-type", "draft-simple"]
            preset += f"model-draft = {model.path}\nspec-type = draft-simple\n"
        return {
            "id": name, "aliases": [], "tags": [], "object": "model", "owned_by": "llamacpp", "created": CREATED,
            "status": {"value": self.status[name], "args": args, "preset": preset},
            "architecture": {}, "source": "preset", "can_remove": False,
        }
