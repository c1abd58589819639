"""bridge/server/doors/openai_decisions.py without a server: an OpenAI request parsed into the typed request (the
message list's JSON state, typed choice values, levels, images as located references), each part located in the
OpenAI body, the answers back in OpenAI's shape, and its errors' param and shape."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.media.images import ImageLimits, ImageTooLarge
from clef_bridge.bridge.media.request import referenced
from clef_bridge.bridge.server.doors.openai_decisions import openai_error, param, parse, to_openai
from clef_bridge.bridge.service.decision import Decision
from clef_bridge.head.answer import ChoiceAnswer, ScoreAnswer
from clef_bridge.head.encoder import encode
from clef_bridge.head.errors import Problem, RequestInvalid
from clef_bridge.head.schema import Limits
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

ASK = [{"type": "predicate", "instructions": "ok?"}]


def problems(body: dict, limits: Limits = Limits(), media_limits=None) -> list[tuple[str | None, str]]:
    with pytest.raises(RequestInvalid) as info:
        parse(body, limits, media_limits or {})
    return [(param(p.loc), p.type) for p in info.value.problems]


def test_param_names_the_field_as_openai_writes_it():
    assert param(("body", "questions", 0, "choices", 12, "value")) == "questions[0].choices[12].value"
    assert param(("body", "input")) == "input" and param(("body",)) is None and param(()) is None


def test_a_message_list_becomes_a_json_state_that_keeps_roles_order_calls_and_outputs():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Look:", "prompt_cache_breakpoint":
                                      {"mode": "explicit"}},
                                     {"type": "input_json", "data": [{"a": 1}]}]},
        {"type": "custom_tool_call", "call_id": "t", "name": "grep", "input": "x", "id": "ctc_1",
         "status": "completed", "namespace": "tools"},
        {"type": "custom_tool_call_output", "call_id": "t", "output": [{"type": "input_text", "text": "found"}]},
        {"role": "assistant", "phase": "final_answer",
         "content": [{"type": "output_text", "text": "Done."}, {"type": "refusal", "refusal": "not that"}]},
    ]
    t = parse({"model": "m", "input": items, "questions": ASK}, Limits())
    assert t.request.state == [
        {"role": "developer", "content": ["Be brief."]},
        {"role": "user", "content": ["Look:", [{"a": 1}]]},
        {"type": "custom_tool_call", "call_id": "t", "name": "grep", "input": "x", "namespace": "tools"},
        {"type": "custom_tool_call_output", "call_id": "t", "output": ["found"]},
        {"role": "assistant", "content": ["Done.", {"refusal": "not that"}], "phase": "final_answer"},
    ]
    [question] = t.request.questions
    assert (question.id, question.type, question.instructions) == ("question_0", "noul", "ok?")
    assert t.media.kinds == () and t.request.state_at == ("body", "input")
    assert parse({"model": "m", "input": "plain text", "questions": ASK}, Limits()).request.state == "plain text"


def test_images_become_markers_in_prompt_order_and_references_located_where_sent():
    url = "data:image/jpeg;base64,/9j/AAAA"
    body = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}],
            "questions": [{"type": "predicate", "instructions": [
                {"type": "input_text", "text": "Is "}, {"type": "input_image", "image_url": url},
                {"type": "input_text", "text": " the same? "}, {"type": "input_json", "data": {"b": 1}}]}]}
    t = parse({"model": "m", **body}, Limits())
    assert t.request.state == [{"role": "user", "content": ["[image 1]"]}]
    assert t.request.questions[0].instructions == "Is [image 2] the same? " + '{"b":1}'
    second = ("body", "questions", 0, "instructions", 1, "image_url")
    assert t.media.of("image") == ((("body", "input", 0, "content", 0, "image_url"), "/9j/AAAA"), (second, "/9j/AAAA"))
    # past the door, a refusal names the image where it was sent: nothing relocates it
    tiny = {"image": ImageLimits(max_bytes=2)}
    with pytest.raises(ImageTooLarge) as info:  # sized at the door, refused once the request is admitted
        referenced(parse({"model": "m", **body}, Limits(), tiny).media, tiny)
    assert [p.loc for p in info.value.problems] == [("body", "input", 0, "content", 0, "image_url"), second]
    assert problems({**body, "model": "m"}, media_limits={"image": ImageLimits(max_images=1)}) == [
        ("input", "too_many_images")]
    assert problems({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "\ud800"}]}],
                     "questions": ASK}) == [("input[0].content[0].text", "value_error.unicode")]


def test_choices_keep_their_types_and_levels_their_labels():
    t = parse({"model": "m", "input": "s", "questions": [
        {"type": "choice", "name": "c", "instructions": "?", "choices": [{"value": False}, {"value": "x",
                                                                                           "description": "d"}]},
        {"type": "score", "instructions": "?", "levels": [{"label": "lo"}, {"label": "hi", "description": "h"}]}]},
        Limits())
    c, score = t.request.questions
    assert (c.id, c.options, c.answer_keys) == ("c", (("false", None), ("x", "d")), ("false", "x"))
    assert (score.id, score.options) == ("question_1", (("0", "lo"), ("1", {"label": "hi", "description": "h"})))
    assert c.where.option("x") == ("body", "questions", 0, "choices", 1)
    assert score.where.option("1") == score.where.option(1) == ("body", "questions", 1, "levels", 1)
    answers = (ChoiceAnswer("c", "x", 0.6, (("false", 0.4), ("x", 0.6))),
               ScoreAnswer("question_1", 0.7, 0.7, (("0", "lo"), ("1", {})), (("0", 0.3), ("1", 0.7))))
    decision = Decision("served-m", "m", answers, 30, {}, reused_tokens=12, batch_size=1)
    assert to_openai(t, decision, {"x_latency_ms": 1.0}) == {
        "model": "m", "x_latency_ms": 1.0,
        "answers": [{"type": "choice", "name": "c", "choice": "x", "confidence": 0.6,
                     "probabilities": [{"value": False, "probability": 0.4}, {"value": "x", "probability": 0.6}]},
                    {"type": "score", "name": None, "score": 0.7, "confidence": 0.7,
                     "probabilities": [{"value": 0, "label": "lo", "probability": 0.3},
                                       {"value": 1, "label": "hi", "probability": 0.7}]}],
        "usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
                  "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 30}}


def test_every_problem_is_named_by_its_param():
    assert problems({"input": 3, "questions": [{"type": "predicate", "name": "a", "instructions": "?"},
                                               {"type": "predicate", "name": "a", "instructions": "?"},
                                               {"type": "score", "instructions": "?", "levels": [{"labl": "x"}]}],
                     "prompt_cache_key": 5, "prompt_cache_options": {"ttl": "1h"}}) == [
        ("model", "missing"), ("prompt_cache_key", "type_error"), ("prompt_cache_options.ttl", "invalid_value"),
        ("input", "type_error"), ("questions[1].name", "duplicate_name"), ("questions[2].levels[0].label", "missing")]
    # a type that is no name (an object, an array) is refused like an unknown one
    assert problems({"model": "m", "input": [{"role": "user", "content": [{"type": {}}]}, {"type": []}],
                     "questions": [{"type": {}}]}) == [
        ("input[0].content[0].type", "invalid_type"), ("input[1].type", "invalid_type"),
        ("questions[0].type", "invalid_value")]
    assert problems({"model": "m", "input": [{"role": "assistant", "content": [{"type": "input_image"}]},
                                             {"role": "user", "content": [{"type": "input_image",
                                                                           "image_url": "data:image/gif;base64,R0"}]}],
                     "questions": ASK}) == [("input[0].content[0].type", "invalid_type"),
                                            ("input[1].content[0].image_url", "invalid_image_url")]


def test_clefs_limits_and_the_encoders_refusals_name_the_openai_field():
    ask = [{"type": "score", "instructions": "?", "levels": [{"label": str(i)} for i in range(3)]},
           {"type": "choice", "instructions": "?", "choices": [{"value": "a"}]}]
    assert problems({"model": "m", "input": "s", "questions": ask}, Limits(max_levels=2)) == [
        ("questions[0].levels", "value_error"), ("questions[1].choices", "value_error")]
    t = parse({"model": "m", "input": "s", "questions": [
        {"type": "predicate", "instructions": " "},
        {"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "b", "description": "boom"}]}]},
        Limits())

    def tokenize(text: str, special: bool) -> list[int]:
        if "boom" in text:
            raise ValueError("cannot encode")
        return [] if text == " " else [1] * len(text)

    with pytest.raises(RequestInvalid) as info:
        encode(t.request, tokenize)
    assert [param(p.loc) for p in info.value.problems] == ["questions[1].choices[1]"]
    ok = parse({"model": "m", "input": "s", "questions": [{"type": "predicate", "instructions": " "}]}, Limits())
    with pytest.raises(RequestInvalid) as info:
        encode(ok.request, tokenize)
    assert [param(p.loc) for p in info.value.problems] == ["questions[0].instructions"]


def test_errors_take_openais_shape():
    invalid = RequestInvalid([Problem(("body", "questions", 0, "choices"), "needs 2", "value_error"),
                              Problem(("body", "input"), "bad", "type_error")])
    assert openai_error(invalid, 400, "validation_error", str(invalid)) == {"error": {
        "message": "questions[0].choices: needs 2; input: bad", "type": "invalid_request_error",
        "param": "questions[0].choices", "code": "value_error"}}
    assert openai_error(None, 404, "not_found", "404: Not Found")["error"] == {
        "message": "not_found: 404: Not Found", "type": "not_found_error", "param": None, "code": "not_found"}
    assert openai_error(None, 503, "timeout", "busy")["error"]["type"] == "server_error"
    assert openai_error(None, 401, "authentication_error", "no key")["error"]["type"] == "authentication_error"


LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4), st.just({}), st.just([]))
JUNK = st.sampled_from([None, 3, {}, [], "poll"])  # a type that names nothing
PART = st.fixed_dictionaries({
    "type": st.one_of(st.sampled_from(["input_text", "output_text", "refusal", "input_json", "input_image"]), JUNK)},
    optional={"text": LEAF, "refusal": LEAF, "data": LEAF, "file_id": LEAF,
    "image_url": st.one_of(LEAF, st.sampled_from(["https://x/a.png", "data:image/png;base64,AAAA",
                                                  "data:image/gif;base64,R0", "data:image/png,AA"]))})
# one_of flattens nested one_ofs: JUNK (one sampled_from) keeps a list half of the draws
CONTENT = st.one_of(st.text(max_size=4), st.lists(st.one_of(PART, JUNK), max_size=3), JUNK)
ITEM = st.fixed_dictionaries({
    "type": st.one_of(st.sampled_from(["message", "function_call", "function_call_output", "custom_tool_call",
                                       "custom_tool_call_output"]), JUNK)}, optional={
    "role": st.one_of(st.sampled_from(["user", "developer", "system", "assistant"]), JUNK),
    "content": CONTENT, "output": CONTENT, "call_id": st.one_of(st.just("c"), LEAF), "name": LEAF,
    "arguments": LEAF, "input": LEAF, "phase": LEAF, "namespace": LEAF})
QUESTION = st.fixed_dictionaries({
    "type": st.one_of(st.sampled_from(["predicate", "choice", "score", "box"]), JUNK)}, optional={"name": LEAF,
    "instructions": CONTENT,
    "choices": st.one_of(JUNK, st.lists(st.one_of(JUNK, st.fixed_dictionaries({}, optional={
        "value": LEAF, "description": LEAF})), max_size=4)),
    "levels": st.one_of(JUNK, st.lists(st.one_of(JUNK, st.fixed_dictionaries({}, optional={
        "label": LEAF, "description": LEAF})), max_size=4))})
BODY = st.fixed_dictionaries({
    "model": st.one_of(st.just("m"), JUNK), "input": st.one_of(st.lists(st.one_of(ITEM, JUNK), min_size=1,
                                                                        max_size=3), JUNK),
    "questions": st.one_of(st.lists(st.one_of(QUESTION, JUNK), min_size=1, max_size=3), JUNK)}, optional={
    "prompt_cache_key": LEAF,
    "safety_identifier": LEAF, "prompt_cache_options": st.one_of(LEAF, st.fixed_dictionaries({}, optional={
        "mode": LEAF, "ttl": LEAF}))})


@settings(max_examples=80, deadline=None)
@given(body=st.one_of(BODY, LEAF))
def test_any_request_is_parsed_or_refused_with_named_fields(body):
    """Whatever the JSON, the door parses the typed request, each question located where it was sent, or refuses it
    with a 400 naming fields."""
    try:
        parsed = parse(body, Limits())
    except RequestInvalid as exc:
        assert all(p.loc[:1] == ("body",) for p in exc.problems)
        assert openai_error(exc, 400, exc.error_type, str(exc))["error"]["message"]
        return
    questions = parsed.request.questions
    assert [q.where.question for q in questions] == [("body", "questions", i) for i in range(len(body["questions"]))]
