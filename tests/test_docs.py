"""The README and docs/ as a reader follows them: every relative link and anchor resolves, and the README's config loads."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from specwatch.settings.schema import Settings
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
