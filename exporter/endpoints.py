"""The canary endpoints' names: known to the config that selects them and to the probes that ask them."""

from __future__ import annotations

from enum import StrEnum


class Endpoint(StrEnum):
    """The ways an eval reads logprobs; each is canaried separately, in this order by default.

    /completion comes first: a fresh server with ngram-map-k whose first request is a chat never drafts afterwards
    (measured on build 11434 with bench/canary_tokens.py), while one whose first request is a completion does.
    """

    COMPLETION = "completion"
    COMPLETION_STREAM = "completion_stream"
    COMPLETION_POST_SAMPLING = "completion_post_sampling"
    V1_COMPLETION = "v1_completion"
    V1_COMPLETION_STREAM = "v1_completion_stream"
    CHAT = "chat"
    CHAT_STREAM = "chat_stream"
