"""docs/gating.md's DeepEval recipe, read from the page and run in real DeepEval (the rig: tests/support/recipes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import recipes
from tests.support.recipes import recipe

pytestmark = [pytest.mark.real, pytest.mark.slow]


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


def test_deepeval_conftest(tmp_path: Path, recipe_servers: dict[str, str], installed_specwatch: tuple[Path, Path]) -> None:
    (conftest,) = recipe("DeepEval", "python")
    site, _ = installed_specwatch
    requirements = [f"deepeval=={recipes.DEEPEVAL}", *recipes.runtime_requirements()]
    with recipes.locked(f"deepeval-{recipes.DEEPEVAL}") as home:
        python = recipes.python_tool(home, requirements)
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "conftest.py").write_text(conftest)
            (work / "test_answers.py").write_text(DEEPEVAL_TEST)
            # The checkout's wheel on PYTHONPATH: pytest finds the plugin through its entry point, as an install would.
            env = recipes.environment([python.parent], LLAMA_URL=recipe_servers[kind], PYTHONPATH=str(site),
                                      DEEPEVAL_TELEMETRY_OPT_OUT="YES")
            result = recipes.run([python.parent / "deepeval", "test", "run", "test_answers.py"], work, env)
            said = recipes.said(result)
            # Nothing here names the plugin: the fixture exists because pytest loaded it through its entry point.
            assert "fixture 'specwatch' not found" not in said, said
            if kind == "draft":
                assert result.returncode == 1, said
                assert f"specwatch: {recipe_servers['draft']} is fill_ins: do not score against it" in said
                assert "ERROR at setup of test_the_model_continues_the_line" in said
                assert not (work / "scored").exists()
            else:
                assert result.returncode == 0, said
                assert "Passed: 1" in said and "Failed: 0" in said, said
                assert "cat sat on a mat" in (work / "scored").read_text()
