"""What an API key must be to go out as a Bearer token, and reading one from a key file; no key ever enters a message."""

from __future__ import annotations

from pathlib import Path


def checked_key(key: str, source: str) -> str:
    """`key` when it can be sent as a Bearer token; else ValueError naming `source` (never the key)."""
    if not key:
        raise ValueError(f"{source} is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(f"{source}: the API key contains whitespace or control characters")
    return key


def read_key_file(path: Path) -> str:
    """The key `path` holds, stripped; else ValueError saying what is wrong with the file (a config naming it is refused)."""
    where = f"api_key_file {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8 text") from None
    return checked_key(text, where)
