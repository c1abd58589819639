"""head/declaration.py: one declaration both checks a body and writes the JSON Schema /openapi.json publishes. The
two must agree: for generated bodies (valid ones, and ones with a field's value replaced by any JSON value), the
check finds no problem exactly when jsonschema (Draft 2020-12, OpenAPI 3.1's dialect) accepts the body under the
schema the same declaration wrote."""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import pytest
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.media.fields import media_declarations
from clef_bridge.bridge.server.doors import (
    ainode,
    deqio,
    openai_decisions,
    systemone,
    systemone_batch,
    vercel,
    workers_ai,
)
from clef_bridge.head.declaration import Bound, check, json_schema, node
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import Limits, question_declaration, questions_declaration, request_declaration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

SMALL = Limits(max_questions=3, max_options=4, max_levels=3)
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False,
                                                                      width=16) | st.text(max_size=3)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                                                          max_size=3), max_leaves=6)
TYPES = st.sampled_from(["noul", "choice", "score", "box", "poll", None])
QUESTION = st.fixed_dictionaries({"type": TYPES}, optional={"instructions": JSON, "criteria": JSON}) | JSON
BODY = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", ""]) | JSON, "state": JSON,
    "questions": st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), QUESTION, max_size=4) | JSON,
    "other": JSON}) | JSON


OPENAI_QUESTION = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["predicate", "choice", "score", "box", "noul"]) | JSON, "name": JSON,
    "instructions": JSON, "choices": JSON, "levels": JSON}) | JSON
OPENAI = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", ""]) | JSON, "input": st.text(max_size=2) | st.lists(JSON, max_size=2) | JSON,
    "questions": st.lists(OPENAI_QUESTION, max_size=3) | JSON,
    "prompt_cache_key": st.sampled_from(["k", "k" * 257]) | JSON,
    "prompt_cache_options": st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["implicit", "x"]) | JSON,
                                                                "ttl": st.sampled_from(["30m", "1h"]) | JSON}) | JSON,
    "safety_identifier": JSON}) | JSON
MEDIA = {name: st.lists(JSON, max_size=5) | JSON for name in media_declarations()}


def problems_of(declared, body) -> list:
    found: list = []
    check(declared, body, ("body",), found)
    return found


def agrees(declared, body) -> None:
    schema = json_schema(declared, published=False)  # what the declaration checks; the rest is each door's code
    accepted = jsonschema.Draft202012Validator(schema).is_valid(body)
    found = problems_of(declared, body)
    assert accepted == (not found), (body, found, schema)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODY, st.booleans())
def test_the_request_declaration_checks_what_its_schema_says(body, name_resolved):
    agrees(request_declaration(SMALL, name_resolved), body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(QUESTION)
def test_the_question_declaration_checks_what_its_schema_says(question):
    agrees(question_declaration(SMALL), question)


def test_each_refusal_is_located_and_says_its_own_words():
    found = problems_of(request_declaration(SMALL), {"model": 3, "questions": {
        "a": {"type": "box"}, "b": {"type": "poll", "instructions": 4}, "c": [], "d": {"type": "noul"}}})
    assert [(p.loc, p.type) for p in found] == [
        (("body", "model"), "type_error"), (("body", "state"), "missing"),
        (("body", "questions"), "too_many_questions")]  # over its bound: its questions are not read
    found = problems_of(request_declaration(SMALL), {"model": "m", "state": None, "questions": {
        "a": {"type": "box"}, "b": {"type": "poll", "instructions": 4}, "c": []}})
    assert [(p.loc, p.type) for p in found] == [
        (("body", "state"), "type_error"), (("body", "questions", "a", "type"), "box_not_supported"),
        (("body", "questions", "b", "type"), "value_error"), (("body", "questions", "b", "instructions"), "type_error"),
        (("body", "questions", "c"), "type_error")]
    assert found[2].msg == "type must be one of noul, choice, score; got 'poll'"
    assert "at most 3 questions per request (max_questions), got 4" in problems_of(
        questions_declaration(SMALL), {q: {"type": "noul"} for q in "abcd"})[0].msg


def test_a_named_declaration_is_written_once_among_the_components():
    refs: dict = {}
    schema = json_schema(request_declaration(SMALL), refs)
    assert schema["properties"]["questions"]["additionalProperties"] == {"$ref": "#/components/schemas/Question"}
    assert set(refs) == {"Question"} and refs["Question"]["required"] == ["type"]
    assert "2 to 4 options" in refs["Question"]["properties"]["criteria"]["description"]


def test_sizes_null_as_absent_and_the_value_in_the_message():
    declared = node("object", msg="must be an object", required=("items",), fields={
        "items": node("array", msg="items must be a non-empty array", nonempty=True, null_missing=True,
                      bound=Bound(2, "at most {most} items, got {got}", "too_many"),
                      items=node("string", msg="a string")),
        "flag": node("boolean", msg="flag must be true or false, got {got!r}", shows_value=True)})
    assert [(p.loc, p.type, p.msg) for p in problems_of(declared, {"items": None, "flag": 1})] == [
        (("body", "items"), "missing", "items must be a non-empty array"),
        (("body", "flag"), "type_error", "flag must be true or false, got 1")]
    assert [p.type for p in problems_of(declared, {"items": []})] == ["type_error"]
    assert [p.type for p in problems_of(declared, {"items": ["a", "b", "c"]})] == ["too_many"]
    assert [p.loc for p in problems_of(declared, {"items": ["a", 2]})] == [("body", "items", 1)]
    schema = json_schema(declared)
    assert schema["properties"]["items"] | {} == {"type": "array", "minItems": 1, "maxItems": 2,
                                                  "items": {"type": "string"}}
    number = node("number")
    assert not number.accepts(True) and number.accepts(2) and not node("object").accepts(None)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPENAI)
def test_openais_declaration_checks_what_its_schema_says(body):
    agrees(openai_decisions.REQUEST, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODY, st.fixed_dictionaries({}, optional=MEDIA), st.sampled_from([{}, {"options": {"rejectIfBusy": True}},
                                                                          {"options": {"rejectIfBusy": 1}},
                                                                          {"options": []}]))
def test_the_system_one_routes_declarations_check_what_their_schemas_say(body, media, options):
    """Jev's route (head's text request, the media fields at a server's counts) and Workers AI's (with options)."""
    server = ServerSpec(images=replace(ServerSpec().images, max_images=2))
    whole = {**body, **media, **options} if isinstance(body, dict) else body
    agrees(systemone.declaration(server).with_fields(options=workers_ai.OPTIONS), whole)


BATCH = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", ""]) | JSON, "states": st.lists(JSON, max_size=4) | JSON,
    "questions": st.dictionaries(st.sampled_from(["a", "b"]), QUESTION, max_size=2) | JSON,
    "max_len": JSON, "batch_size": JSON}) | JSON
VERCEL_QUESTION = st.fixed_dictionaries({"type": st.sampled_from(["boolean", "noul", "choice", "score", "box"])},
                                        optional={"instructions": JSON, "criteria": JSON}) | JSON
VERCEL = st.fixed_dictionaries({}, optional={
    "model": st.none() | JSON, "state": JSON,
    "questions": st.dictionaries(st.sampled_from(["a", "b"]), VERCEL_QUESTION, max_size=3) | JSON}) | JSON


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCH, VERCEL)
def test_the_batch_and_the_evaluation_model_declarations_check_what_their_schemas_say(batch, evaluation):
    agrees(systemone_batch.declaration(SMALL, 3), batch)
    agrees(vercel.declaration(SMALL), evaluation)


AINODE = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", ""]) | JSON, "state": JSON, "instructions": JSON,
    "calibration": st.sampled_from(["raw", "calibrated"]) | JSON,
    "questions": st.dictionaries(st.sampled_from(["a", "b"]), st.fixed_dictionaries({}, optional={
        "question": st.sampled_from(["Why?", ""]) | JSON, "options": JSON, "type": JSON}) | JSON, max_size=2) | JSON})
DEQIO = st.fixed_dictionaries({}, optional={
    "state": JSON, "question": JSON, "id": JSON, "mode": st.sampled_from(["serial", "parallel"]) | JSON,
    "input_policy": st.fixed_dictionaries({}, optional={"overflow": st.sampled_from(["reject", "truncate"])}) | JSON,
    "facts": st.sampled_from(["off", "auto"]) | JSON, "options": st.lists(JSON, max_size=3) | JSON,
    "decisions": st.lists(st.fixed_dictionaries({}, optional={"options": st.lists(JSON, max_size=3) | JSON,
                                                              "id": JSON}) | JSON, max_size=2) | JSON,
    "questions": st.dictionaries(st.sampled_from(["a"]), QUESTION, max_size=1) | JSON}) | JSON


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(AINODE, DEQIO, st.sampled_from(deqio.DEQIO_ROUTES))
def test_ainodes_and_deqios_declarations_check_what_their_schemas_say(body, deqio_body, route):
    agrees(ainode.REQUEST, body)
    agrees(deqio.declarations(SMALL)[route], deqio_body)


def test_words_with_braces_are_kept_as_written():
    """Only a refusal's own placeholders are filled: Deqio's "{instructions, criteria}" once raised KeyError (a 500
    that schemathesis found on POST /v1/score with a question of type {})."""
    declared = node("object", fields={"type": node(enum=("score",), enum_msg="must be a score {instructions, criteria}"
                                                   ", got {got!r}"),
                                      "busy": node("boolean", msg='{"rejectIfBusy": true}, not {got!r}',
                                                   shows_value=True)})
    found = problems_of(declared, {"type": {}, "busy": 1})
    assert [p.msg for p in found] == ["must be a score {instructions, criteria}, got {}",
                                      '{"rejectIfBusy": true}, not 1']
    with pytest.raises(RequestInvalid) as refused:  # the route's own words, through the same check
        deqio.to_systemone("score", {"state": "s", "question": {"type": {}}})
    assert [p.loc for p in refused.value.problems] == [("body", "question", "type")]
