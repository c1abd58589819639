"""Dtypes by ggml's lowercase names (head/weights.py's vocabulary, which reads the older spellings too), with
their sizes and where each may be used: a head's storage, the KV cache, split's safetensors, join's GGUF head."""

from __future__ import annotations

from dataclasses import dataclass

from ...head.weights import DTYPE_ALIASES, STORAGE_DTYPES, dtype_name

__all__ = ["DEFAULT_KV_CACHE_DTYPE", "DTYPES", "DTYPE_ALIASES", "Dtype", "HEAD_DTYPES", "JOIN_DTYPES",
           "KV_CACHE_DTYPES", "SPLIT_DTYPES", "dtype_name"]


@dataclass(frozen=True)
class Dtype:
    name: str  # ggml's lowercase name: every flag's and models.toml key's spelling
    ggml: str  # the GGML type's and safetensors' name
    nbytes: float  # bytes per value (q8_0: 34 bytes per block of 32)
    kv_cache: bool = False  # llama.cpp's KV cache may hold it (models.toml kv_type)
    split: bool = False  # `split` writes the head's safetensors in it
    join: bool = False  # `join` writes the head's GGUF matrices in it

    @property
    def head_storage(self) -> bool:
        """The numpy head may hold its matrices in it (models.toml head_dtype, `fit --head-dtype`)."""
        return self.name in STORAGE_DTYPES


F32 = Dtype("f32", "F32", 4, kv_cache=True, split=True, join=True)
F16 = Dtype("f16", "F16", 2, kv_cache=True, split=True, join=True)
BF16 = Dtype("bf16", "BF16", 2, split=True, join=True)
Q8_0 = Dtype("q8_0", "Q8_0", 34 / 32, join=True)
DTYPES = {d.name: d for d in (F32, F16, BF16, Q8_0)}

HEAD_DTYPES = tuple(n for n, d in DTYPES.items() if d.head_storage)
DEFAULT_KV_CACHE_DTYPE = F16.name  # llama.cpp's own default; listed first wherever the choices are named
KV_CACHE_DTYPES = tuple(sorted((n for n, d in DTYPES.items() if d.kv_cache), key=lambda n: n != DEFAULT_KV_CACHE_DTYPE))
SPLIT_DTYPES = tuple(n for n, d in DTYPES.items() if d.split)
JOIN_DTYPES = tuple(n for n, d in DTYPES.items() if d.join)
