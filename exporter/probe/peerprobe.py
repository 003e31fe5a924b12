"""The peer probe: one prompt per round, asked of every member of a peer group, that replicas of one model must answer alike.

The fill-in canary repeats a line so that speculation drafts; its text is near-certain, so its values say little of
the weights, and a draft continues it as the model does. The probe's prompts leave the model less sure (an eval's kind
of text), so a weight change moves their values and a replica whose text is not the model's (synthetic acceptance)
parts from it within a few tokens. Each round's prompt is drawn from a pool of thousands shipped with the package, in an
order each specwatch process draws anew, so a caching or routing gateway that knows a few prompts is caught. Asked
through /v1/completions, which OpenAI-compatible front ends forward too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
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
COPIES = 2
"""Copies of the round's prompt asked at once of a server of two slots or more: its slots then decode them in one batch
beside whatever else it serves, and how far the two answers part is the member's own noise under its real load."""
SALT = secrets.randbits(64)
"""This process's draw of the pool's order: another process asks the same rounds other prompts."""


@functools.cache
def prompts() -> tuple[str, ...]:
    """The prompt pool shipped beside this module (prompts.json, made by bench/prompt_pool.py): ordinary text that left
    Gemma 3 270M undecided, in a fixed shuffled order; read once."""
    return tuple(json.loads(resources.files(__package__).joinpath("prompts.json").read_text(encoding="utf-8")))


def prompt(question: int, *, salt: int | None = None, among: tuple[int, ...] | None = None) -> int:
    """The pool index round `question` asks: drawn by this process's salt (or `salt`), from `among` where given (the
    prompts a reference recorded), else from the whole pool."""
    digest = hashlib.blake2b(f"{SALT if salt is None else salt}:{question}".encode(), digest_size=8).digest()
    drawn = int.from_bytes(digest, "big")
    return among[drawn % len(among)] if among else drawn % len(prompts())


def body(text: str, model: str | None = None) -> dict[str, Any]:
    """The request body that asks `text` (a router's or a gateway's model named by `model`)."""
    asked: dict[str, Any] = {"prompt": text, "max_tokens": TOKENS, "logprobs": ALTERNATIVES, "temperature": 0.0,
                             "seed": SEED, "cache_prompt": False}
    if model:
        asked["model"] = model
    return asked


def read(answer: Any) -> tuple[Logprobs, str | None]:
    """The answer's logprobs and the model it says produced it; an answer without values is NO_LOGPROBS."""
    reading = read_choice(answer)
    if not reading.tokens:
        # An empty answer (#27572: speculation with several slots) says nothing of the weights: never "agrees".
        raise ProbeFailure(Reason.NO_LOGPROBS, "the answer carries no tokens")
    if reading.tokens[0].logprob is None:
        raise ProbeFailure(Reason.NO_LOGPROBS, "the peer probe's answer carries no logprobs")
    return logprobs_of(reading.tokens), reading.model
