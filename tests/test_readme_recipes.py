"""docs/gating.md's "Gate an eval where it runs" recipes, read from the page and run in real promptfoo, DeepEval and inspect_ai.

Each runs against a real llama-server drafting with draft-simple (the recipe must stop the eval before it reaches the
server) and a plain one (the eval runs and scores what the server answered). The tools come from their registries,
pinned, into a cache of their own (tests/support/recipes.py): the first run installs them (minutes), later runs reuse
them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import markdown, recipes

pytestmark = [pytest.mark.real, pytest.mark.slow]

RUN_TIMEOUT = 600


def recipe(title: str, language: str) -> list[str]:
    """The code blocks in `language` of docs/gating.md's recipe `title`, verbatim."""
    return markdown.blocks(markdown.section(markdown.DOCS / "gating.md", title), language)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("recipes") / "cycle.gguf")
    with LlamaServer.of_kind("draft", model) as draft, LlamaServer.of_kind("plain", model) as plain:
        yield {"draft": draft.url, "plain": plain.url}


@pytest.fixture(scope="module")
def specwatch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This checkout installed from its wheel (its code and its pytest11 entry point), and a `specwatch` command for it."""
    site = recipes.specwatch_install(tmp_path_factory.mktemp("specwatch") / "site")
    command = recipes.specwatch_command(site.parent / "bin", site)
    return site, command.parent


def _run(command: list[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}"


def test_promptfoo_before_all_extension(tmp_path: Path, servers: dict[str, str], specwatch: tuple[Path, Path]) -> None:
    (gate,) = recipe("promptfoo", "js")
    (config,) = recipe("promptfoo", "yaml")
    with recipes.locked(f"promptfoo-{recipes.PROMPTFOO}-lean") as home:
        npm_bin = recipes.npm_tool(home, f"promptfoo@{recipes.PROMPTFOO}", left_out=recipes.PROMPTFOO_LEFT_OUT)
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "specwatch-gate.js").write_text(gate)
            (work / "promptfooconfig.yaml").write_text(config)
            env = recipes.environment([specwatch[1]], LLAMA_URL=servers[kind], PROMPTFOO_DISABLE_TELEMETRY="1",
                                      PROMPTFOO_DISABLE_UPDATE="1", PROMPTFOO_CONFIG_DIR=str(work / ".promptfoo"))
            result = _run([npm_bin / "promptfoo", "eval", "-c", "promptfooconfig.yaml", "--no-cache", "-o", "results.json"],
                          work, env)
            said = _said(result)
            if kind == "draft":
                assert result.returncode == 1, said
                assert "FILL_INS: the server serves fill-in logprobs" in said
                assert 'Extension hook "beforeAll" failed' in said
                assert "Running 1 test cases" not in said and not (work / "results.json").exists(), said
            else:
                assert result.returncode == 0, said
                assert "CLEAN: logprobs are real" in said
                results = json.loads((work / "results.json").read_text())["results"]
                assert results["stats"]["successes"] == 1, results["stats"]
                (answered,) = results["results"]
                assert "cat sat on a mat" in answered["response"]["output"], answered["response"]


DEEPEVAL_TEST = '''
import json
import os
import urllib.request

from deepeval import assert_test
from deepeval.metrics import PatternMatchMetric
from deepeval.test_case import LLMTestCase


def answer(prompt):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0}).encode()
    request = urllib.request.Request(os.environ["LLAMA_URL"] + "/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def test_the_model_continues_the_line():
    case = LLMTestCase(input="the cat", actual_output=answer("the cat"))
    open("scored", "w").write(case.actual_output)
    assert_test(case, [PatternMatchMetric(pattern=r".*cat sat on a mat.*")])
'''
"""A DeepEval test that scores what the server answers, with a metric that needs no judge model."""


def test_deepeval_conftest(tmp_path: Path, servers: dict[str, str], specwatch: tuple[Path, Path]) -> None:
    (conftest,) = recipe("DeepEval", "python")
    site, _ = specwatch
    requirements = [f"deepeval=={recipes.DEEPEVAL}", *recipes.runtime_requirements()]
    with recipes.locked(f"deepeval-{recipes.DEEPEVAL}") as home:
        python = recipes.python_tool(home, requirements)
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "conftest.py").write_text(conftest)
            (work / "test_answers.py").write_text(DEEPEVAL_TEST)
            # The checkout's wheel on PYTHONPATH: pytest finds the plugin through its entry point, as an install would.
            env = recipes.environment([python.parent], LLAMA_URL=servers[kind], PYTHONPATH=str(site),
                                      DEEPEVAL_TELEMETRY_OPT_OUT="YES")
            result = _run([python.parent / "deepeval", "test", "run", "test_answers.py"], work, env)
            said = _said(result)
            # Nothing here names the plugin: the fixture exists because pytest loaded it through its entry point.
            assert "fixture 'specwatch' not found" not in said, said
            if kind == "draft":
                assert result.returncode == 1, said
                assert f"specwatch: {servers['draft']} is fill_ins: do not score against it" in said
                assert "ERROR at setup of test_the_model_continues_the_line" in said
                assert not (work / "scored").exists()
            else:
                assert result.returncode == 0, said
                assert "Passed: 1" in said and "Failed: 0" in said, said
                assert "cat sat on a mat" in (work / "scored").read_text()


INSPECT_TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import GenerateConfig
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def cycle():
    return Task(dataset=[Sample(input="the cat", target="cat sat on a mat")], solver=generate(), scorer=includes(),
                config=GenerateConfig(max_tokens=16, temperature=0, logprobs=True, top_logprobs=3))
'''
"""An inspect task that reads logprobs, as a logprob scorer would, and scores the text the server answered."""


def test_inspect_ai_shell_gate(tmp_path: Path, servers: dict[str, str], specwatch: tuple[Path, Path]) -> None:
    (gate,) = recipe("inspect_ai", "sh")
    with recipes.locked(f"inspect-ai-{recipes.INSPECT_AI}") as home:
        python = recipes.python_tool(home, [f"inspect-ai=={recipes.INSPECT_AI}", f"openai=={recipes.OPENAI}"])
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "task.py").write_text(INSPECT_TASK)
            env = recipes.environment([specwatch[1], python.parent], LLAMA_URL=servers[kind],
                                      INSPECT_LOG_DIR=str(work / "logs"))
            result = _run(["bash", "-c", gate], work, env)
            said = _said(result)
            logs = sorted((work / "logs").glob("*.eval")) if (work / "logs").exists() else []
            if kind == "draft":
                assert result.returncode == 1, said
                assert "FILL_INS: the server serves fill-in logprobs" in said
                assert logs == [], said  # inspect never started
            else:
                assert result.returncode == 0, said
                assert "CLEAN: logprobs are real" in said
                assert len(logs) == 1, said
                assert re.search(r"accuracy\s+1\.000", said), said
