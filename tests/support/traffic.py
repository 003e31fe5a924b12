"""Other requests decoding on a llama-server all the time, as an eval's traffic would: its slots batch the probes."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

WORDS = "the of and a to in is you that it he was for on are as with his they I at be this have from".split()


def random_words(rng: random.Random) -> str:
    """24 common words at random: each request another prompt, as a busy pool's are."""
    return " ".join(rng.choice(WORDS) for _ in range(24))


def _complete(url: str, prompt: str, n_predict: int, timeout: float) -> None:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.8, "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()


@contextlib.contextmanager
def busy(url: str, *, requests: int = 3, n_predict: int = 64, prompt: Callable[[random.Random], str] = random_words,
         timeout: float = 120) -> Iterator[list[int]]:
    """`requests` other requests decoding on the server at all times; yields [how many were answered so far]."""
    stop, answered = threading.Event(), [0]

    def keep_busy(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                _complete(url, prompt(rng), n_predict, timeout)
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)  # a server starting, stopping or full: ask again
                continue
            answered[0] += 1

    threads = [threading.Thread(target=keep_busy, args=(seed,), daemon=True) for seed in range(requests)]
    for thread in threads:
        thread.start()
    try:
        yield answered
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=timeout + 10)
