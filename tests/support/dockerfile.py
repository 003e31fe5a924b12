"""The repository's Dockerfile as instructions, for the tests that hold other files to what it says."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent.parent / "Dockerfile"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuation lines joined, comments and blank lines left out."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        found.append((keyword.upper(), arguments.strip()))
        pending = ""
    return found


def stages(path: Path = DOCKERFILE) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, FROM first; those before the first FROM (ARG) are left out."""
    result: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions(path):
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, arguments))
    return result


def last(keyword: str, path: Path = DOCKERFILE) -> str:
    """The arguments of the last `keyword` instruction, the one that takes effect."""
    matching = [arguments for found, arguments in instructions(path) if found == keyword]
    assert matching, f"the Dockerfile has no {keyword}"
    return matching[-1]


def user() -> tuple[int, int]:
    """(uid, gid) of the final USER."""
    uid, _, gid = last("USER").partition(":")
    return int(uid), int(gid or uid)


def healthcheck_command() -> list[str]:
    """The HEALTHCHECK's command, its options (--interval ...) left out."""
    words = last("HEALTHCHECK").split(" CMD ", 1)[1].strip()
    return json.loads(words) if words.startswith("[") else shlex.split(words)


def healthcheck_options() -> dict[str, str]:
    options = last("HEALTHCHECK").split(" CMD ", 1)[0].split()
    return dict(option.removeprefix("--").split("=", 1) for option in options)
