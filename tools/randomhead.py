"""Deterministic random heads and token layouts, for fixtures, the demo model and benchmarks."""

from __future__ import annotations

import numpy as np

from ..head.config import HeadConfig
from ..head.model import Layout
from ..head.weights import expected_shapes

CLEF_FLASH_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)
CLEF_HEAD = HeadConfig(hidden_size=5120, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)

# The released scalars are trained; zeros would make the joint path vanish, so give them weight.
SCALARS = {"prior_logit_scale": 0.7, "joint_logit_scale": 1.5, "residual_gate": 0.5}


def random_state_dict(cfg: HeadConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights of a plausible scale for every tensor the config implies."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(expected_shapes(cfg).items()):
        if name in SCALARS:
            out[name] = np.float32(SCALARS[name]).reshape(())
        elif len(shape) == 2:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        elif name.endswith("weight"):  # norm gains around one
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def random_layout(n_tokens: int, types: list[int], n_options: list[int], seed: int = 0) -> Layout:
    """Question and option spans laid out like an encoded prompt, inside n_tokens tokens."""
    rng = np.random.default_rng(seed)
    lengths = []  # question span length, then each option span length, per question
    for n in n_options:
        lengths.append(int(rng.integers(3, 12)))
        lengths += [int(v) for v in rng.integers(6, 14, size=n)]
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
