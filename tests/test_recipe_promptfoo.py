"""docs/gating.md's promptfoo recipe, read from the page and run in real promptfoo (the rig: tests/support/recipes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import recipes
from tests.support.recipes import recipe

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_promptfoo_before_all_extension(tmp_path: Path, recipe_servers: dict[str, str], installed_specwatch: tuple[Path, Path]) -> None:
    (gate,) = recipe("promptfoo", "js")
    (config,) = recipe("promptfoo", "yaml")
    with recipes.locked(f"promptfoo-{recipes.PROMPTFOO}-lean") as home:
        npm_bin = recipes.npm_tool(home, f"promptfoo@{recipes.PROMPTFOO}", left_out=recipes.PROMPTFOO_LEFT_OUT)
        for kind in ("draft", "plain"):
            work = tmp_path / kind
            work.mkdir()
            (work / "specwatch-gate.js").write_text(gate)
            (work / "promptfooconfig.yaml").write_text(config)
            env = recipes.environment([installed_specwatch[1]], LLAMA_URL=recipe_servers[kind], PROMPTFOO_DISABLE_TELEMETRY="1",
                                      PROMPTFOO_DISABLE_UPDATE="1", PROMPTFOO_CONFIG_DIR=str(work / ".promptfoo"))
            result = recipes.run([npm_bin / "promptfoo", "eval", "-c", "promptfooconfig.yaml", "--no-cache", "-o", "results.json"],
                          work, env)
            said = recipes.said(result)
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
