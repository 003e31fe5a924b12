"""The Prometheus text format, rendered incrementally: a server's lines are rebuilt only when their inputs change."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client.utils import floatToGoString

from ...core.state import Fleet, ServerState
from ...settings.targets import ServerConfig
from .catalog import FAMILIES, SERVER, Family
from .samples import GROUPS, ExporterStatus, Extra, exporter_families, exporter_samples

_MEMO_LIMIT = 1024
PREPARED_FOR = 2.0
"""How long a scrape serves what prepare() made: one preparation period (a second), and another for it to run late."""


def escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def header(family: Family) -> str:
    doc = family.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {family.sample} {doc}\n# TYPE {family.sample} {family.kind}\n"


_SMALL_INTS = {i: floatToGoString(i) for i in range(-1, 1025)}


def number(value: float) -> str:
    """floatToGoString, with the small integers most samples carry looked up instead of formatted."""
    if type(value) is int:
        found = _SMALL_INTS.get(value)
        if found is not None:
            return found
    return floatToGoString(value)


class ServerLabels:
    """One server's label text for each combination of extra labels, memoised: built once per ServerConfig object."""

    __slots__ = ("_texts", "base", "config")

    def __init__(self, config: ServerConfig | None) -> None:
        self.config = config
        self.base = {} if config is None else {**config.labels, "server": config.name}
        self._texts: dict[Extra, str] = {}

    def text(self, extra: Extra) -> str:
        found = self._texts.get(extra)
        if found is None:
            if len(self._texts) > _MEMO_LIMIT:
                self._texts.clear()  # build/model labels that keep changing must not grow this forever
            # generate_latest's form: keys sorted, values escaped the same way.
            found = self._texts[extra] = ",".join(f'{k}="{escape(v)}"' for k, v in sorted({**self.base, **dict(extra)}.items()))
        return found


class LineSink:
    """Samples of one server (or of the exporter) as exposition lines, grouped per family in the order they came."""

    def __init__(self, labels: ServerLabels) -> None:
        self.labels = labels
        self.lines: dict[str, list[str]] = {}

    def add(self, family: str, extra: Extra, value: float) -> None:
        text = self.labels.text(extra)
        sample = FAMILIES[family].sample
        line = f"{sample}{{{text}}} {number(value)}\n" if text else f"{sample} {number(value)}\n"
        found = self.lines.get(family)
        if found is None:
            self.lines[family] = [line]
        else:
            found.append(line)


def exporter_text(status: ExporterStatus, servers: int) -> bytes:
    """The exporter's own families, after the servers'."""
    out = LineSink(ServerLabels(None))
    exporter_samples(out, status, servers)
    return "".join(header(f) + "".join(out.lines.get(f.name, ())) for f in exporter_families(status)).encode()


_HEADERS: dict[str, bytes] = {f.name: header(f).encode() for f in SERVER}
_UNSET = object()
Parts = tuple[bytes, ...]
"""An exposition as the blocks it is made of, in order: each server family's block, then the exporter's own."""


class _Entry:
    """One server's lines, each family's joined, and the key each group of them was built from."""

    __slots__ = ("keys", "labels", "lines", "state")

    def __init__(self, labels: ServerLabels) -> None:
        self.labels = labels
        self.state: ServerState | None = None
        """The state the lines were last brought up to date with: states are immutable, so the same one needs nothing."""
        self.keys: list[object] = [_UNSET] * len(GROUPS)
        self.lines: dict[str, str] = {}


class TextRenderer:
    """The fleet's families in the text format, byte for byte what generate_latest() makes of the same samples.

    generate_latest() took 0.5 s for 1,000 servers. Here label text is built once per server config; a server's lines
    are rebuilt only for the groups of families whose inputs changed (a poll's timing and counters at each poll, its
    answers when they differ, its canary lines after a canary, its verdict when the evidence changes); and a family's
    fleet-wide block only when one of its servers' lines did.
    """

    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        self._fleet = fleet
        self._status = status
        self._labels: dict[str, ServerLabels] = {}
        self._entries: dict[str, _Entry] = {}
        self._order: tuple[str, ...] = ()
        self._columns: dict[str, list[str]] = {}
        """Each family's lines per server, in fleet order: a block is one join."""
        self._blocks: dict[str, bytes] = {}
        self._prepared: tuple[float, ExporterStatus, int, Parts] | None = None
        self._generation = 0
        self._lock = threading.Lock()  # the memos are shared by scrapes on several HTTP threads and the preparer

    def text(self) -> bytes:
        """The current exposition, joined (see `versioned`)."""
        return b"".join(self.versioned()[1])

    def versioned(self) -> tuple[int, Parts]:
        """The current exposition, in parts, and its generation: what prepare() made while recent and the servers and
        settings are the same, else made now.

        A sample is then served up to PREPARED_FOR seconds after its probe recorded it (its value is as old as its poll
        or canary anyway); a reload, or a server added or removed, is served at once. One generation is one tuple of
        parts, so what is made of it (a gzipped body) can be reused, and kept without keeping the parts.
        """
        with self._lock:
            prepared = self._prepared
            if prepared is not None and time.monotonic() - prepared[0] < PREPARED_FOR:
                _, status, generation, body = prepared
                servers = self._fleet.snapshot()
                # Compared by value: a status function may build a new, equal status on every call.
                if status == self._status() and self._order == tuple(s.config.name for s in servers):
                    return generation, body
            self._prepared = None
            body = self._render(self._status())
            self._generation += 1
            return self._generation, body

    def prepare(self) -> None:
        """Render what changed now, for the scrapes of the next PREPARED_FOR seconds."""
        with self._lock:
            status = self._status()
            self._prepared = None  # the last body is let go before the next is made: one of them at a time
            body = self._render(status)
            self._generation += 1
            self._prepared = (time.monotonic(), status, self._generation, body)

    def _labels_for(self, server: ServerState) -> ServerLabels:
        found = self._labels.get(server.config.name)
        if found is None or found.config is not server.config:
            found = self._labels[server.config.name] = ServerLabels(server.config)
        return found

    def _render(self, status: ExporterStatus) -> Parts:
        try:
            return self._update(status)
        except BaseException:
            # Memos half brought up to date would serve stale lines as current: the next render builds them all anew.
            self._labels, self._entries, self._order, self._columns, self._blocks = {}, {}, (), {}, {}
            self._prepared = None
            raise

    def _update(self, status: ExporterStatus) -> Parts:
        servers = self._fleet.snapshot()
        entries = self._entries
        names = tuple(s.config.name for s in servers)
        reordered = names != self._order or len(self._blocks) != len(SERVER)
        changed: set[str] = set()
        cells: list[tuple[str, int, str]] = []
        ordered: list[_Entry] = []
        for position, server in enumerate(servers):
            entry = entries.get(names[position])
            if entry is not None and entry.state is server:  # states are immutable: nothing changed, config included
                ordered.append(entry)
                continue
            labels = self._labels_for(server)
            if entry is None or entry.labels is not labels:
                if entry is not None:
                    reordered = True  # its families may now have no line of it: every column is laid anew
                entry = entries[names[position]] = _Entry(labels)
            ordered.append(entry)
            entry.state = server
            for index, group in enumerate(GROUPS):
                key = group.key(server)
                if entry.keys[index] is not _UNSET and entry.keys[index] == key:
                    continue
                entry.keys[index] = key
                out = LineSink(labels)
                group.samples(out, server)
                for family in group.families:
                    found = out.lines.get(family)
                    text = "".join(found) if found else ""
                    if entry.lines.get(family, "") != text:
                        entry.lines[family] = text
                        changed.add(family)
                        cells.append((family, position, text))
        if reordered:
            self._order = names
            self._forget_removed(names)
            self._columns = {f: [e.lines.get(f, "") for e in ordered] for f in _HEADERS}
            changed.update(_HEADERS)
        else:
            for family, position, text in cells:
                self._columns[family][position] = text
        for family in changed:
            self._blocks[family] = _HEADERS[family] + "".join(self._columns[family]).encode()
        # The family blocks themselves, not one body joined from them: at 1,000 servers a joined body is another 8 MB
        # held between preparations, and a join of them that a gzipped scrape, compressing them in turn, never needs.
        return (*(self._blocks[f.name] for f in SERVER), exporter_text(status, len(servers)))

    def _forget_removed(self, names: tuple[str, ...]) -> None:
        if len(self._labels) > len(names) or len(self._entries) > len(names):
            kept = set(names)
            for memo in (self._labels, self._entries):
                for name in [n for n in memo if n not in kept]:
                    del memo[name]

    def memo_sizes(self) -> dict[str, int]:
        """How many servers each per-server memo holds: none beyond the watched ones."""
        return {"labels": len(self._labels), "entries": len(self._entries), "blocks": len(self._blocks)}
