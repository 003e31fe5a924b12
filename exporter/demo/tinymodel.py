"""Write tiny GGUF models that repeat a fixed cycle of words forever: llama, and qwen35 with an MTP head."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

DEFAULT_CYCLE_WORDS: tuple[str, ...] = ("the", "cat", "sat", "on", "a", "mat")
DEFAULT_EXTRA_WORDS: tuple[str, ...] = (
    "dog", "ran", "hello", "world", "is", "it", "in", "and", "big", "red",
    "say", "what", "word", "next", "tell", "me", "story",
)

# ChatML, written out as expressions so no jinja whitespace control is needed.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SPACE = "\u2581"  # SentencePiece's word-boundary marker
# How the 2D weight tensors are stored; norms stay F32 either way, as llama.cpp's own converters keep them.
TENSOR_TYPES: tuple[str, ...] = ("F32", "Q8_0")
_QWEN35_HEADS = 2
# Gated delta net sizes of the MTP model's recurrent layer: all zero, so they only have to be consistent.
_SSM = {"conv": 4, "state": 16, "k_heads": 2, "v_heads": 4}


def cycle_text(cycle_words: Sequence[str] = DEFAULT_CYCLE_WORDS, repeats: int = 1) -> str:
    """The text the model generates for one or more turns of the cycle."""
    return "".join(" " + w for w in cycle_words) * repeats


def write_cycle_model(
    path: pathlib.Path,
    *,
    cycle_words: Sequence[str] = DEFAULT_CYCLE_WORDS,
    extra_words: Sequence[str] = DEFAULT_EXTRA_WORDS,
    p_next: float = 0.7,
    p_alternatives: Sequence[float] = (0.02, 0.01),
    n_layer: int = 1,
    n_ctx_train: int = 2048,
    n_ff: int = 32,
    head_dim: int = 64,
    name: str = "specwatch-cycle",
    tensor_type: str = "F32",
) -> pathlib.Path:
    """Write the model to ``path`` and return ``path``.

    Whatever the context, the next token is the successor of the last token in
    ``cycle_words`` (tokens outside the cycle lead to its first word), with
    probability ``p_next``. The words two, three, ... steps ahead get
    ``p_alternatives``, so logprob requests have real alternatives to report;
    the rest of the mass is spread evenly over the vocabulary.

    ``tensor_type="Q8_0"`` stores the 2D weights quantized, so the server runs
    the kernels of a quantized fleet; the cycle and its probabilities survive
    (one-hot rows and a few distinct logits per block quantize almost exactly).
    """
    return _write(path, arch="llama", cycle_words=cycle_words, extra_words=extra_words, p_next=p_next,
                  p_alternatives=p_alternatives, n_layer=n_layer, n_ctx_train=n_ctx_train, n_ff=n_ff, head_dim=head_dim,
                  name=name, tensor_type=tensor_type)


def write_mtp_cycle_model(
    path: pathlib.Path,
    *,
    cycle_words: Sequence[str] = DEFAULT_CYCLE_WORDS,
    extra_words: Sequence[str] = DEFAULT_EXTRA_WORDS,
    p_next: float = 0.7,
    p_alternatives: Sequence[float] = (0.02, 0.01),
    n_ctx_train: int = 2048,
    name: str = "specwatch-cycle-mtp",
    tensor_type: str = "F32",
) -> pathlib.Path:
    """The cycle model with a multi-token-prediction head, for ``--spec-type draft-mtp``; returns ``path``.

    llama.cpp b11434 runs MTP heads only for a few architectures (qwen35, glm4moe, deepseek2, step35, ...). This is
    a dense ``qwen35`` (Qwen3.5) model: a gated-delta-net layer and an attention layer, both zeroed (llama.cpp's
    hybrid memory needs at least one recurrent layer), and one NextN block whose projection keeps the embedding of
    the token it is given, so the head drafts that token's successor, which the model then accepts.
    """
    return _write(path, arch="qwen35", cycle_words=cycle_words, extra_words=extra_words, p_next=p_next,
                  p_alternatives=p_alternatives, n_layer=2, n_ctx_train=n_ctx_train, n_ff=32, head_dim=64,
                  name=name, tensor_type=tensor_type)


def _write(
    path: pathlib.Path,
    *,
    arch: str,
    cycle_words: Sequence[str],
    extra_words: Sequence[str],
    p_next: float,
    p_alternatives: Sequence[float],
    n_layer: int,
    n_ctx_train: int,
    n_ff: int,
    head_dim: int,
    name: str,
    tensor_type: str,
) -> pathlib.Path:
    import gguf  # optional dependency: only test and demo set-ups need it
    import numpy as np

    path = pathlib.Path(path)
    cycle = [str(w) for w in cycle_words]
    # Attention is zeroed, so the last token alone decides the next one: a
    # repeated word would have two successors and break the cycle.
    if len(cycle) < 2 or len(set(cycle)) != len(cycle):
        raise ValueError("cycle_words needs at least two distinct words")
    if any(not w or _SPACE in w or any(c.isspace() for c in w) for w in cycle):
        raise ValueError("cycle words must be non-empty and contain no whitespace")
    alternatives = [float(p) for p in p_alternatives][: len(cycle) - 1]
    if not 0.0 < p_next < 1.0 or any(p <= 0.0 for p in alternatives) or p_next + sum(alternatives) >= 1.0:
        raise ValueError("p_next and p_alternatives must be positive and sum to less than 1")
    if tensor_type not in TENSOR_TYPES:
        raise ValueError(f"tensor_type must be one of {', '.join(TENSOR_TYPES)}, not {tensor_type!r}")
    quantized = tensor_type == "Q8_0"
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if quantized and (n_ff % block or head_dim % block):
        raise ValueError(f"Q8_0 rows are blocks of {block} values: n_ff and head_dim must be multiples of {block}")

    tokens: list[str] = []
    types: list[int] = []
    scores: list[float] = []
    index: dict[str, int] = {}

    def add(text: str, ttype: int, score: float = 0.0) -> int:
        if text in index:
            return index[text]
        index[text] = len(tokens)
        tokens.append(text)
        types.append(ttype)
        scores.append(score)
        return index[text]

    tt = gguf.TokenType
    unk = add("<unk>", tt.UNKNOWN)
    bos = add("<s>", tt.CONTROL)
    eos = add("</s>", tt.CONTROL)
    add("<|im_start|>", tt.CONTROL)
    im_end = add("<|im_end|>", tt.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", tt.BYTE)
    for ch in _SPACE + "abcdefghijklmnopqrstuvwxyz":
        add(ch, tt.NORMAL, -100.0)
    # SPM merges two adjacent pieces only when their concatenation is itself a
    # token, so every prefix of "▁word" must exist for the whole word to form.
    for word in [*cycle, *extra_words]:
        piece = _SPACE + word
        for end in range(2, len(piece) + 1):
            add(piece[:end], tt.NORMAL, -float(len(piece) - end))

    n_vocab = len(tokens)
    # One-hot embeddings need a dimension per token; round up to whole heads.
    n_head = max(1, math.ceil(n_vocab / head_dim))
    n_embd = n_head * head_dim
    n_head_kv = 1
    eps = 1e-5

    cycle_ids = [index[_SPACE + w] for w in cycle]
    position = dict.fromkeys(range(n_vocab), -1)  # outside the cycle: as if before its first word
    position.update({t: i for i, t in enumerate(cycle_ids)})
    end_ids = [eos, im_end]  # end-of-generation tokens must never win

    # With zero attention/FFN the final RMS norm sees a one-hot vector and
    # scales its single entry to 1/sqrt(1/n_embd + eps); fold that into the
    # output weights so logits come out exactly as chosen here.
    norm_gain = 1.0 / math.sqrt(1.0 / n_embd + eps)
    # Tokens not favoured keep logit 0 and share the leftover mass, which fixes
    # the partition function; each favoured token's logit follows from it.
    # Default sampling (min_p 0.05) still keeps only the successor, so even
    # temperature 1 repeats the cycle.
    probs = [p_next, *alternatives]
    n_rest = n_vocab - len(probs) - len(end_ids)
    partition = n_rest / (1.0 - sum(probs))
    logits = [math.log(p * partition) for p in probs]
    end_logit = -2.0 * logits[0]

    token_embd = np.zeros((n_vocab, n_embd), dtype=np.float32)
    token_embd[np.arange(n_vocab), np.arange(n_vocab)] = 1.0
    output = np.zeros((n_vocab, n_embd), dtype=np.float32)
    for t, pos in position.items():
        for step, logit in enumerate(logits, start=1):
            output[cycle_ids[(pos + step) % len(cycle_ids)], t] = logit / norm_gain
    for e in end_ids:
        output[e, :n_vocab] = end_logit / norm_gain

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantized else gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    # The NextN block comes after the trunk and counts as a block.
    w.add_block_count(n_layer if arch == "llama" else n_layer + 1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head if arch == "llama" else _QWEN35_HEADS)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(eps)
    if arch != "llama":
        w.add_nextn_predict_layers(1)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        # Qwen3.5 rotates by sections (M-RoPE); a text model puts all of a head's pairs in the first three.
        w.add_rope_dimension_sections([11, 11, head_dim // 2 - 22, 0])
        w.add_full_attention_interval(2)  # layer 0 gated delta net, layer 1 attention
        w.add_ssm_conv_kernel(_SSM["conv"])
        w.add_ssm_inner_size(_SSM["state"] * _SSM["v_heads"])
        w.add_ssm_state_size(_SSM["state"])
        w.add_ssm_time_step_rank(_SSM["v_heads"])
        w.add_ssm_group_count(_SSM["k_heads"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_unk_token_id(unk)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(CHAT_TEMPLATE)

    def weight(tensor_name: str, values: np.ndarray) -> None:
        if quantized:
            qtype = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(tensor_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(tensor_name, values)

    ones = np.ones(n_embd, dtype=np.float32)
    weight("token_embd.weight", token_embd)
    w.add_tensor("output_norm.weight", ones)
    weight("output.weight", output)

    def zeros(rows: int, cols: int) -> np.ndarray:
        return np.zeros((rows, cols), np.float32)

    def ffn(blk: str) -> None:
        weight(f"{blk}.ffn_gate.weight", zeros(n_ff, n_embd))
        weight(f"{blk}.ffn_up.weight", zeros(n_ff, n_embd))
        weight(f"{blk}.ffn_down.weight", zeros(n_embd, n_ff))

    if arch == "llama":
        kv_dim = n_head_kv * head_dim
        for i in range(n_layer):
            blk = f"blk.{i}"
            w.add_tensor(f"{blk}.attn_norm.weight", ones)
            weight(f"{blk}.attn_q.weight", zeros(n_embd, n_embd))
            weight(f"{blk}.attn_k.weight", zeros(kv_dim, n_embd))
            weight(f"{blk}.attn_v.weight", zeros(kv_dim, n_embd))
            weight(f"{blk}.attn_output.weight", zeros(n_embd, n_embd))
            w.add_tensor(f"{blk}.ffn_norm.weight", ones)
            ffn(blk)
    else:
        def attention(blk: str) -> None:
            w.add_tensor(f"{blk}.attn_norm.weight", ones)
            w.add_tensor(f"{blk}.post_attention_norm.weight", ones)
            weight(f"{blk}.attn_q.weight", zeros(2 * _QWEN35_HEADS * head_dim, n_embd))  # query and its gate
            weight(f"{blk}.attn_k.weight", zeros(n_head_kv * head_dim, n_embd))
            weight(f"{blk}.attn_v.weight", zeros(n_head_kv * head_dim, n_embd))
            weight(f"{blk}.attn_output.weight", zeros(n_embd, _QWEN35_HEADS * head_dim))
            w.add_tensor(f"{blk}.attn_q_norm.weight", np.ones(head_dim, np.float32))
            w.add_tensor(f"{blk}.attn_k_norm.weight", np.ones(head_dim, np.float32))
            ffn(blk)

        state, k_heads, v_heads = _SSM["state"], _SSM["k_heads"], _SSM["v_heads"]
        conv_dim = 2 * state * k_heads + state * v_heads
        blk = "blk.0"
        w.add_tensor(f"{blk}.attn_norm.weight", ones)
        w.add_tensor(f"{blk}.post_attention_norm.weight", ones)
        weight(f"{blk}.attn_qkv.weight", zeros(conv_dim, n_embd))
        weight(f"{blk}.attn_gate.weight", zeros(state * v_heads, n_embd))
        w.add_tensor(f"{blk}.ssm_conv1d.weight", zeros(conv_dim, _SSM["conv"]))  # rows of 4: never quantized
        w.add_tensor(f"{blk}.ssm_dt.bias", np.zeros(v_heads, np.float32))
        w.add_tensor(f"{blk}.ssm_a", -np.ones(v_heads, np.float32))
        weight(f"{blk}.ssm_beta.weight", zeros(v_heads, n_embd))
        weight(f"{blk}.ssm_alpha.weight", zeros(v_heads, n_embd))
        w.add_tensor(f"{blk}.ssm_norm.weight", np.ones(state, np.float32))
        weight(f"{blk}.ssm_out.weight", zeros(n_embd, state * v_heads))
        ffn(blk)
        attention("blk.1")
        # The NextN block sees [enorm(embedding of the next token), hnorm(trunk state)]; keeping the first half and
        # zeroing its own attention and FFN leaves the next token's one-hot for the shared head, which then names
        # that token's successor: the draft the trunk will accept.
        blk = f"blk.{n_layer}"
        attention(blk)
        eh_proj = zeros(n_embd, 2 * n_embd)
        eh_proj[np.arange(n_embd), np.arange(n_embd)] = 1.0
        weight(f"{blk}.nextn.eh_proj.weight", eh_proj)
        w.add_tensor(f"{blk}.nextn.enorm.weight", ones)
        w.add_tensor(f"{blk}.nextn.hnorm.weight", ones)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
