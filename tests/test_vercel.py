"""Vercel AI Gateway's evaluation-model route (issue 54 item 6) over a real socket on the tiny model, posted as the
gateway's clients post it (jev-cli, the AI SDK's experimental_evaluate and its ports: `{state, questions}`, the model
in `ai-model-id`, the specification's headers): each answer equals the System One answer to the same request, in the
specification's shape, and refusals come in the gateway's `{error: {message, type}}`."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.server.doors.vercel import MODEL_HEADER, to_systemone
from clef_bridge.head.errors import RequestInvalid

pytestmark = pytest.mark.integration

PATH = "/v4/ai/evaluation-model"
HEADERS = {"ai-gateway-protocol-version": "0.0.1", "ai-gateway-auth-method": "api-key",
           "ai-evaluation-model-specification-version": "4", "Authorization": "Bearer vck_anything"}
STATE = {"subject": "invoice", "message": "My March invoice was charged twice, please refund one."}
QUESTIONS = {"refund": {"instructions": "Does the customer ask for a refund?"},
             "team": {"type": "choice", "instructions": "Which team?",
                      "criteria": {"billing": "invoices and refunds", "tech": "bugs"}},
             "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "cross", "furious"]}}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def evaluate(server, model: str | None = "tiny", questions: dict | None = None, body: dict | None = None):
    questions = questions or {qid: {"type": "boolean", **q} if qid == "refund" else q for qid, q in QUESTIONS.items()}
    headers = HEADERS | ({MODEL_HEADER: model} if model is not None else {})
    return server.request("POST", PATH, {"state": STATE, "questions": questions, **(body or {})}, headers=headers)


def test_answers_are_system_ones_in_the_specifications_shape(server):
    reply = evaluate(server)
    assert reply.status == 200, reply.body[:300]
    got = reply.json()
    want = server.post({"model": "tiny", "state": STATE, "questions": {
        qid: {"type": "noul", **q} if qid == "refund" else q for qid, q in QUESTIONS.items()}}).json()
    assert got["answers"]["refund"] == {"type": "boolean", "probability": want["answers"]["refund"]["noul"]}
    for qid in ("team", "anger"):
        answer, expected = got["answers"][qid], want["answers"][qid]
        assert answer["type"] == expected["type"] and answer["probabilities"] == expected["probabilities"]
        assert got["providerMetadata"]["typesafe"]["confidence"][qid] == expected["confidence"]
    assert got["answers"]["team"]["choice"] == want["answers"]["team"]["choice"]
    assert got["answers"]["anger"]["score"] == want["answers"]["anger"]["score"]
    assert got["usage"] == {"inputTokens": want["usage"]["input_tokens"], "outputTokens": 0}
    assert got["providerMetadata"]["gateway"]["routing"]["canonicalSlug"] == "tiny" and got["warnings"] == []


def test_without_a_model_header_the_default_answers_and_says_so(server):
    reply = evaluate(server, model=None)
    assert reply.status == 200, reply.body[:300]
    warnings = reply.json()["warnings"]
    assert [w["type"] for w in warnings] == ["other"] and "ai-model-id" in warnings[0]["message"]


def test_refusals_come_in_the_gateways_error_shape(server):
    unknown = evaluate(server, model="typesafe-ai/jev")
    assert unknown.status == 404 and unknown.json()["error"]["type"] == "model_not_found"
    assert "aliases" in unknown.json()["error"]["message"]  # how a client's fixed model id gets served
    bad = evaluate(server, questions={"q": {"type": "yesno"}})
    assert bad.status == 422
    issue = bad.json()["error"]["issues"][0]
    assert issue["path"] == ["body", "questions", "q", "type"] and "boolean, choice, score" in issue["message"]
    with_model = evaluate(server, body={"model": "tiny"})
    assert with_model.status == 422 and with_model.json()["error"]["issues"][0]["path"] == ["body", "model"]
    version = server.request("POST", PATH, {"state": "s", "questions": {"q": {"type": "boolean"}}},
                             headers=HEADERS | {"ai-evaluation-model-specification-version": "3"})
    assert version.status == 422 and "version 4" in version.json()["error"]["message"]


def test_the_route_is_in_openapi(server):
    post = server.request("GET", "/openapi.json").json()["paths"][PATH]["post"]
    assert post["operationId"] == "vercel_evaluation"
    assert {p["name"] for p in post["parameters"]} == {"ai-model-id", "ai-evaluation-model-specification-version"}


def test_boolean_is_noul_and_other_types_are_named_in_the_specifications_words():
    body = to_systemone({"state": "s", "questions": {"a": {"type": "boolean"}, "b": {"type": "noul"}}}, "m")
    assert body == {"state": "s", "model": "m", "questions": {"a": {"type": "noul"}, "b": {"type": "noul"}}}
    with pytest.raises(RequestInvalid) as refused:
        to_systemone({"state": "s", "questions": {"a": {"type": "box"}}}, "m")
    assert [p.loc for p in refused.value.problems] == [("body", "questions", "a", "type")]


def test_a_type_that_is_no_string_is_a_422_not_a_crash():
    """A type of [] or {} (which would not hash) is refused where it is, with every other question's (it once reached
    the mapping to Jev's names and answered 500)."""
    with pytest.raises(RequestInvalid) as refused:
        to_systemone({"state": "s", "questions": {"a": {"type": []}, "b": {"type": {}}, "c": {}, "d": "x"}}, "m")
    assert [(p.loc, p.type) for p in refused.value.problems] == [
        (("body", "questions", "a", "type"), "value_error"), (("body", "questions", "b", "type"), "value_error"),
        (("body", "questions", "c", "type"), "value_error")]  # d is no object: System One's validation says so
