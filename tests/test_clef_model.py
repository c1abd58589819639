"""bridge/model/clef_model.py on the tiny Clef (Qwen3.5 + random head): prepare, prefill a batch, score; a batch
answers as each request alone, the timings and logits a Decision reports, and the refusals before any decode."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.media.request import AUDIO, Media
from clef_bridge.head.errors import ContextLengthExceeded
from clef_bridge.head.schema import parse_request

from .deciding import prepare, score_batch

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4  # batched against alone: float32 rounding of llama.cpp's batched matmuls (no flash attention)
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"},
             "team": {"type": "choice", "criteria": {"billing": "money", "tech": "bugs", "sales": "buying"}}}


def body(state: str) -> dict:
    return {"model": "tiny", "state": state, "questions": QUESTIONS}


def test_a_batch_answers_as_each_request_alone(tiny_model):
    states = ["I was charged twice.", "The app crashes on start, every time since the update yesterday."]
    together = score_batch(tiny_model, [prepare(tiny_model, body(s)) for s in states])
    for state, got in zip(states, together):
        [alone] = score_batch(tiny_model, [prepare(tiny_model, body(state))])
        assert got.input_tokens == alone.input_tokens and got.timings.batch_size == 2
        for (q, z), (q2, z2) in zip(got.logits, alone.logits):
            assert q == q2 and np.allclose(z, z2, atol=TOLERANCE), q.id
        assert [a.id for a in got.answers] == ["urgent", "team"]


def test_a_scored_request_reports_its_tokens_stages_and_unrounded_logits(tiny_model):
    prepared = prepare(tiny_model, body("Where is my parcel?"))
    [scored] = score_batch(tiny_model, [prepared])
    assert scored.input_tokens == len(prepared.encoded.input_ids)
    t = scored.timings
    assert t.tokenize > 0 and t.backbone > 0 and t.head > 0 and t.vision == 0 and t.audio == 0
    assert [(q.id, z.shape) for q, z in scored.logits] == [("urgent", (2,)), ("team", (3,))]


def test_a_prompt_over_max_length_is_refused_before_any_decode(tiny_model):
    with pytest.raises(ContextLengthExceeded):
        tiny_model.prepare(parse_request(body("word " * 20000), tiny_model.limits))


def test_a_clip_too_short_to_frame_is_a_callers_bug_at_prepare(tiny_model):
    """Decoding refuses such clips where the request holds them (tests/test_audio.py); prepare() names the bug of a
    caller that skipped it rather than failing inside the audio tower."""
    request = parse_request(body("[audio 1]"), tiny_model.limits)
    with pytest.raises(ValueError, match="an audio item of 10 samples"):
        tiny_model.prepare(request, Media({AUDIO: (np.zeros(10, np.float32),)}))


def test_a_text_model_takes_no_media(tiny_model):
    assert tiny_model.media == () and tiny_model.geometry is None and not tiny_model.takes_audio
