"""API key files, read again when they change, as Prometheus does with credentials files; no key ever reaches a log."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog
from pydantic import SecretStr

from ..apikey import read_key_file
from ..filestamp import FileStamp, file_stamp

log = structlog.get_logger("specwatch")


class KeySource(Protocol):
    """Where a server's key comes from: the settings' ServerConfig is one, without probes importing settings."""

    @property
    def api_key_file(self) -> Path | None: ...
    @property
    def env_key(self) -> SecretStr | None: ...


@dataclass
class _KeyFile:
    stamp: FileStamp
    key: SecretStr
    problem: str | None = None


class KeyFiles:
    """The keys probes send, with key files read again when they change: one per runner, never shared by a config.

    A file's stamp (device, inode, mtime, size) decides whether it changed, so a thousand servers sharing one key file
    cost a stat each per probe, and a rotated key (written in place or swapped in by a symlink, as Kubernetes
    does) is used from the next probe. While a rotation leaves the file missing or empty, the last good key stays
    in use and one line says so.
    """

    def __init__(self) -> None:
        self._files: dict[Path, _KeyFile] = {}
        self._lock = threading.Lock()

    def key_of(self, server: KeySource) -> SecretStr | None:
        """The key to send to `server` now: its key file's current content, or its api_key_env value, or None."""
        if server.api_key_file is not None:
            return self.get(server.api_key_file)
        return server.env_key

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
            key = SecretStr(read_key_file(path))
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
