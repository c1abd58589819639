"""bridge/llama/backbone.py on the tiny Qwen3.5: the tokenizer's guards on user text and its lower bound, the
hidden states' shape and sequences kept apart, and the values a served model reads (BackboneProtocol's)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from clef_bridge.bridge.llama.backbone import Backbone
from clef_bridge.bridge.llama.options import BackboneOptions

pytestmark = pytest.mark.integration

TEXTS = ["plain ascii", "Ünïcödé 🙂 and 한국어", "e\u0301 decomposed", "x" * 3000, "<think> inside user text"]


@pytest.fixture(scope="module")
def backbone(fx):
    with Backbone(fx.gguf_f32, BackboneOptions(n_ctx=2048, n_seq_max=2)) as bb:
        yield bb


def test_user_text_never_makes_a_token_of_the_prompts_markup(backbone):
    [think] = backbone.tokenize("<think>", True)  # the markup's own token, where the text may name it
    assert think not in backbone.tokenize("<think> inside user text", False)
    assert backbone.tokenize("<think>", True) != backbone.tokenize("<think>", False)


def test_min_tokens_bounds_every_text_from_below(backbone):
    for text in TEXTS:
        assert 0 < backbone.min_tokens(text) <= len(backbone.tokenize(text, False)), text


def test_composed_and_decomposed_text_tokenize_alike_as_the_reference_normalizes(backbone):
    assert backbone.tokenize("e\u0301t\u00e9", False) == backbone.tokenize("\u00e9t\u00e9", False)


def test_threads_tokenizing_at_once_each_get_their_own_tokens(backbone):
    """Requests are encoded off the model's thread (the service prepares them before the queue), several at once:
    a buffer shared between threads gave one text another's tokens."""
    texts = [f"request {i}: " + "a fairly long state to tokenize " * (5 + 7 * i) for i in range(8)]
    want = [backbone.tokenize(t, False) for t in texts]
    start = threading.Barrier(len(texts))

    def many(i: int) -> list[bool]:
        start.wait()
        return [backbone.tokenize(texts[i], False) == want[i] for _ in range(200)]

    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(many, range(len(texts))))
    assert all(all(r) for r in results), [sum(not x for x in r) for r in results]


def test_hidden_states_are_one_row_per_token_and_sequences_stay_apart(backbone):
    a = np.asarray(backbone.tokenize("the first request", False), np.int32)
    b = np.asarray(backbone.tokenize("another, longer request than the first", False), np.int32)
    alone = backbone.prefill(a)
    together = backbone.prefill_many([a, b])
    assert alone.shape == (len(a), backbone.n_embd) and alone.dtype == np.float32
    assert [h.shape[0] for h in together] == [len(a), len(b)]
    assert np.allclose(together[0], alone, atol=1e-4)  # b's tokens do not reach a's states


def test_the_values_a_served_model_reads(backbone, fx):
    assert backbone.path == fx.gguf_f32 and backbone.architecture == "qwen35"
    assert backbone.n_embd_inp == backbone.n_embd  # no deepstack: the input embeddings are as wide as the states
    assert 0 < backbone.decode_budget <= backbone.options.n_ctx and backbone.prefix_cache is None
