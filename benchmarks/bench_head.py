"""bench-head: our numpy head against Cloudflare's torch head, same weights, same inputs, one run.

The heads run in turns (ours, theirs, ours, ...), so the drift of a shared machine lands on every
side of the ratio; the medians come with the range of the runs. head_dtype float16 adds our head
with float16-stored matrices and its largest logit and probability differences to float32.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from clef_bridge.head.answer import softmax64
from clef_bridge.head.errors import Category, ClefError
from clef_bridge.head.model import Layout, joint_schema_head
from clef_bridge.head.schema import Limits
from clef_bridge.head.weights import DTYPES, ENCODERS, dtype_name, store_matrices, unflatten

from tests.randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict, schema_tokens
from tests.reference import ReferenceUnavailable, reference_logits, torch_head

# A router-like schema: 4 questions (noul, choice, score, choice), 19 options.
TYPES, OPTIONS = [0, 1, 2, 1], [2, 7, 5, 5]
LOGIT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class HeadBench:
    tokens: int
    questions: int
    options: int
    weights: str
    times_ms: dict[str, list[float]]  # "numpy", "torch" and, with a head_dtype, "numpy <dtype>"
    max_logit_diff: float  # ours vs the reference
    torch_threads: int
    half: dict[str, Any] | None = None  # head_dtype: its differences to float32

    @property
    def numpy_ms(self) -> float:
        return statistics.median(self.times_ms["numpy"])

    @property
    def torch_ms(self) -> float:
        return statistics.median(self.times_ms["torch"])

    @property
    def ratio(self) -> float:
        return self.numpy_ms / self.torch_ms

    @property
    def ok(self) -> bool:
        return self.max_logit_diff <= LOGIT_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "questions": self.questions, "options": self.options, "weights": self.weights,
                "numpy_ms": round(self.numpy_ms, 2), "torch_ms": round(self.torch_ms, 2),
                "ratio": round(self.ratio, 3), "max_abs_logit_diff": self.max_logit_diff,
                "logit_tolerance": LOGIT_TOLERANCE, "torch_threads": self.torch_threads,
                "ranges_ms": {k: [round(min(v), 2), round(max(v), 2)] for k, v in self.times_ms.items()},
                "head_dtype": self.half}


class ShapeError(ClefError):
    """--tokens too few for the router schema, or --options outside what one choice question holds."""

    category = Category.USAGE
    error_type = "shape_error"


def schema_layout(tokens: int, options: int | None) -> tuple[Layout, int]:
    """The router schema in `tokens` tokens, or one choice of `options` options after a `tokens`-token state."""
    if options is not None and not 2 <= options <= Limits().max_options:
        raise ShapeError(f"--options {options}: a choice question has 2 to {Limits().max_options} options",
                            fix=f"pass --options between 2 and {Limits().max_options}")
    if options is None and tokens < schema_tokens(OPTIONS):
        need = schema_tokens(OPTIONS)
        raise ShapeError(f"--tokens {tokens} cannot hold the router schema: its 4 questions and 19 options alone "
                            f"take {need} tokens", fix=f"pass --tokens {need} or more (the default, 750, is the "
                            "router request's length with Clef's tokenizer), or --options N for one choice question "
                            "after a state of --tokens tokens")
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


def run(tokens: int = 750, repeats: int = 7, options: int | None = None, weights: str = "F32",
        head_dtype: str = "f32") -> HeadBench:
    """Time our head and the reference's on the same random Clef-flash-shaped weights and inputs."""
    layout, n_tokens = schema_layout(tokens, options)  # a shape that cannot be is refused before any work
    try:
        import torch
    except ImportError:
        raise ReferenceUnavailable("bench-head's torch side needs the test extra", fix="pip install -e '.[test]' "
                                   "&& pip install --no-deps clef-finetune==0.1.0") from None
    cfg = CLEF_FLASH_HEAD
    flat = rounded(random_state_dict(cfg, seed=0), weights)
    params = unflatten(flat)
    hidden, input_ids, output_embedding, rows = random_inputs(cfg, layout, n_tokens, seed=0, vocab=2048)
    head = torch_head(cfg, flat)
    ours = lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **params)  # noqa: E731
    theirs = lambda: reference_logits(head, hidden, input_ids, layout, output_embedding)  # noqa: E731
    reference = ours()
    diff = float(np.abs(reference - theirs()).max())
    sides, labels, half = [ours, theirs], ["numpy", "torch"], None
    if dtype_name(head_dtype) != "f32":
        stored = unflatten(store_matrices(flat, head_dtype))
        sides.append(lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **stored))
        labels.append(f"numpy {head_dtype}")
        other = sides[-1]()
        half = {"dtype": head_dtype, "max_abs_logit_diff_vs_float32": float(np.abs(other - reference).max()),
                "max_abs_prob_diff_vs_float32": float(np.abs(probabilities(other, layout)
                                                             - probabilities(reference, layout)).max())}
    times = dict(zip(labels, turns_ms(sides, repeats)))
    return HeadBench(n_tokens, len(layout.types), len(layout.option_spans), weights, times, diff,
                     torch.get_num_threads(), half)
