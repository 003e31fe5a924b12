"""The tiny cycle model's file: tensor types and the weights that make it cycle, read back with gguf."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from exporter.demo.tinymodel import write_cycle_model


def _tensors(path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def test_q8_0_quantizes_the_2d_weights_and_keeps_what_f32_writes(tmp_path):
    f32 = _tensors(write_cycle_model(tmp_path / "f32.gguf"))
    q8 = _tensors(write_cycle_model(tmp_path / "q8.gguf", tensor_type="Q8_0"))
    assert f32.keys() == q8.keys()
    for name, tensor in q8.items():
        expected = gguf.GGMLQuantizationType.Q8_0 if len(f32[name].shape) == 2 else gguf.GGMLQuantizationType.F32
        assert tensor.tensor_type == expected, name
        assert f32[name].tensor_type == gguf.GGMLQuantizationType.F32, name
        assert list(tensor.shape) == list(f32[name].shape), name
    for name in ("token_embd.weight", "output.weight"):
        exact = np.asarray(f32[name].data, dtype=np.float32)
        restored = gguf.quants.dequantize(q8[name].data, gguf.GGMLQuantizationType.Q8_0)
        # Q8_0 keeps 127 steps per block of 32: an error beyond one step would move the cycle's probabilities.
        assert np.max(np.abs(restored - exact)) <= np.max(np.abs(exact)) / 127 + 1e-6, name


def test_q8_0_refuses_rows_that_are_not_whole_blocks(tmp_path):
    with pytest.raises(ValueError, match="multiples of 32"):
        write_cycle_model(tmp_path / "q8.gguf", tensor_type="Q8_0", n_ff=48)


def test_an_unknown_tensor_type_is_refused(tmp_path):
    with pytest.raises(ValueError, match="F32, Q8_0"):
        write_cycle_model(tmp_path / "q4.gguf", tensor_type="Q4_K")
