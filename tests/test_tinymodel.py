"""The tiny cycle model's file: tensor types and the weights that make it cycle, read back with gguf."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from specwatch.demo.tinymodel import write_cycle_model, write_mtp_cycle_model


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


def test_the_mtp_model_is_a_qwen35_trunk_with_one_nextn_block_that_passes_the_next_token_on(tmp_path):
    reader = gguf.GGUFReader(str(write_mtp_cycle_model(tmp_path / "mtp.gguf")))

    def field(key: str):
        return reader.fields[key].contents()

    assert (field("general.architecture"), field("qwen35.block_count"), field("qwen35.nextn_predict_layers")) == ("qwen35", 3, 1)
    tensors = {t.name: t for t in reader.tensors}
    assert {"blk.0.ssm_a", "blk.1.attn_q.weight", "blk.2.nextn.eh_proj.weight", "blk.2.nextn.enorm.weight"} <= tensors.keys()
    n_embd = field("qwen35.embedding_length")
    eh_proj = np.asarray(tensors["blk.2.nextn.eh_proj.weight"].data)
    assert eh_proj.shape == (n_embd, 2 * n_embd)
    assert np.array_equal(eh_proj[:, :n_embd], np.eye(n_embd)) and not eh_proj[:, n_embd:].any()
