"""API key files, read again when they change, as Prometheus does with credentials files; no key ever reaches a log."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import SecretStr

from specwatch.filestamp import FileStamp, file_stamp

log = structlog.get_logger("specwatch")


def checked_key(key: str, source: str) -> str:
    """`key` when it can be sent as a Bearer token; else ValueError naming `source` (never the key)."""
    if not key:
        raise ValueError(f"{source} is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(f"{source}: the API key contains whitespace or control characters")
    return key


def _read_key_file(path: Path) -> str:
    where = f"api_key_file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    return checked_key(text, where)


@dataclass
class _KeyFile:
    stamp: FileStamp
    key: SecretStr
    problem: str | None = None


class KeyFiles:
    """API keys read from files and read again when a file changes.

    A file's stamp (device, inode, mtime, size) decides whether it changed, so a thousand servers sharing one key file
    cost a stat each per request, and a rotated key (written in place or swapped in by a symlink, as Kubernetes
    does) is used from the next request. While a rotation leaves the file missing or empty, the last good key stays
    in use and one line says so.
    """

    def __init__(self) -> None:
        self._files: dict[Path, _KeyFile] = {}
        self._lock = threading.Lock()

    def load(self, path: Path) -> None:
        """Read `path` now; raises ValueError saying what is wrong with it (a config naming it is then refused)."""
        try:
            stamp = file_stamp(path)
        except OSError as err:
            raise ValueError(f"api_key_file {str(path)!r} cannot be read: {err.strerror}") from None
        known = self._files.get(path)
        if known is not None and known.stamp == stamp and known.problem is None:
            return  # a thousand servers sharing one file read it once
        key = SecretStr(_read_key_file(path))
        with self._lock:
            self._files[path] = _KeyFile(stamp, key)

    def get(self, path: Path) -> SecretStr | None:
        """The current key of `path`, or the last good one while the file is missing, empty or unreadable."""
        known = self._files.get(path)
        try:
            stamp = file_stamp(path)
        except OSError as err:
            return self._keep(path, known, None, f"cannot be read: {err.strerror}")
        if known is not None and known.stamp == stamp:
            return known.key
        try:
            key = SecretStr(_read_key_file(path))
        except ValueError as err:
            return self._keep(path, known, stamp, str(err).removeprefix(f"api_key_file {str(path)!r}").strip(" :"))
        with self._lock:
            self._files[path] = _KeyFile(stamp, key)
        if known is not None and (known.problem is not None or known.key != key):
            log.info("api_key_file_changed", file=str(path), why="the file changed; its key is used from now on")
        return key

    def _keep(self, path: Path, known: _KeyFile | None, stamp: FileStamp | None, problem: str) -> SecretStr | None:
        if known is None:
            return None
        if known.problem != problem:
            log.warning("api_key_file_unusable", file=str(path), problem=problem,
                        action="still sending the last key read from it until the file holds a key again")
        with self._lock:
            # The bad file's stamp is remembered, so it is not read again until it changes.
            self._files[path] = _KeyFile(stamp or known.stamp, known.key, problem)
        return known.key


KEY_FILES = KeyFiles()
"""The one registry a process shares: servers naming the same file share its reads."""
