"""Reference files: a trusted server's answers to the peer probe's pool prompts, written once and read by every daemon
whose peer group is held to them (core.peers.Reference)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..probe.logprobs import Logprobs
from ..probe.peerprobe import ALTERNATIVES, TOKENS, prompts
from .peers import Reference

FORMAT = "specwatch-reference/1"
MAX_BYTES = 64 * 1024 * 1024
"""A reference of thousands of prompts is a few MB: anything near this is not one."""


class ReferenceFileError(ValueError):
    """A reference file that cannot be used, and why, in words an operator can act on."""


def encode(answer: Logprobs) -> list[list[Any]]:
    """An answer as the file keeps it: [text, logprob or null for a fill-in, [[alternative, logprob], ...]] a token."""
    tokens = []
    for index, text in enumerate(answer.texts):
        real = answer.real(index)
        listed = range(answer.starts[index], answer.starts[index + 1])
        tokens.append([text, answer.values[index] if real else None,
                       [[answer.alternative_texts[at], answer.alternative_values[at]] for at in listed]])
    return tokens


def decode(tokens: Any, where: str) -> Logprobs:
    """An answer read back from the file; a malformed one is refused with where it is."""
    if not isinstance(tokens, list) or not tokens:
        raise ReferenceFileError(f"{where}: an answer is a non-empty list of tokens")
    texts: list[str] = []
    values = array("d")
    starts = array("I", [0])
    alternative_texts: list[str] = []
    alternative_values = array("d")
    for token in tokens:
        if (not isinstance(token, list) or len(token) != 3 or not isinstance(token[0], str)
                or not (token[1] is None or isinstance(token[1], int | float)) or not isinstance(token[2], list)):
            raise ReferenceFileError(f"{where}: a token is [text, logprob or null, [[alternative, logprob], ...]]")
        texts.append(token[0])
        values.append(math.nan if token[1] is None else float(token[1]))
        for pair in token[2] if token[1] is not None else ():
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                    and isinstance(pair[1], int | float)):
                raise ReferenceFileError(f"{where}: an alternative is [text, logprob]")
            alternative_texts.append(pair[0])
            alternative_values.append(float(pair[1]))
        starts.append(len(alternative_texts))
    return Logprobs(tuple(texts), values, starts, tuple(alternative_texts), alternative_values)


def write(path: Path, answers: Mapping[int, Logprobs], about: Mapping[str, Any]) -> None:
    """Write a reference file atomically: a reader never sees half of one."""
    document = {"format": FORMAT, "pool_size": len(prompts()), "tokens": TOKENS, "alternatives": ALTERNATIVES,
                **about, "answers": {str(index): encode(answer) for index, answer in sorted(answers.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def read(path: Path) -> Reference:
    """A reference file read and checked against this package's probe; what is wrong with it is said, never a trace."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ReferenceFileError(f"{path}: larger than {MAX_BYTES // 2**20} MB: not a reference file")
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReferenceFileError(f"{path}: no such file (record one with `specwatch reference URL --out {path}`)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ReferenceFileError(f"{path}: cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ReferenceFileError(f"{path}: not JSON ({err.msg} at line {err.lineno}): a corrupt or cut-short file; "
                                 "record it again") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ReferenceFileError(f"{path}: not a specwatch reference file (format {FORMAT!r} expected)")
    expected = {"pool_size": len(prompts()), "tokens": TOKENS, "alternatives": ALTERNATIVES}
    found = {key: document.get(key) for key in expected}
    if found != expected:
        raise ReferenceFileError(f"{path}: recorded with another peer probe ({found}, this specwatch asks {expected}): "
                                 "record it again with this version")
    answers = document.get("answers")
    if not isinstance(answers, dict) or not answers:
        raise ReferenceFileError(f"{path}: it holds no answers")
    read_back: dict[int, Logprobs] = {}
    for key, tokens in answers.items():
        if not key.isdigit() or int(key) >= len(prompts()):
            raise ReferenceFileError(f"{path}: answer {key!r} names no prompt of the pool")
        read_back[int(key)] = decode(tokens, f"{path}: answer {key}")
    return Reference(read_back)


def read_all(paths: Mapping[str, Path]) -> dict[str, Reference]:
    """Every configured group's reference, by group; the first file that cannot be used raises ReferenceFileError."""
    return {group: read(path) for group, path in paths.items()}
