"""The code blocks of the project's pages (README.md, docs/*.md), verbatim, for the tests that run them."""

from __future__ import annotations

import re
from pathlib import Path


def blocks_by_section(page: Path, language: str) -> dict[str, list[str]]:
    """The `language` blocks of `page`, by the title of the `## ` section each is in (sections without one left out)."""
    found = {}
    for section in re.split(r"^## ", page.read_text(), flags=re.M)[1:]:
        title, body = section.split("\n", 1)
        blocks = re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
        if blocks:
            found[title.strip()] = blocks
    return found
