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


def _serve(args: argparse.Namespace) -> int:
    from ..bridge.registry import load_registry
    from ..bridge.server import serve

    serve(load_registry(args.models), args.host, args.port)
    return EXIT_OK


def _bench_head(args: argparse.Namespace) -> int:
    from .bench_head import run

    return run(tokens=args.tokens, repeats=args.repeats, as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clef-bridge", description="Self-hosted Clef decision models: a llama.cpp "
                                     "GGUF backbone with Clef's joint schema head.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="serve the System One API for every model in models.toml")
    p.add_argument("--models", default="models.toml", help="the model registry (default: ./models.toml)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8792, help="port to listen on (default: 8792)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("decide", help="answer one System One request from a JSON file, printing the response")
    p.add_argument("--models", default="models.toml", help="the model registry (default: ./models.toml)")
    p.add_argument("--model", default="jev-latest", help="model name or alias (default: the registry's default)")
    p.add_argument("--compact", action="store_true", help="print the response on one line")
    p.add_argument("request", help="a JSON file holding the request body ({model, state, questions})")
    p.set_defaults(func=_decide)

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
        print(f"clef-bridge {args.command}: {exc}", file=sys.stderr)
        return EXIT_REFUSED if isinstance(exc, (RequestInvalid, ContextLengthExceeded)) else EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
