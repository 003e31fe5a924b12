"""`specwatch reference URL --out FILE`: a trusted server's answers to the peer probe's pool prompts, recorded to a
file that a peer group is then held to (`peer_references` in the config)."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..core import reference
from ..probe import peerprobe, probes
from ..probe.http.client import Client, new_client
from ..probe.http.fetch import Fetcher
from ..probe.keyfiles import KeyFiles
from ..probe.logprobs import Logprobs
from ..reasons import ProbeFailure
from ..settings.targets import ServerConfig

DEFAULT_PROMPTS = 400
"""Prompts recorded by default: at one round a canary_interval, a group asks each about once in seven hours."""


async def record(server: ServerConfig, out: Path, *, count: int = DEFAULT_PROMPTS, timeout: float = 60.0,
                 connect: Callable[[], Client] = new_client) -> str:
    """Ask `count` pool prompts (a fresh draw) of `server` and write the reference; what was done, in words."""
    url, model = server.url, server.model
    key = KeyFiles().key_of(server)
    chosen = random.SystemRandom().sample(range(len(peerprobe.prompts())), min(count, len(peerprobe.prompts())))
    answers: dict[int, Logprobs] = {}
    started = time.monotonic()
    async with connect() as http:
        fetcher = Fetcher(http, 4 * 1024 * 1024)
        polled = await probes.poll(fetcher, server, timeout=timeout, api_key=key)
        result = next(iter(polled.models.values())).result if polled.models else None
        build = result.props.build if result is not None else ""
        for done, index in enumerate(chosen, 1):
            try:
                answers[index] = await probes.peer_probe(fetcher, server, index, timeout=timeout, model=model,
                                                         api_key=key)
            except ProbeFailure as failure:
                raise ProbeFailure(failure.reason, f"prompt {index} ({done} of {len(chosen)}): {failure.detail}") from None
            if done % 50 == 0:
                print(f"  {done}/{len(chosen)} prompts, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    reference.write(out, answers, {"build": build, "model": model or "", "recorded_at": time.time()})
    return (f"recorded {len(answers)} answers of {url} (build {build or 'unknown'}) to {out} in "
            f"{time.monotonic() - started:.0f} s; hold a group to it with peer_references: {{GROUP: {out}}}")
