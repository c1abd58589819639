"""The numpy head against Cloudflare's torch JointSchemaHead: same bf16 weights read from a real
safetensors file by our loader, same inputs."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.model import joint_schema_head
from clef_bridge.head.weights import load_state_dict, save_state_dict, unflatten

from .randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict
from .reference import reference_logits, torch_head

pytestmark = pytest.mark.slow

LOGIT_TOLERANCE = 1e-3
PROB_TOLERANCE = 1e-4
TINY = HeadConfig(hidden_size=64, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)


def _softmax_per_question(logits, offsets):
    bounds = list(offsets) + [len(logits)]
    out = []
    for s, e in zip(bounds, bounds[1:]):
        z = np.exp(logits[s:e] - logits[s:e].max())
        out.append(z / z.sum())
    return np.concatenate(out)


@pytest.mark.parametrize("cfg, tokens, types, options", [
    (TINY, 300, [0, 1, 2], [2, 6, 4]),
    (CLEF_FLASH_HEAD, 760, [0, 1, 2, 1, 0, 2], [2, 7, 5, 11, 2, 10]),
    # many options: the attention takes its direct (unfolded) form
    (CLEF_FLASH_HEAD, 3000, [1, 2, 0], [120, 10, 2]),
], ids=["tiny", "clef-flash", "clef-flash-many-options"])
def test_head_matches_reference(tmp_path, cfg, tokens, types, options):
    path = tmp_path / "joint_head.safetensors"
    save_state_dict(path, random_state_dict(cfg, seed=3), "BF16")
    flat = load_state_dict(path, cfg)  # our bf16 decoding, upcast once
    layout = random_layout(tokens, types, options, seed=4)
    hidden, input_ids, output_embedding, rows = random_inputs(cfg, layout, tokens, seed=6)

    ours = joint_schema_head(hidden, rows, layout, cfg.heads, **unflatten(flat))
    theirs = reference_logits(torch_head(cfg, flat), hidden, input_ids, layout, output_embedding)
    assert ours.shape == theirs.shape == (sum(options),)
    assert np.abs(ours - theirs).max() <= LOGIT_TOLERANCE
    p, q = (_softmax_per_question(x, layout.option_offsets) for x in (ours, theirs))
    assert np.abs(p - q).max() <= PROB_TOLERANCE
    assert np.abs(theirs).max() > 0.1  # the comparison is not between two near-zero vectors


def test_logit_scales_above_the_clamp_match_reference(tmp_path):
    """Scales past ln 100 are clamped at 100 by the reference (a fine-tune can push them there)."""
    flat = random_state_dict(TINY, seed=5)
    flat |= {"prior_logit_scale": np.float32(6.0).reshape(()), "joint_logit_scale": np.float32(7.5).reshape(()),
             "residual_gate": np.float32(-1.0).reshape(())}
    layout = random_layout(200, [1, 2], [5, 4], seed=2)
    hidden, input_ids, output_embedding, rows = random_inputs(TINY, layout, 200, seed=8)
    ours = joint_schema_head(hidden, rows, layout, TINY.heads, **unflatten(flat))
    theirs = reference_logits(torch_head(TINY, flat), hidden, input_ids, layout, output_embedding)
    assert np.abs(ours - theirs).max() <= LOGIT_TOLERANCE
