"""GPU memory plans for a Clef GGUF and its head, with Qwen3.5's hybrid layers and MoE experts counted right.

Only the full-attention layers (one in four) keep a KV cache; the Gated DeltaNet layers keep a
fixed-size recurrent state per parallel sequence. Charging KV to every layer overstates the
context cost four times. Clef-omni's qwen3vlmoe backbone is full attention in every layer with a
mixture-of-experts FFN; where the whole model does not fit, the expert tensors of the first N
blocks stay in host memory (llama.cpp's --n-cpu-moe N), N the smallest that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ...head.config import HeadConfig
from ...head.errors import Category, ClefError
from ...head.weights import stored_bytes
from ..catalogue.architectures import EVERY_TOKEN_OUTPUT_ARCHITECTURES, FULL_ATTENTION_ARCHITECTURES
from ..catalogue.dtypes import DTYPES
from ..gguf.clef_format import is_head_tensor
from ..gguf.projector import ProjectorInfo, max_image_tokens
from ..gguf.projector import compute_bytes as vision_compute_bytes
from ..gguf.reader import GGUFInfo, read_gguf
from ..host.gpu import GpuMemory, read_gpu
from ..llama.buffers import is_expert_tensor
from ..llama.native import lc
from ..llama.options import BackboneOptions

MIB = 1 << 20
GIB = 1 << 30
KV_BYTES = {name: d.nbytes for name, d in DTYPES.items()}
MARGIN_FIXED = 512 * MIB  # CUDA context, cuBLAS workspace, fragmentation
MARGIN_SHARE = 0.03


@dataclass(frozen=True)
class TensorSize:
    name: str
    type: str
    nbytes: int
    layer: int | None  # block index; None for token_embd; n_layer for the output layer
    expert: bool = False  # a MoE expert tensor (what --n-cpu-moe keeps in host memory)


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
    n_expert: int = 0  # MoE: experts per block (0: a dense FFN)
    n_expert_used: int = 0
    ff_expert: int = 0  # one expert's feed-forward width
    n_deepstack: int = 0  # Qwen3-VL/Omni deepstack levels: the input embeddings are (1 + n) x n_embd wide
    # Every token is an output (qwen3vlmoe has no hidden-state hook before lm_head, see bridge/llama): the compute
    # buffer then holds n_ubatch x n_vocab logits, and the host output buffer as many.
    every_token_output: bool = False

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

    category = Category.CONFIG
    error_type = "plan_error"


def arch_from_gguf(info: GGUFInfo) -> Arch:
    """What a memory plan needs, from a GGUF header; PlanError names every missing key."""
    a = info.arch_key
    required = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                "feed_forward_length")
    missing = [f"{info.architecture}.{k}" for k in required if not isinstance(a(k), int)]
    experts = [t for t in info.tensors.values() if is_expert_tensor(t.name)]
    if experts:
        missing += [f"{info.architecture}.{k}" for k in ("expert_count", "expert_used_count")
                    if not isinstance(a(k), int)]
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
                               _layer_of(t.name, n_layer), is_expert_tensor(t.name)) for t in info.tensors.values()
                    if not is_head_tensor(t.name))  # a clef GGUF's head runs in numpy/CuPy, not in llama.cpp
    ff_expert = a("expert_feed_forward_length")  # one value, or one per layer
    if isinstance(ff_expert, np.ndarray):
        ff_expert = int(ff_expert.max()) if len(ff_expert) else None
    up = [t for t in experts if "_up_" in t.name or "_gate_exps" in t.name]
    if not isinstance(ff_expert, int) and up:
        ff_expert = up[0].shape[1]  # gate and up are [n_embd, n_ff_exp, n_expert] in ggml order
    return Arch(name=info.path.name, n_layer=n_layer, full=full, n_embd=int(a("embedding_length")),
                n_vocab=int(getattr(tokens, "count", None) or (output.shape[1] if output else 0)),
                n_head=int(a("attention.head_count")), n_head_kv=int(a("attention.head_count_kv")),
                head_dim=int(a("attention.key_length") or a("embedding_length") // a("attention.head_count")),
                ff=int(a("feed_forward_length")), ssm_conv=int(a("ssm.conv_kernel") or 0),
                ssm_inner=int(a("ssm.inner_size") or 0), ssm_state=int(a("ssm.state_size") or 0),
                ssm_group=int(a("ssm.group_count") or 0), ssm_heads=int(a("ssm.time_step_rank") or 0),
                n_ctx_train=int(a("context_length") or 0),
                tensors=tensors, n_expert=int(a("expert_count") or 0) if experts else 0,
                n_expert_used=int(a("expert_used_count") or 0) if experts else 0, ff_expert=int(ff_expert or 0),
                n_deepstack=int(a("n_deepstack_layers") or 0),
                every_token_output=info.architecture in EVERY_TOKEN_OUTPUT_ARCHITECTURES)


@dataclass(frozen=True)
class Plan:
    arch: str
    ctx: int
    parallel: int
    n_ubatch: int
    kv_type: str
    fits: bool  # every layer on the GPU (a MoE model's experts of the first n_cpu_moe blocks in host memory)
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
    max_ctx: int  # largest context that fits with every layer on the GPU (MoE: experts in host memory if need be)
    n_gpu_layers: int  # -1 when all fit; else the most layers that do
    vision_bytes: int = 0  # the projector's weights and compute buffer on the GPU (0: none)
    n_cpu_moe: int = 0  # MoE: blocks whose expert tensors stay in host memory (llama.cpp's --n-cpu-moe)
    host_bytes: int = 0  # host memory: the weights not on the GPU, and the logits of every-token-output backbones

    def summary(self) -> dict[str, int | bool]:
        return {"fits": self.fits, "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "recurrent_state_bytes": self.recurrent_state_bytes, "compute_bytes": self.compute_bytes,
                "head_bytes": self.head_bytes, "vision_bytes": self.vision_bytes, "total_bytes": self.total_bytes,
                "vram_bytes": self.vram_bytes, "max_ctx": self.max_ctx, "n_gpu_layers": self.n_gpu_layers,
                "n_cpu_moe": self.n_cpu_moe, "cpu_weights_bytes": self.cpu_weights_bytes,
                "host_bytes": self.host_bytes}


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
    if arch.n_expert:
        return moe_compute_bytes(arch, ctx, n_ubatch, flash_attn)
    conv = 2 * arch.ssm_group * arch.ssm_state + arch.ssm_inner
    out = n_ubatch * (512 * arch.ssm_heads + 4.5 * max(arch.ff, conv)) * 4
    if not flash_attn:
        out += 1.2 * n_ubatch * pad_ctx(ctx) * arch.n_head * 4
    return int(out)


def moe_compute_bytes(arch: Arch, ctx: int, n_ubatch: int, flash_attn: bool = True) -> int:
    """The same for a MoE backbone, in floats per token of the ubatch, fitted to llama.cpp's reports on
    qwen3vlmoe backbones of Qwen3-Omni's proportions (hidden 256 to 2048, 4 or 8 of 16 to 128 experts, expert
    width 3/8 of hidden; Clef-omni's own shape through no_alloc): the routed experts' activations (2.5 x hidden
    per used expert, or 3 x the expert width where that is larger), the router (3 per expert), 2 x hidden per
    deepstack level, the attention mask (f16 with flash attention, f32 without) and, without flash attention,
    the KQ matrix; with every token an output, the n_vocab logits of each token when they outweigh the rest.
    (When the experts are wider than half the hidden size llama.cpp reuses their freed activations and needs
    up to a quarter less than this.)"""
    h, used, cells = arch.n_embd, arch.n_expert_used, pad_ctx(ctx)
    body = max(2.5 * h * used + 2 * h + 3 * arch.n_expert, 3 * arch.ff_expert * used + 4 * h) \
        + 2 * arch.n_deepstack * h
    logits = arch.n_vocab if arch.every_token_output else 0
    if flash_attn:  # the mask is gone by the time the logits are made
        per_token = max(body + cells / 2, logits + 2 * h + cells / 8 if logits else 0)
    else:
        per_token = max(body, logits, arch.n_head * cells + 2 * arch.n_head * arch.head_dim + 3.5 * h) + cells
    return int(n_ubatch * per_token * 4)


def _gpu_layers(arch: Arch, ngl: int) -> set[int]:
    """Blocks (and n_layer, the output layer) llama.cpp puts on the GPU for n_gpu_layers = ngl."""
    ngl = arch.n_layer + 1 if ngl < 0 else ngl
    start = max(arch.n_layer + 1 - ngl, 0)
    return set(range(start, arch.n_layer + 1))


OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda runs an op on host-resident weights on the GPU from this batch on


@dataclass(frozen=True)
class _Parts:
    total: int
    weights: int
    kv: int
    recurrent: int
    compute: int
    margin: int
    by_type: dict[str, int]


def _total(arch: Arch, ctx: int, parallel: int, n_ubatch: int, kv_type: str, head: int, ngl: int, n_cpu_moe: int,
           vram: int) -> _Parts:
    """The GPU's share with the first ngl layers offloaded and the experts of blocks below n_cpu_moe on the host.

    llama.cpp copies host-resident expert weights to the GPU for each ubatch of OP_OFFLOAD_MIN_BATCH tokens
    or more (ggml-backend's op offload): the compute buffer holds one block's experts for that copy.
    """
    on_gpu = _gpu_layers(arch, ngl)
    by_type: dict[str, int] = {}
    weights = 0
    staged: dict[int, int] = {}  # a block's experts left in host memory
    for t in arch.tensors:
        if t.layer is None or t.layer not in on_gpu:
            continue
        if t.expert and t.layer < n_cpu_moe:
            staged[t.layer] = staged.get(t.layer, 0) + t.nbytes
            continue
        weights += t.nbytes
        by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
    kv = kv_cache_bytes(arch, ctx, kv_type, on_gpu)
    rs = recurrent_bytes(arch, parallel, on_gpu)
    copy = max(staged.values()) if staged and n_ubatch >= OP_OFFLOAD_MIN_BATCH else 0
    compute = compute_bytes(arch, ctx, n_ubatch) + copy if on_gpu else 0
    margin = MARGIN_FIXED + int(MARGIN_SHARE * vram)
    return _Parts(weights + kv + rs + compute + head + margin, weights, kv, rs, compute, margin, by_type)


def plan(arch: Arch, vram_bytes: int, ctx: int = 16384, parallel: int = 1, n_ubatch: int = 512,
         kv_type: str = "f16", head_bytes: int = 0, vision_bytes: int = 0, n_cpu_moe: int | None = 0) -> Plan:
    """Everything on the GPU if it fits; else, for a MoE backbone with n_cpu_moe None ("auto"), the experts of
    the fewest first blocks in host memory; else the most layers that fit, and the largest context. The
    projector (vision_bytes) goes on the GPU whenever the backbone uses one."""
    args = (parallel, n_ubatch, kv_type, head_bytes + vision_bytes)
    fits_with = lambda c, g, m: _total(arch, c, *args, g, m, vram_bytes).total <= vram_bytes  # noqa: E731
    candidates = range(arch.n_layer + 1) if arch.n_expert and n_cpu_moe is None else [n_cpu_moe or 0]
    most = candidates[-1]
    moe = next((m for m in candidates if fits_with(ctx, -1, m)), None)
    fits = moe is not None
    moe = most if moe is None else moe
    ngl = -1 if fits else next((g for g in range(arch.n_layer, -1, -1) if fits_with(ctx, g, moe)), 0)
    lo, hi, step = 0, max(arch.n_ctx_train, 256), 256
    while lo < hi:  # largest multiple of 256 whose full offload fits (with all the experts allowed on the host)
        mid = (lo + hi + step) // (2 * step) * step
        lo, hi = (mid, hi) if fits_with(mid, -1, most) else (lo, mid - step)
    parts = _total(arch, ctx, *args, ngl, moe, vram_bytes)
    cpu = sum(t.nbytes for t in arch.tensors) - parts.weights
    logits = n_ubatch * arch.n_vocab * 4 if arch.every_token_output else 0  # llama.cpp's host output buffer
    return Plan(arch.name, ctx, parallel, n_ubatch, kv_type, fits, parts.weights, parts.by_type, cpu, parts.kv,
                parts.recurrent, parts.compute, head_bytes, parts.margin, parts.total, vram_bytes, lo, ngl,
                vision_bytes, moe if arch.n_expert else 0, cpu + logits)


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
    n_cpu_moe = None if options.n_cpu_moe == "auto" else int(options.n_cpu_moe)
    return plan(arch, vram_bytes, ctx, parallel, options.n_ubatch, options.kv_type, head_bytes=head_bytes,
                vision_bytes=vision_bytes, n_cpu_moe=n_cpu_moe)


def head_gpu_bytes(config: HeadConfig, head_device: str, head_dtype: str) -> int:
    """The head's parameters on the GPU (head_dtype's storage), or 0 when it runs on the CPU."""
    return stored_bytes(config, head_dtype) if head_device == "cuda" else 0


@dataclass(frozen=True)
class ProjectorSizes:
    """A projector's bytes in a GPU plan: from its header (projector_sizes) or from published dimensions."""

    vision_weight_bytes: int  # llama.cpp's mtmd holds the vision tower
    vision_compute_bytes: int  # mtmd's compute buffer for the largest image of the backbone's reference
    audio_weight_bytes: int  # Qwen3-Omni's audio tower, float32 (the bridge's numpy/CuPy tower); 0 without one


def projector_sizes(info: ProjectorInfo, architecture: str | None) -> ProjectorSizes:
    """A projector's plan sizes beside a backbone of this architecture (its reference's largest image)."""
    return ProjectorSizes(info.weight_bytes, vision_compute_bytes(info, max_image_tokens(architecture)),
                          info.audio_float32_bytes)


@dataclass(frozen=True)
class PlanInputs:
    """What a GPU plan counts beside the backbone: the head and the media towers on the GPU."""

    head_bytes: int  # the head's parameters on this GPU (0 on the CPU)
    vision_weight_bytes: int = 0
    vision_compute_bytes: int = 0
    audio_weight_bytes: int = 0  # the audio tower runs where the head runs: 0 with the head on the CPU
    adapter_bytes: int = 0  # LoRA adapters served over the backbone (llama.cpp keeps each beside its base weight)

    @property
    def beside_bytes(self) -> int:
        """The plans' head_bytes: the heads and the adapters of the models on one backbone."""
        return self.head_bytes + self.adapter_bytes

    @property
    def media_bytes(self) -> int:
        """The plans' vision_bytes: every tower's weights and the vision compute buffer."""
        return self.vision_weight_bytes + self.vision_compute_bytes + self.audio_weight_bytes


def plan_inputs(config: HeadConfig, head_device: str, head_dtype: str, projector: ProjectorSizes | None,
                heads: int = 1, adapter_bytes: int = 0) -> PlanInputs:
    """THE inputs of a model's GPU plan beside its backbone, for `serve` (bridge/model/loading.py) and `fit`
    alike: the head in head_dtype's storage and the audio tower where head_device puts them, the vision tower
    always with the backbone. heads, adapter_bytes: the models sharing the backbone (one head each, of this
    shape) and their LoRA adapters' bytes."""
    head = heads * head_gpu_bytes(config, head_device, head_dtype)
    if projector is None:
        return PlanInputs(head, adapter_bytes=adapter_bytes)
    audio = projector.audio_weight_bytes if head_device == "cuda" else 0
    return PlanInputs(head, projector.vision_weight_bytes, projector.vision_compute_bytes, audio, adapter_bytes)


def lora_linears(arch: Arch) -> list[tuple[int, int]]:
    """(in, out) of every linear clef-finetune adapts on a Qwen3.5 backbone: full attention q (with its gate), k,
    v, o; linear attention qkv, z, a, b, out; the MLP's gate, up, down."""
    out = []
    for full in arch.full:
        if full:
            q, kv = arch.n_head * arch.head_dim, arch.n_head_kv * arch.head_dim
            out += [(arch.n_embd, 2 * q), (arch.n_embd, kv), (arch.n_embd, kv), (q, arch.n_embd)]
        else:
            qkv = 2 * arch.ssm_group * arch.ssm_state + arch.ssm_inner
            out += [(arch.n_embd, qkv), (arch.n_embd, arch.ssm_inner), (arch.n_embd, arch.ssm_heads),
                    (arch.n_embd, arch.ssm_heads), (arch.ssm_inner, arch.n_embd)]
        out += [(arch.n_embd, arch.ff), (arch.n_embd, arch.ff), (arch.ff, arch.n_embd)]
    return out


def lora_bytes(arch: Arch, rank: int, bytes_per_weight: int = 4) -> int:
    """One adapter at this rank on every clef-finetune target, as the bridge converts it (float32 A and B)."""
    return rank * sum(i + o for i, o in lora_linears(arch)) * bytes_per_weight


def parse_size(text: str) -> int:
    """'16GiB', '24GB', '8000MiB', '16' (GiB) -> bytes."""
    units = {"gib": GIB, "gb": 10**9, "mib": MIB, "mb": 10**6, "g": GIB, "m": MIB, "": GIB}
    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    if unit not in units or not number:
        raise ValueError(f"cannot read the size {text!r}; write e.g. 16GiB, 24GB or 12000MiB")
    return int(float(number) * units[unit])


NO_NVML = ("GPU memory cannot be read (install nvidia-ml-py: pip install 'clef-bridge[cuda]'; or "
           "CUDA_VISIBLE_DEVICES hides every GPU)")


def placement_for(gguf: Path, options: BackboneOptions, head_bytes: int,
                  read: Callable[[], GpuMemory | None] = read_gpu,
                  vision_bytes: int = 0) -> tuple[BackboneOptions, list[str]]:
    """The options to load with, n_gpu_layers and n_cpu_moe resolved ("auto": the plan's), and warnings when
    the configured context will not fit the GPU.

    Call it before this model's head is on the GPU: NVML's free memory then still holds the head,
    which the plan counts once as head_bytes.
    """
    layers, experts = options.n_gpu_layers, options.n_cpu_moe
    if not lc.llama_supports_gpu_offload():  # a CPU build: everything is in host memory already
        return replace(options, n_gpu_layers=0 if layers == "auto" else int(layers),
                       n_cpu_moe=0 if experts == "auto" else int(experts)), []
    gpu = read()
    if gpu is None:
        warnings = []
        if layers == "auto":
            warnings.append(f"fit.no_nvml: n_gpu_layers = \"auto\" but {NO_NVML}; every layer is offloaded, which "
                            "fails if it does not fit")
        if experts == "auto" and arch_from_gguf(read_gguf(gguf)).n_expert:
            warnings.append(f"fit.no_nvml: n_cpu_moe = \"auto\" but {NO_NVML}; every expert goes to the GPU, "
                            "which fails if they do not fit: set n_cpu_moe to a number (`clef-bridge fit --vram`)")
        return replace(options, n_gpu_layers=-1 if layers == "auto" else int(layers),
                       n_cpu_moe=0 if experts == "auto" else int(experts)), warnings
    p = serving_plan(gguf, options, head_bytes, gpu.free_bytes, vision_bytes)
    warnings = []
    if not p.fits:
        moved = f" and the experts of all {p.n_cpu_moe} blocks in host memory" if experts == "auto" and \
            p.n_cpu_moe else ""
        warnings.append(f"fit.context: n_ctx {options.n_ctx} with every layer on the GPU{moved} needs "
                        f"{p.total_bytes / GIB:.1f} GiB but {gpu.free_bytes / GIB:.1f} GiB is free on {gpu.device}; "
                        f"the largest context that fits is {p.max_ctx}"
                        + (f"; n_gpu_layers = \"auto\" offloads {p.n_gpu_layers} layers" if layers == "auto"
                           else "; lower n_ctx or set n_gpu_layers = \"auto\""))
    return replace(options, n_gpu_layers=p.n_gpu_layers if layers == "auto" else int(layers),
                   n_cpu_moe=p.n_cpu_moe if experts == "auto" else int(experts)), warnings
