"""The `clef-bridge` command: a thin argparse layer over the library functions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..head.errors import ClefError, ContextLengthExceeded, RequestInvalid

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def _decide(args: argparse.Namespace) -> int:
    from ..bridge.pipeline import ClefModel
    from ..bridge.registry import load_registry

    try:
        body = json.loads(Path(args.request).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(f"clef-bridge decide: cannot read {args.request}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    registry = load_registry(args.models)
    spec = registry.resolve(args.model)
    model = ClefModel(spec)
    try:
        response = model.decide(body)
    finally:
        model.close()
    json.dump(response, sys.stdout, ensure_ascii=False, indent=None if args.compact else 2)
    sys.stdout.write("\n")
    return EXIT_OK


IO_CODES = ("gguf.missing", "head.missing")


def _load_for_canaries(gguf: Path, head: Path):
    from ..bridge.pipeline import ClefModel
    from ..bridge.registry import ModelSpec

    return ClefModel(ModelSpec(name="check", gguf=gguf, head=head, n_ctx=4096, max_length=4096))


def _print_report(report, name: str | None) -> None:
    title = f"model {name}: " if name else ""
    verdict = "ACCEPTED" if report.accepted else "REFUSED"
    print(f"{title}{report.gguf} + {report.head or '(no head)'}: {verdict}")
    for f in report.findings:
        print(f"  {f.level.upper():7s} {f.code}: {f.message}")
        if f.fix:
            print(f"          fix: {f.fix}")
    if report.accepted and not report.findings:
        facts = report.facts
        print(f"  {facts.get('architecture')}, hidden {facts.get('embedding_length')}, {facts.get('block_count')} "
              f"layers ({facts.get('full_attention_layers')} full attention), vocab {facts.get('vocab_size')}")


def _check(args: argparse.Namespace) -> int:
    from ..bridge.integrity import check_all
    from ..bridge.registry import load_registry

    if (args.gguf is None) == (args.models is None):
        print("clef-bridge check: give a GGUF or --models models.toml (not both)", file=sys.stderr)
        return EXIT_USAGE
    if args.models is not None:
        registry = load_registry(args.models)
        for spec in registry.models.values():
            spec.ensure_files()
        named = [(name, check_all(spec.gguf, spec.head, spec.pair, spec.gguf_sha256, spec.head_sha256,
                                  load_model=_load_for_canaries)) for name, spec in registry.models.items()]
    else:
        named = [(None, check_all(args.gguf, args.head, args.pair, load_model=_load_for_canaries))]
    accepted = all(r.accepted for _, r in named)
    if args.json:
        print(json.dumps({"accepted": accepted, "reports": [{"model": n, **r.to_dict()} for n, r in named]},
                         indent=2))
    else:
        for name, report in named:
            _print_report(report, name)
    if any(f.code in IO_CODES for _, r in named for f in r.findings):
        return EXIT_USAGE
    return EXIT_OK if accepted else EXIT_REFUSED


def _pair(args: argparse.Namespace) -> int:
    from ..bridge.integrity import check_pair
    from ..bridge.provenance import default_pair_path, pair_record

    report = check_pair(args.gguf, args.head)
    if not report.accepted:
        _print_report(report, None)
        return EXIT_USAGE if any(f.code in IO_CODES for f in report.findings) else EXIT_REFUSED
    model = _load_for_canaries(args.gguf, args.head)
    try:
        record = pair_record(args.gguf, args.head, model)
    finally:
        model.close()
    out = args.output or default_pair_path(args.gguf)
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: head sha256 {record['head_sha256'][:16]}..., {len(record['fingerprint']['row_ids'])} "
          f"fingerprint rows, {len(record['canaries'])} canary requests")
    return EXIT_OK


def _fit(args: argparse.Namespace) -> int:
    from ..bridge.fit import ARCHES, GIB, MIB, arch_from_gguf, arch_preset, device_vram, head_params, parse_size, plan
    from ..bridge.gguf_file import read_gguf

    if (args.gguf is None) == (args.arch is None):
        print("clef-bridge fit: give a GGUF or --arch NAME", file=sys.stderr)
        return EXIT_USAGE
    try:
        vram = parse_size(args.vram) if args.vram else device_vram()
    except ValueError as exc:
        print(f"clef-bridge fit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if vram is None:
        print("clef-bridge fit: no GPU found (nvidia-ml-py reads it); pass --vram 16GiB", file=sys.stderr)
        return EXIT_USAGE
    if args.arch:
        try:
            arch = arch_preset(args.arch, args.quant)
        except KeyError as exc:
            print(f"clef-bridge fit: {exc.args[0]}", file=sys.stderr)
            return EXIT_USAGE
        hidden = ARCHES[args.arch]["head_hidden"]
    else:
        arch = arch_from_gguf(read_gguf(args.gguf))
        hidden = arch.n_embd
    head = head_params(hidden) * 4 if args.head_on_gpu else 0
    result = plan(arch, vram, args.ctx, args.parallel, args.ubatch, head_bytes=head)
    if args.json:
        print(json.dumps(result.summary()))
        return EXIT_OK if result.fits else EXIT_REFUSED
    gib = lambda n: f"{n / GIB:6.2f} GiB"  # noqa: E731
    print(f"{result.arch}: {args.ctx} tokens of context, {args.parallel} parallel sequence(s), "
          f"{vram / GIB:.1f} GiB of VRAM")
    types = ", ".join(f"{t} {n / GIB:.2f}" for t, n in sorted(result.weights_by_type.items(), key=lambda x: -x[1]))
    print(f"  weights on GPU     {gib(result.weights_bytes)}  ({types}; token_embd stays on the CPU: "
          f"{result.cpu_weights_bytes / GIB:.2f} GiB)")
    print(f"  KV cache           {gib(result.kv_cache_bytes)}  ({sum(arch.full)} full-attention layers of "
          f"{arch.n_layer}, {result.kv_type})")
    print(f"  recurrent state    {gib(result.recurrent_state_bytes)}  ({arch.n_layer - sum(arch.full)} linear layers"
          f" x {args.parallel} sequence(s))")
    print(f"  compute buffers    {gib(result.compute_bytes)}  (n_ubatch {args.ubatch})")
    print(f"  head               {gib(result.head_bytes)}  ({'GPU, CuPy' if args.head_on_gpu else 'on the CPU'}: "
          f"{head_params(hidden) * 4 / MIB:.0f} MiB float32)")
    print(f"  margin             {gib(result.margin_bytes)}")
    print(f"  total              {gib(result.total_bytes)}  -> {'FITS' if result.fits else 'does NOT fit'}")
    print(f"  largest context with every layer on the GPU: {result.max_ctx}")
    if not result.fits:
        print(f"  at {args.ctx} tokens use n_gpu_layers = {result.n_gpu_layers} (the rest runs on the CPU)")
    return EXIT_OK if result.fits else EXIT_REFUSED


def _pull(args: argparse.Namespace) -> int:
    from .pull import pull

    if not args.gguf_repo or not args.gguf_file:
        print("clef-bridge pull: community GGUF names vary: pass --gguf-repo OWNER/REPO and --gguf-file NAME.gguf "
              f"(a GGUF of {args.model}'s backbone, e.g. a Q8_0 for a 16 GB card; `clef-bridge fit --arch "
              f"{args.model}` compares them); the head always comes from the release repository", file=sys.stderr)
        return EXIT_USAGE
    pulled = pull(args.model, args.gguf_repo, args.gguf_file, args.models, args.name, args.revision,
                  load_model=_load_for_canaries)
    print(json.dumps({"model": pulled.name, "gguf": str(pulled.gguf), "head": str(pulled.head),
                      "gguf_sha256": pulled.gguf_sha256, "head_sha256": pulled.head_sha256,
                      "pair": str(pulled.pair), "models_toml": str(pulled.models_toml)}, indent=2))
    return EXIT_OK


def _local_model(models: Path, name: str):
    from ..bridge.pipeline import ClefModel
    from ..bridge.registry import load_registry

    return ClefModel(load_registry(models).resolve(name))


def _eval(args: argparse.Namespace) -> int:
    from .evaldata import load_examples
    from .evaluate import build_report, markdown, run_http, run_local, write_report

    if (args.url is None) == (args.models is None) or (args.models is not None and args.model is None):
        print("clef-bridge eval: give --url URL, or --models PATH with --model NAME", file=sys.stderr)
        return EXIT_USAGE
    examples = load_examples(args.data)
    if args.url:
        outcomes = run_http(args.url, examples, args.concurrency, args.api_key)
    else:
        model = _local_model(args.models, args.model)
        try:
            outcomes = run_local(model.decide, examples)
        finally:
            model.close()
    report = build_report(outcomes)
    print(markdown(report))
    if args.out:
        for note in write_report(report, args.out):
            print(note, file=sys.stderr)
    return EXIT_OK if not report.errors else EXIT_REFUSED


def _calibrate(args: argparse.Namespace) -> int:
    from ..bridge.registry import load_registry
    from .calibrate import SPLITS, calibrate_items, collect_items, write_temperature
    from .evaldata import load_examples

    examples = load_examples(args.data)
    spec = load_registry(args.models).resolve(args.model)
    model = _local_model(args.models, args.model)
    try:
        items = collect_items(model, examples)
    finally:
        model.close()
    results = {kind: calibrate_items(kind, kind_items, spec.temperature[kind]) for kind, kind_items in items.items()}
    for r in results.values():
        verdict = "accepted" if r.accepted else "declined (held-out NLL does not improve)"
        print(f"{r.kind}: {r.n} decisions; T = {r.fitted:.3f} (IQR {r.iqr[0]:.3f}-{r.iqr[1]:.3f}, "
              f"{SPLITS} random halves), now {r.current:g}: {verdict}")
        print(f"    held-out NLL {r.heldout_nll_current:.4f} -> {r.heldout_nll_fitted:.4f}")
        print(f"    ECE {r.before['ece']:.4f} -> {r.after['ece']:.4f}, Brier {r.before['brier']:.4f} -> "
              f"{r.after['brier']:.4f}, NLL {r.before['nll']:.4f} -> {r.after['nll']:.4f}")
    if args.write:
        temperatures = dict(spec.temperature) | {k: r.temperature for k, r in results.items()}
        write_temperature(args.models, spec.name, temperatures)
        print(f"wrote temperature = {temperatures} to [models.{spec.name}] in {args.models}")
    return EXIT_OK


def _drift(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..bridge.pipeline import ClefModel
    from ..bridge.registry import ModelSpec
    from .drift import drift, probe_requests
    from .evaldata import load_examples

    requests = [e.request for e in load_examples(args.data)] if args.data else probe_requests()
    base = ModelSpec(name="drift", gguf=args.gguf_a, head=args.head, n_ctx=args.ctx, max_length=args.ctx)
    a = ClefModel(base)
    try:
        b = ClefModel(replace(base, gguf=args.gguf_b))
        try:
            result = drift(a, b, requests)
        finally:
            b.close()
    finally:
        a.close()
    if args.json:
        print(json.dumps({"a": str(args.gguf_a), "b": str(args.gguf_b), "requests": len(requests), **result}))
        return EXIT_OK
    print(f"{args.gguf_a.name} vs {args.gguf_b.name}, {len(requests)} requests "
          f"({'from ' + str(args.data) if args.data else 'built-in probes'})")
    for kind, s in result.items():
        print(f"  {kind:7s} {s['decisions']:5d} decisions: max |dp| {s['max_abs_dp']:.4f}, mean |dp| "
              f"{s['mean_abs_dp']:.5f}, argmax flips {s['argmax_flips']}, flips among decisions above 0.8: "
              f"{s['flips_above_0.8']} of {s['decisions_above_0.8']}")
    return EXIT_OK


def _soak(args: argparse.Namespace) -> int:
    from .soak import run

    return run(args.requests, args.concurrency, args.models, args.warmup, args.seed, args.json)


def _serve(args: argparse.Namespace) -> int:
    from ..bridge.registry import demo_registry, load_registry
    from ..bridge.server import serve

    path = args.models or Path("models.toml")
    if args.models is None and not path.is_file():
        registry = demo_registry(path.resolve())
        spec = registry.models["demo"]
        spec.ensure_files()
        print(f"clef-bridge: no models.toml in {Path.cwd()}: serving the built-in demo model from "
              f"{spec.gguf.parent} (RANDOM weights: its answers are meaningless). Configure a real model with "
              "`clef-bridge pull clef-flash` or a models.toml.", file=sys.stderr)
    else:
        registry = load_registry(path)
    serve(registry, args.host, args.port)
    return EXIT_OK


def _make_demo(args: argparse.Namespace) -> int:
    from ..bridge.demo import make_demo

    files = make_demo(args.folder, args.seed)
    print(f"wrote the demo model to {files.folder}: {files.gguf.name}, {files.head.name}, "
          f"joint_head_config.json, {files.models_toml.name} (random weights, meaningless answers)")
    print(f"serve it with: clef-bridge serve --models {files.models_toml}")
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from .bench import run

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        print(f"clef-bridge bench: --concurrency takes numbers like 1,4,16, not {args.concurrency!r}", file=sys.stderr)
        return EXIT_USAGE
    return run(args.url.rstrip("/"), levels, args.requests, args.api_key, args.json, args.gguf, args.reference,
               args.head, args.model, args.out)


def _bench_head(args: argparse.Namespace) -> int:
    from .bench_head import run

    return run(tokens=args.tokens, repeats=args.repeats, as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clef-bridge", description="Self-hosted Clef decision models: a llama.cpp "
                                     "GGUF backbone with Clef's joint schema head.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="serve the System One API for every model in models.toml")
    p.add_argument("--models", type=Path, help="the model registry (default: ./models.toml; without one, the "
                                              "built-in demo model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8792, help="port to listen on (default: 8792)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("fit", help="GPU memory plan for a GGUF and its head (exit 0 fits, 1 does not)")
    p.add_argument("gguf", nargs="?", type=Path, help="the backbone GGUF")
    p.add_argument("--arch", choices=["clef-flash", "clef"], help="plan from published dimensions instead of a file")
    p.add_argument("--quant", default="Q8_0", help="quantization for --arch: F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M "
                                                   "(default: Q8_0)")
    p.add_argument("--vram", help="GPU memory to plan for, e.g. 16GiB (default: free memory read through NVML)")
    p.add_argument("--ctx", type=int, default=16384, help="context (n_ctx) in tokens (default: 16384)")
    p.add_argument("--parallel", type=int, default=1, help="sequences decoded together (n_seq_max, default: 1)")
    p.add_argument("--ubatch", type=int, default=512, help="llama.cpp's n_ubatch (default: 512)")
    p.add_argument("--head-on-gpu", action="store_true", help="count the head on the GPU (head_device = cuda)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_fit)

    p = sub.add_parser("pull", help="download a backbone GGUF and its head from the Hugging Face Hub, verify, "
                                    "check, pair, and add it to models.toml")
    p.add_argument("model", choices=["clef-flash", "clef"], help="which Clef release the head comes from")
    p.add_argument("--gguf-repo", help="hub repository holding the backbone GGUF")
    p.add_argument("--gguf-file", help="the GGUF's file name in that repository")
    p.add_argument("--revision", help="revision of the release repository (default: main)")
    p.add_argument("--name", help="name of the models.toml entry (default: the model)")
    p.add_argument("--models", type=Path, default=Path("models.toml"), help="the registry to add the entry to "
                                                                            "(default: ./models.toml)")
    p.set_defaults(func=_pull)

    p = sub.add_parser("make-demo", help="write the small random demo model (GGUF, head, models.toml) to a folder")
    p.add_argument("folder", type=Path, help="where to write it")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files (default: 0)")
    p.set_defaults(func=_make_demo)

    p = sub.add_parser("check", help="refuse a GGUF without its matching head (exit 0 accepted, 1 refused, "
                                     "2 usage or I/O error)")
    p.add_argument("gguf", nargs="?", type=Path, help="the backbone GGUF to check")
    p.add_argument("--head", type=Path, help="joint_head.safetensors (default: look beside the GGUF)")
    p.add_argument("--pair", type=Path, help="a pairing record from `clef-bridge pair` "
                                            "(default: <gguf stem>.pair.json beside the GGUF, if present)")
    p.add_argument("--models", type=Path, help="check every model of this registry instead of one GGUF")
    p.add_argument("--json", action="store_true", help="print one JSON document with every finding")
    p.set_defaults(func=_check)

    p = sub.add_parser("pair", help="write a pairing record: head sha256, backbone fingerprint, canary probes")
    p.add_argument("gguf", type=Path, help="the backbone GGUF")
    p.add_argument("head", type=Path, help="its joint_head.safetensors")
    p.add_argument("-o", "--output", type=Path, help="where to write (default: <gguf stem>.pair.json beside the GGUF)")
    p.set_defaults(func=_pair)

    p = sub.add_parser("decide", help="answer one System One request from a JSON file, printing the response")
    p.add_argument("--models", default="models.toml", help="the model registry (default: ./models.toml)")
    p.add_argument("--model", default="jev-latest", help="model name or alias (default: the registry's default)")
    p.add_argument("--compact", action="store_true", help="print the response on one line")
    p.add_argument("request", help="a JSON file holding the request body ({model, state, questions})")
    p.set_defaults(func=_decide)

    p = sub.add_parser("bench", help="latency and throughput of a running server, with optional baselines")
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8792")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=40, help="requests per concurrency level (default: 40)")
    p.add_argument("--model", default="jev-latest", help="model name to send (default: jev-latest)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--gguf", type=Path, help="also time the bare llama.cpp prefill of the same tokens with this GGUF")
    p.add_argument("--reference", type=Path, metavar="HF_DIR",
                   help="also time Cloudflare's reference code on this transformers model (needs --head)")
    p.add_argument("--head", type=Path, help="joint_head.safetensors for --reference")
    p.add_argument("--out", type=Path, help="write latency and throughput charts (PNG, needs matplotlib) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_bench)

    p = sub.add_parser("soak", help="many mixed requests against a fresh server, watching memory, descriptors "
                                    "and tail latency (exit 0 when stable)")
    p.add_argument("--requests", type=int, default=20000, help="requests in all (default: 20000)")
    p.add_argument("--concurrency", type=int, default=8, help="parallel clients (default: 8)")
    p.add_argument("--models", type=Path, help="the registry to serve (default: the built-in demo)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before memory is compared (default: 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_soak)

    p = sub.add_parser("eval", help="accuracy, calibration and coverage on labelled data (errors first)")
    p.add_argument("--data", type=Path, required=True, help="JSONL of {\"request\": ..., \"labels\": ...}")
    p.add_argument("--url", help="a running server to evaluate")
    p.add_argument("--models", type=Path, help="or a registry, to run a model in this process")
    p.add_argument("--model", help="the model name, with --models")
    p.add_argument("--out", type=Path, help="write report.json, report.md and charts here")
    p.add_argument("--concurrency", type=int, default=4, help="parallel requests with --url (default: 4)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer with --url")
    p.set_defaults(func=_eval)

    p = sub.add_parser("calibrate", help="fit a temperature per question type on labelled data")
    p.add_argument("--data", type=Path, required=True, help="JSONL of labelled requests")
    p.add_argument("--models", type=Path, required=True, help="the registry holding the model")
    p.add_argument("--model", required=True, help="the model to calibrate")
    p.add_argument("--write", action="store_true", help="store the accepted temperatures in models.toml")
    p.set_defaults(func=_calibrate)

    p = sub.add_parser("drift", help="how much a second backbone (e.g. a coarser quantization) moves answers")
    p.add_argument("gguf_a", type=Path, help="the reference backbone, e.g. F16")
    p.add_argument("gguf_b", type=Path, help="the backbone to compare, e.g. Q4_K_M")
    p.add_argument("--head", type=Path, required=True, help="joint_head.safetensors used with both")
    p.add_argument("--data", type=Path, help="labelled or unlabelled requests (JSONL; default: built-in probes)")
    p.add_argument("--ctx", type=int, default=8192, help="n_ctx for both backbones (default: 8192)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_drift)

    p = sub.add_parser("bench-head", help="time the numpy head against the reference torch head at Clef-flash shape")
    p.add_argument("--tokens", type=int, default=750, help="prompt length in tokens (default: 750)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per side; medians are reported (default: 7)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_bench_head)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ClefError as exc:
        from ..bridge.integrity import ModelRefused
        from .pull import PullError

        print(f"clef-bridge {args.command}: {exc}", file=sys.stderr)
        refusals = (RequestInvalid, ContextLengthExceeded, ModelRefused, PullError)
        return EXIT_REFUSED if isinstance(exc, refusals) else EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
