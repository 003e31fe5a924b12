"""The project's Markdown as the tests read it: sections by heading, code blocks, links, and the anchors GitHub makes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside_code(text: str) -> list[str | None]:
    """The lines of `text`, with None for each line of a fenced code block (its fences included)."""
    lines: list[str | None] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            lines.append(None)
        else:
            lines.append(None if fenced else line)
    return lines


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of each heading, in order; a `#` line in a code block is none."""
    return [(len(m.group(1)), m.group(2)) for line in _outside_code(text) if line and (m := _HEADING.match(line))]


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every fragment a link may point to: one per heading, a repeated one numbered as GitHub does (`-1`, `-2`)."""
    found: set[str] = set()
    for _, title in headings(text):
        slug = base = github_anchor(title)
        n = 0
        while slug in found:
            n += 1
            slug = f"{base}-{n}"
        found.add(slug)
    return found


def section(path: Path, title: str) -> str:
    """The text under the heading `title` in `path`, up to the next heading of the same level or above."""
    lines = path.read_text().splitlines()
    plain = _outside_code("\n".join(lines))
    start = level = None
    for i, line in enumerate(plain):
        match = _HEADING.match(line) if line else None
        if not match:
            continue
        if start is None and match.group(2) == title:
            start, level = i + 1, len(match.group(1))
        elif start is not None and len(match.group(1)) <= level:
            return "\n".join(lines[start:i]) + "\n"
    assert start is not None, f"{path.relative_to(ROOT)} has no heading {title!r}"
    return "\n".join(lines[start:]) + "\n"


def blocks(text: str, language: str) -> list[str]:
    """The code blocks of `text` in `language`, verbatim."""
    return re.findall(rf"^```{re.escape(language)}\n(.*?)^```", text, flags=re.S | re.M)


def links(text: str) -> list[str]:
    """The targets of the inline links outside code blocks."""
    return [target for line in _outside_code(text) if line for target in _LINK.findall(line)]
