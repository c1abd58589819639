"""gpu-check: the GPU path measured in one report (tools/gpu_check.sh runs it on a CUDA machine).

Steps, each recorded whatever the others do:
- build: llama.cpp built with CUDA (GPU offload), CuPy and the GPU NVML reads;
- head: the head on CuPy against the numpy head on the same hidden states (float32 and float16
  matrices; BF16 weights, as Cloudflare ships them, fit float16 exactly), and their times;
- backbone: llama.cpp with every layer on the GPU against a pure-CPU backbone (no layers, no op
  offload, no flash attention) on the same tokens: an F32 backbone and the Q8_0 one;
- serve-Q8_0, serve-Q4_K_M: a random backbone of Clef-flash's shape with the published head's
  shape, served over HTTP: p50/p95 of a ~750-token router request (4 questions, 19 options) split
  into backbone / head / server, throughput at concurrency 1, 4, 16, peak VRAM against fit's plan;
- workloads: `python -m benchmarks workloads`'s three workloads served by clef-bridge on the Q8_0 model
  (decisions/s, p50, p95 at concurrency 1, 8, 32; the bare prefill's limit and clef-bridge's share of it), beside a
  CUDA llama-server only when one is given (benchmarks/gpu_workloads.py). It runs last: a run the device time
  cuts short still reports every other step.

--smoke runs every step on the CPU at small shapes, each comparison between two different things:
the head on the module `import cupy` finds (the tests' strict stand-in) against numpy, and the
backbone as the GPU path sets it (flash attention, small ubatches) against the reference settings.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from clef_bridge.bridge.demo.builtins import random_head
from clef_bridge.bridge.host.gpu import read_gpu, release_cached, to_device
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.head.answer import softmax64
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.model import Layout, joint_schema_head
from clef_bridge.head.weights import load_state_dict, params_from

from tests.randomhead import random_inputs, random_layout

from .bench_head import schema_layout, turns_ms
from .gpu_models import GpuModels, prepare
from .gpu_serve import serve_step
from .gpu_workloads import workloads_step

HEAD_TOLERANCE = 1e-5  # logits, CuPy vs numpy: the order of float32 sums only
# The backbone, GPU vs CPU: max over tokens of |a - b| / |b| for hidden states, and option probabilities
# through a head. F32 matrices: cuBLAS's and the CPU's sums, flash attention's f16 K/V (measured on
# the CPU, flash attention alone moves the smoke F32 backbone by 5e-5). Quantized: CUDA and the
# CPU quantize activations to different blocks (q8_1 vs q8_0) and the differences grow layer by
# layer (flash attention alone moves the smoke Q8_0 backbone by 4.5e-3).
BACKBONE_TOLERANCE = {"F32": (5e-3, 5e-3), "Q8_0": (5e-2, 2e-2)}  # (hidden, probabilities)


@dataclass(frozen=True)
class Step:
    name: str
    ok: bool | None  # None: skipped (detail["skipped"] says why)
    seconds: float
    detail: dict[str, Any]


@dataclass(frozen=True)
class GpuCheck:
    smoke: bool
    steps: tuple[Step, ...]

    @property
    def ok(self) -> bool:
        return all(s.ok is not False for s in self.steps) and (self.smoke or all(s.ok for s in self.steps))

    def to_dict(self) -> dict[str, Any]:
        return {"smoke": self.smoke, "ok": self.ok,
                "tolerances": {"head_logits": HEAD_TOLERANCE, "backbone_hidden_and_probabilities": BACKBONE_TOLERANCE},
                "steps": {s.name: {"ok": s.ok, "seconds": round(s.seconds, 1), **s.detail} for s in self.steps}}


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def build_step(smoke: bool) -> dict[str, Any]:
    import llama_cpp

    offload = bool(llama_cpp.llama_supports_gpu_offload())
    gpu, cupy = read_gpu(), _cupy()
    out = {"gpu_offload": offload, "system_info": llama_cpp.llama_print_system_info().decode().strip(),
           "cupy": getattr(cupy, "__version__", "stand-in" if cupy else None),
           "nvml_device": gpu.device if gpu else None, "ok": offload or smoke}
    if smoke:
        out["note"] = "smoke: a CPU build is expected"
    return out


def head_step(models: GpuModels, xp: Any, repeats: int) -> dict[str, Any]:
    """The served head's weights on xp against numpy, on random hidden states of the router's layout."""
    cfg = models.shape.head
    flat = load_state_dict(models.head, cfg)  # BF16 in the file, as released
    layout, tokens = schema_layout(750, None)  # the router request: 4 questions, 19 options
    hidden, _, _, rows = random_inputs(cfg, layout, tokens, seed=5)
    want = joint_schema_head(hidden, rows, layout, cfg.heads, **params_from(flat))
    out: dict[str, Any] = {"tokens": tokens, "options": len(layout.option_spans)}
    calls: dict[str, Callable[[], Any]] = {"numpy": lambda: joint_schema_head(hidden, rows, layout, cfg.heads,
                                                                               **params_from(flat))}
    ok = True
    for dtype in ("float32", "float16"):
        params = params_from(flat, xp, dtype)

        def device(params=params):
            out = joint_schema_head(to_device(xp, hidden), to_device(xp, rows), layout, cfg.heads, **params)
            return xp.asnumpy(out)  # the download waits for the GPU: the time is the head's

        diff = float(np.abs(device() - want).max())
        prob = float(np.abs(_probabilities(device(), layout) - _probabilities(want, layout)).max())
        out[dtype] = {"max_abs_logit_diff": diff, "max_abs_prob_diff": prob}
        ok = ok and diff <= HEAD_TOLERANCE
        calls[f"device {dtype}"] = device
    times = turns_ms(list(calls.values()), repeats)
    out["median_ms"] = {label: round(float(np.median(ts)), 2) for label, ts in zip(calls, times)}
    out["ok"] = ok
    return out


def _probabilities(logits: np.ndarray, layout: Layout) -> np.ndarray:
    return np.concatenate([softmax64(z) for z in np.split(logits, layout.option_offsets[1:])])


def compare_backbones(gguf: Path, tokens: int, candidate: BackboneOptions, reference: BackboneOptions,
                      tolerance: tuple[float, float]) -> dict[str, Any]:
    """Hidden states of the same tokens under two settings, and what their difference does to answers."""
    ids = np.random.default_rng(7).integers(3, 260, tokens).astype(np.int32)  # byte-level tokens
    hidden = {}
    for label, options in (("reference", reference), ("candidate", candidate)):
        with Backbone(gguf, options) as backbone:
            t0 = time.perf_counter()
            hidden[label] = backbone.prefill(ids)
            hidden[f"{label}_ms"] = (time.perf_counter() - t0) * 1e3
    a, b = hidden["candidate"], hidden["reference"]
    rel = float((np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)).max())
    cfg, layout = _probe_head(a.shape[1], tokens)
    flat = random_head(cfg, seed=9)
    rows = np.random.default_rng(3).standard_normal((int(np.diff(layout.option_spans).sum()), cfg.hidden_size),
                                                    dtype=np.float32)
    logits = [joint_schema_head(h, rows, layout, cfg.heads, **params_from(flat)) for h in (a, b)]
    prob = float(np.abs(_probabilities(logits[0], layout) - _probabilities(logits[1], layout)).max())
    return {"tokens": tokens, "finite": bool(np.isfinite(a).all() and np.isfinite(b).all()),
            "max_rel_hidden_diff": rel, "max_abs_prob_diff": prob,
            "prefill_ms": {k: round(hidden[f"{k}_ms"], 1) for k in ("candidate", "reference")},
            "ok": bool(np.isfinite(a).all()) and rel <= tolerance[0] and prob <= tolerance[1]}


def _probe_head(hidden: int, tokens: int) -> tuple[HeadConfig, Layout]:
    """A small random head at the backbone's width and a two-question layout: answers to compare."""
    return (HeadConfig(hidden_size=hidden, width=64, routing_layers=1, layers=1, heads=4, feedforward=128),
            random_layout(tokens, [1, 2], [3, 4], seed=1))


def backbone_step(models: GpuModels, smoke: bool) -> dict[str, Any]:
    base = BackboneOptions(n_ctx=max(models.shape.compare_tokens, 512), n_seq_max=1)
    reference = replace(base, n_gpu_layers=0, op_offload=False, flash_attn=False)
    # on the GPU: every layer there; in the smoke, on the CPU: the settings the GPU path uses there
    candidate = replace(base, n_gpu_layers=-1, **({"flash_attn": True, "n_ubatch": 32} if smoke else {}))
    out = {name: compare_backbones(models.ggufs[key], models.shape.compare_tokens, candidate, reference,
                                   BACKBONE_TOLERANCE[tol])
           for name, key, tol in (("F32", "compare-F32", "F32"), ("Q8_0", "Q8_0", "Q8_0"))}
    out["candidate"] = "every layer on the GPU" if not smoke else "flash attention, n_ubatch 32 (CPU)"
    out["reference"] = "n_gpu_layers 0, op_offload off, flash attention off"
    out["ok"] = all(v["ok"] for v in out.values() if isinstance(v, dict))
    return out


def run(folder: Path, smoke: bool, vocab: Path, out: Path | None = None, repeats: int = 5,
        build_seconds: float | None = None, llama_server: Path | None = None) -> GpuCheck:
    """Every step, one after the other; the report is written to `out` after each (a run cut short
    still leaves what it measured). llama_server: a llama-server binary the workloads step runs too."""
    models = prepare(folder, smoke, vocab)
    xp = _cupy()
    head_device = "cuda" if xp is not None else "cpu"
    steps: list[Step] = [Step("models", True, models.seconds, models.to_dict())]
    plans: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("build", lambda: build_step(smoke) | ({} if build_seconds is None else {"build_seconds": build_seconds})),
        ("head", (lambda: head_step(models, xp, repeats)) if xp is not None else None),
        ("backbone", lambda: backbone_step(models, smoke)),
        *[(f"serve-{q}", lambda q=q: serve_step(models.ggufs[q], models.head, head_device, models.shape.router_tokens,
                                                 models.shape.requests)) for q in ("Q8_0", "Q4_K_M")],
        ("workloads", lambda: workloads_step(models, llama_server)),
    ]
    for name, fn in plans:
        if xp is not None:
            release_cached(xp)  # what an earlier step left in CuPy's cache would hide in the next one's peak
        t0 = time.perf_counter()
        if fn is None:
            steps.append(Step(name, None, 0.0, {"skipped": "CuPy is not installed (pip install 'clef-bridge[cuda]')"}))
        else:
            try:
                detail = fn()
                steps.append(Step(name, bool(detail.pop("ok")), time.perf_counter() - t0, detail))
            except Exception as exc:  # noqa: BLE001 - one step's failure is recorded; the others still run
                steps.append(Step(name, False, time.perf_counter() - t0,
                                  {"error": repr(exc), "traceback": traceback.format_exc(limit=-4)}))
        if out is not None:
            out.write_text(json.dumps(GpuCheck(smoke, tuple(steps)).to_dict(), indent=2) + "\n")
    return GpuCheck(smoke, tuple(steps))
