"""The package's architecture as docs/development.md states it: layers whose imports point down, one home for prometheus_client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import markdown

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"
MAX_LINES = 450

# Bottom first. A module may import from its own layer and those below, never above; within a layer the imports
# form no cycle. Every module has a layer, so a new one is placed on purpose.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specwatch", "specwatch.version", "specwatch.reasons", "specwatch.durations", "specwatch.filestamp", "specwatch.problems",
     "specwatch.endpoints", "specwatch.apikey", "specwatch.loop"),
    # How to speak HTTP, then what llama-server says over it.
    ("specwatch.probe.http", "specwatch.probe.http.*"),
    ("specwatch.probe", "specwatch.probe.*"),
    ("specwatch.settings", "specwatch.settings.*"),
    # The spine: what specwatch knows of each server and decides of it, and the one runner.
    ("specwatch.core", "specwatch.core.*"),
    # The two wings over one core: the eval side and the daemon; neither imports the other (see WINGS).
    ("specwatch.gate", "specwatch.gate.*", "specwatch.daemon", "specwatch.daemon.*"),
    ("specwatch.demo", "specwatch.demo.*"),
    ("specwatch.cli", "specwatch.__main__"),
)
WINGS = ("specwatch.gate", "specwatch.daemon")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("specwatch", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        found[name] = path
    return found


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, by its full name (relative imports resolved; TYPE_CHECKING ones included, but for
    the package root's: its public names load on first use, so it stays on the ground floor, holding the version)."""
    names = set()
    tree = ast.parse(path.read_text())
    if path == PACKAGE / "__init__.py":
        tree.body = [node for node in tree.body if not _type_checking(node)]
    # The package imports itself relatively (its folder is exporter/, its name specwatch): resolve against its place.
    package = ("specwatch", *path.parent.relative_to(PACKAGE).parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _type_checking(node: ast.stmt) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:` (by any name of the module)."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def layer_of(module: str) -> int:
    for index, members in enumerate(LAYERS):
        for member in members:
            if module == member or (member.endswith(".*") and module.startswith(member[:-1])):
                return index
    raise KeyError(module)


def _internal(module: str, modules: dict[str, Path]) -> set[str]:
    """The package's own modules that `module` imports (a name imported from a package counts as that package)."""
    return {name for name in _imports(modules[module]) if name in modules and name != module}


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in _modules():
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == [], "place each module in LAYERS (and in the listing of docs/development.md)"


def test_imports_point_down() -> None:
    modules = _modules()
    upward = [(module, imported) for module in modules for imported in _internal(module, modules)
              if layer_of(imported) > layer_of(module)]
    assert upward == []


def test_the_imports_have_no_cycle() -> None:
    modules = _modules()
    graph = {module: _internal(module, modules) for module in modules}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*path, module, imported])}")
            if imported not in state:
                visit(imported, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def _importers_of(prefix: str) -> set[str]:
    return {module for module, path in _modules().items()
            if any(name == prefix or name.startswith(prefix + ".") for name in _imports(path))}


def test_only_the_exposition_imports_prometheus_client_in_the_runtime() -> None:
    importers = _importers_of("prometheus_client")
    # The demo reads /metrics with prometheus_client's text parser, as a user would; it is not part of `run` or `check`.
    assert importers, "the exposition imports prometheus_client"
    assert {m for m in importers if not m.startswith(("specwatch.daemon.exposition.", "specwatch.demo"))} == set()


def test_one_way_to_speak_http() -> None:
    """Every request to a server goes through probe/http (aiohttp); no second client hides anywhere in the package."""
    assert {m for m in _importers_of("aiohttp") if not m.startswith("specwatch.probe.http")} == set()
    assert _importers_of("httpx") | _importers_of("h11") | _importers_of("httpcore") | _importers_of("requests") == set()
    # The standard library's client, from synchronous code, reads only what specwatch started itself: the image's
    # HEALTHCHECK asks its own exporter, the demo its exporter and the llama-servers it launched.
    assert _importers_of("urllib.request") | _importers_of("http.client") == {
        "specwatch.daemon.healthcheck", "specwatch.demo", "specwatch.demo.llamaserver"}


def test_probes_know_no_settings_and_no_metrics_and_settings_know_no_http() -> None:
    for module in _modules():
        imported = _imports(_modules()[module])
        if module.startswith("specwatch.probe"):
            assert not any(n.startswith(("specwatch.settings", "prometheus_client", "specwatch.daemon")) for n in imported), module
        if module.startswith("specwatch.settings"):
            assert not any(n.startswith(("aiohttp", "httpx", "specwatch.probe")) for n in imported), module


def test_the_wings_never_import_each_other() -> None:
    """The gate (check, ask, audit, the plugin, the API) and the daemon share the core below them, and nothing else."""
    crossing = []
    for module, path in _modules().items():
        for wing in WINGS:
            other = next(w for w in WINGS if w != wing)
            if module == wing or module.startswith(wing + "."):
                crossing += [(module, name) for name in _imports(path) if name == other or name.startswith(other + ".")]
    assert crossing == []


def test_settings_never_import_probes() -> None:
    """The config is data: validating it reaches no probe (blackbox's config never imports its probers)."""
    importing = {module: sorted(n for n in _imports(path) if n.startswith("specwatch.probe"))
                 for module, path in _modules().items() if module.startswith("specwatch.settings")}
    assert {m: names for m, names in importing.items() if names} == {}


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_runtime_module_is_over_450_lines(module: str) -> None:
    lines = len(_modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by job before adding to it"


def _listing() -> list[str]:
    """The modules and packages docs/development.md's architecture block names, top to bottom."""
    (block,) = markdown.blocks(markdown.section(markdown.DOCS / "development.md", "The package"), "")
    listed: list[str] = []
    folders: list[tuple[int, str]] = []  # (indent, dotted package) of the folders enclosing the current line
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = line.strip().split("  ", 1)[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        for entry in (n.strip() for n in names.split(",")):
            if entry.endswith("/"):
                # The source folder exporter/ installs as the package specwatch.
                dotted = ("specwatch" if entry == "exporter/" else entry.rstrip("/")) if not parent else f"{parent}.{entry.rstrip('/')}"
                folders.append((indent, dotted))
                if parent:
                    listed.append(dotted)
            elif entry.endswith(".py"):
                module = f"{parent}.{entry.removesuffix('.py')}".removesuffix(".__init__")
                listed.append(module)
    return listed


def test_the_docs_list_the_package_as_it_is_layered() -> None:
    """docs/development.md's listing names every module, and goes from the top layer down."""
    listed, modules = _listing(), _modules()
    assert [m for m in listed if m not in modules] == [], "docs/development.md lists modules that do not exist"
    assert sorted(set(modules) - set(listed) - {"specwatch"}) == [], "the listing of docs/development.md misses modules"
    placed = [(m, layer_of(m)) for m in listed]
    assert [layer for _, layer in placed] == sorted((layer for _, layer in placed), reverse=True), placed
