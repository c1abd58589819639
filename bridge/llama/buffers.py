"""llama.cpp's tensor buffer-type overrides: a mixture-of-experts model's expert tensors kept in host memory.

The same placement as llama.cpp's `--n-cpu-moe N` (common/arg.cpp): the expert tensors of blocks 0..N-1
go to the CPU buffer type, everything else of every offloaded layer stays on the GPU. llama-cpp-python
0.3.36 declares `llama_model_params.tensor_buft_overrides` as a bare pointer and binds neither the
override struct nor `ggml_backend_cpu_buffer_type`, so both are declared here (llama.h, ggml-backend.h).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .native import ctypes_ext, lc

# llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h): the stacked expert matrices of a MoE block
EXPERT_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
OVERRIDE_LINE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")  # llama.cpp's debug log


class _Override(ctypes.Structure):  # struct llama_model_tensor_buft_override (llama.h)
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def is_expert_tensor(name: str) -> bool:
    """True for a tensor `--n-cpu-moe` moves: blk.N.ffn_{gate,up,down,gate_up}_exps (and the _chexps kind)."""
    return re.search(EXPERT_REGEX, name) is not None


def expert_pattern(n_layers: int) -> str:
    """One regex for the expert tensors of blocks 0..n_layers-1 (llama.cpp tries every pattern on every tensor,
    compiling it each time, so one alternation is cheaper than llama.cpp's own one pattern per block)."""
    return rf"blk\.({'|'.join(str(i) for i in range(n_layers))}){EXPERT_REGEX}"


@cache
def _cpu_buffer_type() -> int:
    """ggml_backend_cpu_buffer_type() of the ggml inside llama-cpp-python (libggml-base)."""
    lib = ctypes_ext.load_shared_library("ggml-base", Path(lc.load().__file__).parent / "lib")
    lib.ggml_backend_cpu_buffer_type.argtypes = []
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    return lib.ggml_backend_cpu_buffer_type()


@dataclass(frozen=True)
class BufferOverrides:
    """A NULL-terminated override array and the pattern bytes it points into: keep both alive with the model."""

    patterns: tuple[bytes, ...]
    array: ctypes.Array

    def apply(self, mparams) -> None:
        mparams.tensor_buft_overrides = ctypes.cast(self.array, ctypes.c_void_p)


def cpu_experts(n_cpu_moe: int | str) -> BufferOverrides | None:
    """The overrides keeping the experts of the first n_cpu_moe blocks in host memory; None for 0."""
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int):
        raise ValueError(f"n_cpu_moe must be resolved to a number before loading, got {n_cpu_moe!r}")
    if n_cpu_moe < 0:
        raise ValueError(f"n_cpu_moe must be 0 or more, got {n_cpu_moe}")
    if n_cpu_moe == 0:
        return None
    patterns = (expert_pattern(n_cpu_moe).encode(),)
    array = (_Override * (len(patterns) + 1))()  # zeroed: the last entry is the NULL terminator
    for entry, pattern in zip(array, patterns):
        entry.pattern, entry.buft = pattern, _cpu_buffer_type()
    return BufferOverrides(patterns, array)


def overridden(log: str) -> dict[str, str]:
    """Tensor name -> buffer type, from llama.cpp's load log (debug level: capture it with log.capture())."""
    return {m.group(1): m.group(2) for m in OVERRIDE_LINE.finditer(log)}
