"""The closed set of reasons a poll or canary can fail, shared by probes, logs and metrics."""

from enum import StrEnum


class Reason(StrEnum):
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    UNREACHABLE = "unreachable"
    """No route to the server: its host or network is unreachable (a link or a route down), said by the network."""
    DNS = "dns"
    TLS = "tls"
    TIMEOUT = "timeout"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    NOT_SUPPORTED = "not_supported"
    LOADING = "loading"
    SERVER_ERROR = "server_error"
    CLIENT_ERROR = "client_error"
    REDIRECT = "redirect"
    INVALID_JSON = "invalid_json"
    INVALID_RESPONSE = "invalid_response"
    BODY_TOO_LARGE = "body_too_large"
    NO_LOGPROBS = "no_logprobs"
    NOT_POST_SAMPLING = "not_post_sampling"
    """Post-sampling probabilities were asked for at temperature 0, where sampling keeps one candidate (prob 1.0, one
    entry in top_probs), and tokens came with other numbers: pre-sampling ones, under the post-sampling keys."""
    MODEL_MISMATCH = "model_mismatch"
    NOT_LOADED = "not_loaded"
    """A router answered that the model is not loaded: a state of the model, not a failure of the server."""
    INTERNAL = "internal"


class ProbeFailure(Exception):
    """A server answered wrongly or not at all; `reason` is one of the closed set."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
