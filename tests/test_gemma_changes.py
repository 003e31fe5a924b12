"""The same-shape weight changes of tests/support/gemma.py, on a small generated GGUF laid out as Gemma's: the file's
size and header stay as they were, the chosen tensors' values move by about eps, and a seed gives the same file again."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from tests.support import gemma

LAYERS = 4
WIDTH, HIDDEN = 64, 128


def _small_model(path: Path) -> Path:
    """Gemma's layout in miniature: F32 norms, Q5_0 ffn_up and ffn_gate, attn_v in Q8_0 on even layers and Q5_0 on odd."""
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(WIDTH)
    writer.add_file_type(15)
    writer.add_string("general.name", "tiny")

    def quantized(name: str, rows: int, kind: Q) -> None:
        weights = (rng.standard_normal((rows, WIDTH)) * 0.04).astype(np.float32)
        writer.add_tensor(name, quants.quantize(weights, kind), raw_dtype=kind)

    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))
    for layer in range(LAYERS):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))
        quantized(f"blk.{layer}.attn_v.weight", 32, Q.Q8_0 if layer % 2 == 0 else Q.Q5_0)
        quantized(f"blk.{layer}.ffn_gate.weight", HIDDEN, Q.Q5_0)
        quantized(f"blk.{layer}.ffn_up.weight", HIDDEN, Q.Q5_0)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _small_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


def _changed(source: Path, directory: Path, kind: str, eps: float, seed: int) -> tuple[Path, list[str]]:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    shutil.copyfile(source, target)
    return target, gemma.CHANGERS[kind](target, eps, seed)


def _values(path: Path) -> dict[str, np.ndarray]:
    return {t.name: quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in gguf.GGUFReader(path).tensors}


def _header(path: Path) -> bytes:
    return path.read_bytes()[:gguf.GGUFReader(path).data_offset]


@pytest.mark.parametrize("kind", gemma.CHANGES)
def test_a_change_keeps_the_size_and_header_and_moves_only_its_tensors(source: Path, tmp_path: Path, kind: str) -> None:
    target, names = _changed(source, tmp_path, kind, 0.2, 1)
    assert target.stat().st_size == source.stat().st_size
    assert _header(target) == _header(source)  # metadata, names, types, shapes: what /v1/models' meta is read from
    before, after = _values(source), _values(target)
    moved = sorted(name for name in before if not np.array_equal(before[name], after[name]))
    assert moved == sorted(names) and moved
    for name in names:  # about eps of the tensor's size, quantization's rounding aside
        relative = np.linalg.norm(after[name] - before[name]) / np.linalg.norm(before[name])
        assert 0.1 < relative < 0.3, (name, relative)


def test_which_tensors_each_change_moves(source: Path, tmp_path: Path) -> None:
    assert _changed(source, tmp_path / "n", "norms", 0.1, 1)[1] == [
        "output_norm.weight", *(f"blk.{i}.{n}_norm.weight" for i in range(LAYERS) for n in ("attn", "ffn"))]
    assert _changed(source, tmp_path / "l", "layer", 0.1, 1)[1] == [f"blk.{(3 * 1 + 1) % LAYERS}.ffn_up.weight"]
    # Layer (5 * seed + 2) % 4: seed 0 gives layer 2, whose attn_v is Q8_0; seed 1 layer 3, whose attn_v is Q5_0.
    assert _changed(source, tmp_path / "r0", "lowrank", 0.1, 0)[1] == ["blk.2.attn_v.weight"]
    assert _changed(source, tmp_path / "r1", "lowrank", 0.1, 1)[1] == ["blk.3.ffn_gate.weight"]


@pytest.mark.parametrize("kind", gemma.CHANGES)
def test_a_seed_gives_the_same_file_and_another_seed_another(source: Path, tmp_path: Path, kind: str) -> None:
    first = _changed(source, tmp_path / "a", kind, 0.1, 3)[0].read_bytes()
    again = _changed(source, tmp_path / "b", kind, 0.1, 3)[0].read_bytes()
    assert first == again
    # The same tensors under another seed (the norms always; layer and lowrank pick their layer by seed, so seed 3 + 4).
    other = _changed(source, tmp_path / "c", kind, 0.1, 3 + LAYERS)[0].read_bytes()
    assert other != first and len(other) == len(first)


def test_the_low_rank_change_has_its_rank(source: Path, tmp_path: Path) -> None:
    """Before requantization the delta is of rank RANK; after it, its leading RANK singular values carry most of it."""
    target, [name] = _changed(source, tmp_path, "lowrank", 0.3, 0)
    delta = _values(target)[name] - _values(source)[name]
    singular = np.linalg.svd(delta, compute_uv=False)
    assert (singular[:gemma.RANK] ** 2).sum() > 0.8 * (singular ** 2).sum()


def test_the_norm_change_is_the_one_the_replica_tests_use(source: Path, tmp_path: Path) -> None:
    """changed_weights (the replica tests' and bench.peer_power's) is change_norms at the module's seed."""
    kept = gemma.changed_weights(source, tmp_path / "old", 0.05)
    made, _ = _changed(source, tmp_path / "new", "norms", 0.05, gemma.SEED)
    assert kept.read_bytes() == made.read_bytes()
