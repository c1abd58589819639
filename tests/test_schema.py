"""head/schema.py's parse_request, the one validation on the request path: what a valid body becomes, and every
problem of a bad one reported at once, each at its location."""

from __future__ import annotations

import pytest
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import NOUL_DEFAULTS, Limits, parse_request

pytestmark = pytest.mark.unit


def problems(body, limits: Limits = Limits()) -> dict[tuple, str]:
    with pytest.raises(RequestInvalid) as e:
        parse_request(body, limits)
    return {tuple(p.loc): p.type for p in e.value.problems}


def test_a_body_becomes_its_questions_in_body_order_with_options_in_prompt_order():
    request = parse_request({"model": "m", "state": {"b": 1}, "questions": {
        "tone": {"type": "choice", "criteria": {"warm": "friendly", "cold": "curt", "Angry": "shouting"}},
        "urgent": {"type": "noul", "instructions": "Urgent?", "criteria": {"false": "routine"}},
        "stars": {"type": "score", "criteria": ["bad", {"level": "ok"}, "great"]}}})
    assert request.model == "m" and request.state == {"b": 1}
    tone, urgent, stars = request.questions
    assert [q.id for q in request.questions] == ["tone", "urgent", "stars"]
    # choice: listed by code point whatever the body's order, answered in the body's order
    assert [k for k, _ in tone.options] == ["Angry", "cold", "warm"] and tone.answer_keys == ("warm", "cold", "Angry")
    # noul: true then false, a criterion sent replacing its default only
    assert urgent.options == (("true", NOUL_DEFAULTS["true"]), ("false", "routine"))
    assert stars.options == (("0", "bad"), ("1", {"level": "ok"}), ("2", "great")) and stars.type_id == 2


def test_every_problem_of_a_body_comes_in_one_refusal_at_its_location():
    found = problems({"model": "", "questions": {
        "a": {"type": "poll"}, "b": {"type": "choice", "criteria": {"only": "one"}},
        "c": {"type": "score"}, "d": {"type": "noul", "criteria": {"maybe": "x"}}}})
    assert found == {("body", "model"): "type_error", ("body", "state"): "missing",
                     ("body", "questions", "a", "type"): "value_error",
                     ("body", "questions", "b", "criteria"): "value_error",
                     ("body", "questions", "c", "criteria"): "missing",
                     ("body", "questions", "d", "criteria"): "value_error"}


def test_limits_refuse_with_the_key_that_sets_them():
    body = {"model": "m", "state": "x" * 20, "questions": {f"q{i}": {"type": "noul"} for i in range(3)}}
    with pytest.raises(RequestInvalid) as e:
        parse_request(body, Limits(max_questions=2, max_state_bytes=10))
    messages = {p.type: p.msg for p in e.value.problems}
    assert set(messages) == {"too_many_questions", "state_too_large"}
    assert "(max_questions)" in messages["too_many_questions"] and "(max_state_bytes)" in messages["state_too_large"]


def test_media_on_the_text_path_and_box_questions_are_refused_by_name():
    found = problems({"model": "m", "state": "s", "images": ["aGk="], "questions": {"where": {"type": "box"}}})
    assert found == {("body", "images"): "images_not_supported",
                     ("body", "questions", "where", "type"): "box_not_supported"}


def test_a_body_that_is_not_an_object_or_nests_too_deep_is_refused_before_anything_else():
    assert problems([1, 2]) == {("body",): "type_error"}
    deep: dict = {"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}}
    deep["extra"] = nested = {}
    for _ in range(70):
        nested["x"] = nested = {}
    assert problems(deep) == {("body",): "json_too_deep"}
