"""GPU memory plans for a Clef GGUF and its head, with Qwen3.5's hybrid layers counted right.

Only the full-attention layers (one in four) keep a KV cache; the Gated DeltaNet layers keep a
fixed-size recurrent state per parallel sequence. Charging KV to every layer overstates the
context cost four times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...head.config import HeadConfig
from ...head.errors import ClefError
from ...head.weights import stored_bytes
from ..gguf.clef_format import is_head_tensor
from ..gguf.reader import GGUFInfo, read_gguf
from ..host.gpu import GpuMemory, read_gpu
from ..llama.backbone import BackboneOptions

MIB = 1 << 20
GIB = 1 << 30
KV_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "q8_0": 34 / 32}
MARGIN_FIXED = 512 * MIB  # CUDA context, cuBLAS workspace, fragmentation
MARGIN_SHARE = 0.03


@dataclass(frozen=True)
class TensorSize:
    name: str
    type: str
    nbytes: int
    layer: int | None  # block index; None for token_embd; n_layer for the output layer


@dataclass(frozen=True)
class Arch:
    """What a memory plan needs to know about a backbone."""

    name: str
    n_layer: int
    full: tuple[bool, ...]  # full attention per layer
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ff: int
    ssm_conv: int
    ssm_inner: int
    ssm_state: int
    ssm_group: int
    ssm_heads: int  # DeltaNet value heads
    n_ctx_train: int
    tensors: tuple[TensorSize, ...] = field(repr=False)

    @property
    def n_full(self) -> int:
        return sum(self.full)

    @property
    def recurrent_row(self) -> int:
        """Floats of recurrent state per linear layer and sequence (llama.cpp's n_embd_r + n_embd_s)."""
        conv = (self.ssm_conv - 1) * (self.ssm_inner + 2 * self.ssm_group * self.ssm_state)
        return conv + self.ssm_state * self.ssm_inner


def _layer_of(name: str, n_layer: int) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    if name == "token_embd.weight":
        return None
    return n_layer  # output.weight, output_norm.weight


# Architectures whose every layer is full attention (a KV cache each; no recurrent layers): Qwen3-Omni's thinker
FULL_ATTENTION_ARCHITECTURES = frozenset({"qwen3vlmoe"})


def layer_pattern(info: GGUFInfo) -> list[bool] | None:
    """True for each full-attention layer (the ones with a KV cache), from the GGUF's metadata."""
    n_layers = info.arch_key("block_count")
    if info.architecture in FULL_ATTENTION_ARCHITECTURES and isinstance(n_layers, int):
        return [True] * n_layers
    recurrent = info.arch_key("attention.recurrent_layers")
    if isinstance(recurrent, np.ndarray) and len(recurrent):
        return [not bool(r) for r in recurrent]
    interval = info.arch_key("full_attention_interval")
    if isinstance(n_layers, int) and isinstance(interval, int) and interval > 0:
        return [(i + 1) % interval == 0 for i in range(n_layers)]
    return None


class PlanError(ClefError):
    """The GGUF lacks what a memory plan needs."""

    error_type = "plan_error"


def arch_from_gguf(info: GGUFInfo) -> Arch:
    """What a memory plan needs, from a GGUF header; PlanError names every missing key."""
    a = info.arch_key
    required = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                "feed_forward_length")
    missing = [f"{info.architecture}.{k}" for k in required if not isinstance(a(k), int)]
    pattern = layer_pattern(info)
    if pattern is None:
        missing.append(f"{info.architecture}.attention.recurrent_layers or .full_attention_interval")
    if missing:
        raise PlanError(f"{info.path}: no memory plan: the GGUF lacks {', '.join(missing)}",
                        fix=f"run `clef-bridge check {info.path}`; convert the model again with llama.cpp's converter")
    n_layer = int(a("block_count"))
    full = tuple(pattern)
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    output = info.tensors.get("output.weight") or info.tensors.get("token_embd.weight")
    tensors = tuple(TensorSize(t.name, getattr(t.type, "name", str(t.type)), t.n_bytes or 0,
                               _layer_of(t.name, n_layer)) for t in info.tensors.values()
                    if not is_head_tensor(t.name))  # a clef GGUF's head runs in numpy/CuPy, not in llama.cpp
    return Arch(name=info.path.name, n_layer=n_layer, full=full, n_embd=int(a("embedding_length")),
                n_vocab=int(getattr(tokens, "count", None) or (output.shape[1] if output else 0)),
                n_head=int(a("attention.head_count")), n_head_kv=int(a("attention.head_count_kv")),
                head_dim=int(a("attention.key_length") or a("embedding_length") // a("attention.head_count")),
                ff=int(a("feed_forward_length")), ssm_conv=int(a("ssm.conv_kernel") or 0),
                ssm_inner=int(a("ssm.inner_size") or 0), ssm_state=int(a("ssm.state_size") or 0),
                ssm_group=int(a("ssm.group_count") or 0), ssm_heads=int(a("ssm.time_step_rank") or 0),
                n_ctx_train=int(a("context_length") or 0),
                tensors=tensors)


# Published dimensions: Qwen3.5-9B (Clef-flash) and Qwen3.8-27B (Clef), text model only.
ARCHES = {
    "clef-flash": dict(n_layer=32, n_embd=4096, ff=12288, n_head=16, n_head_kv=4, head_dim=256, n_vocab=248320,
                       linear_k_heads=16, linear_v_heads=32, linear_dim=128, head_hidden=4096),
    "clef": dict(n_layer=64, n_embd=5120, ff=17408, n_head=24, n_head_kv=4, head_dim=256, n_vocab=248320,
                 linear_k_heads=16, linear_v_heads=48, linear_dim=128, head_hidden=5120),
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


def head_params(hidden: int, width: int = 1024, routing: int = 2, layers: int = 4, ff: int = 4096) -> int:
    """Parameters of JointSchemaHead (121,762,820 at Clef-flash shape)."""
    attn = 3 * width * width + 3 * width + width * width + width
    norm = 2 * width
    evidence = 3 * norm + attn + 2 * width * ff + ff + width
    decoder = 2 * attn + 2 * width * ff + ff + width + 3 * norm
    return (3 + 2 * hidden + 6 * hidden * width + 3 * width + routing * evidence + norm + layers * decoder
            + 2 * norm + 4 * width * width + width + width + 1)


@dataclass(frozen=True)
class Plan:
    arch: str
    ctx: int
    parallel: int
    n_ubatch: int
    kv_type: str
    fits: bool
    weights_bytes: int  # on the GPU
    weights_by_type: dict[str, int]
    cpu_weights_bytes: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    compute_bytes: int
    head_bytes: int  # on the GPU (0 when the head runs on the CPU)
    margin_bytes: int
    total_bytes: int
    vram_bytes: int
    max_ctx: int  # largest context that fits with every layer on the GPU (0: none does)
    n_gpu_layers: int  # -1 when all fit; else the most layers that do
    vision_bytes: int = 0  # the vision projector's weights and compute buffer (0: none)

    def summary(self) -> dict[str, int | bool]:
        return {"fits": self.fits, "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "recurrent_state_bytes": self.recurrent_state_bytes, "compute_bytes": self.compute_bytes,
                "head_bytes": self.head_bytes, "vision_bytes": self.vision_bytes, "total_bytes": self.total_bytes,
                "vram_bytes": self.vram_bytes, "max_ctx": self.max_ctx, "n_gpu_layers": self.n_gpu_layers}


def pad_ctx(ctx: int) -> int:
    return -(-ctx // 256) * 256  # llama.cpp rounds the KV cache up to 256 cells


def kv_cache_bytes(arch: Arch, ctx: int, kv_type: str = "f16", layers: set[int] | None = None) -> int:
    n = sum(1 for i, f in enumerate(arch.full) if f and (layers is None or i in layers))
    return int(n * 2 * arch.n_head_kv * arch.head_dim * pad_ctx(ctx) * KV_BYTES[kv_type])


def recurrent_bytes(arch: Arch, parallel: int, layers: set[int] | None = None) -> int:
    n = sum(1 for i, f in enumerate(arch.full) if not f and (layers is None or i in layers))
    return n * arch.recurrent_row * 4 * max(parallel, 1)


def compute_bytes(arch: Arch, ctx: int, n_ubatch: int, flash_attn: bool = True) -> int:
    """llama.cpp's compute buffer for one ubatch, fitted to its own reports on the test backbones:
    the DeltaNet's chunked intermediates (64-token chunks: 512 floats per token and value head), 4.5
    floats per channel of the widest layer (FFN or DeltaNet conv), and without flash attention the KQ
    matrix (1.2x, for its softmax). Outputs are one per sequence, so the logits stay small.
    """
    conv = 2 * arch.ssm_group * arch.ssm_state + arch.ssm_inner
    out = n_ubatch * (512 * arch.ssm_heads + 4.5 * max(arch.ff, conv)) * 4
    if not flash_attn:
        out += 1.2 * n_ubatch * pad_ctx(ctx) * arch.n_head * 4
    return int(out)


def _gpu_layers(arch: Arch, ngl: int) -> set[int]:
    """Blocks (and n_layer, the output layer) llama.cpp puts on the GPU for n_gpu_layers = ngl."""
    ngl = arch.n_layer + 1 if ngl < 0 else ngl
    start = max(arch.n_layer + 1 - ngl, 0)
    return set(range(start, arch.n_layer + 1))


def _total(arch: Arch, ctx: int, parallel: int, n_ubatch: int, kv_type: str, head: int, ngl: int,
           vram: int) -> tuple[int, int, int, int, int, int, dict[str, int]]:
    on_gpu = _gpu_layers(arch, ngl)
    by_type: dict[str, int] = {}
    weights = 0
    for t in arch.tensors:
        if t.layer is not None and t.layer in on_gpu:
            weights += t.nbytes
            by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
    kv = kv_cache_bytes(arch, ctx, kv_type, on_gpu)
    rs = recurrent_bytes(arch, parallel, on_gpu)
    compute = compute_bytes(arch, ctx, n_ubatch) if on_gpu else 0
    margin = MARGIN_FIXED + int(MARGIN_SHARE * vram)
    return weights + kv + rs + compute + head + margin, weights, kv, rs, compute, margin, by_type


def plan(arch: Arch, vram_bytes: int, ctx: int = 16384, parallel: int = 1, n_ubatch: int = 512,
         kv_type: str = "f16", head_bytes: int = 0, vision_bytes: int = 0) -> Plan:
    """Everything on the GPU if it fits; else the most layers that do, and the largest context. The
    vision projector (vision_bytes) goes on the GPU whenever the backbone uses one."""
    args = (parallel, n_ubatch, kv_type, head_bytes + vision_bytes)
    total, weights, kv, rs, compute, margin, by_type = _total(arch, ctx, *args, -1, vram_bytes)
    fits = total <= vram_bytes
    ngl = -1
    if not fits:
        ngl = next((g for g in range(arch.n_layer, -1, -1)
                    if _total(arch, ctx, *args, g, vram_bytes)[0] <= vram_bytes), 0)
    max_ctx, step = 0, 256
    hi = max(arch.n_ctx_train, 256)
    lo = 0
    while lo < hi:  # largest multiple of 256 whose full offload fits
        mid = (lo + hi + step) // (2 * step) * step
        if _total(arch, mid, *args, -1, vram_bytes)[0] <= vram_bytes:
            lo = mid
        else:
            hi = mid - step
    max_ctx = lo
    cpu = sum(t.nbytes for t in arch.tensors) - weights
    return Plan(arch.name, ctx, parallel, n_ubatch, kv_type, fits, weights, by_type, cpu, kv, rs, compute,
                head_bytes, margin, total, vram_bytes, max_ctx, ngl, vision_bytes)


def serving_plan(gguf: str | Path, options: BackboneOptions, head_bytes: int, vram_bytes: int,
                 vision_bytes: int = 0) -> Plan:
    """THE plan for one model: what `serve` loads with and what `fit GGUF` prints (one function, so
    the two agree). head_bytes: the head's bytes on this GPU (head_gpu_bytes), 0 on the CPU;
    vision_bytes: the projector's weights and compute buffer. A prefix cache adds its recurrent slots
    (prefix_cache_sequences) and KV cells (prefix_cache_cells) to the context."""
    return options_plan(arch_from_gguf(read_gguf(gguf)), options, head_bytes, vram_bytes, vision_bytes)


def options_plan(arch: Arch, options: BackboneOptions, head_bytes: int, vram_bytes: int, vision_bytes: int = 0) -> Plan:
    """The plan for a backbone loaded with these options (a prefix cache's sequences and cells included)."""
    cache = options.prefix_cache if options.prefix_cache and options.prefix_cache.max_mb > 0 else None
    ctx = options.n_ctx + (cache.extra_cells if cache else 0)
    parallel = options.n_seq_max + (cache.sequences if cache else 0)
    return plan(arch, vram_bytes, ctx, parallel, options.n_ubatch, options.kv_type, head_bytes=head_bytes,
                vision_bytes=vision_bytes)


def head_gpu_bytes(config: HeadConfig, head_device: str, head_dtype: str) -> int:
    """The head's parameters on the GPU (head_dtype's storage), or 0 when it runs on the CPU."""
    return stored_bytes(config, head_dtype) if head_device == "cuda" else 0


def parse_size(text: str) -> int:
    """'16GiB', '24GB', '8000MiB', '16' (GiB) -> bytes."""
    units = {"gib": GIB, "gb": 10**9, "mib": MIB, "mb": 10**6, "g": GIB, "m": MIB, "": GIB}
    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    if unit not in units or not number:
        raise ValueError(f"cannot read the size {text!r}; write e.g. 16GiB, 24GB or 12000MiB")
    return int(float(number) * units[unit])


def gpu_layers_for(gguf: Path, options: BackboneOptions, head_bytes: int,
                   read: Callable[[], GpuMemory | None] = read_gpu, vision_bytes: int = 0) -> tuple[int, list[str]]:
    """The n_gpu_layers to load with, and warnings when the configured context will not fit the GPU.

    Call it before this model's head is on the GPU: NVML's free memory then still holds the head,
    which the plan counts once as head_bytes.
    """
    import llama_cpp

    wanted = options.n_gpu_layers
    if not llama_cpp.llama_supports_gpu_offload():
        return (0 if wanted == "auto" else int(wanted)), []
    gpu = read()
    if gpu is None:
        if wanted != "auto":
            return int(wanted), []
        return -1, ["fit.no_nvml: n_gpu_layers = \"auto\" but GPU memory cannot be read (install nvidia-ml-py: "
                    "pip install 'clef-bridge[cuda]'; or CUDA_VISIBLE_DEVICES hides every GPU); every layer is "
                    "offloaded, which fails if it does not fit"]
    p = serving_plan(gguf, options, head_bytes, gpu.free_bytes, vision_bytes)
    warnings = []
    if not p.fits:
        warnings.append(f"fit.context: n_ctx {options.n_ctx} with every layer on the GPU needs "
                        f"{p.total_bytes / GIB:.1f} GiB but {gpu.free_bytes / GIB:.1f} GiB is free on {gpu.device}; "
                        f"the largest context that fits is {p.max_ctx}"
                        + (f"; n_gpu_layers = \"auto\" offloads {p.n_gpu_layers} layers" if wanted == "auto"
                           else "; lower n_ctx or set n_gpu_layers = \"auto\""))
    if wanted == "auto":
        return p.n_gpu_layers, warnings
    return int(wanted), warnings
