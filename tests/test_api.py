"""The Python API: specwatch.check and specwatch.ask give what `check --json` prints, refuse what `check` refuses in its
words, run inside an event loop too; importing specwatch loads nothing heavy; a type checker sees the API's types."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import specwatch
from specwatch.cli import main
from tests.support.loopback import FaultServer
from tests.support.pages import blocks_by_section
from tests.support.verdicts import serving
from tests.support.wire import FakeLlama

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ("__init__.py", "gate/api.py", "gate/received.py")
"""The modules of the public API, under exporter/: a type checker runs over them in strict mode."""


def cli(*args: str) -> tuple[int, str, str]:
    """`specwatch ARGS` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as usage:  # argparse refuses a flag's value itself
            code = usage.code if isinstance(usage.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def plain() -> Iterator[FaultServer]:
    with FaultServer(FakeLlama.plain(tokens=None)) as server:
        yield server


@pytest.fixture
async def daemon() -> AsyncIterator[str]:
    fakes = {"eval-a": FakeLlama.plain(tokens=8), "eval-b": FakeLlama.draft(tokens=8), "serve-a": FakeLlama.plain(tokens=8)}
    labels = {"eval-a": {"pool": "eval"}, "eval-b": {"pool": "eval"}, "serve-a": {"pool": "serve"}}
    async with serving(fakes, labels) as url:
        yield url


@pytest.mark.parametrize(("fake", "verdict", "code"), [(FakeLlama.plain, "clean", 0), (FakeLlama.draft, "fill_ins", 1)])
def test_check_returns_what_check_json_prints(fake: Any, verdict: str, code: int) -> None:
    with FaultServer(fake(tokens=None)) as server:
        report = specwatch.check(server.url, tokens=16)
        printed = cli("check", server.url, "--tokens", "16", "--json")
    assert isinstance(report, specwatch.CheckReport)
    assert (report.verdict, report.exit_code, printed[0]) == (verdict, code, code)
    assert report.as_json() == json.loads(printed[1])
    assert all(e.tokens == 16 and e.judged_tokens == 15 for e in report.endpoints)


def test_checks_arguments_reach_the_canary(plain: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain.fake = FakeLlama.plain(tokens=None, api_key="sk-test")
    monkeypatch.setenv("LLAMA_KEY", "sk-test")
    report = specwatch.check(plain.url, api_key_env="LLAMA_KEY", endpoints=["chat", "completion"], tokens=8, timeout="5s")
    assert (report.verdict, report.api_key_sent) == ("clean", True)
    assert [(e.endpoint, e.tokens) for e in report.endpoints] == [("chat", 8), ("completion", 8)]  # as given, as --endpoint
    asked = [s.json() for s in plain.seen if s.method == "POST"]
    assert len(asked) == 2 and all(body.get("n_predict", body.get("max_tokens")) == 8 for body in asked)
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    assert specwatch.check(plain.url, api_key_file=key, endpoints="chat", tokens=4).exit_code == 0  # one name, not letters
    refused = specwatch.check(plain.url, endpoints=["chat"], tokens=4)
    assert (refused.verdict, refused.api_key_sent) == ("unchecked", False)
    assert "no API key was sent: give api_key_file or api_key_env" in refused.summary  # the arguments, not check's flags


def test_an_unreachable_server_is_a_report_not_an_exception() -> None:
    report = specwatch.check("http://127.0.0.1:9", timeout=2)
    assert (report.verdict, report.exit_code, report.reason) == ("unchecked", 2, "connection_refused")
    asked = specwatch.ask("http://127.0.0.1:9", timeout=2)
    assert (asked.verdict, asked.exit_code) == ("unchecked", 2) and "cannot ask the exporter" in asked.summary


# Each refusal beside the same arguments on the command line (`check` exits 64 for them), and what the ValueError says:
# check's reason, after the argument's name where check's says its flag's; the exporter's flags named as `ask` names them.
REFUSALS = [
    ("check", "127.0.0.1:8080", {}, [], "url: '127.0.0.1:8080' has no scheme: add http://"),
    ("check", "http://127.0.0.1:8080/v1", {}, [], "url: 'http://127.0.0.1:8080/v1' ends in /v1: give the server's root"),
    ("check", "http://h:8080?key=sk-1", {}, [], "url: 'http://h' must not carry a query or fragment"),
    ("check", "http://127.0.0.1", {}, [], "url: 'http://127.0.0.1' gives no port: llama-server listens on 9931 from build "
     "11521 and on 8080 before; give the port, e.g. 'http://127.0.0.1:9931' (an explicit ':80' for a front end on port 80)"),
    ("check", "http://h:8080", {"tokens": 3}, ["--tokens", "3"], "tokens: '3' is not a whole number from 4 to 512"),
    ("check", "http://h:8080", {"tokens": 513}, ["--tokens", "513"], "tokens: '513' is not a whole number from 4 to 512"),
    ("check", "http://h:8080", {"timeout": "soon"}, ["--timeout", "soon"], "timeout: 'soon' is not a duration"),
    ("check", "http://h:8080", {"timeout": 0.01}, ["--timeout", "0.01"], "timeout: 10ms is below the 100ms floor"),
    ("check", "http://h:8080", {"timeout": -1}, ["--timeout", "-1"], "timeout: duration must be positive and finite"),
    ("check", "http://h:8080", {"api_key_file": "/nonexistent/key"}, ["--api-key-file", "/nonexistent/key"],
     "api_key_file '/nonexistent/key' cannot be read"),
    ("check", "http://h:8080", {"endpoints": ["chat", "vision"]}, ["--endpoint", "chat", "--endpoint", "vision"],
     "endpoints: unknown endpoint vision; choose from completion, "),
    ("ask", "http://e:9824", {"labels": {"": "eval"}}, ["--label", "=eval"], "labels: '=eval' must look like KEY=VALUE"),
    ("ask", "http://e:9824", {"timeout": "1x"}, ["--timeout", "1x"], "timeout: '1x' is not a duration"),
]
# What check says of its flags, `ask` says of its arguments.
FLAG_REFUSALS = [
    ({"key_file": "k.pem"}, ["--exporter-key-file", "k.pem"], "key_file needs cert_file",
     "--exporter-key-file needs --exporter-cert-file"),
    ({"password_file": "pw"}, ["--exporter-password-file", "pw"], "password_file needs username",
     "--exporter-password-file needs --exporter-username"),
]


@pytest.mark.parametrize(("function", "url", "kwargs", "flags", "said"), REFUSALS)
def test_a_refusal_is_a_value_error_naming_the_argument(function: str, url: str, kwargs: dict[str, Any], flags: list[str],
                                                       said: str) -> None:
    with pytest.raises(ValueError) as refused:
        getattr(specwatch, function)(url, **kwargs)
    assert str(refused.value).startswith(said), str(refused.value)
    args = ["check", url, *flags] if function == "check" else ["check", "--exporter", url, *flags]
    code, _, cli_said = cli(*args)
    reason = str(refused.value).removeprefix(f"{next(iter(kwargs))}: ") if kwargs else str(refused.value)
    assert code == 64 and reason in cli_said, (reason, cli_said)


@pytest.mark.parametrize(("kwargs", "flags", "said", "cli_said"), FLAG_REFUSALS)
def test_an_exporter_argument_is_refused_by_its_python_name(kwargs: dict[str, Any], flags: list[str], said: str,
                                                           cli_said: str) -> None:
    with pytest.raises(ValueError) as refused:
        specwatch.ask("http://e:9824", **kwargs)
    assert str(refused.value) == said
    code, _, printed = cli("check", "--exporter", "http://e:9824", *flags)
    assert code == 64 and cli_said in printed, printed


def test_ask_needs_an_exporter() -> None:
    with pytest.raises(ValueError, match="give the URL of at least one specwatch daemon"):
        specwatch.ask([])


async def test_the_sync_forms_run_inside_a_running_loop(plain: FaultServer) -> None:
    report = specwatch.check(plain.url, endpoints=["chat"], tokens=8)
    twin = await specwatch.acheck(plain.url, endpoints=["chat"], tokens=8)
    assert report.as_json() == twin.as_json() and report.verdict == "clean"


def _timeless(value: Any) -> Any:
    """A document without the ages, which move between two asks."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "age_seconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


async def test_ask_returns_what_check_exporter_json_prints(daemon: str) -> None:
    report = specwatch.ask(daemon, labels={"pool": "eval"})  # inside this test's running loop: in a thread
    code, printed, _ = await asyncio.to_thread(cli, "check", "--exporter", daemon, "--label", "pool=eval", "--json")
    assert isinstance(report, specwatch.AskReport)
    assert (report.verdict, report.exit_code, code) == ("fill_ins", 1, 1)
    assert _timeless(report.as_json()) == _timeless(json.loads(printed))
    assert [m.server for m in report.models] == ["eval-b", "eval-a"]


async def test_aask_selects_as_the_flags_do(daemon: str) -> None:
    one = await specwatch.aask(daemon, servers="eval-a")
    assert (one.verdict, [m.server for m in one.models], one.selection["servers"]) == ("clean", ["eval-a"], ["eval-a"])
    both = await specwatch.aask([daemon, daemon], servers=["eval-a", "serve-a"], timeout=5)
    assert both.exporters == [daemon, daemon] and sorted(m.server for m in both.models) == ["eval-a", "serve-a"]
    nothing = await specwatch.aask(daemon, labels={"pool": "none"})
    assert (nothing.verdict, nothing.exit_code) == ("unchecked", 2)


@pytest.mark.real
def test_importing_specwatch_loads_nothing_heavy() -> None:
    """No HTTP client, daemon, metrics library or scheduler until asked for; judging answers never needs them."""
    script = textwrap.dedent("""
        import sys
        HEAVY = ("httpx", "httpcore", "pydantic", "prometheus_client", "apscheduler", "specwatch.daemon", "specwatch.gate")
        def heavy():
            return sorted(m for m in sys.modules if m.startswith(HEAVY))
        import specwatch
        print(heavy())
        specwatch.require_real, specwatch.tally, specwatch.FillInLogprobs, specwatch.AnswerTally
        print([m for m in heavy() if not m.startswith(("specwatch.gate", "pydantic"))])
        specwatch.check, specwatch.ask, specwatch.CheckReport
        print([m for m in heavy() if m.startswith(("prometheus_client", "apscheduler", "specwatch.daemon"))])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.splitlines() == ["[]", "[]", "[]"], result.stdout + result.stderr


def test_the_public_modules_silence_no_type_checker() -> None:
    for name in PUBLIC:
        assert "type: ignore" not in (ROOT / "exporter" / name).read_text(), name


USER_SCRIPT = '''
import asyncio
from typing import assert_type

import specwatch

report = specwatch.check("http://127.0.0.1:8080", endpoints=["chat"], tokens=32, timeout="30s")
assert_type(report, specwatch.CheckReport)
assert_type(report.exit_code, int)
entries: list[specwatch.EndpointReport] = report.endpoints
routed: list[specwatch.ModelReport] = report.models
asked = specwatch.ask(["http://specwatch-0:9824", "http://specwatch-1:9824"], labels={"pool": "eval"})
assert_type(asked, specwatch.AskReport)
models: list[specwatch.ModelVerdict] = asked.models
assert_type(asyncio.run(specwatch.acheck("http://127.0.0.1:8080")), specwatch.CheckReport)
assert_type(asyncio.run(specwatch.aask("http://specwatch:9824", servers=["eval-a"])), specwatch.AskReport)
counted = specwatch.tally({"choices": []})
assert_type(counted, specwatch.AnswerTally)
assert_type(counted.status, specwatch.Status)
assert_type(specwatch.require_real([]).fill_ins, int)
try:
    specwatch.require_real({})
except specwatch.FillInLogprobs as err:
    assert_type(err.tally, specwatch.AnswerTally)
except specwatch.CannotJudge as err:
    assert_type(err.tally, specwatch.AnswerTally | None)
assert_type(specwatch.__version__, str)
'''
"""A user's typed script: every call and type of the API, each result's type asserted."""
WRONG = {
    'mistyped: specwatch.AskReport = specwatch.check("http://h:8080")': "Incompatible types in assignment",
    'specwatch.chekc("http://h:8080")': 'Module has no attribute "chekc"',
    'specwatch.check("http://h:8080", tokens="48")': 'Argument "tokens" to "check" has incompatible type "str"',
    'specwatch.ask("http://e:9824", labels=[("pool", "eval")])': 'Argument "labels" to "ask" has incompatible type',
    'specwatch.tally({}).fill_ins.upper()': '"int" has no attribute "upper"',
}
"""Lines a type checker must refuse, with what it says: the API's types are seen, never Any."""


@pytest.mark.real
@pytest.mark.slow
def test_mypy_strict_over_the_public_api_a_users_script_and_the_docs(tmp_path: Path) -> None:
    # The package as it installs (exporter/ as specwatch), as a user's type checker finds it, py.typed included.
    shutil.copytree(ROOT / "exporter", tmp_path / "specwatch", ignore=shutil.ignore_patterns("__pycache__"))
    assert (tmp_path / "specwatch" / "py.typed").exists()
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "wrong.py").write_text("import specwatch\n\n" + "\n".join(WRONG) + "\n")
    docs = []
    for number, block in enumerate(b for blocks in blocks_by_section(ROOT / "docs" / "api.md", "python").values() for b in blocks):
        docs.append(f"doc_{number}.py")
        (tmp_path / docs[-1]).write_text(block)
    public = [f"specwatch/{name}" for name in PUBLIC]
    # Strict over the public modules and the scripts; what they import is read for its types, its own errors unsaid.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary", "--cache-dir",
         str(tmp_path / ".mypy_cache"), *public, "user.py", "wrong.py", *docs],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert [e for e in errors if not e.startswith("wrong.py:")] == [], result.stdout + result.stderr
    by_line = {int(e.split(":")[1]): e for e in errors if e.startswith("wrong.py:")}
    for number, (line, says) in enumerate(WRONG.items(), start=3):
        assert says in by_line.get(number, ""), (line, by_line.get(number), result.stdout)
