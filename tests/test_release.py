"""The release said one way: `specwatch --version`, the changelog's newest entry and the upgrading notes' newest section."""

from __future__ import annotations

import re

import pytest

from specwatch import __version__, cli
from tests.support import markdown


def test_the_version_is_the_changelogs_newest_release() -> None:
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (markdown.ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == __version__
    assert releases == sorted(releases, key=lambda r: tuple(map(int, r.split("."))), reverse=True)


def test_the_upgrading_notes_describe_the_release() -> None:
    newest = re.search(r"^## (.+)$", (markdown.DOCS / "upgrading.md").read_text(), re.M)
    assert newest is not None
    assert newest[1] == ".".join(__version__.split(".")[:2])


def test_the_command_line_reports_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"specwatch {__version__}\n"
