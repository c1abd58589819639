"""Deterministic random heads and token layouts, for fixtures, the demo model and benchmarks."""

from __future__ import annotations

import numpy as np
from clef_bridge.bridge.demo.builtins import random_head
from clef_bridge.head.config import CLEF_FLASH_HEAD, HeadConfig
from clef_bridge.head.model import Layout

__all__ = ["CLEF_FLASH_HEAD", "SCALARS", "random_inputs", "random_layout", "random_state_dict", "schema_tokens"]

SCALARS = {"prior_logit_scale": 0.7, "joint_logit_scale": 1.5, "residual_gate": 0.5}


def random_state_dict(cfg: HeadConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights of a plausible scale for every tensor the config implies."""
    return random_head(cfg, seed, SCALARS)


def random_inputs(cfg: HeadConfig, layout: Layout, tokens: int, seed: int, vocab: int = 1000):
    """Hidden states [t, H], token ids [t], an output embedding [vocab, H] and its option-span rows."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((tokens, cfg.hidden_size), dtype=np.float32)
    input_ids = rng.integers(0, vocab, size=tokens)
    output_embedding = rng.standard_normal((vocab, cfg.hidden_size), dtype=np.float32)
    rows = np.concatenate([output_embedding[input_ids[s:e]] for s, e in layout.option_spans])
    return hidden, input_ids, output_embedding, rows


def _span_lengths(n_options: list[int], seed: int) -> list[int]:
    """Question span length, then each option span length, per question."""
    rng = np.random.default_rng(seed)
    lengths = []
    for n in n_options:
        lengths.append(int(rng.integers(3, 12)))
        lengths += [int(v) for v in rng.integers(6, 14, size=n)]
    return lengths


def schema_tokens(n_options: list[int], seed: int = 0) -> int:
    """The fewest tokens random_layout can lay this schema out in."""
    lengths = _span_lengths(n_options, seed)
    return sum(lengths) + 3 * len(lengths) + 20


def random_layout(n_tokens: int, types: list[int], n_options: list[int], seed: int = 0) -> Layout:
    """Question and option spans laid out like an encoded prompt, inside n_tokens tokens."""
    lengths = _span_lengths(n_options, seed)
    gaps = 3 * len(lengths) + 20
    if sum(lengths) + gaps > n_tokens:
        raise ValueError(f"{n_tokens} tokens cannot hold this schema")
    pos = n_tokens - sum(lengths) - gaps + 8  # the state fills the front, as in a real prompt
    q_spans, o_spans, offsets, k = [], [], [], 0
    for n in n_options:
        q_spans.append((pos, pos + lengths[k]))
        pos += lengths[k] + 3
        k += 1
        offsets.append(len(o_spans))
        for _ in range(n):
            o_spans.append((pos, pos + lengths[k]))
            pos += lengths[k] + 3
            k += 1
    return Layout(np.array(q_spans), np.array(o_spans), np.array(offsets), np.array(types))
