"""The backbone's and the prefix cache's options as plain data (models.toml's model keys): a leaf that imports no
llama.cpp, so the registry, the memory plan and their tests load without the native library."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixCacheOptions:
    max_mb: float = 1024  # host memory for checkpoints: recurrent states plus payloads; 0 turns the cache off
    every: int = 1024  # a checkpoint at every multiple of this position inside a request's cache span
    margin: int = 4  # and one this many tokens before the span's end: a grown state re-tokenizes its tail
    sequences: int = 4  # spare llama.cpp sequence ids that keep cached prefixes' KV cells (a recurrent slot each)
    extra_cells: int = 0  # KV cells the context adds for cached prefixes, beyond the decode budget n_ctx
    payloads: bool = False  # new checkpoints serve hits only once attach() gave them their payloads

    def __post_init__(self):
        low = {"max_mb": 0, "every": 1, "margin": 0, "sequences": 1, "extra_cells": 0}
        wrong = [f"{k} = {getattr(self, k)} (at least {v})" for k, v in low.items() if getattr(self, k) < v]
        if wrong:
            raise ValueError(f"prefix cache options out of range: {', '.join(wrong)}")


@dataclass(frozen=True)
class BackboneOptions:
    n_ctx: int = 16384  # token budget of one llama_decode, all sequences together
    n_gpu_layers: int | str = -1  # -1: every layer on the GPU when built with one; "auto": resolved by the loader
    # MoE: the expert tensors of the first N blocks stay in host memory (llama.cpp's --n-cpu-moe N); "auto": the
    # loader picks the smallest N that fits the GPU (bridge/config/memory_plan.py)
    n_cpu_moe: int | str = 0
    n_seq_max: int = 8  # sequences per decode (each hybrid model sequence needs its own recurrent slot)
    n_ubatch: int = 512
    n_threads: int = 0  # 0: every core
    # None: on where layers are offloaded to a GPU, off on the CPU, where llama.cpp's flash attention
    # rounds through f16 (batched results then differ from one-at-a-time by ~1e-4) and saves little.
    flash_attn: bool | None = None
    cpu_repack: bool = False  # llama.cpp's repacked/AMX weight buffers on the CPU (see Backbone.__init__)
    # llama.cpp runs big batches' ops on CPU-resident weights on the GPU; False with n_gpu_layers 0 keeps a
    # CUDA build's backbone wholly on the CPU (the reference gpu-check compares the GPU with)
    op_offload: bool = True
    verbose: bool = False
    prefix_cache: PrefixCacheOptions | None = None  # None or max_mb 0: off, each decode starts from empty memory
    kv_type: str = "f16"  # the KV cache's type: "f32" doubles its memory and drops llama.cpp's f16 rounding of it
