"""The `clef-bridge` command: argparse over library functions that return typed results.

This module alone prints: a result's text (tools/render.py) or, with --json, its to_dict(); and it
alone picks exit codes: 0 ok, 1 refused / not ok, 2 usage, I/O or another error, with the fix (an error's
code comes from its category, in the table the server's statuses come from: bridge/server/errors.py); 141
when the reader of its output went away (`| head`), as a command stopped by SIGPIPE exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..bridge.server.errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, answer_for
from ..head.errors import Category, ClefError
from .cliargs import build_parser

EXIT_PIPE = 128 + 13  # SIGPIPE's: Python ignores the signal and raises BrokenPipeError instead


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    return value


def emit(result: Any, as_json: bool) -> int:
    """Print a result for people or as one JSON document; its exit code."""
    if as_json:
        print(json.dumps(_jsonable(result), ensure_ascii=False, default=str))
    else:
        from .render import text

        print(text(result))
    return EXIT_OK if getattr(result, "ok", True) else EXIT_REFUSED


class UsageError(ClefError):
    category = Category.USAGE
    error_type = "usage_error"


@contextmanager
def checked_service(models: Path, name: str) -> Iterator[Any]:
    """A models.toml entry loaded the one checked way (pins, pairing record, canaries) behind the decision service
    (bridge.service.local.LocalService) with the entry's [server] limits, as the server runs it; closed afterwards."""
    from ..bridge.config.registry import load_registry, name_table, resolve
    from ..bridge.gguf.reader import read_gguf
    from ..bridge.model.loading import load_checked
    from ..bridge.service.local import LocalService

    registry = load_registry(models)
    hidden, architectures = {}, {}
    for n, spec in registry.models.items():
        if spec.gguf.is_file():
            info = read_gguf(spec.gguf)
            width = info.arch_key("embedding_length")
            hidden[n], architectures[n] = (width if isinstance(width, int) else 0), info.architecture or ""
    spec = registry.models[resolve(name_table(registry, hidden, architectures), name)]
    loaded = load_checked(spec, registry.server.limits)
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        with LocalService(loaded.model, registry.server) as service:
            yield service
    finally:
        loaded.model.close()


def _read_json_file(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", fix="pass a JSON file holding the request body") from None


def _decide(args: argparse.Namespace) -> int:
    from ..bridge.server.doors.systemone import systemone_body

    body = _read_json_file(args.request)
    with checked_service(args.models, args.model) as service:
        response = systemone_body(service.decide(body))
    print(json.dumps(response, ensure_ascii=False, indent=None if args.compact else 2))
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    from ..bridge.config.registry import load_registry
    from .checks import check_files, check_registry

    if (args.gguf is None) == (args.models is None):
        raise UsageError("give a GGUF or --models models.toml (not both)")
    if args.models and args.verify_against is not None:
        raise UsageError("--verify-against checks one GGUF", fix="clef-bridge check GGUF --verify-against [REPO]")
    if args.models and args.lora is not None:
        raise UsageError("--lora goes with one GGUF; a registry's entries name their own `lora`")
    result = check_registry(load_registry(args.models)) if args.models else \
        check_files(args.gguf, args.head, args.pair, args.verify_against, args.lora)
    code = emit(result, args.json)
    return EXIT_USAGE if result.io_error else code


def _pair(args: argparse.Namespace) -> int:
    from .checks import IO_CODES, pair_files

    result = pair_files(args.gguf, args.head, args.output, args.verify_against, args.mmproj, args.lora)
    code = emit(result, args.json)
    return EXIT_USAGE if any(f.code in IO_CODES for f in result.report.findings) else code


def _fit(args: argparse.Namespace) -> int:
    from ..bridge.config.memory_plan import parse_size
    from ..bridge.host.gpu import read_gpu
    from .fit import fit

    try:
        vram = parse_size(args.vram) if args.vram else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    gpu = None if vram else read_gpu()
    if vram is None and gpu is None:
        raise UsageError("no GPU found (nvidia-ml-py reads it, on the first device CUDA_VISIBLE_DEVICES shows)",
                         fix="pass --vram 16GiB")
    return emit(fit(args.gguf, args.arch, args.quant, vram or gpu.free_bytes, args.ctx, args.parallel, args.ubatch,
                    args.head_on_gpu, args.head_dtype, gpu.device if gpu else "", args.head, args.mmproj,
                    args.n_cpu_moe, args.adapters, args.lora_rank), args.json)


def _pull(args: argparse.Namespace) -> int:
    from ..bridge.catalogue.releases import CLEF_OMNI
    from .pull import pull

    if (not args.gguf_repo or not args.gguf_file) and args.model == CLEF_OMNI.name:
        raise UsageError("no official Clef-omni GGUF is known: pass --gguf-repo OWNER/REPO and --gguf-file NAME.gguf "
                         "of a qwen3vlmoe GGUF of its thinker",
                         fix="convert Cloudflare/clef-omni with llama.cpp's convert_hf_to_gguf.py (and --mmproj for "
                             "its projector), or name a community repository; a Q4_K_M needs n_cpu_moe on a 16 GB "
                             "card (`clef-bridge fit --arch clef-omni --quant Q4_K_M --vram 16GiB`); the head comes "
                             "from Cloudflare/clef-omni")
    if not args.gguf_repo or not args.gguf_file:
        raise UsageError("community GGUF names vary: pass --gguf-repo OWNER/REPO and --gguf-file NAME.gguf",
                         fix=f"pick a GGUF of {args.model}, e.g. a Q8_0 for a 16 GB card (`clef-bridge fit --arch "
                             f"{args.model}` compares them): a clef GGUF (ggml-org/Clef-Flash-GGUF) carries its head; "
                             "for a qwen35 backbone the head comes from the release repository")
    return emit(pull(args.model, args.gguf_repo, args.gguf_file, args.models, args.name, args.revision,
                     args.mmproj_file, not args.no_mmproj, None if args.no_verify else args.verify_against), args.json)


def _eval(args: argparse.Namespace) -> int:
    from ..bridge.server.doors.systemone import systemone_body
    from .evaldata import load_examples
    from .evaluate import build_report, run_http, run_local, write_report

    if (args.url is None) == (args.models is None) or (args.models is not None and args.model is None):
        raise UsageError("give --url URL, or --models PATH with --model NAME")
    examples = load_examples(args.data)
    if args.url:
        outcomes = run_http(args.url, examples, args.concurrency, args.api_key)
    else:
        with checked_service(args.models, args.model) as service:
            outcomes = run_local(lambda body: systemone_body(service.decide(body)), examples)
    report = build_report(outcomes)
    if args.out:
        for note in write_report(report, args.out):
            print(note, file=sys.stderr)
    return emit(report, args.json)


def _calibrate(args: argparse.Namespace) -> int:
    from ..bridge.config.registry_file import set_model_keys
    from ..head.schema import QUESTION_TYPES
    from .calibrate import CalibrateResult, calibrate
    from .evaldata import load_examples

    examples = load_examples(args.data)
    with checked_service(args.models, args.model) as service:
        current = {kind: service.model.answer_options.temperature.get(kind, 1.0) for kind in QUESTION_TYPES}
        calibrations = calibrate(service.decide, examples, current)
        name = service.model.name
    temperatures = dict(current) | {c.kind: c.temperature for c in calibrations}
    if args.write:
        set_model_keys(args.models, name, {"temperature": temperatures})
    return emit(CalibrateResult(name, calibrations, temperatures, args.models if args.write else None), args.json)


def _drift(args: argparse.Namespace) -> int:
    from ..bridge.config.registry import model_spec
    from ..bridge.model.loading import load_checked
    from ..bridge.service.local import LocalService
    from .drift import DriftResult, drift, probe_requests
    from .evaldata import load_examples

    requests = [e.request for e in load_examples(args.data)] if args.data else probe_requests()
    keys = {"n_ctx": args.ctx, "max_length": args.ctx}
    a = load_checked(model_spec("a", args.gguf_a, args.head, **keys)).model  # clef GGUFs bring their own heads
    try:
        b = load_checked(model_spec("b", args.gguf_b, args.head, **keys)).model
        try:
            with LocalService(a) as service_a, LocalService(b) as service_b:
                by_type = drift(service_a.decide, service_b.decide, requests)
        finally:
            b.close()
    finally:
        a.close()
    source = f"from {args.data}" if args.data else "built-in probes"
    return emit(DriftResult(str(args.gguf_a), str(args.gguf_b), len(requests), source, by_type), args.json)


def _split(args: argparse.Namespace) -> int:
    from .split_join import split_model

    return emit(split_model(args.clef, args.output, args.head_dtype, args.overwrite), args.json)


def _lora(args: argparse.Namespace) -> int:
    from ..bridge.gguf.lora import convert_lora_file
    from ..bridge.model.loading import backbone_file

    return emit(convert_lora_file(args.adapter, backbone_file(args.gguf), args.output), args.json)


def _join(args: argparse.Namespace) -> int:
    from .split_join import join_model

    return emit(join_model(args.backbone, args.head, args.output, args.head_dtype, args.temperature,
                           args.from_calibration, args.overwrite), args.json)


def demos_read() -> str:
    """What each built-in demo reads, as the banner says it ("demo: text and images; ..."): from the catalogue, the
    media kinds of its release's architecture."""
    from ..bridge.catalogue.architectures import ARCHITECTURES
    from ..bridge.catalogue.media import MEDIA_KINDS
    from ..bridge.catalogue.releases import RELEASES

    def listed(words: list[str]) -> str:
        return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]

    return "; ".join(f"{r.demo}: {listed(['text'] + [MEDIA_KINDS[k].field for k in ARCHITECTURES[r.backbone].media])}"
                     for r in RELEASES.values() if r.demo)


def _serve(args: argparse.Namespace) -> int:
    from ..bridge.catalogue.releases import CLEF_FLASH
    from ..bridge.config.registry import demo_registry, file_registry, load_registry
    from ..bridge.model.loading import materialize
    from ..bridge.server.app import serve

    if (args.ray_address or args.ray_dashboard) and not args.ray:
        raise UsageError("--ray-address and --ray-dashboard are for --ray", fix="add --ray, or drop them")
    if args.gguf is not None and args.models is not None:
        raise UsageError("serve takes a GGUF or --models, not both", fix="name the GGUF in models.toml, or drop --models")
    if args.gguf is None and (args.head or args.mmproj):
        raise UsageError("--head and --mmproj go with a GGUF", fix="clef-bridge serve MODEL.gguf --head HEAD ...")
    path = args.models or Path("models.toml")
    if args.gguf is not None:
        registry = file_registry(args.gguf, args.head, args.mmproj)
    elif args.models is None and not path.is_file():
        registry = demo_registry(path.resolve())
        materialize(registry.models["demo"])  # writes both demos, once
        print(f"clef-bridge: no models.toml in {Path.cwd()}: serving the built-in demo models ({demos_read()}) "
              f"from {registry.models['demo'].gguf.parent} (RANDOM weights: their "
              f"answers are meaningless). Configure a real model with `{CLEF_FLASH.pull_command}` or a models.toml.",
              file=sys.stderr)
    else:
        registry = load_registry(path)
    if args.ray:
        _serve_ray(registry, args)
    else:
        serve(registry, args.host, args.port)
    return EXIT_OK


def _serve_ray(registry: Any, args: argparse.Namespace) -> None:
    from ..bridge.scale.ray_plan import LOCAL_ONLY_ENV, cluster_address

    address = cluster_address(args.ray_address, os.environ)
    if address is not None and args.ray_dashboard:
        raise UsageError(f"--ray-dashboard starts the dashboard of a Ray this command starts; it joins {address}",
                         fix="drop --ray-dashboard (the cluster's `ray start --head` decides its dashboard), or "
                             "drop --ray-address and RAY_ADDRESS")
    if address is None:
        os.environ[LOCAL_ONLY_ENV[0]] = LOCAL_ONLY_ENV[1]  # before Ray is imported; the processes it starts inherit it
    try:
        from ..bridge.scale.ray_serve import run
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise UsageError(f"--ray needs Ray Serve ({exc})", fix="pip install 'clef-bridge[ray]'") from None
    try:
        run(registry, args.host, args.port, address, args.ray_dashboard)
    except ConnectionError as exc:  # ray.init found no cluster at the address
        raise UsageError(f"cannot join the Ray cluster {address}: {exc}",
                         fix="start one (ray start --head), or drop --ray-address for a Ray on this machine") from None


def _make_demo(args: argparse.Namespace) -> int:
    from ..bridge.demo.builtins import make_demo

    return emit(make_demo(args.folder, args.seed), args.json)


def _bench(args: argparse.Namespace) -> int:
    from .bench import run

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise UsageError(f"--concurrency takes numbers like 1,4,16, not {args.concurrency!r}") from None
    return emit(run(args.url.rstrip("/"), levels, args.requests, args.api_key, args.gguf, args.model, args.out),
                args.json)


def _report(args: argparse.Namespace) -> int:
    from .report import build_report, write_plots

    result = build_report(args.log, args.labels, args.bucket)
    if args.plots is not None and result.ok:
        for note in write_plots(result, args.plots):
            print(note, file=sys.stderr)
    return emit(result, args.json)


COMMANDS = {"serve": _serve, "fit": _fit, "pull": _pull, "make-demo": _make_demo, "check": _check, "pair": _pair,
            "split": _split, "join": _join, "lora": _lora,
            "decide": _decide, "bench": _bench, "eval": _eval, "calibrate": _calibrate, "drift": _drift,
            "report": _report}


def dispatch(commands: dict[str, Any], args: argparse.Namespace, prog: str = "clef-bridge") -> int:
    """Run args.command; a ClefError becomes its message and fix on stderr and an exit code."""
    try:
        code = commands[args.command](args)
        sys.stdout.flush()  # into a pipe the output is buffered: a reader gone shows here, not at exit
        return code
    except BrokenPipeError:
        # `clef-bridge decide ... | head`: the reader has what it wanted; stdout goes nowhere from now on, so
        # the interpreter's last flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except ClefError as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        if exc.fix:
            print(f"  fix: {exc.fix}", file=sys.stderr)
        return answer_for(exc).exit_code


def main(argv: list[str] | None = None) -> int:
    return dispatch(COMMANDS, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
