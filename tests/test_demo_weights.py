"""bridge/demo/weights.py: the demos' byte-level vocabulary, random tensors, quantized blocks and head."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.demo.weights import (
    BLOCKS,
    DEMO_SCALARS,
    MEDIA_SPECIALS,
    MERGES,
    SPECIALS,
    byte_level_vocab,
    more_bits,
    random_blocks,
    random_head,
    random_tensor,
)
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.encoder import PREFIX
from clef_bridge.head.weights import expected_shapes
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

pytestmark = pytest.mark.unit

TINY = HeadConfig(hidden_size=16, width=8, routing_layers=1, layers=1, heads=2, feedforward=16)


def test_the_byte_tokens_are_gpt2s_byte_to_unicode_map():
    tokens, types, merges = byte_level_vocab()
    bytes_ = tokens[:256]
    assert len(set(bytes_)) == 256 and all(len(t) == 1 for t in bytes_)
    assert bytes_[ord("A")] == "A" and bytes_[ord("~")] == "~" and bytes_[0xE9] == "é"  # printable: themselves
    assert bytes_[ord(" ")] == "Ġ" and bytes_[ord("\n")] == "Ċ" and bytes_[0] == chr(256)  # GPT-2's shifted ones
    assert merges == MERGES and len(types) == len(tokens) and len(set(tokens)) == len(tokens)


def test_each_merge_joins_two_tokens_into_a_token():
    tokens, _, merges = byte_level_vocab()
    vocab = set(tokens)
    for merge in merges:
        left, right = merge.split(" ")
        assert {left, right, left + right} <= vocab, merge


def test_specials_and_media_placeholders_come_last_with_their_types():
    tokens, types, _ = byte_level_vocab()
    tail = list(zip(tokens, types))[-len(SPECIALS + MEDIA_SPECIALS):]
    assert tail == SPECIALS + MEDIA_SPECIALS
    assert all(t == 1 for t in types[:-len(tail)])  # normal tokens
    assert "<|im_start|>" in PREFIX and all(text in tokens for text, _ in SPECIALS if text in PREFIX)


@pytest.mark.parametrize("kind", ["w", "norm", "ssm_a", "bias"])
def test_random_tensors_have_the_shape_dtype_and_range_of_their_kind(kind):
    x = random_tensor(kind, (64, 32), 0.02, np.random.default_rng(0))
    assert x.shape == (64, 32) and x.dtype == np.float32
    if kind == "w":
        assert 0.018 < x.std() < 0.022
    elif kind == "norm":
        assert 0.95 < x.mean() < 1.05
    elif kind == "ssm_a":  # Mamba's A = -exp(A_log): always negative
        assert (x < 0).all() and (x > -np.e - 1e-6).all()
    else:
        assert abs(x.mean()) < 0.02 and 0.08 < x.std() < 0.12


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda q: q.name)
def test_random_blocks_dequantize_to_weights_of_std_one_over_sqrt_cols(qtype):
    rows, cols = 64, 512
    pool = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    raw = random_blocks(qtype, rows, cols, pool, np.random.default_rng(2))
    block, size = GGML_QUANT_SIZES[qtype]
    assert size == BLOCKS[qtype][0] and raw.dtype == np.uint8 and raw.shape == (rows, cols // block * size)
    w = dequantize(raw, qtype)
    assert w.shape == (rows, cols) and np.isfinite(w).all()
    assert 0.5 < w.std() * np.sqrt(cols) < 2.0, w.std() * np.sqrt(cols)
    assert abs(w.mean()) < 0.2 * w.std()  # centred


def test_more_bits_is_llama_cpps_choice_of_layers():
    chosen = [i for i in range(32) if more_bits(i, 32)]
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_random_head_has_every_tensor_of_the_config_and_the_trained_scalars():
    head = random_head(TINY, seed=3)
    shapes = expected_shapes(TINY)
    assert {k: v.shape for k, v in head.items()} == {k: tuple(s) for k, s in shapes.items()}
    assert all(v.dtype == np.float32 for v in head.values())
    for name, value in DEMO_SCALARS.items():
        assert head[name] == np.float32(value), name
    matrices = [v for v in head.values() if v.ndim == 2]
    assert matrices and all(0.4 < v.std() * np.sqrt(v.shape[1]) < 1.6 for v in matrices if v.size >= 64)


def test_random_head_is_a_function_of_its_seed():
    a, b, c = random_head(TINY, 3), random_head(TINY, 3), random_head(TINY, 4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a if k not in DEMO_SCALARS)
