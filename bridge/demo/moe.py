"""Random qwen3vlmoe GGUFs (Qwen3-Omni's thinker as llama.cpp's converter writes it), from numpy and gguf:
the Clef-omni demo's backbone, and the MoE memory-plan tests' models.

Every layer is full attention with a mixture-of-experts FFN: a router `ffn_gate_inp` and the experts
`ffn_{gate,up,down}_exps` stacked in one 3-D tensor each. Weights are random (F32, or random Q4_K/Q6_K
blocks laid out as llama.cpp's Q4_K_M mixes them), the vocabulary the demo's byte-level one; llama.cpp
loads and runs them (no transformers, no converter: a file takes well under a second). The converter writes
`n_deepstack_layers = 0` for Qwen3-Omni whatever its vision tower feeds; so does this (0 unless asked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from ..catalogue.architectures import QWEN3VLMOE
from ..gguf.writer import quiet_gguf_py
from .weights import BLOCKS, POOL_BYTES, Vocab, byte_level_vocab, more_bits, random_blocks, random_tensor

ARCH = QWEN3VLMOE.name


@dataclass(frozen=True)
class MoeDims:
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    experts: int = 8
    experts_used: int = 2
    expert_ff: int = 256
    context: int = 65536
    deepstack: int = 0


def tensor_specs(d: MoeDims, n_vocab: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (kind, numpy shape) in file order; kinds "w" (a matrix or a stack of expert matrices) and "norm"."""
    h, q, kv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    out = {"output.weight": ("w", (n_vocab, h)), "token_embd.weight": ("w", (n_vocab, h))}
    for i in range(d.layers):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": ("norm", (h,)),
                p + "ffn_down_exps.weight": ("w", (d.experts, h, d.expert_ff)),
                p + "ffn_gate_exps.weight": ("w", (d.experts, d.expert_ff, h)),
                p + "ffn_up_exps.weight": ("w", (d.experts, d.expert_ff, h)),
                p + "ffn_gate_inp.weight": ("router", (d.experts, h)), p + "ffn_norm.weight": ("norm", (h,)),
                p + "attn_k_norm.weight": ("norm", (d.head_dim,)), p + "attn_k.weight": ("w", (kv, h)),
                p + "attn_output.weight": ("w", (h, q)), p + "attn_q_norm.weight": ("norm", (d.head_dim,)),
                p + "attn_q.weight": ("w", (q, h)), p + "attn_v.weight": ("w", (kv, h))}
    out["output_norm.weight"] = ("norm", (h,))
    return out


def tensor_type(matrices: str, name: str, kind: str, d: MoeDims) -> GGMLQuantizationType:
    """A tensor's type in a file of `matrices` (F32 or Q4_K_M): Q4_K_M as llama.cpp's quantizer mixes it for
    a model of more than 8 experts (output Q6_K; attn_v and ffn_down_exps Q6_K on use_more_bits layers)."""
    Q = GGMLQuantizationType
    if kind != "w" or matrices == "F32":
        return Q.F32  # norms and the router stay F32 in every llama.cpp quantization
    if name == "output.weight":
        return Q.Q6_K
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if (name.endswith("ffn_down_exps.weight") or name.endswith("attn_v.weight")) and more_bits(layer, d.layers):
        return Q.Q6_K
    return Q.Q4_K


def _nbytes(kind: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return int(np.prod(shape)) // block * size


def write_qwen3vlmoe_gguf(path: Path, d: MoeDims = MoeDims(), seed: int = 0, matrices: str = "F32",
                          n_vocab: int = 0, data: bool = True, vocab: Vocab | None = None,
                          name: str = "clef-bridge tiny qwen3vlmoe") -> Path:
    """A random qwen3vlmoe GGUF llama.cpp loads; n_vocab pads the vocabulary (the byte-level one unless given) to
    a real model's embedding and output sizes. data False writes the header alone and extends the file, sparse,
    to its full size: enough for llama.cpp's no_alloc load, which sizes every buffer of a real-sized model and
    reads no weight."""
    tokens, types, merges = (list(v) for v in (vocab or byte_level_vocab()))
    pad = max(n_vocab - len(tokens), 0)
    tokens += [f"<|unused_{i}|>" for i in range(pad)]
    types += [1] * pad
    rng = np.random.default_rng(seed)
    with quiet_gguf_py():  # gguf-py's INFO lines would land in serve's banner (the demo is written on first serve)
        writer = GGUFWriter(str(path), ARCH)
    writer.add_name(name)
    for key, value in (("block_count", d.layers), ("context_length", d.context), ("embedding_length", d.hidden),
                       ("feed_forward_length", d.expert_ff), ("attention.head_count", d.heads),
                       ("attention.head_count_kv", d.kv_heads), ("expert_count", d.experts),
                       ("expert_used_count", d.experts_used), ("attention.key_length", d.head_dim),
                       ("attention.value_length", d.head_dim), ("expert_feed_forward_length", d.expert_ff),
                       ("n_deepstack_layers", d.deepstack)):
        writer.add_uint32(f"{ARCH}.{key}", value)
    rot = d.head_dim // 2  # M-RoPE sections (t, h, w) over half the head, as Qwen3-Omni's [24, 20, 20] of 64
    writer.add_array(f"{ARCH}.rope.dimension_sections", [rot - 2 * (rot * 5 // 16), rot * 5 // 16, rot * 5 // 16, 0])
    writer.add_float32(f"{ARCH}.rope.freq_base", 1_000_000.0)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(QWEN3VLMOE.pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_file_type({"F32": 0, "Q4_K_M": 15}[matrices])
    specs = tensor_specs(d, len(tokens))
    kinds = {n: tensor_type(matrices, n, kind, d) for n, (kind, _) in specs.items()}
    total = 0
    for n, (_, shape) in specs.items():
        writer.add_tensor_info(n, shape, np.dtype(np.float32), _nbytes(kinds[n], shape), kinds[n])
        total += _nbytes(kinds[n], shape)
    with quiet_gguf_py():
        writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    if not data:
        writer.close()
        aligned = sum(-(-_nbytes(kinds[n], shape) // 32) * 32 for n, (_, shape) in specs.items())  # 32-byte aligned
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size + aligned + 32)
        return path
    pool = rng.integers(0, 256, min(POOL_BYTES, total), dtype=np.uint8) if matrices != "F32" else None
    for n, (kind, shape) in specs.items():
        if kinds[n] in BLOCKS:
            rows = int(np.prod(shape[:-1]))
            writer.write_tensor_data(random_blocks(kinds[n], rows, shape[-1], pool, rng).reshape(*shape[:-1], -1))
        else:
            writer.write_tensor_data(random_tensor("norm" if kind == "norm" else "w", shape, 0.05, rng))
    writer.close()
    return path
