"""head/encoder.py with a character tokenizer (one id per character, so any span decodes back to its text): where
the state, each instruction and each option land, the context checks before the bulk is tokenized, truncation, and
the media block's place."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clef_bridge.head.encoder import IMAGE_PAD, PREFIX, EncodeOptions, encode
from clef_bridge.head.errors import ContextLengthExceeded
from clef_bridge.head.schema import parse_request

pytestmark = pytest.mark.unit

BODY = {"model": "m", "state": "The invoice was charged twice.", "questions": {
    "refund": {"type": "noul", "instructions": "Asks for a refund?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"sales": None, "billing": "money"}}}}


class CharTokenizer:
    """Each character one id (its code point); records every text it was asked for."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, text: str, parse_special: bool) -> list[int]:
        self.asked.append(text)
        return [ord(c) for c in text]


def text(ids) -> str:
    return "".join(map(chr, ids))


def test_the_spans_hold_the_state_each_instruction_and_each_option():
    request = parse_request(BODY)
    encoded = encode(request, CharTokenizer())
    ids = encoded.input_ids
    assert text(ids[slice(*encoded.state_span)]) == BODY["state"] and text(ids).startswith(PREFIX)
    assert [text(ids[s:e]) for s, e in encoded.layout.question_spans] == ["Asks for a refund?", "Which team?"]
    options = [json.loads(text(ids[s:e])) for s, e in encoded.layout.option_spans]
    assert [o["option_id"] for o in options] == ["true", "false", "billing", "sales"]
    assert options[2]["description"] == "money" and "description" not in options[3]  # a null one is left out
    assert encoded.layout.option_offsets.tolist() == [0, 2] and encoded.layout.types.tolist() == [0, 1]
    assert np.array_equal(encoded.option_token_ids, np.concatenate([ids[s:e] for s, e in encoded.layout.option_spans]))


def test_a_request_that_cannot_fit_is_refused_before_its_state_is_tokenized():
    tokenize = CharTokenizer()
    state = "x" * 5000
    with pytest.raises(ContextLengthExceeded, match="at least"):
        encode(parse_request({**BODY, "state": state}), tokenize, EncodeOptions(max_length=1000), min_tokens=len)
    assert state not in tokenize.asked


def test_truncation_cuts_the_states_tail_and_says_how_much():
    full = encode(parse_request(BODY), CharTokenizer())
    budget = len(full.input_ids) - 10
    with pytest.raises(ContextLengthExceeded):
        encode(parse_request(BODY), CharTokenizer(), EncodeOptions(max_length=budget))
    cut = encode(parse_request(BODY), CharTokenizer(), EncodeOptions(max_length=budget, truncate_state=True))
    assert cut.state_tokens_dropped == 10 and len(cut.input_ids) == budget
    assert text(cut.input_ids[slice(*cut.state_span)]) == BODY["state"][:-10]


def test_images_pad_runs_sit_between_the_prefix_and_the_state():
    plain = encode(parse_request(BODY), CharTokenizer())
    media = encode(parse_request(BODY), CharTokenizer(), image_tokens=[3, 2])
    start, end = media.state_span
    block = text(media.input_ids[len(PREFIX):start])
    assert block.count(IMAGE_PAD) == 5 and text(media.input_ids[start:end]) == BODY["state"]
    assert end - start == plain.state_span[1] - plain.state_span[0]


def test_a_json_state_is_rendered_once_for_its_size_check_its_prompt_and_its_key(monkeypatch):
    """The door's validation renders the state (its size is checked on the text) and keeps the text: the encoder,
    the service's request key and the decision log read it (issue 51: the body serialised once)."""
    from clef_bridge.head import encoder as encoder_module
    from clef_bridge.head import schema as schema_module
    from clef_bridge.head.schema import rendered_state

    state = {"ticket": {"id": 7, "lines": ["charged twice", "refund?"]}, "channel": "email"}
    rendered = []
    for module in (schema_module, encoder_module):
        real = module.render
        monkeypatch.setattr(module, "render", lambda value, real=real: rendered.append(value) or real(value))
    request = parse_request({**BODY, "state": state})
    encoded = encode(request, CharTokenizer())
    assert rendered_state(request) == text(encoded.input_ids[slice(*encoded.state_span)])
    assert [value for value in rendered if value == state] == [state]
