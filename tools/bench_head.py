"""bench-head: our numpy head against Cloudflare's torch head, same weights, same inputs, one run.

The two heads run in turns (ours, theirs, ours, ...), so the drift of a shared machine lands on
both sides of the ratio; the medians come with the range of the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from ..head.model import Layout, joint_schema_head
from ..head.weights import unflatten
from .randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict
from .reference import ReferenceUnavailable, reference_logits, torch_head

# A router-like schema: 4 questions (noul, choice, score, choice), 19 options.
TYPES, OPTIONS = [0, 1, 2, 1], [2, 7, 5, 5]
LOGIT_TOLERANCE = 1e-3


def schema_layout(tokens: int, options: int | None) -> tuple[Layout, int]:
    """The router schema in `tokens` tokens, or one choice of `options` options after a `tokens`-token state."""
    if options is None:
        return random_layout(tokens, TYPES, OPTIONS, seed=0), tokens
    probe = 1 << 20  # the schema's own length does not depend on the total
    total = tokens + probe - int(random_layout(probe, [1], [options], seed=0).question_spans[0, 0])
    return random_layout(total, [1], [options], seed=0), total


def turns_ms(fns, repeats: int) -> list[list[float]]:
    """Wall times in milliseconds of each fn, called in turns after one warm-up call each."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return times


def run(tokens: int = 750, repeats: int = 7, as_json: bool = False, options: int | None = None) -> int:
    try:
        import torch
    except ImportError:
        print("bench-head: the torch side needs the test extra: pip install -e '.[test]' && "
              "pip install --no-deps clef-finetune==0.1.0", file=sys.stderr)
        return 2
    cfg = CLEF_FLASH_HEAD
    flat = random_state_dict(cfg, seed=0)
    params = unflatten(flat)
    layout, n_tokens = schema_layout(tokens, options)
    hidden, input_ids, output_embedding, rows = random_inputs(cfg, layout, n_tokens, seed=0, vocab=2048)
    try:
        head = torch_head(cfg, flat)
    except ReferenceUnavailable as exc:
        print(f"bench-head: {exc}", file=sys.stderr)
        return 2
    ours = lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **params)  # noqa: E731
    theirs = lambda: reference_logits(head, hidden, input_ids, layout, output_embedding)  # noqa: E731
    diff = float(np.abs(ours() - theirs()).max())
    numpy_times, torch_times = turns_ms([ours, theirs], repeats)
    numpy_ms, torch_ms = statistics.median(numpy_times), statistics.median(torch_times)
    schema = f"{len(layout.types)} questions / {len(layout.option_spans)} options"
    result = {"tokens": n_tokens, "questions": len(layout.types), "options": len(layout.option_spans),
              "numpy_ms": round(numpy_ms, 2), "torch_ms": round(torch_ms, 2), "ratio": round(numpy_ms / torch_ms, 3),
              "numpy_range_ms": [round(min(numpy_times), 2), round(max(numpy_times), 2)],
              "torch_range_ms": [round(min(torch_times), 2), round(max(torch_times), 2)],
              "max_abs_logit_diff": diff}
    if as_json:
        print(json.dumps(result))
    else:
        print(f"joint head at Clef-flash shape, {n_tokens} tokens, {schema}, {torch.get_num_threads()} torch threads, "
              f"{repeats} runs each in turns")
        print(f"  numpy  median {numpy_ms:8.1f} ms  (range {min(numpy_times):.1f} to {max(numpy_times):.1f})")
        print(f"  torch  median {torch_ms:8.1f} ms  (range {min(torch_times):.1f} to {max(torch_times):.1f}; "
              "Cloudflare's reference, float32)")
        print(f"  ratio numpy/torch {numpy_ms / torch_ms:.3f}   max |logit diff| {diff:.2e} "
              f"(tolerance {LOGIT_TOLERANCE:g})")
    return 0 if diff <= LOGIT_TOLERANCE else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=750,
                        help="prompt length; with --options, the state's length before the question (default: 750)")
    parser.add_argument("--options", type=int, help="one choice question with this many options (at most 255) "
                        "instead of the router schema (4 questions, 19 options)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per side; medians are reported (default: 7)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    return run(tokens=args.tokens, repeats=args.repeats, as_json=args.json, options=args.options)


if __name__ == "__main__":
    sys.exit(main())
