"""Published dimensions of the Clef backbones, as memory-plan Archs for `fit --arch` (no files needed).

Clef-flash (Qwen3.5-9B) and Clef (Qwen3.8-27B) take llama.cpp's average bits per weight of each preset;
Clef-omni (Qwen3-Omni-30B-A3B's thinker) takes each tensor's own type, as llama.cpp's quantizer mixes
them, because which bytes are experts decides how many blocks' experts must leave the GPU.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..catalogue.architectures import QWEN3VLMOE
from ..catalogue.releases import CLEF_27B, CLEF_FLASH, CLEF_OMNI
from ..gguf.projector import ProjectorInfo, compute_bytes
from .memory_plan import Arch, ProjectorSizes, TensorSize

# Published dimensions: Qwen3.5-9B (Clef-flash) and Qwen3.8-27B (Clef), text model only.
ARCHES = {
    CLEF_FLASH.name: dict(n_layer=32, n_embd=CLEF_FLASH.width, ff=12288, n_head=16, n_head_kv=4, head_dim=256,
                          n_vocab=248320, linear_k_heads=16, linear_v_heads=32, linear_dim=128,
                          head_hidden=CLEF_FLASH.width),
    CLEF_27B.name: dict(n_layer=64, n_embd=CLEF_27B.width, ff=17408, n_head=24, n_head_kv=4, head_dim=256,
                        n_vocab=248320, linear_k_heads=16, linear_v_heads=48, linear_dim=128,
                        head_hidden=CLEF_27B.width),
    # Qwen/Qwen3-Omni-30B-A3B-Instruct's config.json, thinker_config.text_config: 48 layers, all full attention,
    # every FFN 128 experts of width 768 with 8 used, 32 query / 4 KV heads of 128, vocab_size 152,064 (the
    # converter writes that many tokens), 65,536 positions; vision deepstack_visual_indexes [8, 16, 24].
    CLEF_OMNI.name: dict(n_layer=48, n_embd=CLEF_OMNI.width, ff=768, n_head=32, n_head_kv=4, head_dim=128,
                         n_vocab=152064, n_expert=128, n_expert_used=8, n_ctx_train=65536, n_deepstack=3,
                         head_hidden=CLEF_OMNI.width),
}
# Bytes per weight of llama.cpp's presets for the big matrices (blocks of 32 or 256 with scales).
BITS = {"F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_K_M": 5.69, "Q4_K_M": 4.89, "F32": 32.0}
OUTPUT_TYPE = {"Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K"}  # presets keep output.weight finer


def arch_preset(name: str, quant: str) -> Arch:
    """An Arch from published dimensions, for plans without the files (`fit --arch clef-flash`)."""
    if name not in ARCHES:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(ARCHES)}")
    if quant not in BITS:
        raise KeyError(f"unknown quantization {quant!r}; known: {', '.join(BITS)}")
    d = ARCHES[name]
    if "n_expert" in d:
        return _moe_preset(name, quant, d)
    h, L = d["n_embd"], d["n_layer"]
    kh, vh, dim = d["linear_k_heads"], d["linear_v_heads"], d["linear_dim"]
    inner = vh * dim
    full = tuple((i + 1) % 4 == 0 for i in range(L))

    def size(params: int, qtype: str = quant) -> int:
        return int(params * BITS[qtype] / 8)

    tensors = [TensorSize("token_embd.weight", quant, size(d["n_vocab"] * h), None),
               TensorSize("output.weight", OUTPUT_TYPE.get(quant, quant),
                          size(d["n_vocab"] * h, OUTPUT_TYPE.get(quant, quant)), L),
               TensorSize("output_norm.weight", "F32", 4 * h, L)]
    for i in range(L):
        if full[i]:
            attn = h * 2 * d["n_head"] * d["head_dim"] + 2 * h * d["n_head_kv"] * d["head_dim"] + \
                d["n_head"] * d["head_dim"] * h
        else:
            attn = h * (2 * kh * dim + inner) + h * inner + 2 * h * vh + inner * h + 4 * (2 * kh * dim + inner)
        tensors.append(TensorSize(f"blk.{i}.attn", quant, size(attn), i))
        tensors.append(TensorSize(f"blk.{i}.ffn", quant, size(3 * h * d["ff"]), i))
        tensors.append(TensorSize(f"blk.{i}.norms", "F32", 4 * 2 * h, i))
    return Arch(name=f"{name} {quant}", n_layer=L, full=full, n_embd=h, n_vocab=d["n_vocab"], n_head=d["n_head"],
                n_head_kv=d["n_head_kv"], head_dim=d["head_dim"], ff=d["ff"], ssm_conv=4, ssm_inner=inner,
                ssm_state=dim, ssm_group=kh, ssm_heads=vh, n_ctx_train=262144, tensors=tuple(tensors))


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # llama.cpp's use_more_bits (llama-quant.cpp)


# quant -> (most matrices, attn_v and ffn_down on use_more_bits layers, output.weight), as llama-quant.cpp
# picks them for a model of more than 8 experts; norms and the router (ffn_gate_inp) stay F32
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K", "Q6_K"), "Q6_K": ("Q6_K", "Q6_K", "Q6_K"),
         "Q8_0": ("Q8_0", "Q8_0", "Q8_0"), "F16": ("F16", "F16", "F16"), "BF16": ("BF16", "BF16", "BF16"),
         "F32": ("F32", "F32", "F32")}


def type_bytes(qtype: str, n: int) -> int:
    """Bytes of n weights stored as qtype (whole blocks)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return n // block * size


def _moe_preset(name: str, quant: str, d: dict) -> Arch:
    """A qwen3vlmoe Arch tensor by tensor (the names llama.cpp's converter writes)."""
    h, L, ff, E = d["n_embd"], d["n_layer"], d["ff"], d["n_expert"]
    q, kv = d["n_head"] * d["head_dim"], d["n_head_kv"] * d["head_dim"]
    base, more, out = MIXES[quant]
    tensors = [TensorSize("token_embd.weight", base, type_bytes(base, d["n_vocab"] * h), None),
               TensorSize("output.weight", out, type_bytes(out, d["n_vocab"] * h), L),
               TensorSize("output_norm.weight", "F32", 4 * h, L)]
    for i in range(L):
        fine = more if _more_bits(i, L) else base
        for tensor, qtype, n, expert in (("attn_q", base, h * q, False), ("attn_k", base, h * kv, False),
                                         ("attn_v", fine, h * kv, False), ("attn_output", base, q * h, False),
                                         ("ffn_gate_exps", base, E * ff * h, True),
                                         ("ffn_up_exps", base, E * ff * h, True),
                                         ("ffn_down_exps", fine, E * ff * h, True),
                                         ("ffn_gate_inp", "F32", E * h, False),
                                         ("norms", "F32", 2 * h + 2 * d["head_dim"], False)):
            tensors.append(TensorSize(f"blk.{i}.{tensor}.weight", qtype, type_bytes(qtype, n), i, expert))
    return Arch(name=f"{name} {quant}", n_layer=L, full=(True,) * L, n_embd=h, n_vocab=d["n_vocab"],
                n_head=d["n_head"], n_head_kv=d["n_head_kv"], head_dim=d["head_dim"], ff=ff, ssm_conv=0,
                ssm_inner=0, ssm_state=0, ssm_group=0, ssm_heads=0, n_ctx_train=d["n_ctx_train"],
                tensors=tuple(tensors), n_expert=E, n_expert_used=d["n_expert_used"], ff_expert=ff,
                n_deepstack=d["n_deepstack"], every_token_output=QWEN3VLMOE.every_token_output)


def omni_projector() -> ProjectorSizes:
    """Clef-omni's projector from published dimensions (Qwen3-Omni's vision encoder, F16 as mmproj-*-f16.gguf
    stores it, and its audio tower in float32). Vision: 27 blocks of width 1152 (ff 4304), patches 2x16x16, 2304
    positions, a merger and three deepstack mergers 4608 -> 4608 -> 2048; audio: 3 convolutions of 480 channels,
    a 7680 -> 1280 projection, 32 layers of width 1280 (ff 5120), 1280 -> 1280 -> 2048 out. Matrices F16, vectors
    F32 (as the converter writes them)."""
    w, f, m = 1152, 4304, 4608
    v_matrices = 3 * 2 * 16 * 16 * w + 2304 * w + 27 * (w * 3 * w + w * w + 2 * w * f) + 4 * (m * m + m * 2048)
    v_vectors = 27 * (3 * w + w + f + w + 4 * w) + 2 * w + 3 * 2 * m + 4 * (m + 2048)
    a, af = 1280, 5120
    layer = 4 * a * a + 2 * a * af + 4 * a + af + a + 4 * a  # q, k, v, out, fc1, fc2, their biases, 2 layer norms
    a_params = 9 * 480 + 2 * 480 * 480 * 9 + 3 * 480 + 7680 * a + 32 * layer + 2 * a + a * a + a + a * 2048 + 2048
    info = ProjectorInfo("qwen3vl_merger", 2048, 16, 2, True, 0, w, f)
    return ProjectorSizes(2 * v_matrices + 4 * v_vectors, compute_bytes(info, QWEN3VLMOE.image_tokens[1]),
                          4 * a_params)
