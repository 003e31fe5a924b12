"""A real llama-server in router mode whose one model can be reloaded with other flags, and a llama-server's own counters."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from specwatch.demo.llamaserver import find_llama_server
from tests.support.metrics import parse
from tests.support.net import free_port
from tests.support.process import _stop_group
from tests.support.waiting import wait_until

PREDICTED, PROMPT = "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"
ROUTER_MODEL = "cyc"
# Preset keys are the long flag names without their dashes.
_PRESET_KEYS = {"-md": "model-draft", "--model-draft": "model-draft", "--spec-type": "spec-type"}


def counters(url: str, query: str = "") -> dict[str, float]:
    """A llama-server's own /metrics (started with --metrics), as {name: value} of its unlabelled samples."""
    text = httpx.get(f"{url}/metrics{query}", timeout=10).text
    return {name: value for (name, labels), value in parse(text).items() if not labels}


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Router:
    """llama-server with `--models-preset FILE` (one model section, ROUTER_MODEL) and no -m, on 127.0.0.1.

    Build 11434 re-reads its preset on `GET /models?reload=1` and unloads a model whose section changed; the next
    load (`POST /models/load`, or any request naming it while autoload is on) starts it with the new flags.
    """

    def __init__(self, model: Path, workdir: Path) -> None:
        self.model = model
        self.preset = workdir / "router-preset.ini"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "router.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def write_preset(self, extra: list[str]) -> None:
        """The model's section, with `extra` given as flag/value pairs (e.g. ["-md", PATH, "--spec-type", "ngram-mod"])."""
        lines = [f"[{ROUTER_MODEL}]", f"model = {self.model}", "c = 2048", "t = 1", "parallel = 1"]
        lines += [f"{_PRESET_KEYS[flag]} = {value}" for flag, value in zip(extra[::2], extra[1::2], strict=True)]
        self.preset.write_text("\n".join(lines) + "\n")

    def start(self) -> Router:
        self.write_preset([])
        command = [str(find_llama_server()), "--models-preset", str(self.preset), "--host", "127.0.0.1",
                   "--port", str(self.port), "--metrics", "--models-max", "1"]
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        wait_until(f"router on {self.url} answering /health", lambda: answers(f"{self.url}/health"), timeout=60)
        return self

    def status(self) -> str:
        listing = httpx.get(f"{self.url}/models", timeout=10).json()["data"]
        return next(m["status"]["value"] for m in listing if m["id"] == ROUTER_MODEL)

    def load(self) -> float:
        """Load the model as a client would; the monotonic time /models first lists it loaded."""
        httpx.post(f"{self.url}/models/load", json={"model": ROUTER_MODEL}, timeout=30).raise_for_status()
        wait_until("the router model loaded", lambda: self.status() == "loaded", timeout=60, interval=0.05)
        return time.monotonic()

    def reload_with(self, extra: list[str]) -> float:
        """Change the preset, make the router re-read it (it unloads the changed model), and load the model again;
        the monotonic time /models first lists it loaded."""
        self.write_preset(extra)
        httpx.get(f"{self.url}/models?reload=1", timeout=30).raise_for_status()
        wait_until("the router to unload the changed model", lambda: self.status() == "unloaded", timeout=30)
        return self.load()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_group(proc, 10)
