"""bench-head: our numpy head against Cloudflare's torch head, same weights, same inputs, one run."""

from __future__ import annotations

import json
import sys

import numpy as np

from ..head.model import joint_schema_head
from ..head.weights import unflatten
from .bench import median_ms
from .randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict
from .reference import ReferenceUnavailable, reference_logits, torch_head

# A router-like schema: 4 questions (noul, choice, score, choice), 19 options.
TYPES, OPTIONS = [0, 1, 2, 1], [2, 7, 5, 5]
LOGIT_TOLERANCE = 1e-3


def run(tokens: int = 750, repeats: int = 7, as_json: bool = False) -> int:
    try:
        import torch
    except ImportError:
        print("bench-head: the torch side needs the test extra: pip install -e '.[test]' && "
              "pip install --no-deps clef-finetune==0.1.0", file=sys.stderr)
        return 2
    cfg = CLEF_FLASH_HEAD
    flat = random_state_dict(cfg, seed=0)
    params = unflatten(flat)
    layout = random_layout(tokens, TYPES, OPTIONS, seed=0)
    hidden, input_ids, output_embedding, rows = random_inputs(cfg, layout, tokens, seed=0, vocab=2048)
    try:
        head = torch_head(cfg, flat)
    except ReferenceUnavailable as exc:
        print(f"bench-head: {exc}", file=sys.stderr)
        return 2
    ours = lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **params)  # noqa: E731
    theirs = lambda: reference_logits(head, hidden, input_ids, layout, output_embedding)  # noqa: E731
    diff = float(np.abs(ours() - theirs()).max())
    numpy_ms = median_ms(ours, repeats)
    torch_ms = median_ms(theirs, repeats)
    result = {"tokens": tokens, "numpy_ms": round(numpy_ms, 2), "torch_ms": round(torch_ms, 2),
              "ratio": round(numpy_ms / torch_ms, 3)}
    if as_json:
        print(json.dumps(result))
    else:
        print(f"joint head at Clef-flash shape, {tokens} tokens, 4 questions / 19 options, "
              f"{torch.get_num_threads()} torch threads")
        print(f"  numpy  median {numpy_ms:8.1f} ms")
        print(f"  torch  median {torch_ms:8.1f} ms (Cloudflare's reference, float32)")
        print(f"  ratio numpy/torch {numpy_ms / torch_ms:.3f}   max |logit diff| {diff:.2e} "
              f"(tolerance {LOGIT_TOLERANCE:g})")
    return 0 if diff <= LOGIT_TOLERANCE else 1
