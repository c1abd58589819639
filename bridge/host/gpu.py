"""The GPU side of the head and the memory plan: host rows in pinned memory, one-copy uploads, CuPy's
pool handed back after an out-of-memory, and the NVML device that the CUDA runtime will use.

CuPy is never imported here: callers pass the array module they hold (numpy, CuPy, or the tests'
strict stand-in), so a CPU-only install never touches CUDA.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ...head.errors import Category, ClefError

HostRows = Callable[[int, int], np.ndarray]  # (rows, n_embd) -> float32 [rows, n_embd] on the host


def host_rows_for(xp: Any) -> HostRows:
    """Where the backbone copies llama.cpp's hidden states: pinned memory when the head runs on CuPy.

    From pinned memory the upload is one DMA; from pageable memory the driver (or cupy.asarray) first
    copies into a pinned staging buffer of its own. CuPy's pinned pool keeps freed blocks, so the
    same pages serve request after request.
    """
    if xp is np:
        return lambda rows, width: np.empty((rows, width), np.float32)

    def pinned(rows: int, width: int) -> np.ndarray:
        n = rows * width
        return np.frombuffer(xp.cuda.alloc_pinned_memory(4 * n), np.float32, n).reshape(rows, width)

    return pinned


def to_device(xp: Any, host: np.ndarray) -> Any:
    """host on xp's device in one copy (ndarray.set: a direct DMA from pinned memory; cupy.asarray
    would stage even pinned memory through a buffer of its own)."""
    if xp is np:
        return host
    out = xp.empty(host.shape, host.dtype)
    out.set(np.ascontiguousarray(host))
    return out


class DeviceOutOfMemory(ClefError):
    """The head ran out of GPU memory (HTTP 503 with Retry-After: the next request may fit)."""

    category = Category.UNAVAILABLE
    error_type = "out_of_memory"


def release_cached(xp: Any, drain: bool = False) -> None:
    """Hand the blocks CuPy's pool caches back to the driver, where llama.cpp allocates too.

    drain: wait for the GPU first (after a failed head: an upload still in flight reads pinned rows
    that go back to the pinned pool, and to the next decode, once their request is dropped). Not at
    load, where it would create the CUDA context before NVML's free memory is read.
    """
    if xp is not np:
        if drain:
            xp.cuda.Device().synchronize()
        xp.get_default_memory_pool().free_all_blocks()


def device_out_of_memory(xp: Any, exc: MemoryError) -> DeviceOutOfMemory:
    """After CuPy ran out of memory: the failed run's device arrays dropped (they live on in its
    traceback's frames), the GPU drained, the pool's blocks released; the error to raise instead."""
    traceback.clear_frames(exc.__traceback__)
    release_cached(xp, drain=True)
    return DeviceOutOfMemory(f"the GPU ran out of memory for the head ({exc}); its cached blocks are released, "
                             "retry shortly", fix="if it recurs: fewer concurrent requests, head_dtype = "
                             "\"float16\", or a lower n_ctx to leave the head more memory")


def visible_device(env: Mapping[str, str] = os.environ) -> int | str | None:
    """The device the CUDA runtime calls 0: an NVML index, a UUID (GPU-... or MIG-...), or None
    when CUDA_VISIBLE_DEVICES hides every GPU ("" or a negative index).

    NVML numbers GPUs in PCI bus order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default
    order puts the fastest first, which differs only on machines with unlike GPUs.
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return 0
    first = value.split(",")[0].strip()
    if not first or first.startswith("-"):
        return None
    return int(first) if first.isdigit() else first


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as NVML reads it."""

    device: str  # e.g. "GPU 1 (NVIDIA GeForce RTX 4080)"
    free_bytes: int
    total_bytes: int
    used_bytes: int


def nvml_handle(nvml: Any, device: int | str) -> Any:
    if isinstance(device, int):
        return nvml.nvmlDeviceGetHandleByIndex(device)
    try:
        return nvml.nvmlDeviceGetHandleByUUID(device)
    except nvml.NVMLError:  # CUDA also takes a unique prefix of a UUID
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(device):
                return handle
        raise


def read_gpu(env: Mapping[str, str] = os.environ) -> GpuMemory | None:
    """Free memory of the GPU llama.cpp and CuPy will use (CUDA_VISIBLE_DEVICES's first), or None
    without NVML (nvidia-ml-py), without a driver, or with no GPU visible."""
    device = visible_device(env)
    if device is None:
        return None
    try:
        import pynvml as nvml
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
        try:
            handle = nvml_handle(nvml, device)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError:
        return None
    name = name.decode() if isinstance(name, bytes) else name
    return GpuMemory(f"GPU {device} ({name})", int(info.free), int(info.total), int(info.used))


def why_no_gpu(env: Mapping[str, str] = os.environ) -> str | None:
    """Why there is no GPU for CUDA to use, as NVML sees it; None when there is one."""
    if visible_device(env) is None:
        return f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU"
    try:
        import pynvml  # noqa: F401 - only whether it is there
    except ImportError:
        return "nvidia-ml-py, which reads the GPU, is not installed (pip install 'clef-bridge[cuda]')"
    if read_gpu(env) is None:
        return "NVML finds no NVIDIA GPU (no driver, or no device)"
    return None


def head_device(setting: str) -> str:
    """models.toml's head_device as the device the head runs on: "auto" is "cuda" where CuPy imports and finds a CUDA
    device (the head's time off the CPU on every request), else "cpu"."""
    if setting != "auto":
        return setting
    try:
        import cupy
    except ImportError:
        return "cpu"
    try:
        return "cuda" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or CUDA_VISIBLE_DEVICES hides every device
        return "cpu"
