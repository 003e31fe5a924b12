"""Reference files: written atomically, read back exactly, and every way one can be unusable refused in words an
operator can act on; a daemon whose group has one holds the pair to it and names the odd member."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.core import reference
from specwatch.core.peers import Reference
from specwatch.daemon.run import read_references
from specwatch.probe.logprobs import logprobs_of
from specwatch.probe.readers import Token
from specwatch.problems import ConfigError
from specwatch.settings.schema import Settings

ANSWER = logprobs_of([Token(-0.5, 2, text=" A", top=(" A", -0.5, " The", -1.1)), Token(None, 0, text=" cat", top=())])


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "gemma.reference.json"
    reference.write(path, {3: ANSWER, 17: ANSWER}, {"build": "b11549"})
    return path


def test_a_reference_reads_back_what_was_written(tmp_path: Path) -> None:
    read = reference.read(_written(tmp_path))
    assert read.prompts == (3, 17)
    back = read.answers[17]
    assert back.texts == ANSWER.texts and back.value_of(0, " The") == -1.1 and not back.real(1)  # a fill-in stays one
    assert [p.name for p in tmp_path.iterdir()] == ["gemma.reference.json"]  # no partial file left behind


def _document(tmp_path: Path) -> dict:
    return json.loads(_written(tmp_path).read_text())


# (what is wrong, how the file is made from a good one, the words of the refusal)
BAD = {
    "missing": (lambda p, d: p.unlink(), "no such file (record one with `specwatch reference URL --out"),
    "cut short": (lambda p, d: p.write_text(p.read_text()[:40]), "not JSON (Unterminated string"),
    "not ours": (lambda p, d: p.write_text(json.dumps({"format": "x"})), "not a specwatch reference file"),
    "another probe": (lambda p, d: p.write_text(json.dumps({**d, "tokens": 16})), "recorded with another peer probe"),
    "no answers": (lambda p, d: p.write_text(json.dumps({**d, "answers": {}})), "it holds no answers"),
    "a prompt out of the pool": (lambda p, d: p.write_text(json.dumps({**d, "answers": {"999999": d["answers"]["3"]}})),
                                 "answer '999999' names no prompt of the pool"),
    "a malformed token": (lambda p, d: p.write_text(json.dumps({**d, "answers": {"3": [["x", "y", []]]}})),
                          "answer 3: a token is [text, logprob or null"),
}


@pytest.mark.parametrize("case", BAD, ids=BAD)
def test_an_unusable_reference_is_refused_in_words(case: str, tmp_path: Path) -> None:
    document = _document(tmp_path)
    path = tmp_path / "gemma.reference.json"
    spoil, words = BAD[case]
    spoil(path, document)
    with pytest.raises(reference.ReferenceFileError) as refused:
        reference.read(path)
    assert words in str(refused.value) and str(path) in str(refused.value)
    # In a config, it refuses the config (at start, and on reload the running one stays).
    with pytest.raises(ConfigError) as config:
        read_references(Settings(peer_references={"gemma": path}))
    assert "peer_references: " in str(config.value) and words in str(config.value)


def test_a_group_held_to_its_reference_asks_only_the_prompts_it_recorded(tmp_path: Path) -> None:
    from specwatch.probe.peerprobe import prompt

    held = Reference({3: ANSWER, 17: ANSWER})
    assert {prompt(q, among=held.prompts) for q in range(200)} == {3, 17}


@pytest.mark.parametrize(("args", "words"), [
    (["http://127.0.0.1", "--out", "{out}"], "gives no port"),
    (["http://127.0.0.1:9", "--out", "{out}", "--api-key-env", "SPECWATCH_TEST_UNSET_KEY"], "is unset or empty"),
    (["http://127.0.0.1:9", "--out", "{out}", "--prompts", "0"], "--prompts must be 1 or more"),
])
def test_specwatch_reference_refuses_a_bad_call_in_words(args: list[str], words: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from specwatch.cli import main

    out = tmp_path / "ref.json"
    assert main(["reference", *[a.replace("{out}", str(out)) for a in args]]) == 64
    assert words in capsys.readouterr().err and not out.exists()
