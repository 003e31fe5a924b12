"""The peer probe: short questions replicas of one model must answer alike, asked of each member of a peer group.

The fill-in canary repeats a line so that speculation drafts; its text is near-certain, so its values say little of
the weights, and a draft continues it as the model does. These questions leave the model less sure (an eval's kind of
text), so a weight change moves their values and a replica whose text is not the model's (synthetic acceptance)
parts from it within a few tokens. Asked through /v1/completions, which OpenAI-compatible front ends forward too.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from ..reasons import ProbeFailure, Reason
from .logprobs import Logprobs, logprobs_of
from .readers import read_choice

PATH = "/v1/completions"
TOKENS = 8
ALTERNATIVES = 5
"""Alternatives per token (OpenAI's /v1/completions allows five): where two replicas' texts part, each answer's
alternatives give the other's token its value, so a near-tie flipped by noise is told from a real parting."""
SEED = 4242
BURST = 4
"""Copies of a question asked at once, the first time a process is asked it: a server's slots then decode together,
and the spread of the answers is the batching noise of its model, build and hardware (a server of one slot has none)."""
QUESTIONS = (
    "Once upon a time, in a small village,",
    "Question: What is a good name for a pet cat?\nAnswer:",
    "Here is a list of fruits:",
    "The best thing about mornings is",
    "Q: Name a colour.\nA:",
    "My favourite book is",
)
"""Ordinary text the model is not sure how to go on with; a member is asked them in turn."""


@functools.cache
def prompts() -> tuple[str, ...]:
    """The prompt pool shipped beside this module (prompts.json, made by bench/prompt_pool.py): ordinary text that left
    Gemma 3 270M undecided, in a fixed shuffled order; read once."""
    return tuple(json.loads(resources.files(__package__).joinpath("prompts.json").read_text(encoding="utf-8")))


def body(question: int, model: str | None = None) -> dict[str, Any]:
    """The request body of question `question` (a router's or a gateway's model named by `model`)."""
    asked: dict[str, Any] = {"prompt": QUESTIONS[question], "max_tokens": TOKENS, "logprobs": ALTERNATIVES,
                             "temperature": 0.0, "seed": SEED, "cache_prompt": False}
    if model:
        asked["model"] = model
    return asked


def read(answer: Any) -> tuple[Logprobs, str | None]:
    """The answer's logprobs and the model it says produced it; an answer without values is NO_LOGPROBS."""
    reading = read_choice(answer)
    if not reading.tokens or reading.tokens[0].logprob is None:
        raise ProbeFailure(Reason.NO_LOGPROBS, "the peer probe's answer carries no logprobs")
    return logprobs_of(reading.tokens), reading.model
