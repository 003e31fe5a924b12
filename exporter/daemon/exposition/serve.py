"""What /metrics answers each scraper: the format and encoding it accepts, from text prepared in the background."""

from __future__ import annotations

import gzip
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import structlog
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder

from ...core.state import Fleet
from .registry import SpecwatchCollector
from .samples import ExporterStatus
from .text import Parts, TextRenderer

GZIP_LEVEL = 1
"""Text metrics shrink about fifteenfold even at the fastest level, which keeps a large fleet's scrape cheap."""
TEXT_FORMAT = CONTENT_TYPE_PLAIN_0_0_4
PREPARE_SECONDS = 1.0

log = structlog.get_logger("specwatch")


def _weights(header: str | None) -> dict[str, float]:
    """An Accept or Accept-Encoding header as {token: q-value}; a q that is not a number refuses its token."""
    weights: dict[str, float] = {}
    for part in (header or "").split(","):
        token, *params = (p.strip() for p in part.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if token:
            weights[token.lower()] = weight
    return weights


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header allows gzip (q-values honoured: 'gzip;q=0' refuses it)."""
    weights = _weights(header)
    return weights.get("gzip", weights.get("*", 0.0)) > 0


def accepts_text_format(header: str | None) -> bool:
    """Whether a scraper's Accept header allows the classic text format (no header at all does).

    Prometheus lists OpenMetrics first and the text format after it at a lower q. The text format is what the
    renderer keeps ready; OpenMetrics is rendered from every family afresh (1.5 s at 1,000 servers), so it goes only
    to a scraper that accepts nothing else, as Go exporters serve the text format unless told otherwise.
    """
    if not header:
        return True
    weights = _weights(header)
    return max(weights.get("text/plain", 0.0), weights.get("text/*", 0.0), weights.get("*/*", 0.0)) > 0


@dataclass(frozen=True)
class Scrape:
    """One /metrics answer."""

    body: bytes
    content_type: str
    gzipped: bool


class _GzipPrefix:
    """The parts of a text compressed once; member(rest) is one gzip member of the text + rest, what gzip.compress()
    would decompress to.

    One member, not two concatenated: many clients (httpx, urllib3) stop reading after the first. The compressor's
    state after the parts is copied for each scrape, so only the small rest is compressed again.
    """

    _HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"  # deflate, no name, mtime 0, fastest, unknown OS

    def __init__(self, generation: int, parts: Parts) -> None:
        self.generation = generation
        """The renderer's generation of `parts`; the parts themselves are not kept (8 MB at 1,000 servers)."""
        self._compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        compressed, self._length, self._crc = [self._HEADER], 0, 0
        for part in parts:  # one stream over all of them: the same bytes as compressing them joined
            compressed.append(self._compressor.compress(part))
            self._length += len(part)
            self._crc = zlib.crc32(part, self._crc)
        self._prefix = b"".join(compressed)

    def member(self, rest: bytes) -> bytes:
        compressor = self._compressor.copy()
        tail = compressor.compress(rest) + compressor.flush()
        trailer = struct.pack("<II", zlib.crc32(rest, self._crc), (self._length + len(rest)) & 0xFFFFFFFF)
        return b"".join((self._prefix, tail, trailer))


class _Scrapes:
    """When gzipped scrapes came, and so when the next ones are due: each scraper comes every scrape_interval.

    The fleet's text changes every second at fleet scale, so each scrape compressed it anew (10 to 20 ms of CPU at
    1,000 servers, and more in wall time while the probes held the interpreter). The preparation just before a scrape
    is due compresses it instead, off the scrape's path; a scrape that comes unforeseen compresses it itself.
    """

    KEEP = 16
    TOLERANCE = 0.3
    """Seconds a scrape may come early or late against its interval: Prometheus keeps to it within milliseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: list[float] = []
        self._period: float | None = None

    def seen(self, at: float) -> None:
        with self._lock:
            self._times = [*self._times[-(self.KEEP - 1) :], at]
            self._period = _period(self._times, self.TOLERANCE)

    def due(self, now: float, within: float) -> bool:
        """Whether a scrape is expected from now to `within` seconds on (or is a little late and has not come yet)."""
        times, period = self._times, self._period
        if period is None:
            return False
        for at in times:
            expected = at + period
            if -self.TOLERANCE <= expected - now <= within and not any(abs(t - expected) <= self.TOLERANCE for t in times):
                return True
        return False


def _period(times: list[float], tolerance: float) -> float | None:
    """The scrape interval: the gap after which most scrapes were followed by another (one scraper, or an HA pair
    of them with the same interval at other phases); None until a gap came twice."""
    best, count = None, 1
    for gap in sorted({round(b - a, 1) for i, a in enumerate(times) for b in times[i + 1 :] if b - a >= 1.0}):
        followed = sum(1 for i, a in enumerate(times) if any(abs(b - a - gap) <= tolerance for b in times[i + 1 :]))
        if followed > count:
            best, count = gap, followed
    return best


class _Delegate:
    """Puts one registry's metrics into another, so OpenMetrics scrapes see everything."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        return self._registry.collect()


class _Failures:
    """Renders of /metrics that failed: each counted and logged, though the background's same error only once in a row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self._repeating: str | None = None
        """The error the background preparation last logged, while it keeps failing with it (every second)."""

    def failed(self, err: Exception, during: str) -> None:
        error = f"{err.__class__.__name__}: {str(err)[:200]}"
        with self._lock:
            self.count += 1
            count = self.count
            again = during == "prepare" and error == self._repeating
            if during == "prepare":
                self._repeating = error
        if not again:
            log.error("metrics_render_failed", during=during, error=error, exposition_errors_total=count)

    def prepared(self) -> None:
        self._repeating = None


class Exposition:
    """What /metrics serves: specwatch's families and the process' own, in the format the scraper asks for."""

    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        failures = self._failures = _Failures()

        def counted() -> ExporterStatus:
            return replace(status(), exposition_errors=failures.count)

        # Each render's status carries the failures so far: they are exported as the rest of the exporter's own state.
        self.renderer = TextRenderer(fleet, counted)
        self.collector = SpecwatchCollector(fleet, counted)
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.registry.register(_Delegate(self._process))
        self._preparing: threading.Thread | None = None
        self._starting = threading.Lock()
        self._gzipped: _GzipPrefix | None = None
        """The fleet's text compressed: the scrapes of one preparation compress it once."""
        self._scrapes = _Scrapes()

    def scrape(self, accept: str | None = None, accept_encoding: str | None = None) -> Scrape:
        """The answer to a scrape with these Accept and Accept-Encoding headers; a failure is counted, logged and raised."""
        self._prepare_in_background()
        try:
            return self._scrape(accept, accept_encoding)
        except Exception as err:
            self._failures.failed(err, "scrape")
            raise

    def _scrape(self, accept: str | None, accept_encoding: str | None) -> Scrape:
        gzipped = accepts_gzip(accept_encoding)
        if not accepts_text_format(accept):
            encoder, content_type = choose_encoder(accept or "")
            body = encoder(self.registry)
            return Scrape(gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0) if gzipped else body, content_type, gzipped)
        generation, parts = self.renderer.versioned()
        process = generate_latest(self._process)
        if not gzipped:
            return Scrape(b"".join((*parts, process)), TEXT_FORMAT, False)
        self._scrapes.seen(time.monotonic())
        cached = self._gzipped
        if cached is None or cached.generation != generation:
            cached = self._gzipped = _GzipPrefix(generation, parts)
        return Scrape(cached.member(process), TEXT_FORMAT, True)

    def _prepare_in_background(self) -> None:
        """From the first scrape on, what changed is rendered every PREPARE_SECONDS in a thread of its own.

        A poll changes a server's lines at every poll_interval; rendering them at the scrape made a scrape of 1,000
        servers take 20 ms of CPU (40 ms while the probes held the interpreter half the time). Rendered as they
        change (2% of the daemon's CPU at 1,000 servers), a scrape only joins what is ready. Nothing runs before
        the first scrape.
        """
        if self._preparing is not None:
            return
        with self._starting:  # two first scrapes at once start one thread
            if self._preparing is None:
                self._preparing = threading.Thread(
                    target=_prepare_forever, args=(weakref.ref(self), self._failures), name="specwatch-metrics",
                    daemon=True,
                )
                self._preparing.start()

    def prepare(self) -> None:
        """Render what changed; compress it too when a gzipped scrape is due before the next preparation."""
        self.renderer.prepare()
        if self._scrapes.due(time.monotonic(), PREPARE_SECONDS + _Scrapes.TOLERANCE):
            generation, parts = self.renderer.versioned()
            cached = self._gzipped
            if cached is None or cached.generation != generation:
                self._gzipped = _GzipPrefix(generation, parts)


def _prepare_forever(exposition: weakref.ReferenceType[Exposition], failures: _Failures) -> None:
    """Prepare the exposition every PREPARE_SECONDS while it exists (a weak reference: it is not kept)."""
    while True:
        time.sleep(PREPARE_SECONDS)
        found = exposition()
        if found is None:
            return
        try:
            found.prepare()
        except Exception as err:  # noqa: BLE001 - the thread lives on; the next scrape renders afresh
            failures.failed(err, "prepare")
        else:
            failures.prepared()
        del found
