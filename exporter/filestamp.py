"""A file's change stamp: whether a watched file changed costs one stat, never a read."""

from __future__ import annotations

import os
from typing import NamedTuple


class FileStamp(NamedTuple):
    """Device and inode catch a file swapped in by rename or symlink; mtime and size catch one written in place."""

    device: int
    inode: int
    mtime_ns: int
    size: int


def file_stamp(path: str | os.PathLike[str]) -> FileStamp:
    """The stamp of `path`, following symlinks (Kubernetes swaps a secret's files through one); raises OSError."""
    status = os.stat(path)
    return FileStamp(status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size)
