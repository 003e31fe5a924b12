"""docs/gating.md's inspect_ai recipe, read from the page and run in real inspect_ai (the rig: tests/support/recipes.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import recipes
from tests.support.recipes import recipe

pytestmark = [pytest.mark.real, pytest.mark.slow]


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


def test_inspect_ai_shell_gate(tmp_path: Path, recipe_servers: dict[str, str], installed_specwatch: tuple[Path, Path]) -> None:
    (gate,) = recipe("inspect_ai", "sh")
    with recipes.locked(f"inspect-ai-{recipes.INSPECT_AI}") as home:
        python = recipes.python_tool(home, [f"inspect-ai=={recipes.INSPECT_AI}", f"openai=={recipes.OPENAI}"])
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "task.py").write_text(INSPECT_TASK)
            env = recipes.environment([installed_specwatch[1], python.parent], LLAMA_URL=recipe_servers[kind],
                                      INSPECT_LOG_DIR=str(work / "logs"))
            result = recipes.run(["bash", "-c", gate], work, env)
            said = recipes.said(result)
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
