"""Several sequences in one llama_decode give the hidden states each gets alone."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions

pytestmark = pytest.mark.integration

# Different lengths, none longer than a ubatch: llama.cpp then splits a sequence at the same
# points alone and in a batch, and the results agree to float32 rounding.
LENGTHS = [37, 120, 250, 3, 511]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def backbone(fx):
    bb = Backbone(fx.gguf_f32, BackboneOptions(n_ctx=4096, n_seq_max=8, n_ubatch=512))
    yield bb
    bb.close()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_batch_equals_one_at_a_time(backbone):
    rng = np.random.default_rng(5)
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé 🙂 1234. " * 40
    base = np.array(backbone.tokenize(text, True))
    sequences = [np.roll(base, 7 * i)[:n] for i, n in enumerate(LENGTHS)]
    sequences.append(rng.integers(0, 151000, size=64))
    batched = backbone.prefill_many(sequences)
    assert [h.shape for h in batched] == [(len(s), backbone.n_embd) for s in sequences]
    for seq, hidden in zip(sequences, batched):
        alone = backbone.prefill(seq)
        assert _rel(hidden, alone) <= TOLERANCE
    # the same batch twice: no state leaks from one decode into the next
    again = backbone.prefill_many(sequences)
    for a, b in zip(batched, again):
        assert _rel(a, b) <= TOLERANCE


def test_batch_limits(backbone):
    with pytest.raises(ValueError, match="sequences"):
        backbone.prefill_many([np.array([1, 2, 3])] * 9)
    with pytest.raises(ValueError, match="do not fit"):
        backbone.prefill_many([np.arange(3000), np.arange(3000)])
    with pytest.raises(ValueError, match="do not fit"):
        backbone.prefill_many([np.array([], dtype=np.int32)])
