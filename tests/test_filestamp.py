"""File stamps: a change by rename, by symlink swap or in place changes the stamp; a file left alone keeps it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specwatch.filestamp import file_stamp


def test_a_stamp_changes_with_every_kind_of_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("one")
    first = file_stamp(path)
    assert file_stamp(path) == first  # a stat, not a read: nothing changed
    path.write_text("two!")  # in place: a new size
    in_place = file_stamp(path)
    assert in_place != first and in_place.inode == first.inode
    fresh = tmp_path / "key.new"
    fresh.write_text("six!")  # the same size, swapped in by rename: a new inode
    os.replace(fresh, path)
    renamed = file_stamp(path)
    assert renamed != in_place and renamed.size == in_place.size


def test_a_stamp_follows_a_symlink_swapped_as_kubernetes_does(tmp_path: Path) -> None:
    for version in ("v1", "v2"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "key").write_text("same")
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "key").symlink_to("..data/key")
    before = file_stamp(tmp_path / "key")
    (tmp_path / "..data.new").symlink_to("v2")
    os.replace(tmp_path / "..data.new", tmp_path / "..data")
    assert file_stamp(tmp_path / "key") != before


def test_a_missing_file_raises() -> None:
    with pytest.raises(FileNotFoundError):
        file_stamp("/nonexistent/key")
