"""Several records through the head at once (head.model.option_logits with R records) give each record the logits
it gets alone: the stacked linear layers must not mix records, and each record attends only its own memory and its
own fields, in both of multi_head_attention's forms, on numpy and on the strict CuPy stand-in."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.model import hidden_memory, multi_head_attention, option_logits
from clef_bridge.head.weights import unflatten

from .randomhead import random_inputs, random_layout, random_state_dict, schema_tokens
from .strictcupy import StrictCuPy

pytestmark = pytest.mark.unit

TOLERANCE = 2e-5  # float32 products summed in another blocking when rows are stacked
CFG = HeadConfig(hidden_size=64, width=32, routing_layers=2, layers=2, heads=4, feedforward=48)
# (types, options per question, tokens, seed): records of different sizes, one question or several
RECORDS = [([0], [2], 0, 1), ([1, 2, 1], [4, 5, 3], 0, 2), ([2, 0], [5, 2], 400, 3), ([1], [7], 0, 4)]


def record(types, n_options, tokens, seed):
    tokens = tokens or schema_tokens(n_options, seed) + 5
    layout = random_layout(tokens, types, n_options, seed)
    hidden, _, _, rows = random_inputs(CFG, layout, tokens, seed)
    return hidden, rows, layout


def inputs(params, records, xp=np):
    hs, memories, rows, layouts = [], [], [], []
    for hidden, option_rows, layout in records:
        h, memory = hidden_memory(xp.asarray(hidden), params["hidden_norm"], params["memory_projection"])
        hs.append(h), memories.append(memory), rows.append(xp.asarray(option_rows)), layouts.append(layout)
    return hs, memories, rows, layouts


def decision(params):
    return {k: v for k, v in params.items() if k not in ("hidden_norm", "memory_projection")}


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 0, 3, 1], [1, 1]])
def test_records_stacked_get_the_logits_they_get_alone(order):
    params = unflatten(random_state_dict(CFG, seed=7))
    records = [record(*RECORDS[i]) for i in order]
    hs, memories, rows, layouts = inputs(params, records)
    together = option_logits(hs, memories, rows, layouts, CFG.heads, **decision(params))
    assert [len(z) for z in together] == [len(layout.option_spans) for layout in layouts]
    for i in range(len(records)):
        alone = option_logits(hs[i:i + 1], memories[i:i + 1], rows[i:i + 1], layouts[i:i + 1], CFG.heads,
                              **decision(params))[0]
        scale = max(1.0, float(np.abs(alone).max()))
        np.testing.assert_allclose(together[i], alone, rtol=0, atol=TOLERANCE * scale)


def test_a_record_is_not_scored_with_another_records_memory():
    """The same layout and rows over two different prompts: stacked, each keeps its own logits (they differ)."""
    params = unflatten(random_state_dict(CFG, seed=7))
    hidden, rows, layout = record(*RECORDS[1])
    other = (np.random.default_rng(9).standard_normal(hidden.shape, dtype=np.float32), rows, layout)
    hs, memories, option_rows, layouts = inputs(params, [(hidden, rows, layout), other])
    together = option_logits(hs, memories, option_rows, layouts, CFG.heads, **decision(params))
    alone = [option_logits([h], [m], [r], [lay], CFG.heads, **decision(params))[0]
             for h, m, r, lay in zip(hs, memories, option_rows, layouts)]
    assert np.abs(alone[0] - alone[1]).max() > 100 * TOLERANCE
    for got, want in zip(together, alone):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("memory_rows", [[3, 5, 2], [300, 9, 150]])  # the projected form, then the queries' form
def test_attention_over_records_is_each_records_attention(memory_rows):
    rng = np.random.default_rng(3)
    w, n_head, queries = 16, 4, [2, 1, 3]
    params = {"in_proj_weight": rng.standard_normal((3 * w, w), dtype=np.float32) / 4,
              "in_proj_bias": rng.standard_normal(3 * w, dtype=np.float32),
              "out_proj": {"weight": rng.standard_normal((w, w), dtype=np.float32) / 4,
                           "bias": rng.standard_normal(w, dtype=np.float32)}}
    xs = [rng.standard_normal((n, w), dtype=np.float32) for n in queries]
    ms = [rng.standard_normal((t, w), dtype=np.float32) for t in memory_rows]
    bounds = (np.cumsum([0, *queries]), np.cumsum([0, *memory_rows]))
    got = multi_head_attention(np.concatenate(xs), np.concatenate(ms), **params, n_head=n_head, bounds=bounds)
    want = np.concatenate([multi_head_attention(x, m, **params, n_head=n_head) for x, m in zip(xs, ms)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_records_stacked_on_the_device_stand_in():
    """The stacked path keeps every array on the device (the stand-in refuses host arrays mixed in)."""
    xp = StrictCuPy()
    flat = random_state_dict(CFG, seed=7)
    params, device = unflatten(flat), unflatten({k: xp.asarray(v) for k, v in flat.items()})
    records = [record(*RECORDS[i]) for i in (1, 2)]
    want = option_logits(*inputs(params, records), CFG.heads, **decision(params))
    got = option_logits(*inputs(device, records, xp), CFG.heads, **decision(device))
    for g, w in zip(got, want):
        np.testing.assert_allclose(xp.asnumpy(g), w, rtol=0, atol=TOLERANCE * max(1.0, float(np.abs(w).max())))
