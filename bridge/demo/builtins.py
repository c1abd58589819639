"""The embedded demo models, from numpy and gguf: a small random qwen35 GGUF with a random vision projector and
a matching random head; and a small random Clef-omni (a qwen3vlmoe GGUF, a vision + audio projector in the
converter's layout, a head).

Their answers are meaningless; they exist so that `clef-bridge serve` answers on a fresh install
before any real model is configured, with text, images (and audio on Clef-omni), and so that every part
of the pipeline can be seen working.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from ...head.config import CONFIG_NAME, HeadConfig
from ...head.weights import save_state_dict
from ..catalogue.architectures import QWEN35
from ..catalogue.releases import CLEF_FLASH, CLEF_OMNI, REAL_RELEASES
from ..gguf.writer import quiet_gguf_py
from .mmproj import AudioDims, VisionDims, write_projector
from .moe import MoeDims, write_qwen3vlmoe_gguf
from .weights import (
    BLOCKS,
    POOL_BYTES,
    Vocab,
    byte_level_vocab,
    more_bits,
    random_blocks,
    random_head,
    random_tensor,
)

DEMO_VERSION = 3  # 2: the media placeholders in the vocabulary, the projectors, Clef-omni; 3: <|video_pad|>
DEMO_DESCRIPTION = ("built-in demo: RANDOM weights, its answers are meaningless; configure a real Clef model in "
                    f"models.toml ({CLEF_FLASH.pull_command})")


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


MATRIX_TYPES = ("F32", "F16", "Q8_0", "Q4_K_M")


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
    if (name.endswith("ffn_down.weight") and more_bits(layer, d.layers)) or \
            (name.endswith("attn_v.weight") and more_bits(full.index(layer), len(full))):
        return Q.Q6_K
    return Q.Q4_K


DEMO_GGUF_NAMES = ("clef-bridge demo", "clef-bridge Clef-omni demo")  # general.name of the demos' GGUFs


def write_qwen35_gguf(path: Path, d: Qwen35Dims, seed: int, name: str = DEMO_GGUF_NAMES[0],
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
    arch = QWEN35.name
    with quiet_gguf_py():
        writer = GGUFWriter(str(path), arch)
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
    writer.add_tokenizer_pre(QWEN35.pre_tokenizer)
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


# --- the demos' files -------------------------------------------------------------------------------

# Qwen3.5's vision tower, tiny, feeding the demo's width (patch 16, merge 2: one token per 32x32 pixels)
DEMO_VISION = VisionDims()
# Clef-omni's: a thinker of few experts, a vision tower whose first two blocks also feed the backbone (deepstack),
# an audio tower of Qwen3-Omni's shape (128 mel bins, 1 s chunks of 13 tokens), all feeding the same width
OMNI_DIMS = MoeDims(hidden=DEMO_DIMS.hidden, layers=4, heads=4, kv_heads=2, head_dim=32, experts=4, experts_used=2,
                    expert_ff=128)
OMNI_VISION = VisionDims(blocks=3, deepstack=(True, True, False))
OMNI_AUDIO = AudioDims()
OMNI_HEAD = HeadConfig(hidden_size=OMNI_DIMS.hidden, width=64, routing_layers=1, layers=1, heads=4, feedforward=128)
DEMO, OMNI_DEMO = CLEF_FLASH.demo, CLEF_OMNI.demo  # the builtin values of models.toml, the demo registry's names
BUILTINS = tuple(REAL_RELEASES)
OMNI_DESCRIPTION = ("built-in Clef-omni demo (text, images, audio): RANDOM weights, its answers are meaningless; "
                    f"configure a real Clef-omni in models.toml ({CLEF_OMNI.pull_command})")
DEMO_N_CTX = 32768  # a 64-question request through the byte-level demo vocabulary needs ~20k tokens


@dataclass(frozen=True)
class OmniDemoFiles:
    folder: Path  # a folder of its own: its head's config has the one name a config has
    gguf: Path
    mmproj: Path  # <stem>.mmproj.gguf: found beside the GGUF (bridge/gguf/projector.py find_projector)
    head: Path


@dataclass(frozen=True)
class DemoFiles:
    folder: Path
    gguf: Path
    head: Path
    models_toml: Path
    mmproj: Path  # the vision projector, beside the GGUF where find_projector looks
    omni: OmniDemoFiles | None = None  # None: not written (make_demo(omni=False))


def demo_files(folder: Path, omni: bool = False) -> DemoFiles:
    sub = folder / "omni"
    parts = OmniDemoFiles(sub, sub / "omni.gguf", sub / "omni.mmproj.gguf", sub / "joint_head.safetensors")
    return DemoFiles(folder, folder / "demo.gguf", folder / "joint_head.safetensors", folder / "models.toml",
                     folder / "demo.mmproj.gguf", parts if omni else None)


def demo_folder() -> Path:
    """Where `serve` keeps the built-in demos: the cache, one folder per version."""
    from ..host.paths import cache_dir

    return cache_dir() / f"demo-v{DEMO_VERSION}"


def demo_entry(builtin: str = DEMO) -> dict[str, object]:
    """The models.toml keys of a built-in demo (its files live in the cache)."""
    files = demo_files(demo_folder(), omni=True)
    if builtin == OMNI_DEMO:
        gguf, head, description = files.omni.gguf, files.omni.head, OMNI_DESCRIPTION
    else:
        gguf, head, description = files.gguf, files.head, DEMO_DESCRIPTION
    return {"gguf": str(gguf), "head": str(head), "n_ctx": DEMO_N_CTX, "max_length": DEMO_N_CTX,
            "description": description}


def builtin_folder(builtin: str, gguf: Path) -> Path:
    """The demo folder a built-in entry's GGUF lies in (make_demo's)."""
    return gguf.parent.parent if builtin == OMNI_DEMO else gguf.parent


def _write_head(path: Path, cfg: HeadConfig, seed: int) -> None:
    save_state_dict(path, random_head(cfg, seed), "BF16")
    (path.parent / CONFIG_NAME).write_text(json.dumps(vars(cfg), indent=2))


def _replace(path: Path, write) -> None:
    """Write a file under a temporary name, then put it in place: a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    write(tmp)
    tmp.replace(path)


def _models_toml(files: DemoFiles) -> str:
    def entry(name: str, gguf: Path, head: Path, description: str) -> str:
        return (f'\n[models.{name}]\ngguf = "{gguf.relative_to(files.folder)}"\n'
                f'head = "{head.relative_to(files.folder)}"\nn_ctx = {DEMO_N_CTX}\nmax_length = {DEMO_N_CTX}\n'
                f'description = "{description}"\n')

    text = '# The built-in demos: random weights, meaningless answers.\ndefault = "demo"\n'
    text += entry(DEMO, files.gguf, files.head, DEMO_DESCRIPTION)
    if files.omni is not None:
        text += entry(OMNI_DEMO, files.omni.gguf, files.omni.head, OMNI_DESCRIPTION)
    return text


def make_demo(folder: str | Path, seed: int = 0, omni: bool = True) -> DemoFiles:
    """Write the demo GGUF, its vision projector, head, config and a models.toml serving them (idempotent,
    deterministic); with omni the Clef-omni demo too."""
    files = demo_files(Path(folder).resolve(), omni)
    files.folder.mkdir(parents=True, exist_ok=True)
    with open(files.folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = files.folder / "demo.json"
        wanted = {"version": DEMO_VERSION, "seed": seed, "omni": omni}
        wanted_files = [files.gguf, files.head, files.mmproj, files.models_toml]
        if files.omni is not None:
            wanted_files += [files.omni.gguf, files.omni.mmproj, files.omni.head]
        if all(f.is_file() for f in wanted_files) and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
            return files
        stamp.unlink(missing_ok=True)  # a build cut short leaves no stamp: the next one starts again
        _replace(files.gguf, lambda p: write_qwen35_gguf(p, DEMO_DIMS, seed))
        _replace(files.mmproj, lambda p: write_projector(p, DEMO_DIMS.hidden, seed + 2, DEMO_VISION))
        _write_head(files.head, DEMO_HEAD, seed + 1)
        if files.omni is not None:
            files.omni.folder.mkdir(exist_ok=True)
            _replace(files.omni.gguf, lambda p: write_qwen3vlmoe_gguf(p, OMNI_DIMS, seed + 10,
                                                                       name=DEMO_GGUF_NAMES[1]))
            _replace(files.omni.mmproj, lambda p: write_projector(p, OMNI_DIMS.hidden, seed + 12, OMNI_VISION,
                                                                  OMNI_AUDIO, name="clef-bridge Clef-omni demo"))
            _write_head(files.omni.head, OMNI_HEAD, seed + 11)
        files.models_toml.write_text(_models_toml(files))
        stamp.write_text(json.dumps(wanted))
    return files
