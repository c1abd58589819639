"""The embedded demo model: a small random qwen35 GGUF and a matching random head, from numpy and gguf.

Its answers are meaningless; it exists so that `clef-bridge serve` answers on a fresh install
before any real model is configured, and so that every part of the pipeline can be seen working.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from ...head.config import CONFIG_NAME, HeadConfig
from ...head.weights import expected_shapes, save_state_dict
from ..gguf.writer import quiet_gguf_py

DEMO_VERSION = 1
DEMO_DESCRIPTION = ("built-in demo: RANDOM weights, its answers are meaningless; configure a real Clef model in "
                    "models.toml (clef-bridge pull clef-flash)")
SPECIALS = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("</think>", 4)]
MERGES = ["Ġ t", "Ġ a", "h e", "i n", "t h", "e r", "Ġ s", "o n", "r e", "Ġ o", "a n", "e s"]


@dataclass(frozen=True)
class Qwen35Dims:
    """Shapes of a Qwen3.5 hybrid backbone (Gated DeltaNet + full attention every `interval` layers)."""

    hidden: int = 128
    layers: int = 4
    interval: int = 4
    ff: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    linear_k_heads: int = 2
    linear_v_heads: int = 4
    linear_k_dim: int = 32
    linear_v_dim: int = 32
    conv_kernel: int = 4
    context: int = 32768

    def is_full(self, layer: int) -> bool:
        return (layer + 1) % self.interval == 0


DEMO_DIMS = Qwen35Dims()
DEMO_HEAD = HeadConfig(hidden_size=DEMO_DIMS.hidden, width=64, routing_layers=1, layers=1, heads=4, feedforward=128)


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """GPT-2 style byte-level tokens, a few merges, and the special tokens the prompt uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tokens = [chars[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = [1] * len(tokens)
    for text, kind in SPECIALS:
        tokens.append(text)
        types.append(kind)
    return tokens, types, list(MERGES)


def tensor_specs(d: Qwen35Dims, n_vocab: int) -> dict[str, tuple[str, tuple[int, ...], float]]:
    """name -> (kind, numpy shape [ne1, ne0], scale) of every tensor, in file order.

    Kinds: "w" a weight matrix, "norm" a gain around one, "ssm_a" DeltaNet's negative decay, "bias".
    """
    h = d.hidden
    out = {"token_embd.weight": ("w", (n_vocab, h), 0.5), "output.weight": ("w", (n_vocab, h), 0.5),
           "output_norm.weight": ("norm", (h,), 0)}
    w = lambda rows, cols, scale=0.05: ("w", (rows, cols), scale)  # noqa: E731
    norm = lambda n: ("norm", (n,), 0)  # noqa: E731
    inner = d.linear_v_heads * d.linear_v_dim
    conv = 2 * d.linear_k_heads * d.linear_k_dim + inner
    for i in range(d.layers):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": norm(h), p + "post_attention_norm.weight": norm(h),
                p + "ffn_gate.weight": w(d.ff, h), p + "ffn_up.weight": w(d.ff, h), p + "ffn_down.weight": w(h, d.ff)}
        if d.is_full(i):
            out |= {p + "attn_q.weight": w(2 * d.heads * d.head_dim, h),
                    p + "attn_k.weight": w(d.kv_heads * d.head_dim, h),
                    p + "attn_v.weight": w(d.kv_heads * d.head_dim, h),
                    p + "attn_output.weight": w(h, d.heads * d.head_dim),
                    p + "attn_q_norm.weight": norm(d.head_dim), p + "attn_k_norm.weight": norm(d.head_dim)}
        else:
            out |= {p + "attn_qkv.weight": w(conv, h), p + "attn_gate.weight": w(inner, h),
                    p + "ssm_a": ("ssm_a", (d.linear_v_heads,), 0), p + "ssm_dt.bias": ("bias", (d.linear_v_heads,), 0),
                    p + "ssm_alpha.weight": w(d.linear_v_heads, h), p + "ssm_beta.weight": w(d.linear_v_heads, h),
                    p + "ssm_conv1d.weight": w(conv, d.conv_kernel, 0.3), p + "ssm_norm.weight": norm(d.linear_v_dim),
                    p + "ssm_out.weight": w(h, inner)}
    return out


def random_tensor(kind: str, shape: tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """float32 values of a plausible scale for one tensor_specs entry."""
    if kind == "w":
        return (scale * rng.standard_normal(shape)).astype(np.float32)
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "ssm_a":
        return -np.exp(rng.uniform(-1, 1, shape)).astype(np.float32)
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


# Random quantized blocks: (bytes per block, offset of the f16 scale d, offset of a second f16 (dmin) or
# None, the weight std per unit of d). Q4_K's w = d*sc*q - dmin*m (dmin = 7.5 d centres it), Q6_K's
# w = d*sc*(q - 32), Q8_0's w = d*q; random bytes give the quants and sub-block scales.
BLOCKS = {GGMLQuantizationType.Q8_0: (34, 0, None, 73.0), GGMLQuantizationType.Q4_K: (144, 0, 2, 243.0),
          GGMLQuantizationType.Q6_K: (210, 208, None, 1350.0)}
POOL_BYTES = 64 << 20  # random bytes made once; each tensor copies a stretch of them from a random offset
MATRIX_TYPES = ("F32", "F16", "Q8_0", "Q4_K_M")


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # llama.cpp's use_more_bits


def matrix_type(matrices: str, name: str, d: Qwen35Dims) -> GGMLQuantizationType:
    """A weight matrix's type in a file of `matrices`: Q4_K_M as llama.cpp's quantizer mixes it (output,
    and ffn_down / attn_v on its use_more_bits layers, in Q6_K)."""
    Q = GGMLQuantizationType
    if matrices in ("F32", "F16", "Q8_0") or "ssm_conv1d" in name:
        return Q.F32 if matrices == "F32" or "ssm_conv1d" in name else Q[matrices]
    if name == "output.weight":
        return Q.Q6_K
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    full = [i for i in range(d.layers) if d.is_full(i)]
    if (name.endswith("ffn_down.weight") and _more_bits(layer, d.layers)) or \
            (name.endswith("attn_v.weight") and _more_bits(full.index(layer), len(full))):
        return Q.Q6_K
    return Q.Q4_K


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, pool: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """A [rows, cols] matrix of random qtype blocks (weights of std ~1/sqrt(cols)): uint8 [rows, row bytes]."""
    size, at, second, spread = BLOCKS[qtype]
    per_row = cols // GGML_QUANT_SIZES[qtype][0]
    start = int(rng.integers(0, len(pool)))
    raw = np.resize(pool[start:], rows * per_row * size).reshape(rows * per_row, size)  # a copy, repeated as needed
    raw[:, at:at + 2] = np.float16(1 / (np.sqrt(cols) * spread)).reshape(1).view(np.uint8)
    if second is not None:
        raw[:, second:second + 2] = np.float16(7.5 / (np.sqrt(cols) * spread)).reshape(1).view(np.uint8)
    return raw.reshape(rows, per_row * size)


Vocab = tuple[list[str], list[int], list[str]]  # tokens, token types, merges


def write_qwen35_gguf(path: Path, d: Qwen35Dims, seed: int, name: str = "clef-bridge demo",
                      matrices: str = "F32", n_vocab: int = 0, vocab: Vocab | None = None) -> None:
    """A random qwen35 GGUF that llama.cpp loads and runs, written one tensor at a time.

    matrices: F32 or F16 (random normal), Q8_0 or Q4_K_M (random blocks, no float weights made);
    norms and DeltaNet's small tensors stay F32. vocab: the byte-level one unless given (it must
    hold the prompt's special tokens); n_vocab pads it with tokens no text produces, for a real
    model's embedding and output sizes.
    """
    tokens, types, merges = (list(v) for v in (vocab or byte_level_vocab()))
    pad = max(n_vocab - len(tokens), 0)
    tokens += [f"<|unused_{i}|>" for i in range(pad)]
    types += [1] * pad
    rng = np.random.default_rng(seed)
    with quiet_gguf_py():
        writer = GGUFWriter(str(path), "qwen35")
    arch = "qwen35"
    writer.add_name(name)
    writer.add_uint32(f"{arch}.block_count", d.layers)
    writer.add_uint32(f"{arch}.context_length", d.context)
    writer.add_uint32(f"{arch}.embedding_length", d.hidden)
    writer.add_uint32(f"{arch}.feed_forward_length", d.ff)
    writer.add_uint32(f"{arch}.attention.head_count", d.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", d.kv_heads)
    writer.add_uint32(f"{arch}.attention.key_length", d.head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", d.head_dim)
    rot = d.head_dim // 4  # partial rotary factor 0.25
    writer.add_uint32(f"{arch}.rope.dimension_count", rot)
    writer.add_array(f"{arch}.rope.dimension_sections", [rot // 2 - 2 * (rot // 6), rot // 6, rot // 6, 0])
    writer.add_float32(f"{arch}.rope.freq_base", 10_000_000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", d.conv_kernel)
    writer.add_uint32(f"{arch}.ssm.state_size", d.linear_k_dim)
    writer.add_uint32(f"{arch}.ssm.group_count", d.linear_k_heads)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", d.linear_v_heads)
    writer.add_uint32(f"{arch}.ssm.inner_size", d.linear_v_heads * d.linear_v_dim)
    writer.add_array(f"{arch}.attention.recurrent_layers", [not d.is_full(i) for i in range(d.layers)])
    writer.add_uint32(f"{arch}.full_attention_interval", d.interval)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_K_M": 15}[matrices])
    specs = tensor_specs(d, len(tokens))
    kinds = {n: matrix_type(matrices, n, d) if kind == "w" else GGMLQuantizationType.F32
             for n, (kind, _, _) in specs.items()}
    total = 0
    for n, (_, shape, _) in specs.items():
        block, size = GGML_QUANT_SIZES[kinds[n]]
        writer.add_tensor_info(n, shape, np.dtype(np.float32), int(np.prod(shape)) // block * size, kinds[n])
        total += int(np.prod(shape)) // block * size
    with quiet_gguf_py():
        writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pool = rng.integers(0, 256, min(POOL_BYTES, total), dtype=np.uint8) if matrices in ("Q8_0", "Q4_K_M") else None
    for n, (kind, shape, scale) in specs.items():
        if kinds[n] in BLOCKS:
            writer.write_tensor_data(random_blocks(kinds[n], *shape, pool, rng))
        else:
            data = random_tensor(kind, shape, scale, rng)
            writer.write_tensor_data(data.astype(np.float16) if kinds[n] == GGMLQuantizationType.F16 else data)
    writer.close()


DEMO_SCALARS = {"prior_logit_scale": 1.0, "joint_logit_scale": 2.0, "residual_gate": 0.5}


def random_head(cfg: HeadConfig, seed: int, scalars: dict[str, float] = DEMO_SCALARS) -> dict[str, np.ndarray]:
    """Float32 weights of a plausible scale for every tensor the config implies.

    The released scalars are trained; zeros would make the joint path vanish, so they get weight.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(expected_shapes(cfg).items()):
        if name in scalars:
            out[name] = np.float32(scalars[name]).reshape(())
        elif len(shape) == 2:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        elif name.endswith("weight"):  # norm gains around one
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


@dataclass(frozen=True)
class DemoFiles:
    folder: Path
    gguf: Path
    head: Path
    models_toml: Path


def demo_files(folder: Path) -> DemoFiles:
    return DemoFiles(folder, folder / "demo.gguf", folder / "joint_head.safetensors", folder / "models.toml")


DEMO_N_CTX = 32768  # a 64-question request through the byte-level demo vocabulary needs ~20k tokens


def demo_entry() -> dict[str, object]:
    """The models.toml keys of the built-in demo (its files live in the cache)."""
    from ..host.paths import cache_dir

    files = demo_files(cache_dir() / f"demo-v{DEMO_VERSION}")
    return {"gguf": str(files.gguf), "head": str(files.head), "n_ctx": DEMO_N_CTX, "max_length": DEMO_N_CTX,
            "description": DEMO_DESCRIPTION}


def make_demo(folder: str | Path, seed: int = 0) -> DemoFiles:
    """Write the demo GGUF, head, config and a models.toml serving them (idempotent, deterministic)."""
    files = demo_files(Path(folder).resolve())
    files.folder.mkdir(parents=True, exist_ok=True)
    with open(files.folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = files.folder / "demo.json"
        wanted = {"version": DEMO_VERSION, "seed": seed}
        complete = files.gguf.is_file() and files.head.is_file()
        if complete and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
            return files
        write_qwen35_gguf(files.gguf.with_suffix(".tmp"), DEMO_DIMS, seed)
        files.gguf.with_suffix(".tmp").replace(files.gguf)
        save_state_dict(files.head, random_head(DEMO_HEAD, seed + 1), "BF16")
        (files.folder / CONFIG_NAME).write_text(json.dumps(vars(DEMO_HEAD), indent=2))
        files.models_toml.write_text(
            '# The built-in demo: random weights, meaningless answers.\n'
            'default = "demo"\n\n[models.demo]\ngguf = "demo.gguf"\nhead = "joint_head.safetensors"\n'
            f'n_ctx = {DEMO_N_CTX}\nmax_length = {DEMO_N_CTX}\n'
            f'description = "{DEMO_DESCRIPTION}"\n')
        stamp.write_text(json.dumps(wanted))
    return files
