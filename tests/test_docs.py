"""The README and docs/ as a reader follows them: every relative link and anchor resolves, and the README's config loads."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from pydantic import ValidationError

from specwatch.cli import EPILOG_CHECK, EPILOG_RUN
from specwatch.problems import problem_lines
from specwatch.settings.schema import Settings
from specwatch.settings.targets import LLAMA_SERVER_PORT, LLAMA_SERVER_PORT_BEFORE, PORT_CHANGED_IN_BUILD, ServerConfig
from tests.support import markdown

PAGES = sorted([markdown.ROOT / "README.md", markdown.ROOT / "bench" / "README.md", *markdown.DOCS.glob("*.md")])


def _broken(page: Path, text: str) -> list[str]:
    """The links of `text`, read as the page at `page`, that lead nowhere."""
    broken = []
    for target in markdown.links(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / unquote(path)).resolve()
        if path and (not resolved.is_relative_to(markdown.ROOT) or not resolved.exists()):
            broken.append(f"{target}: no such file")
        elif fragment and (path.endswith(".md") or not path):
            if fragment not in markdown.anchors(resolved.read_text() if path else text):
                broken.append(f"{target}: no heading there has the anchor #{fragment}")
        elif fragment:
            broken.append(f"{target}: an anchor in a file that is not Markdown")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(markdown.ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert _broken(page, page.read_text()) == []


def test_a_broken_link_or_anchor_is_caught() -> None:
    text = ("# A page\n\n## Its part: `x --y`\n\n[here](#its-part-x---y) [there](reference.md#metrics) [gone](#nothing) "
            "[gone too](reference.md#no-such-part) [lost](nowhere.md)\n\n```sh\n[in code](skipped.md)\n```\n")
    assert _broken(markdown.DOCS / "a-page.md", text) == [
        "#nothing: no heading there has the anchor #nothing",
        "reference.md#no-such-part: no heading there has the anchor #no-such-part",
        "nowhere.md: no such file",
    ]


def test_anchors_follow_github() -> None:
    text = "# specwatch\n## The gate behind a load balancer: `check --exporter`\n## Tests\n## Tests\n```\n# not a heading\n```\n"
    assert markdown.anchors(text) == {"specwatch", "the-gate-behind-a-load-balancer-check---exporter", "tests", "tests-1"}


def test_the_readme_config_is_one_specwatch_accepts() -> None:
    [config] = markdown.blocks(markdown.section(markdown.ROOT / "README.md", "The daemon"), "yaml")
    settings = Settings(**yaml.safe_load(config))
    assert [s.name for s in settings.servers] == ["eval-a", "eval-b"]
    assert all(s.labels == {"pool": "eval"} for s in settings.servers)


# Where a user is told where llama-server listens: the pages, the example configs and the help. Not
# docs/llama-server-behaviour.md (measurements of build 11434) nor the history in docs/upgrading.md and CHANGELOG.md.
TELLS_WHERE = [markdown.ROOT / "README.md", *sorted(markdown.DOCS.glob("*.md")), *sorted((markdown.ROOT / "examples").glob("*.yml")),
               markdown.ROOT / "deploy" / "kubernetes" / "base" / "specwatch.yml"]
_LLAMA_ADDRESS = re.compile(rf"[A-Za-z0-9.-]+:(?:{LLAMA_SERVER_PORT}|{LLAMA_SERVER_PORT_BEFORE})\b")


@pytest.mark.parametrize("where", TELLS_WHERE, ids=[str(p.relative_to(markdown.ROOT)) for p in TELLS_WHERE])
def test_a_page_that_gives_a_llama_server_address_says_which_port_each_build_listens_on(where: Path) -> None:
    """9931 from build 11521 (upstream PR 26508), 8080 before: a page with either in an address says both, by build."""
    if where.name in ("llama-server-behaviour.md", "upgrading.md"):
        return
    text = where.read_text()
    if not _LLAMA_ADDRESS.search(text) and "SERVER:PORT" not in text:
        return
    said = " ".join(text.split())
    assert re.search(rf"{LLAMA_SERVER_PORT}\W+from build {PORT_CHANGED_IN_BUILD}\W.{{0,80}}\b{LLAMA_SERVER_PORT_BEFORE}\W+before",
                     said), f"{where.name} gives a llama-server address without saying 9931 from build 11521, 8080 before"


@pytest.mark.parametrize("text", [EPILOG_RUN, EPILOG_CHECK], ids=["run", "check"])
def test_the_help_that_gives_a_llama_server_address_says_both_ports(text: str) -> None:
    said = " ".join(text.split())
    assert "from build 11521" in said and "8080 before" in said and "9931" in said


def test_the_refusal_operating_md_quotes_is_the_one_specwatch_gives() -> None:
    page = " ".join(markdown.section(markdown.DOCS / "operating.md", "Configuration").split())
    with pytest.raises(ValidationError) as refused:
        ServerConfig(name="a", url="http://10.0.0.5")
    [said] = problem_lines(refused.value, ServerConfig)
    said = said.removeprefix("url: ")
    assert said.startswith("'http://10.0.0.5' gives no port: ")
    assert f"(`{said}`)" in page
