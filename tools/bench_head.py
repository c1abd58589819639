"""bench-head: our numpy head against Cloudflare's torch head, same weights, same inputs, one run.

The heads run in turns (ours, theirs, ours, ...), so the drift of a shared machine lands on every
side of the ratio; the medians come with the range of the runs. `--head-dtype float16` adds our
head with float16-stored matrices and its largest logit and probability differences to float32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from ..head.answer import softmax64
from ..head.model import Layout, joint_schema_head
from ..head.weights import DTYPES, ENCODERS, STORAGE_DTYPES, store_matrices, unflatten
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


def rounded(flat: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """The weights as a safetensors file of that dtype would hold them."""
    return {k: DTYPES[dtype][1](ENCODERS[dtype](v).view(np.uint8)).reshape(v.shape) for k, v in flat.items()}


def probabilities(logits: np.ndarray, layout: Layout) -> np.ndarray:
    return np.concatenate([softmax64(z) for z in np.split(logits, layout.option_offsets[1:])])


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


def run(tokens: int = 750, repeats: int = 7, as_json: bool = False, options: int | None = None,
        weights: str = "F32", head_dtype: str = "float32") -> int:
    try:
        import torch
    except ImportError:
        print("bench-head: the torch side needs the test extra: pip install -e '.[test]' && "
              "pip install --no-deps clef-finetune==0.1.0", file=sys.stderr)
        return 2
    cfg = CLEF_FLASH_HEAD
    flat = rounded(random_state_dict(cfg, seed=0), weights)
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
    reference = ours()
    diff = float(np.abs(reference - theirs()).max())
    sides = [ours, theirs]
    if head_dtype != "float32":
        half = unflatten(store_matrices(flat, head_dtype))
        sides.append(lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **half))
        other = sides[-1]()
    times = turns_ms(sides, repeats)
    numpy_ms, torch_ms = statistics.median(times[0]), statistics.median(times[1])
    result = {"tokens": n_tokens, "questions": len(layout.types), "options": len(layout.option_spans),
              "weights": weights, "numpy_ms": round(numpy_ms, 2), "torch_ms": round(torch_ms, 2),
              "ratio": round(numpy_ms / torch_ms, 3), "max_abs_logit_diff": diff,
              "numpy_range_ms": [round(min(times[0]), 2), round(max(times[0]), 2)],
              "torch_range_ms": [round(min(times[1]), 2), round(max(times[1]), 2)],
              "head_dtype": None}
    if head_dtype != "float32":
        result["head_dtype"] = {
            "dtype": head_dtype, "median_ms": round(statistics.median(times[2]), 2),
            "range_ms": [round(min(times[2]), 2), round(max(times[2]), 2)],
            "max_abs_logit_diff_vs_float32": float(np.abs(other - reference).max()),
            "max_abs_prob_diff_vs_float32": float(np.abs(probabilities(other, layout)
                                                         - probabilities(reference, layout)).max())}
    if as_json:
        print(json.dumps(result))
    else:
        _print(result, times, repeats, torch.get_num_threads())
    return 0 if diff <= LOGIT_TOLERANCE else 1


def _print(result: dict, times: list[list[float]], repeats: int, threads: int) -> None:
    print(f"joint head at Clef-flash shape, {result['tokens']} tokens, {result['questions']} questions / "
          f"{result['options']} options, {result['weights']} weights, {threads} torch threads, {repeats} runs "
          "each in turns")
    labels = ["numpy", "torch (Cloudflare's reference, float32)"]
    if result["head_dtype"]:
        labels.append(f"numpy, {result['head_dtype']['dtype']} matrices")
    for label, ts in zip(labels, times):
        print(f"  median {statistics.median(ts):8.1f} ms  (range {min(ts):.1f} to {max(ts):.1f})  {label}")
    print(f"  ratio numpy/torch {result['ratio']:.3f}   max |logit diff| {result['max_abs_logit_diff']:.2e} "
          f"(tolerance {LOGIT_TOLERANCE:g})")
    if result["head_dtype"]:
        d = result["head_dtype"]
        print(f"  {d['dtype']} matrices vs float32: max |logit diff| {d['max_abs_logit_diff_vs_float32']:.2e}, "
              f"max |probability diff| {d['max_abs_prob_diff_vs_float32']:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=750,
                        help="prompt length; with --options, the state's length before the question (default: 750)")
    parser.add_argument("--options", type=int, help="one choice question with this many options (at most 255) "
                        "instead of the router schema (4 questions, 19 options)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per side; medians are reported (default: 7)")
    parser.add_argument("--weights", choices=sorted(DTYPES), default="F32",
                        help="round the random weights as a safetensors file of this dtype holds them; "
                        "Cloudflare ships BF16 (default: F32)")
    parser.add_argument("--head-dtype", choices=list(STORAGE_DTYPES), default="float32",
                        help="also time our head with its matrices stored in this dtype and report its "
                        "largest differences to float32 (default: float32, no extra side)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    return run(tokens=args.tokens, repeats=args.repeats, as_json=args.json, options=args.options,
               weights=args.weights, head_dtype=args.head_dtype)


if __name__ == "__main__":
    sys.exit(main())
