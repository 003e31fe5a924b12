"""The pytest plugin (exporter/gate/pytest_plugin.py), run by pytester: the session gate, its options, the fixture, the exporter form."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import bcrypt
import pytest

from specwatch.gate.options import ASKING, CHECK, OPTIONS, PLUGIN, Mode, Option
from specwatch.gate.pytest_plugin import EXIT_NOT_REAL, EXIT_UNCHECKED, Defaults, defaults_of
from tests.support import markdown
from tests.support.loopback import FaultServer
from tests.support.net import refused_url
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama, FakeRouter

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)
KEY = "sk-gate-secret-7f3a"
PASSING_SUITE = "def test_scores():\n    open('scored', 'w').close()\n"
"""A suite whose one test leaves a file behind: it ran exactly when the file is there."""


def plugin_args() -> list[str]:
    """Load the plugin as the environment has it: through its `pytest11` entry point once installed, else by name."""
    installed = entry_points(group="pytest11", name="specwatch")
    return [] if installed else ["-p", "specwatch.gate.pytest_plugin"]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run pytest in this process with the plugin and pytest-asyncio only, loaded by their entry-point names.

    Whatever else the environment has installed would run inside this test's process too: pytest-benchmark, for one,
    starts `git` when a session begins, which the quick suite refuses. The subprocess tests load every plugin."""
    named = ["-p", "specwatch"] if entry_points(group="pytest11", name="specwatch") else ["-p", "specwatch.gate.pytest_plugin"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        # In-process, the plugin module is already imported: pytest cannot rewrite its asserts (it has none), and says so.
        return pytester.runpytest(*named, "-p", "asyncio", "-p", "no:cacheprovider",
                                  "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                  "-o", "asyncio_default_fixture_loop_scope=function", *args)


def scored(pytester: pytest.Pytester) -> bool:
    """Whether the suite's test ran since the last look."""
    mark = pytester.path / "scored"
    found = mark.exists()
    mark.unlink(missing_ok=True)
    return found


@pytest.fixture(scope="module")
def plain() -> Iterator[FaultServer]:
    with FaultServer(FakeLlama.plain(tokens=None)) as server:
        yield server


@pytest.fixture(scope="module")
def draft() -> Iterator[FaultServer]:
    with FaultServer(FakeLlama.draft(tokens=None)) as server:
        yield server


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_eval=PASSING_SUITE)
    return pytester


def test_refused_on_a_speculating_server_before_any_test(suite: pytest.Pytester, draft: FaultServer) -> None:
    result = run(suite, "--specwatch", draft.url)
    assert result.ret == EXIT_NOT_REAL == 11
    assert not scored(suite)
    out = result.stdout.str()
    assert f"specwatch: {draft.url}: FILL_INS: the server serves fill-in logprobs" in out
    assert re.search(r"chat_stream +fill-ins 47/47 after the first", out), out
    assert f"no test ran (exit 11): logprobs are not real: {draft.url} is fill_ins" in result.stderr.str()
    # The gate runs before collection: the suite's module was never imported.
    assert "collected" not in out


def test_runs_on_a_plain_server_and_says_it_checked(suite: pytest.Pytester, plain: FaultServer) -> None:
    result = run(suite, "--specwatch", plain.url)
    assert result.ret == 0, result.stdout.str()
    assert scored(suite)
    result.stdout.fnmatch_lines([f"specwatch: checks before the session: {plain.url}",
                                 f"specwatch: {plain.url}: CLEAN: logprobs are real*", "*1 passed*"])


def test_every_server_named_must_be_clean_and_the_worst_verdict_decides(suite: pytest.Pytester, plain: FaultServer,
                                                                        draft: FaultServer) -> None:
    down = refused_url()
    assert run(suite, "--specwatch", plain.url, "--specwatch", plain.url).ret == 0 and scored(suite)
    both = run(suite, "--specwatch", plain.url, "--specwatch", draft.url)
    assert both.ret == EXIT_NOT_REAL and not scored(suite)
    unreachable = run(suite, "--specwatch", plain.url, "--specwatch", down)
    assert unreachable.ret == EXIT_UNCHECKED == 12 and not scored(suite)
    assert f"specwatch: {down}: UNCHECKED: could not poll the server: connection_refused" in unreachable.stdout.str()
    assert f"could not check: {down} is unchecked" in unreachable.stderr.str()
    # Fill-ins are proof, whatever the other servers do: they outrank a server that could not be checked.
    assert run(suite, "--specwatch", down, "--specwatch", draft.url).ret == EXIT_NOT_REAL


@pytest.mark.real
def test_inert_without_its_options(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded but not asked: no header line, no check, nothing of specwatch imported but its table of options; its
    options and fixture exist, and the fixture says what it returns."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    pytester.makepyfile(test_quiet="""
        import sys

        def test_nothing_of_specwatch_was_loaded(request):
            loaded = sorted(m for m in sys.modules if m.startswith("specwatch."))
            # The option table, the names of the canary's endpoints that --specwatch-endpoint takes, and the release
            # the package root holds.
            assert loaded == ["specwatch.endpoints", "specwatch.gate", "specwatch.gate.options", "specwatch.gate.pytest_plugin",
                              "specwatch.version"], loaded
            assert request.config.pluginmanager.has_plugin("specwatch") or request.config.pluginmanager.has_plugin(
                "specwatch.gate.pytest_plugin")
    """)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert not [line for line in result.stdout.lines if line.startswith("specwatch")], result.stdout.str()
    helped = pytester.runpytest_subprocess(*plugin_args(), "--help").stdout.str()
    for flag in ("--specwatch=URL", "--specwatch-exporter=URL", "--specwatch-label=KEY=VALUE", "--specwatch-api-key-file=FILE"):
        assert flag in helped
    assert "specwatch (args):" in helped  # the ini key
    fixtures = " ".join(pytester.runpytest_subprocess(*plugin_args(), "--fixtures").stdout.str().split())
    assert "specwatch [session scope]" in fixtures
    assert "returns its CheckReport, (exporter=url) its AskReport, if clean: .as_json() is what check --json prints" in fixtures


def test_collect_only_checks_nothing(suite: pytest.Pytester) -> None:
    """Editors list tests with --collect-only; a server that is down must not make that fail."""
    result = run(suite, "--specwatch", refused_url(), "--collect-only")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["specwatch: not checked: --collect-only runs no test", "*test_scores*"])


def test_from_the_ini_file_and_the_command_line_wins(suite: pytest.Pytester, plain: FaultServer, draft: FaultServer) -> None:
    suite.makeini(f"[pytest]\nspecwatch = {draft.url}\n")
    assert run(suite).ret == EXIT_NOT_REAL and not scored(suite)
    assert run(suite, "--specwatch", plain.url).ret == 0 and scored(suite)


def test_from_pyproject_as_a_list(suite: pytest.Pytester, plain: FaultServer, draft: FaultServer) -> None:
    suite.makepyprojecttoml(f'[tool.pytest.ini_options]\nspecwatch = ["{plain.url}", "{draft.url}"]\nspecwatch_tokens = "16"\n')
    result = run(suite)
    assert result.ret == EXIT_NOT_REAL and not scored(suite)
    assert re.search(r"completion +fill-ins 15/15 after the first", result.stdout.str()), result.stdout.str()


def test_the_api_key_comes_from_a_variable_or_a_file_and_is_never_shown(suite: pytest.Pytester,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with FaultServer(FakeLlama.plain(tokens=None, api_key=KEY)) as server:
        missing = run(suite, "--specwatch", server.url)
        assert missing.ret == EXIT_UNCHECKED
        assert "no API key was sent: give --specwatch-api-key-file or --specwatch-api-key-env" in missing.stdout.str()
        monkeypatch.setenv("EVAL_LLAMA_KEY", KEY)
        by_env = run(suite, "--specwatch", server.url, "--specwatch-api-key-env", "EVAL_LLAMA_KEY")
        assert by_env.ret == 0, by_env.stdout.str()
        # A key file named in the ini is found beside the ini, wherever pytest runs from.
        (suite.path / "keys").mkdir()
        (suite.path / "keys" / "llama.key").write_text(KEY + "\n")
        suite.makeini(f"[pytest]\nspecwatch = {server.url}\nspecwatch_api_key_file = keys/llama.key\n")
        by_file = run(suite)
        assert by_file.ret == 0, by_file.stdout.str()
        (suite.path / "keys" / "llama.key").write_text("sk-wrong\n")
        refused = run(suite)
        assert refused.ret == EXIT_UNCHECKED and "the API key sent was refused" in refused.stdout.str()
        seen = {r.headers.get("authorization") for r in server.seen}
    assert f"Bearer {KEY}" in seen
    for result in (missing, by_env, by_file, refused):
        assert KEY not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(("args", "message"), [
    (["--specwatch", "http://a:8080/v1?key=x"], "must not carry a query or fragment"),
    (["--specwatch", "http://a:8080", "--specwatch-tokens", "2"], "'2' is not a whole number from 4 to 512"),
    (["--specwatch", "http://a:8080", "--specwatch-timeout", "soon"], "soon"),
    (["--specwatch", "http://a:8080", "--specwatch-endpoint", "chats"], "unknown endpoint chats; choose from completion,"),
    (["--specwatch", "http://a:8080", "--specwatch-label", "pool=eval"],
     "--specwatch-label select what --specwatch-exporter reports: give --specwatch-exporter URL too"),
    (["--specwatch-exporter", "http://e:9824", "--specwatch-label", "pool"], "'pool' must look like KEY=VALUE"),
    (["--specwatch-exporter", "http://e:9824", "--specwatch-exporter-password-file", "pw"],
     "--specwatch-exporter-password-file needs --specwatch-exporter-username"),
    (["--specwatch-exporter", "http://e:9824", "--specwatch-exporter-key-file", "key.pem"],
     "--specwatch-exporter-key-file needs --specwatch-exporter-cert-file"),
    (["--specwatch", "http://a:8080", "--specwatch-server", "a", "--specwatch-label", "pool=eval"],
     "--specwatch-server, --specwatch-label select what --specwatch-exporter reports"),
    (["--specwatch", "http://a:8080", "--specwatch-api-key-env", "SPECWATCH_TEST_UNSET_VARIABLE"],
     "environment variable 'SPECWATCH_TEST_UNSET_VARIABLE' (api_key_env) is unset or empty"),
    (["--specwatch", "http://a:8080", "--specwatch-api-key-file", "no-such.key"], "no-such.key"),
])
def test_usage_errors_stop_pytest_before_anything_is_checked(suite: pytest.Pytester, args: list[str], message: str) -> None:
    result = run(suite, *args)
    assert result.ret == USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert message in result.stderr.str(), result.stderr.str()
    assert result.stderr.str().startswith("ERROR: specwatch: ")
    assert not scored(suite)


def test_a_canary_too_short_proves_nothing_where_slots_cannot_be_seen(suite: pytest.Pytester) -> None:
    with FaultServer(FakeLlama.plain(tokens=None, slots_enabled=False)) as server:
        short = run(suite, "--specwatch", server.url, "--specwatch-tokens", "4")
        assert short.ret == EXIT_NOT_REAL and not scored(suite)
        assert "UNPROVEN: speculation cannot be seen" in short.stdout.str()
        assert run(suite, "--specwatch", server.url).ret == 0


def test_only_the_endpoints_asked_for_are_canaried(suite: pytest.Pytester, plain: FaultServer) -> None:
    before = plain.count("/completion"), plain.count("/v1/chat/completions")
    assert run(suite, "--specwatch", plain.url, "--specwatch-endpoint", "chat").ret == 0
    assert (plain.count("/completion"), plain.count("/v1/chat/completions")) == (before[0], before[1] + 1)


def _docs_fixture_example() -> str:
    section = markdown.section(markdown.DOCS / "gating.md", "Gate an eval where it runs")
    (example,) = [b for b in markdown.blocks(section, "python") if "specwatch(" in b and "scope=\"module\"" in b]
    return example


def test_the_docs_fixture_example_fails_a_module_loudly_and_checks_each_server_once(pytester: pytest.Pytester) -> None:
    """docs/gating.md's module fixture, verbatim but for its URLs, in three modules; one of them scores against a draft server."""
    example = _docs_fixture_example()
    assert len([line for line in example.splitlines() if line.strip()]) <= 6, example
    judge_url, candidate_url = re.findall(r'"(http://[^"]+)"', example)
    with FaultServer(FakeLlama.plain(tokens=None)) as judge, FaultServer(FakeLlama.plain(tokens=None)) as candidate, \
            FaultServer(FakeLlama.draft(tokens=None)) as speculating:
        clean = example.replace(judge_url, judge.url).replace(candidate_url, candidate.url)
        mixed = example.replace(judge_url, judge.url).replace(candidate_url, speculating.url)
        pytester.makepyfile(test_clean=clean + "\n\ndef test_a(): pass\n\ndef test_b(): pass\n",
                            test_mixed=mixed + "\n\ndef test_c(): pass\n", test_other=clean + "\n\ndef test_d(): pass\n")
        result = run(pytester, "-rE")
        # One check per server for the whole session: a check canaries /v1/chat/completions twice (chat, chat_stream).
        assert [s.count("/v1/chat/completions") for s in (judge, candidate, speculating)] == [2, 2, 2]
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("errors")) == (3, 1), outcomes
    result.stdout.fnmatch_lines(["*ERROR at setup of test_c*", f"specwatch: {speculating.url} is fill_ins: do not score against it",
                                 "ERROR test_mixed.py::test_c - Failed: specwatch: *"])
    assert "FILL_INS: the server serves fill-in logprobs" in result.stdout.str()


def test_the_fixture_from_an_async_test(pytester: pytest.Pytester, plain: FaultServer, draft: FaultServer) -> None:
    pytester.makepyfile(test_async=f"""
        import pytest

        @pytest.mark.asyncio
        async def test_inside_a_running_loop(specwatch):
            assert specwatch({plain.url!r}).verdict == "clean"

        @pytest.mark.asyncio
        async def test_refused_inside_a_running_loop(specwatch):
            specwatch({draft.url!r})
    """)
    result = run(pytester)
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed")) == (1, 1), result.stdout.str()
    result.stdout.fnmatch_lines([f"specwatch: {draft.url} is fill_ins: do not score against it",
                                 "FAILED test_async.py::test_refused_inside_a_running_loop*"])


def test_the_fixture_refuses_a_call_it_cannot_make(pytester: pytest.Pytester, plain: FaultServer) -> None:
    pytester.makepyfile(test_calls=f"""
        def test_bad_url(specwatch):
            specwatch("http://a:8080/?key=1")

        def test_both(specwatch):
            specwatch({plain.url!r}, exporter="http://e:9824")

        def test_bad_tokens(specwatch):
            specwatch({plain.url!r}, tokens=1)
    """)
    result = run(pytester)
    result.stdout.fnmatch_lines([
        "*_ test_bad_url _*", "specwatch fixture: cannot check http://a:8080/?key=1: *must not carry a query or fragment*",
        "*_ test_both _*", "*TypeError: specwatch fixture: give a server's URL to canary it, or exporter=URL to ask a running specwatch",
        "*_ test_bad_tokens _*", "specwatch fixture: '1' is not a whole number from 4 to 512",
    ])
    assert "During handling" not in result.stdout.str()
    assert result.parseoutcomes().get("failed") == 3


@pytest.mark.real
def test_run_and_check_never_import_the_plugin_or_pytest(tmp_path: Path) -> None:
    """pytest is no runtime dependency: `specwatch run` and `check` work where it cannot be imported, and never load the plugin."""
    config = tmp_path / "specwatch.yml"
    config.write_text("servers:\n  - {name: a, url: 'http://127.0.0.1:9'}\n")
    script = (
        "import sys\n"
        "sys.modules['pytest'] = None  # as where pytest is not installed: importing it fails\n"
        "from specwatch import cli\n"
        f"assert cli.main(['run', '--config', {str(config)!r}, '--check-config']) == 0\n"
        "assert cli.main(['check', 'http://127.0.0.1:9', '--timeout', '1']) == 2\n"
        "assert cli.main(['check', '--exporter', 'http://127.0.0.1:9', '--timeout', '1']) == 2\n"
        "import specwatch.daemon.run, specwatch.gate.check, specwatch.gate.ask\n"
        "print(sorted(m for m in sys.modules if 'pytest' in m))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['pytest']"  # only the None placeholder


def test_the_defaults_with_no_option_given_are_checks_defaults() -> None:
    """The plugin's Defaults has a field for each option of the table, holding check's default (a tuple for a list)."""
    from specwatch.cli import _parser
    from specwatch.gate.options import DEFAULT_TIMEOUT, DEFAULT_TOKENS

    assert Defaults() == defaults_of({})
    assert (Defaults().tokens, Defaults().timeout) == (DEFAULT_TOKENS, DEFAULT_TIMEOUT) == (48, 60.0)
    assert set(Defaults.__dataclass_fields__) == {"urls"} | {o.dest for o in OPTIONS}
    checked = vars(_parser().parse_args(["check", "http://h:1"]))
    for option in OPTIONS:
        as_check = checked[option.dest]
        assert getattr(Defaults(), option.dest) == (tuple(as_check or ()) if option.repeatable else as_check), option.name


def _said(text: str) -> str:
    """Help text as words: argparse and pytest wrap it to the terminal's width."""
    return " ".join(text.split())


def _shown(option: Option, flag: str, joiner: str) -> str:
    """How --help lists an option: its flag, the value it takes, and its help in the front end's words."""
    value = option.metavar or "{" + ",".join(option.choices) + "}"
    spelling = CHECK if flag == option.flag else PLUGIN
    return _said(f"{flag}{'' if option.parse is None else joiner + value} {spelling.say(option.help)}")


def test_every_option_of_the_table_is_a_flag_of_check_and_of_the_plugin(pytester: pytest.Pytester,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """One table, two front ends: each row is in `specwatch check --help` and `pytest --help` (with its ini key), with the
    same value, the same help in each front end's flags and the same grouping (the exporter form's options apart)."""
    from specwatch.cli import main

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    check = _said(capsys.readouterr().out)
    plugin = _said(run(pytester, "--help").stdout.str())
    check_group, plugin_group = check.index(_said(CHECK.say(ASKING))), plugin.index(_said(f"specwatch: {PLUGIN.say(ASKING)}:"))
    # Each points where its own reader finds the load balancer told: not at a README, which may be the user project's.
    assert "see below" in CHECK.say(ASKING) and "see specwatch check --help" in PLUGIN.say(ASKING)
    for option in OPTIONS:
        in_check, in_plugin = check.find(_shown(option, option.flag, " ")), plugin.find(_shown(option, option.plugin_flag, "="))
        assert in_check > 0, (option.name, check)
        assert in_plugin > 0, (option.name, plugin)
        assert (in_check > check_group) == (in_plugin > plugin_group) == (option.mode is Mode.EXPORTER), option.name
        kind = "bool" if option.parse is None else "args" if option.repeatable else "string"
        assert _said(f"{option.ini} ({kind}): {PLUGIN.say(option.help)} (as {option.plugin_flag})") in plugin, option.name
        assert "{" not in PLUGIN.say(option.help) and "--specwatch-" not in CHECK.say(option.help)


# A value for each option of the table, as a command line or an ini gives it (together they break no rule).
SAMPLES = {"api_key_file": "llama.key", "api_key_env": "LLAMA_KEY", "model": "qwen", "load": None, "endpoint": "chat",
           "tokens": "16", "timeout": "1m30s", "exporter": "http://e:9824", "server": "eval-a", "label": "pool=eval",
           "exporter_username": "eval", "exporter_password_file": "pw", "exporter_ca_file": "ca.pem",
           "exporter_cert_file": "cert.pem", "exporter_key_file": "key.pem"}


def test_every_option_given_reaches_the_check_as_check_takes_it() -> None:
    """The same value through `specwatch check --FLAG` and the plugin's option: the check gets the same thing."""
    from specwatch.cli import _parser

    assert set(SAMPLES) == {o.name for o in OPTIONS}
    argv = [arg for o in OPTIONS for arg in (o.flag, SAMPLES[o.name]) if arg is not None]
    checked = vars(_parser().parse_args(["check", *argv]))
    given = {o.ini: True if o.parse is None else [SAMPLES[o.name]] if o.repeatable else SAMPLES[o.name] for o in OPTIONS}
    plugin = defaults_of(given)
    for option in OPTIONS:
        as_check = checked[option.dest]
        assert as_check != option.default, option.name  # the sample is not the default: it must have travelled
        assert getattr(plugin, option.dest) == (tuple(as_check) if option.repeatable else as_check), option.name


def test_every_message_names_the_plugins_flags_in_the_plugin() -> None:
    """Usage problems are worded once; filled in for the plugin, they name no flag of check's."""
    from specwatch.gate import options

    # ASKING is a help group's title, not a problem: the plugin's may send its reader to `specwatch check --help`.
    templates = [v for k, v in vars(options).items() if k.isupper() and k != "ASKING" and isinstance(v, str) and "{" in v]
    assert len(templates) >= 6
    for template in templates:
        said = PLUGIN.say(template, flags="--specwatch-x")
        assert "{" not in said and re.findall(r"--[\w-]+", said), said
        assert all(flag.startswith("--specwatch-") for flag in re.findall(r"(?<![\w-])--[\w-]+", said)), said
        in_check = CHECK.say(template, flags="--x")
        assert all(not flag.startswith("--specwatch") for flag in re.findall(r"(?<![\w-])--[\w-]+", in_check)), in_check


def test_load_reaches_the_plugins_check(suite: pytest.Pytester) -> None:
    """--specwatch-load (or the ini's specwatch_load) asks a router to load --specwatch-model first, as check --load."""
    models = {"plain": FakeLlama.plain(tokens=None), "cold": FakeLlama.plain(tokens=None)}
    with FaultServer(FakeRouter(models=models, status={"plain": "loaded"})) as server:
        unloaded = run(suite, "--specwatch", server.url, "--specwatch-model", "cold")
        assert unloaded.ret == EXIT_UNCHECKED and not scored(suite), unloaded.stdout.str()
        assert server.fake.loads == []
        suite.makeini(f"[pytest]\nspecwatch = {server.url}\nspecwatch_model = cold\nspecwatch_load = true\n")
        loaded = run(suite)
        assert loaded.ret == 0 and scored(suite), loaded.stdout.str()
        assert server.fake.loads == ["cold"]


@pytest.mark.real
def test_a_check_from_the_plugin_imports_neither_the_command_line_nor_the_daemon(pytester: pytest.Pytester,
                                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                                   plain: FaultServer) -> None:
    """The plugin runs `check` and `check --exporter` through the gate alone: no specwatch.cli, no daemon, no web server."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    pytester.makeconftest("""
        import sys

        def pytest_unconfigure(config):
            with open("loaded.txt", "w") as out:
                out.write("\\n".join(sorted(m for m in sys.modules if m.startswith("specwatch"))))
    """)
    pytester.makepyfile(test_eval=PASSING_SUITE)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "--specwatch", plain.url,
                                           "--specwatch-exporter", refused_url(), "--specwatch-timeout", "2s")
    assert result.ret == EXIT_UNCHECKED, result.stdout.str() + result.stderr.str()
    assert f"specwatch: {plain.url}: CLEAN" in result.stdout.str()  # both ways of checking ran
    loaded = (pytester.path / "loaded.txt").read_text().split()
    assert {"specwatch.gate.check", "specwatch.gate.ask"} <= set(loaded), loaded
    assert [m for m in loaded if m == "specwatch.cli" or m.startswith("specwatch.daemon")] == [], loaded


def test_the_base_install_registers_the_plugin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"specwatch": "specwatch.gate.pytest_plugin"}
    assert not any(d.split("[")[0].split(">")[0].split("=")[0].strip() == "pytest" for d in project["dependencies"])


# --- The exporter form: a real `specwatch run` process asked for the verdicts it holds.

PASSWORD = "gate-exporter-secret"


def _web_config(tmp_path: Path) -> tuple[Path, Path]:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  eval: {bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
    password = tmp_path / "exporter.password"
    password.write_text(PASSWORD + "\n")
    return web, password


def _watch(tmp_path: Path, servers: dict[str, tuple[str, str]]) -> Path:
    config = tmp_path / "specwatch.yml"
    lines = ["servers:"] + [f"  - {{name: {name}, url: '{url}', labels: {{pool: {pool}}}}}"
                            for name, (url, pool) in servers.items()]
    config.write_text("\n".join([*lines, "poll_interval: 1s", "canary_interval: 2s", "canary_tokens: 48",
                                 "canary_tokens_speculating: 48", ""]))
    return config


def _verdicts_settled(url: str, names: set[str]) -> bool:
    request = urllib.request.Request(url + "/api/v1/verdicts")
    request.add_header("Authorization", "Basic " + __import__("base64").b64encode(f"eval:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        document = json.load(answer)
    verdicts = {s["server"]: [m["verdict"] for m in s["models"]] for s in document["servers"]}
    fresh = all(m["fresh"] for s in document["servers"] for m in s["models"])
    return fresh and set(verdicts) == names and all(v and "unchecked" not in v for v in verdicts.values())


def _ask_args(exporter: str, password: Path, *selection: str) -> list[str]:
    return ["--specwatch-exporter", exporter, *selection, "--specwatch-exporter-username", "eval",
            "--specwatch-exporter-password-file", str(password)]


@pytest.mark.real
@pytest.mark.slow
def test_asks_a_running_exporter_with_basic_auth(suite: pytest.Pytester, tmp_path: Path, plain: FaultServer,
                                                 draft: FaultServer) -> None:
    web, password = _web_config(tmp_path)
    config = _watch(tmp_path, {"eval-a": (plain.url, "eval"), "eval-b": (draft.url, "eval"), "serve-a": (plain.url, "serve")})
    with ExporterProcess("--config", str(config), "--web-config", str(web)) as exporter:
        url = exporter.wait_started().url()
        wait_until("every verdict", lambda: _verdicts_settled(url, {"eval-a", "eval-b", "serve-a"}), timeout=30, alive=exporter.process)
        pool = run(suite, *_ask_args(url, password, "--specwatch-label", "pool=eval"))
        assert pool.ret == EXIT_NOT_REAL and not scored(suite)
        assert "eval-b: FILL_INS" in pool.stdout.str() and "worst of 2 selected" in pool.stdout.str()
        served = run(suite, *_ask_args(url, password, "--specwatch-label", "pool=serve"))
        assert served.ret == 0 and scored(suite), served.stdout.str()
        served.stdout.fnmatch_lines([f"specwatch: {url} (label=pool=serve): CLEAN: *"])
        assert run(suite, *_ask_args(url, password, "--specwatch-server", "eval-a")).ret == 0
        nothing = run(suite, *_ask_args(url, password, "--specwatch-label", "pool=none"))
        assert nothing.ret == EXIT_UNCHECKED and "nothing the exporter(s) watch matches the selection" in nothing.stdout.str()
        # The fixture asks too, with the command line's credentials as its defaults.
        suite.makepyfile(test_pools=f"""
            def test_serving_pool(specwatch):
                assert specwatch(exporter={url!r}, labels={{"pool": "serve"}}).verdict == "clean"

            def test_eval_pool(specwatch):
                specwatch(exporter={url!r}, labels={{"pool": "eval"}})
        """)
        pools = run(suite, "test_pools.py", "--specwatch-exporter-username", "eval", "--specwatch-exporter-password-file",
                    str(password))
        assert (pools.parseoutcomes().get("passed"), pools.parseoutcomes().get("failed")) == (1, 1), pools.stdout.str()
        pools.stdout.fnmatch_lines([f"specwatch: {url} (label=pool=eval) is fill_ins: do not score against it"])
        password.write_text("wrong\n")
        refused = run(suite, *_ask_args(url, password, "--specwatch-label", "pool=serve"))
        assert refused.ret == EXIT_UNCHECKED and "the exporter refused the credentials: give --specwatch-exporter-username" \
            in refused.stdout.str()
    for result in (pool, served, refused):
        assert PASSWORD not in result.stdout.str() + result.stderr.str()


# --- Real llama-servers: a speculating one refuses the session, a plain one lets it run.


@pytest.fixture(scope="module")
def real_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("plugin") / "cycle.gguf")
    with LlamaServer.of_kind("draft", model) as speculating, LlamaServer.of_kind("plain", model) as plain_server:
        yield {"draft": speculating.url, "plain": plain_server.url}


@pytest.mark.real
def test_real_servers_refused_when_speculating_run_when_plain(suite: pytest.Pytester, real_servers: dict[str, str]) -> None:
    refused = run(suite, "--specwatch", real_servers["draft"])
    assert refused.ret == EXIT_NOT_REAL and not scored(suite)
    assert re.search(r"chat +fill-ins 47/47 after the first .* drafted \d+", refused.stdout.str()), refused.stdout.str()
    ran = run(suite, "--specwatch", real_servers["plain"])
    assert ran.ret == 0 and scored(suite), ran.stdout.str()
    ran.stdout.fnmatch_lines([f"specwatch: {real_servers['plain']}: CLEAN: logprobs are real*", "*1 passed*"])


@pytest.mark.real
def test_real_exporter_watching_real_servers(suite: pytest.Pytester, tmp_path: Path, real_servers: dict[str, str]) -> None:
    web, password = _web_config(tmp_path)
    config = _watch(tmp_path, {"judge": (real_servers["plain"], "judges"), "candidate": (real_servers["draft"], "candidates")})
    with ExporterProcess("--config", str(config), "--web-config", str(web)) as exporter:
        url = exporter.wait_started().url()
        wait_until("every verdict", lambda: _verdicts_settled(url, {"judge", "candidate"}), timeout=60, alive=exporter.process)
        everything = run(suite, *_ask_args(url, password))
        assert everything.ret == EXIT_NOT_REAL and not scored(suite)
        assert "candidate: FILL_INS" in everything.stdout.str()
        judges = run(suite, *_ask_args(url, password, "--specwatch-label", "pool=judges"))
        assert judges.ret == 0 and scored(suite), judges.stdout.str()
