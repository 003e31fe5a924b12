"""Network faults on real llama-servers: the right reason, never a clean verdict, neighbours on time, one line each way, no leaks."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
import structlog

import specwatch.probe.http.client
import specwatch.probe.http.fetch
from specwatch.daemon import logs
from specwatch.daemon.cadence import spacing
from specwatch.daemon.exposition.text import PREPARED_FOR
from specwatch.demo.llamaserver import LlamaServer, server_args
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.favour import Favour, favoured
from tests.support.metrics import Samples, value
from tests.support.net import free_port, stranded_sockets
from tests.support.netfault import (
    DaemonThread,
    Firewall,
    Frozen,
    LogFile,
    Namespace,
    NamespacedLlamaServer,
    ProbeRecord,
    Sampler,
    StreamTap,
    connections,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]

POLL_INTERVAL, POLL_TIMEOUT = 1.0, 0.8
CANARY_INTERVAL, CANARY_TIMEOUT = 2.0, 1.9
TOKENS, TOKENS_SPECULATING = 32, 128
ENDPOINTS = ("completion_stream", "v1_completion_stream", "chat_stream")
"""Streaming endpoints only: whichever canary runs when a fault strikes mid-stream is a stream."""
HOLD = 5.0
"""How long a fault lasts: five polls, and long enough for a dead link's neighbour entry to fail (about 3 s)."""
CADENCE_SLACK = 1.5
"""A neighbour's polls and canaries come at most this many of their intervals apart, fault or not."""
CADENCE_WINDOW = 3 * 2 * CANARY_INTERVAL + 0.5
"""Cadence is measured over at least this long from the count before the fault: whatever their phase, the most
spaced-out servers (a canary every 2 canary_intervals, up to a second long) complete two canaries in it."""
RECOVERY = POLL_INTERVAL + POLL_TIMEOUT
"""A server answers again: its next poll, at most one interval away, succeeds within the timeout."""
NAME_PREFIX = "specwatch-netfault-"
NAME = f"{NAME_PREFIX}{os.getpid()}"
CHAIN_PREFIX = "SPECWATCH-NETFAULT-"
CHAIN = f"{CHAIN_PREFIX}{os.getpid()}"
LOOPBACK = "-s 127.0.0.1/32 -d 127.0.0.1/32"

# name -> (kind, slow model, in the namespace); plain servers read clean, draft ones fill_ins.
SERVERS = {
    "plain": ("plain", False, False),
    "draft": ("draft", False, False),
    "hole": ("draft", False, False),
    "stream": ("draft", True, False),
    "linked": ("plain", False, True),
}
EXPECTED = {"plain": "clean", "draft": "fill_ins"}
KEPT = {"specwatch_verdict", "specwatch_up", "specwatch_poll_failures_total", "specwatch_canary_failures_total"}


@dataclass
class Rig:
    servers: dict[str, LlamaServer]
    daemon: DaemonThread
    sampler: Sampler
    log: LogFile
    firewall: Firewall
    namespace: Namespace
    tap: StreamTap
    record: ProbeRecord
    favour: Favour

    def kind(self, name: str) -> str:
        return SERVERS[name][0]

    def state(self, name: str) -> Any:
        assert self.daemon.daemon is not None
        return self.daemon.daemon.fleet.get(name)

    def peers(self) -> dict[str, tuple[str, int]]:
        return {name: (server.host, server.port) for name, server in self.servers.items()}

    def latest(self) -> Samples:
        """The exposition as it stands now: a scrape may serve a body prepared up to PREPARED_FOR seconds earlier."""
        since = time.time() + PREPARED_FOR
        deadline = time.monotonic() + PREPARED_FOR + 5
        while not self.sampler.scrapes or self.sampler.scrapes[-1].at < since:
            assert time.monotonic() < deadline, f"no scrape: {self.sampler.errors[-3:]}"
            time.sleep(0.02)
        return self.sampler.scrapes[-1].samples


def verdict_of(samples: Samples, name: str) -> str | None:
    found = [v for v in ("clean", "fill_ins", "unproven", "unchecked") if value(samples, "specwatch_verdict", server=name,
                                                                              verdict=v) == 1]
    return found[0] if len(found) == 1 else None


def healthy(rig: Rig, name: str) -> bool:
    state = rig.state(name)
    model = state.model() if state is not None else None
    if state is None or not state.poll_success or model is None:
        return False
    canaries = [model.canaries.get(e) for e in model.endpoints]
    return (model.decision.verdict.value == EXPECTED[rig.kind(name)] and all(c is not None and c.success for c in canaries)
            and not any(key[1] == name for key in list(rig.daemon.daemon.watcher._streaks)))  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("netfaults")
    tiny = write_cycle_model(work / "cycle.gguf")
    # Slower per token (a wider, deeper network): a 128-token stream lasts about 0.4 s, long enough to strike in.
    slow = write_cycle_model(work / "cycle-slow.gguf", n_layer=2, n_ff=2048)
    saved_logging, saved_gc = structlog.get_config(), gc.get_threshold()
    log = LogFile(work / "specwatch.log")
    Firewall.sweep(CHAIN_PREFIX)
    Namespace.sweep(NAME_PREFIX)
    # The rig's servers and exporter go first for a CPU: its bounds are about cadence and timeouts, which a machine
    # busy with other work (the suite's other workers) would otherwise stretch, a healthy 0.4 s stream past 1.9 s.
    with favoured() as favour, Firewall(CHAIN) as firewall, Namespace(NAME) as namespace, pytest.MonkeyPatch.context() as patch:
        servers: dict[str, LlamaServer] = {}
        tap, record = StreamTap(), ProbeRecord()
        tap.install(patch)
        record.install(patch)
        daemon = sampler = None
        try:
            for name, (kind, is_slow, inside) in SERVERS.items():
                model = slow if is_slow else tiny
                if inside:
                    servers[name] = NamespacedLlamaServer(namespace, model, server_args(kind, model), log_dir=work)
                else:
                    servers[name] = LlamaServer.of_kind(kind, model, log_dir=work)
                servers[name].start()
            config = work / "specwatch.yml"
            lines = ["servers:", *(f"  - {{name: {name}, url: '{s.url}'}}" for name, s in servers.items())]
            lines += [f"poll_interval: {POLL_INTERVAL}s", f"poll_timeout: {POLL_TIMEOUT}s",
                      f"canary_interval: {CANARY_INTERVAL}s", f"canary_timeout: {CANARY_TIMEOUT}s",
                      f"canary_tokens: {TOKENS}", f"canary_tokens_speculating: {TOKENS_SPECULATING}",
                      f"canary_endpoints: [{', '.join(ENDPOINTS)}]"]
            config.write_text("\n".join(lines) + "\n")
            logs.configure("info", json=True, stream=log.stream)
            daemon = DaemonThread(config, free_port()).start()
            sampler = Sampler(daemon.url, keep=KEPT.__contains__).start()
            built = Rig(servers, daemon, sampler, log, firewall, namespace, tap, record, favour)
            wait_until("every server watched, canaried and healthy", lambda: all(healthy(built, n) for n in servers), timeout=60, interval=0.1)
            yield built
        finally:
            if sampler is not None:
                sampler.stop()
            try:
                if daemon is not None:
                    daemon.stop()
            finally:
                for server in servers.values():
                    server.stop()
                structlog.configure(**saved_logging)
                gc.unfreeze()
                gc.set_threshold(*saved_gc)
                log.close()


@dataclass
class Holdings:
    """What the exporter holds at a quiet moment: no probe in flight."""

    tasks: list[str]
    """What each task still running awaits (its coroutine's name): a leaked one names itself."""
    threads: list[str]
    sockets: dict[str, list[str]]
    stranded: int
    left_after_close: dict[str, int]
    busy: str
    """What still ran once the schedule had been paused long enough for every probe to end: nothing, or a leak."""

    def report(self) -> str:
        return (f"tasks {len(self.tasks)}, threads {len(self.threads)}, "
                f"sockets {sum(map(len, self.sockets.values()))} ({ {n: len(s) for n, s in self.sockets.items()} }), "
                f"CLOSE_WAIT {self.stranded}, left once idle connections expire {sum(self.left_after_close.values())}")


def held(rig: Rig) -> Holdings:
    """Pause the schedule, let every probe end, count, wait for the idle connections to expire, count again."""
    daemon = rig.daemon.daemon
    assert daemon is not None
    peers = rig.peers()
    names = {peer: name for name, peer in peers.items()}

    async def quiet() -> tuple[list[str], str]:
        daemon.schedule.pause()
        watcher = daemon.watcher

        def busy() -> str:
            # Ticks count too: one between its poll and its rounds (asking /v1/models, say) claims no probe. So does a
            # job the scheduler fired before the pause and has not finished: its task is still counted after.
            probes, rounds, ticks = len(watcher._in_flight), len(watcher._rounds), len(watcher._tasks)
            jobs = sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "run_coroutine_job")
            if probes or rounds or ticks or jobs:
                return f"probes in flight {probes}, canary rounds {rounds}, ticks {ticks}, scheduler jobs {jobs}"
            return ""

        # A job the scheduler fired just before the pause may not have claimed its probe yet: quiet twice in a row.
        # Every exchange ends by its deadline (Fetcher._exchange), so one still going well after that has leaked.
        deadline = asyncio.get_running_loop().time() + 2 * CANARY_TIMEOUT + 2
        while True:
            await asyncio.sleep(0.1)
            if not busy():
                await asyncio.sleep(0.1)
                if not busy():
                    break
            if asyncio.get_running_loop().time() > deadline:
                break
        me = asyncio.current_task()
        tasks = sorted(getattr(t.get_coro(), "__qualname__", repr(t)) for t in asyncio.all_tasks() if t is not me)
        return tasks, busy()

    def expired() -> bool:
        return not any(connections(set(peers.values())).values())

    async def resume() -> None:
        daemon.schedule.resume()

    with rig.sampler.paused():
        try:
            tasks, busy = rig.daemon.call(quiet)
            wait_until("the scrapes' request threads to end", lambda: not any("process_request" in t.name
                                                                         for t in threading.enumerate()), timeout=5)
            threads = sorted(t.name for t in threading.enumerate())
            sockets = {names[peer]: states for peer, states in connections(set(peers.values())).items()}
            stranded = stranded_sockets({port for _, port in peers.values()})
            # The client gives an idle connection up after KEEPALIVE_SECONDS (aiohttp looks that often), llama-server
            # after 5 s: one still open long after is held by a probe that never ended, or by nobody.
            with contextlib.suppress(AssertionError):
                wait_until("the idle connections to expire", expired, timeout=3 * specwatch.probe.http.client.KEEPALIVE_SECONDS,
                           interval=0.1)
            left = {names[peer]: len(states) for peer, states in connections(set(peers.values())).items()}
        finally:
            rig.daemon.call(resume)
    return Holdings(tasks, threads, sockets, stranded, left, busy)


@dataclass
class Run:
    """One fault, start to end: times, what the exporter logged, the scrapes taken meanwhile."""

    target: str
    started: float
    counted: float = 0.0
    """When the count before the fault resumed the schedule: cadence is measured from here."""
    struck: float = 0.0
    lifted: float = 0.0
    recovered: float = 0.0
    settled: float = 0.0
    measured: float = 0.0
    """The end of the neighbours' cadence window."""
    before: Samples = field(default_factory=dict)
    after: Samples = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    held_before: Holdings | None = None
    held_after: Holdings | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def strike(rig: Rig, target: str, inject: Callable[[], None], lift: Callable[[], None], *,
           trigger: Callable[[], None] | None = None) -> Run:
    """Settle, count, inject (once `trigger` returns, if given), hold HOLD, lift, wait for recovery, count again."""
    wait_until("every server healthy before the fault", lambda: all(healthy(rig, n) for n in rig.servers), timeout=30, interval=0.05)
    run = Run(target, time.time())
    run.held_before = held(rig)
    run.counted = time.time()
    wait_until("every server healthy after the count", lambda: all(healthy(rig, n) for n in rig.servers), timeout=30, interval=0.05)
    run.before = rig.latest()
    logged = len(rig.log.events())
    run.started = time.time()
    try:
        if trigger is not None:
            trigger()
        inject()
        run.struck = time.time()
        run.figures["rules"] = rig.firewall.rules()
        wait_until(f"{target}'s poll to fail", lambda: rig.state(target).poll_success is False, timeout=HOLD)
        time.sleep(max(0.0, run.struck + HOLD - time.time()))
    finally:
        lift()
        run.lifted = time.time()
    assert not rig.firewall.rules()

    def answered() -> float | None:
        at = rig.state(target).last_poll_success_timestamp
        return at if at is not None and at > run.lifted and rig.state(target).poll_success else None

    run.recovered = wait_until(f"{target} to answer a poll again", answered, timeout=10)
    wait_until(f"{target} canaried on every endpoint again", lambda: healthy(rig, target), timeout=20)
    run.settled = time.time()
    run.measured = max(run.settled + 0.3, run.counted + CADENCE_WINDOW)  # the scrapes and log lines of the last canary
    time.sleep(max(0.0, run.measured - time.time()))
    run.after = rig.latest()
    run.events = rig.log.events()[logged:]
    run.held_after = held(rig)
    return run


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def lines(run: Run, server: str, *events: str) -> list[dict[str, Any]]:
    return [e for e in run.events if e.get("server") == server and e["event"] in events and e["level"] != "debug"]


def counted(before: Samples, after: Samples, name: str, **labels: str) -> dict[str, float]:
    """Increases of a failure counter by reason between two scrapes."""
    grown: dict[str, float] = {}
    for (sample, found), now in after.items():
        have = dict(found)
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            was = before.get((sample, found), 0.0)
            if now > was:
                key = have["reason"] if "endpoint" not in have or "endpoint" in labels else f"{have['endpoint']}:{have['reason']}"
                grown[key] = grown.get(key, 0.0) + now - was
    return grown


def success_times(rig: Rig, server: str, start: float, end: float, *, canary: bool) -> list[float]:
    """When the successful polls of `server` ended, or its successful canaries (on any endpoint) began, in the window."""
    return [p.started if canary else p.ended for p in rig.record.successes(server, start, end, canary=canary)]


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


class Problems(list[str]):
    def expect(self, ok: object, what: str) -> None:
        if not ok:
            self.append(what)


def check(rig: Rig, run: Run, *, poll_reasons: set[str], canary_reasons: set[str], first: set[str]) -> None:
    """Everything every fault must show, all of it checked before failing; the figures are printed for the docs."""
    target, kind = run.target, rig.kind(run.target)
    problems = Problems()

    # The right reasons, counted where they belong.
    polls = counted(run.before, run.after, "specwatch_poll_failures_total", server=target)
    canaries = counted(run.before, run.after, "specwatch_canary_failures_total", server=target)
    problems.expect(polls and set(polls) <= poll_reasons, f"poll failures {polls}, expected only {poll_reasons}")
    problems.expect({key.split(":")[1] for key in canaries} <= canary_reasons,
                    f"canary failures {canaries}, expected only {canary_reasons}")
    run.figures.update(poll_failures=polls, canary_failures=canaries)

    # Never clean while the fault lasts or the server recovers; unchecked whenever its poll fails.
    window = rig.sampler.between(run.started, run.settled)
    problems.expect(len(window) >= (run.settled - run.started) / (rig.sampler.every * 4), f"{len(window)} scrapes only")
    seen = [(round(s.at - run.struck, 2), verdict_of(s.samples, target), value(s.samples, "specwatch_up", server=target))
            for s in window]
    down = [v for _, v, up in seen if up == 0]
    problems.expect(down and set(down) == {"unchecked"}, f"verdicts while down: {sorted(set(down))}")
    # Every verdict the state passed through, probe by probe: a clean one between two scrapes would show here.
    passed = [(p.endpoint or "poll", p.ok, p.verdict) for p in rig.record.between(target, run.started, run.settled)]
    if kind == "draft":
        problems.expect("clean" not in {v for _, v, _ in seen}, f"a draft server read clean: {seen}")
        problems.expect("clean" not in {v for _, _, v in passed}, f"a draft server's state turned clean: {passed}")
    else:
        problems.expect(all(v != "clean" or up == 1 for _, v, up in seen), f"clean while down: {seen}")
        problems.expect(all(v != "clean" or ok or endpoint != "poll" for endpoint, ok, v in passed),
                        f"clean after a failed poll: {passed}")
    problems.expect(verdict_of(run.after, target) == EXPECTED[kind], f"verdict after: {verdict_of(run.after, target)}")
    run.figures["verdicts"] = sorted({v for _, v, _ in seen if v} | {v for _, _, v in passed if v})
    spread = max(gaps([s.at for s in window]), default=0.0)
    problems.expect(spread <= POLL_INTERVAL, f"the scrapes stalled for {spread:.2f}s")
    run.figures["scrapes"] = f"{len(window)}, at most {spread:.2f}s apart"

    # The neighbours keep their cadence, measured from the end of the count before the fault to after the recovery.
    cadence = {}
    for name in rig.servers:
        if name == target:
            continue
        model = rig.state(name).model()
        every = spacing(model, interval=CANARY_INTERVAL, tokens=TOKENS, tokens_speculating=TOKENS_SPECULATING)
        poll_gaps = gaps(success_times(rig, name, run.counted, run.measured, canary=False))
        canary_gaps = gaps(success_times(rig, name, run.counted, run.measured, canary=True))
        problems.expect(poll_gaps and max(poll_gaps) <= CADENCE_SLACK * POLL_INTERVAL, f"{name} poll gaps {poll_gaps}")
        problems.expect(canary_gaps and max(canary_gaps) <= CADENCE_SLACK * every,
                        f"{name} canary gaps {canary_gaps} (spacing {every:g}s)")
        longest = max((p.ended - p.started for p in rig.record.between(name, run.counted, run.measured) if p.endpoint),
                      default=None)
        cadence[name] = (max(poll_gaps, default=None), max(canary_gaps, default=None), every,
                         round(longest, 2) if longest is not None else None)
        noise = lines(run, name, "poll_failed", "canary_failed", "poll_skipped", "canary_skipped")
        problems.expect(not noise, f"{name} logged {noise}")
    run.figures["neighbours (max poll gap, max canary gap, canary spacing, longest canary)"] = cadence

    # One line when the trouble starts, one when it ends, per failing thing (the poll, each endpoint).
    failed = lines(run, target, "poll_failed")
    recovered = lines(run, target, "poll_recovered")
    run.figures["log lines"] = [(e["event"], e.get("reason") or e.get("last_reason"), e.get("endpoint", ""))
                                for e in run.events if e.get("server") == target and e["event"].startswith(("poll_", "canary_"))
                                and e["level"] != "debug"]
    problems.expect(failed and failed[0]["reason"] in first, f"first poll_failed {failed[:1]}, expected one of {first}")
    problems.expect(len(failed) == len({e["reason"] for e in failed}) <= len(poll_reasons), f"poll_failed lines {failed}")
    problems.expect(len(recovered) == 1 and _at(recovered[0]) >= run.lifted - 0.05, f"poll_recovered lines {recovered}")
    problems.expect(not lines(run, target, "poll_skipped", "canary_skipped"), "skipped probes")
    for endpoint in ENDPOINTS:
        bad = [e for e in lines(run, target, "canary_failed") if e["endpoint"] == endpoint]
        back = [e for e in lines(run, target, "canary_recovered") if e["endpoint"] == endpoint]
        problems.expect(len(bad) == len(back) <= 1, f"{endpoint}: canary_failed {bad}, canary_recovered {back}")

    # No probe outlives its deadline, however the server fails.
    late = [(p.endpoint or "poll", round(p.ended - p.started, 3)) for p in rig.record.between(target, run.started, run.settled)
            if p.ended - p.started > (CANARY_TIMEOUT if p.endpoint else POLL_TIMEOUT) + 0.1]
    problems.expect(not late, f"probes past their deadline: {late}")
    failing = [p for p in rig.record.between(target, run.started, run.settled) if not p.ok]
    run.figures["longest failed probe"] = max(((p.endpoint or "poll", round(p.ended - p.started, 2)) for p in failing),
                                              key=lambda pair: pair[1], default=None)

    # Back within one poll after the fault lifts.
    took = run.recovered - run.lifted
    problems.expect(took <= RECOVERY, f"answered {took:.2f}s after the fault lifted")
    run.figures.update(recovered_after=round(took, 2), canaried_again_after=round(run.settled - run.lifted, 2))

    # Nothing leaked: the same tasks and threads, no socket left once the idle connections expire.
    before, after = run.held_before, run.held_after
    assert before is not None and after is not None
    problems.expect(not before.busy and not after.busy, f"never quiet: {before.busy!r} -> {after.busy!r}")
    problems.expect(after.tasks == before.tasks and after.threads == before.threads, f"tasks/threads {before} -> {after}")
    problems.expect(before.stranded == after.stranded == 0, f"CLOSE_WAIT {before.stranded} -> {after.stranded}")
    problems.expect(sum(after.left_after_close.values()) == sum(before.left_after_close.values()) == 0,
                    f"sockets left once idle connections expired {before.left_after_close} -> {after.left_after_close}")
    problems.expect(all(len(s) <= specwatch.probe.http.client.CONNECTIONS_PER_SERVER for s in after.sockets.values()),
                    f"sockets {after.sockets}")
    run.figures.update(held_before=before.report(), held_after=after.report(), machine=rig.favour.report())
    print(f"\n{target}: " + "; ".join(f"{k}: {v}" for k, v in run.figures.items()))
    assert not problems, "\n".join(problems)


def test_blackhole(rig: Rig) -> None:
    port = rig.servers["hole"].port
    run = strike(rig, "hole", lambda: rig.firewall.blackhole(port), rig.firewall.clear)
    assert run.figures["rules"] == [f"-A {CHAIN} {LOOPBACK} -p tcp -m tcp --dport {port} -j DROP",
                                    f"-A {CHAIN} {LOOPBACK} -p tcp -m tcp --sport {port} -j DROP"]
    check(rig, run, poll_reasons={"timeout"}, canary_reasons={"timeout"}, first={"timeout"})


def strike_mid_stream(rig: Rig, inject: Callable[[], None], lift: Callable[[], None], *, attempts: int = 3) -> Run:
    """strike() the stream server once its next canary has read 10 lines; again if that canary still got its whole answer.

    The server sends its 128 tokens in about 0.4 s, and what the fetcher has read lags what arrived: on a busy machine
    the whole answer may be in before the fault lands, and the canary rightly succeeds. Such a strike tests nothing;
    nor does one on a server whose probe failed while the strike waited for a stream (on a starved machine, a healthy
    stream once took longer than the canary's timeout): the failures counted would not all be the fault's.
    """
    port = rig.servers["stream"].port
    struck: list[int] = []
    missed: list[str] = []
    for _ in range(attempts):
        run = strike(rig, "stream", inject, lift,
                     trigger=lambda: struck.append(rig.tap.next_stream(port, 10, 3 * CANARY_INTERVAL * 2)))
        early = [(p.endpoint or "poll", round(p.ended - p.started, 2))
                 for p in rig.record.between("stream", run.started, run.struck) if not p.ok]
        if not early and rig.tap.cut(port, struck[-1]):
            return run
        missed.append(f"failed before the fault: {early}" if early else "whole answer before the fault")
    raise AssertionError(f"in {attempts} strikes the canary under way was never cut by the fault: {missed}")


def test_reset_mid_stream(rig: Rig) -> None:
    server = rig.servers["stream"]
    run = strike_mid_stream(rig, lambda: rig.firewall.reset(server.port), rig.firewall.clear)
    assert run.figures["rules"] == [f"-A {CHAIN} {LOOPBACK} -p tcp -m tcp --dport {server.port} -j REJECT --reject-with tcp-reset"]
    # The stream in flight was reset; new connections were refused while the rule stood (a poll caught mid-answer by
    # the rule would be reset too, in the few milliseconds one takes).
    check(rig, run, poll_reasons={"connection_refused", "connection_reset"}, canary_reasons={"connection_reset"},
          first={"connection_refused", "connection_reset"})
    assert "connection_refused" in run.figures["poll_failures"], run.figures
    assert any(key.endswith(":connection_reset") for key in run.figures["canary_failures"]), run.figures


def test_link_down(rig: Rig) -> None:
    run = strike(rig, "linked", lambda: rig.namespace.link(False), lambda: rig.namespace.link(True))
    # Packets vanish into the dead link (timeout); once the neighbour entry has failed the kernel says no route.
    check(rig, run, poll_reasons={"timeout", "unreachable"}, canary_reasons={"timeout", "unreachable"}, first={"timeout"})


def test_sigstop_mid_stream(rig: Rig) -> None:
    server = rig.servers["stream"]
    with Frozen(server) as frozen:
        run = strike_mid_stream(rig, frozen.stop, frozen.resume)
    check(rig, run, poll_reasons={"timeout"}, canary_reasons={"timeout"}, first={"timeout"})
    assert any(key.endswith(":timeout") for key in run.figures["canary_failures"]), run.figures
