"""Shared fixtures (fake fleets on loopback, a clock the test moves, logging put back) and the suite's workers."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import Callable, Iterator

import pytest
import structlog

from specwatch import loop
from specwatch.core.state import Fleet
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.client import Client
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support import fakes as fake_fleets
from tests.support import llamabuild, net
from tests.support.wire import FakeLlama

# Most real tests wait on what they started (servers, daemons, intervals going by), not on a CPU: three per CPU halve
# the suite against one. A test that times real work holds on a starved worker: it asserts an order or a count, or
# its rig goes first for a CPU (tests/support/favour.favoured); speed itself is measured by bench/, not by tests.
WORKERS_PER_CPU = 3


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test on the loop `specwatch run` makes (specwatch.loop): uvloop's where it is installed."""
    return {"specwatch": loop.factory()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_watcher(clock: FakeClock):
    """Builds watchers over fake fleets served on loopback; closes every client it opened once the test is done."""
    clients: list[Client] = []

    def build(fakes: dict[str, FakeLlama], **settings_kw: object) -> Watcher:
        servers = settings_kw.pop("servers", None) or [{"name": host, "url": f"http://{host}:8080"} for host in fakes]
        settings = Settings(servers=servers, **settings_kw)
        client = fake_fleets.fake_fleet(fakes).client()
        clients.append(client)
        return Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, settings.max_response_bytes), clock=clock)

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture(autouse=True)
def _fake_fleets_stopped():
    """Every look-alike a test served on loopback stops with the test."""
    yield
    fake_fleets.stop_all()


@pytest.fixture
def restored_logging():
    """logs.configure() sets process-wide state: put it back, so later tests see logging as they expect it."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def fixed_llama_binary(pytestconfig) -> pathlib.Path:
    """The patched llama-server: build 11434, or with upstream PRs' behaviours switched on (llamabuild.build_env)."""
    return llamabuild.session_binary(pytestconfig)


@pytest.fixture(scope="module")
def recipe_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """What docs/gating.md's recipes gate: a llama-server drafting with draft-simple, and a plain one."""
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("recipes") / "cycle.gguf")
    with LlamaServer.of_kind("draft", model) as draft, LlamaServer.of_kind("plain", model) as plain:
        yield {"draft": draft.url, "plain": plain.url}


@pytest.fixture(scope="session")
def installed_specwatch(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    """This checkout installed from its wheel (its code and its pytest11 entry point), and a `specwatch` command for it:
    once per run, whichever worker asks first (the workers' temporary directories share a parent)."""
    from tests.support import recipes

    base = tmp_path_factory.getbasetemp()
    return recipes.shared_specwatch((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared")


@pytest.fixture(autouse=True)
def _a_process_makes_a_test_real(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick suite (-m "not real and not slow") starts no process: a test that does is marked `real`."""
    if request.node.get_closest_marker("real") is not None:
        return
    import subprocess

    def refuse(self: subprocess.Popen, args: object, *rest: object, **kw: object) -> None:
        raise AssertionError(f"this test starts a process ({args!r}): mark it @pytest.mark.real")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def pytest_configure(config: pytest.Config) -> None:
    """Servers made before they start (LlamaServer) take their port from this worker's range, as every test's do."""
    # bind(0) may hand a port another worker has chosen for a server it has not started yet: that worker's server then
    # fails to bind, or a test watches another worker's server.
    import specwatch.demo.llamaserver

    specwatch.demo.llamaserver.free_port = net.free_port


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers `-n auto`, the suite's default, starts: WORKERS_PER_CPU per CPU."""
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


LONGEST = ("test_image.py", "test_recipe_promptfoo.py", "test_peers_gemma.py", "test_check.py", "test_recipe_deepeval.py",
           "test_recipe_inspect_ai.py")
"""The files that took longest on a fresh machine (bench/README.md), longest first: one each to start every worker."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST first, then files with a slow test, then files with a real one: the long files start first instead of
    ending last."""
    # Each file goes to one worker whole, in this order (--dist loadfile --no-loadscope-reorder); each worker is given
    # two files at the start, so the first files should be the longest: a long file given second waits behind the
    # first, and ends the run alone (a cold run's last quarter left a third of the CPUs idle).
    group: dict[pathlib.Path, tuple[int, int]] = {}
    for item in items:
        rank = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("real") else 2
        first = LONGEST.index(item.path.name) if item.path.name in LONGEST else len(LONGEST)
        group[item.path] = min(group.get(item.path, (first, 2)), (first, rank))
    items.sort(key=lambda item: group[item.path])
