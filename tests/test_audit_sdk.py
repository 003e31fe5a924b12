"""The OpenAI Python SDK against a real plain and a real draft llama-server: its answers judged by the API and by `specwatch audit`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specwatch.gate.received import FillInLogprobs, Status, require_real, tally
from specwatch.probe.canary import CHAT_INSTRUCTION, PROMPT_TEXT

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 24
SHAPES = ("chat", "chat_stream", "v1_completion", "v1_completion_stream")


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What the SDK returned on each server: a ChatCompletion, a Completion, and every chunk of each stream."""
    from openai import OpenAI

    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("audit") / "cycle.gguf")
    found = {}
    for kind in ("plain", "draft"):
        with LlamaServer.of_kind(kind, model) as server:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
            chat: dict[str, Any] = {
                "model": "cycle", "max_tokens": TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 3,
                "messages": [{"role": "system", "content": CHAT_INSTRUCTION}, {"role": "user", "content": PROMPT_TEXT}],
            }
            completion: dict[str, Any] = {"model": "cycle", "max_tokens": TOKENS, "temperature": 0, "logprobs": 3,
                                          "prompt": PROMPT_TEXT}
            found[kind] = {
                "chat": client.chat.completions.create(**chat),
                "chat_stream": list(client.chat.completions.create(**chat, stream=True)),
                "v1_completion": client.completions.create(**completion),
                "v1_completion_stream": list(client.completions.create(**completion, stream=True)),
            }
    return found


def dumped(answers: dict[str, Any]) -> bytes:
    """model_dump_json() of each answer, and of each chunk of each stream, one per line."""
    objects = [obj for value in answers.values() for obj in (value if isinstance(value, list) else [value])]
    return b"".join(obj.model_dump_json().encode() + b"\n" for obj in objects)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_api_finds_every_token_real_on_the_plain_server(answers: dict[str, dict[str, Any]], shape: str) -> None:
    counted = require_real(answers["plain"][shape])
    assert (counted.shape, counted.tokens, counted.judged_tokens, counted.fill_ins, counted.draft_n) == (
        shape, TOKENS, TOKENS - 1, 0, None)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_api_finds_fill_ins_on_the_draft_server(answers: dict[str, dict[str, Any]], shape: str) -> None:
    with pytest.raises(FillInLogprobs) as caught:
        require_real(answers["draft"][shape])
    counted = caught.value.tally
    assert counted.shape == shape and counted.judged and counted.fill_ins > 0, counted
    assert counted.draft_n, "the SDK keeps llama-server's timings, and with them draft_n"
    assert tally(answers["draft"][shape]) == counted


def test_the_sdk_dumps_carry_what_the_audit_reads(answers: dict[str, dict[str, Any]]) -> None:
    completion = json.loads(answers["draft"]["v1_completion"].model_dump_json())
    # The SDK's Completion adds OpenAI's legacy fields, null, beside llama-server's content; and keeps timings.
    assert set(completion["choices"][0]["logprobs"]) == {"content", "text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert completion["choices"][0]["logprobs"]["tokens"] is None and completion["timings"]["draft_n"] > 0
    last = json.loads(answers["draft"]["chat_stream"][-1].model_dump_json())
    assert last["object"] == "chat.completion.chunk" and last["timings"]["draft_n"] > 0


def test_audit_reads_the_sdk_dumps(answers: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    paths = {}
    for kind in ("plain", "draft"):
        paths[kind] = tmp_path / f"{kind}.jsonl"
        paths[kind].write_bytes(dumped(answers[kind]))
    runs = {kind: subprocess.run([sys.executable, "-m", "specwatch", "audit", str(path), "--json"], capture_output=True,
                                 text=True, timeout=60, cwd=ROOT) for kind, path in paths.items()}
    plain, draft = (json.loads(runs[kind].stdout)["files"][0] for kind in ("plain", "draft"))
    assert (runs["plain"].returncode, plain["answers"], plain["clean"], plain["judged_tokens"], plain["fill_ins"]) == (
        0, 4, 4, 4 * (TOKENS - 1), 0)
    assert plain["shapes"] == dict.fromkeys(SHAPES, 1)
    assert (runs["draft"].returncode, draft["answers"], draft["fill_in_answers"], draft["drafted"]) == (1, 4, 4, 4)
    assert draft["fill_ins"] == sum(tally(answers["draft"][shape]).fill_ins for shape in SHAPES)
    both = subprocess.run([sys.executable, "-m", "specwatch", "audit", str(paths["plain"]), str(paths["draft"])],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert both.returncode == 1 and both.stdout.splitlines()[-1].startswith("FILL_INS: 4 of 8 answers in 2 files carry")


def test_a_clean_tally_is_clean(answers: dict[str, dict[str, Any]]) -> None:
    assert {tally(answers["plain"][shape]).status for shape in SHAPES} == {Status.CLEAN}
