"""bench-head: our numpy head against Cloudflare's torch head, same weights, same inputs, one run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..head.model import joint_schema_head
from ..head.weights import unflatten
from .bench import median_ms
from .randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict
from .reference import ReferenceUnavailable, reference_logits, torch_head

# A router-like schema: 4 questions (noul, choice, score, choice), 19 options.
TYPES, OPTIONS = [0, 1, 2, 1], [2, 7, 5, 5]
LOGIT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class HeadBench:
    tokens: int
    numpy_ms: float
    torch_ms: float
    max_logit_diff: float
    torch_threads: int

    @property
    def ratio(self) -> float:
        return self.numpy_ms / self.torch_ms

    @property
    def ok(self) -> bool:
        return self.max_logit_diff <= LOGIT_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "numpy_ms": round(self.numpy_ms, 2), "torch_ms": round(self.torch_ms, 2),
                "ratio": round(self.ratio, 3), "max_logit_diff": self.max_logit_diff,
                "logit_tolerance": LOGIT_TOLERANCE, "torch_threads": self.torch_threads}


def run(tokens: int = 750, repeats: int = 7) -> HeadBench:
    """Time our head and the reference's on the same random Clef-flash-shaped weights and inputs."""
    try:
        import torch
    except ImportError:
        raise ReferenceUnavailable("bench-head's torch side needs the test extra", fix="pip install -e '.[test]' "
                                   "&& pip install --no-deps clef-finetune==0.1.0") from None
    cfg = CLEF_FLASH_HEAD
    flat = random_state_dict(cfg, seed=0)
    params = unflatten(flat)
    layout = random_layout(tokens, TYPES, OPTIONS, seed=0)
    hidden, input_ids, output_embedding, rows = random_inputs(cfg, layout, tokens, seed=0, vocab=2048)
    head = torch_head(cfg, flat)
    ours = lambda: joint_schema_head(hidden, rows, layout, cfg.heads, **params)  # noqa: E731
    theirs = lambda: reference_logits(head, hidden, input_ids, layout, output_embedding)  # noqa: E731
    diff = float(np.abs(ours() - theirs()).max())
    return HeadBench(tokens, median_ms(ours, repeats), median_ms(theirs, repeats), diff, torch.get_num_threads())
