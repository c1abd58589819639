"""Deqio's routes (issue 54 item 6) driven by the real deqio-client 0.6.5 over a real socket on the tiny model: each
answer equals the System One answer to the same question (a noul's yes being its probability of true, a choice's
probabilities its own, shared decisions decided jointly as one request), and what Deqio asks that Clef cannot do is
refused by name (a 422 whose detail the client reads)."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.server.doors.deqio import DEQIO_ROUTES


pytestmark = pytest.mark.integration

STATE = "Customer: my March invoice was charged twice, please refund one."


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def client(server):
    from deqio_client import DeqioClient

    return DeqioClient(server.url)


def systemone(server, questions: dict) -> dict:
    reply = server.post({"model": "tiny", "state": STATE, "questions": questions})
    assert reply.status == 200
    return reply.json()["answers"]


def test_noul_and_choice_answer_as_system_one(server, client):
    got = client.noul(STATE, "Does the customer ask for a refund?", id="t-1")
    [want] = systemone(server, {"decision": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}
                       ).values()
    assert got["id"] == "t-1" and got["probabilities"]["yes"] == want["noul"]
    assert got["decision"] == ("yes" if want["noul"] >= 0.5 else "no") and set(got["option_logits"]) == {"yes", "no"}
    options = {"billing": "invoices and refunds", "tech": "bugs", "sales": None}
    for route in (client.choice, client.decision):
        pick = route(STATE, "Which team?", options)
        [want] = systemone(server, {"decision": {"type": "choice", "instructions": "Which team?", "criteria": {
            k: v if v is not None else k for k, v in options.items()}}}).values()  # the client fills a description
        assert pick["probabilities"] == want["probabilities"] and pick["decision"] == want["choice"]
        assert pick["top_probability"] == max(want["probabilities"].values()) and pick["input_tokens"] > 0


def test_shared_decisions_are_decided_jointly(server, client):
    decisions = [{"id": "team", "question": "Which team?", "options": ["billing", "tech"]},
                 {"id": "tone", "question": "Tone?", "options": {"calm": "calm", "angry": "angry"}}]
    got = client.shared(STATE, decisions)
    want = systemone(server, {"team": {"type": "choice", "instructions": "Which team?",
                                       "criteria": {"billing": "billing", "tech": "tech"}},
                              "tone": {"type": "choice", "instructions": "Tone?",
                                       "criteria": {"calm": "calm", "angry": "angry"}}})
    assert [r["id"] for r in got["results"]] == ["team", "tone"]
    for result in got["results"]:
        assert result["probabilities"] == want[result["id"]]["probabilities"]


def test_score_and_soam_answer_in_system_ones_shape(server, client):
    question = {"instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}
    got = client.score(STATE, question, name="anger")
    assert got["answers"]["anger"] == systemone(server, {"anger": {**question, "type": "score"}})["anger"]
    questions = {"refund": {"type": "noul", "instructions": "Refund?"}}
    assert client.soam(STATE, questions)["answers"] == systemone(server, questions)


def test_what_clef_cannot_do_is_refused_by_name(client):
    from deqio_client import DeqioError

    with pytest.raises(DeqioError) as caught:
        client.score(STATE, {"instructions": "?", "criteria": ["a", "b"]}, facts="auto")
    assert caught.value.status == 422 and "facts" in str(caught.value.detail)
    with pytest.raises(DeqioError) as caught:
        client.noul(STATE, "?", input_policy={"require_complete": True, "overflow": "truncate"})
    assert caught.value.status == 422 and "overflow" in str(caught.value.detail)
    twice = [{"id": "a", "question": "?", "options": ["x", "y"]}, {"id": "a", "question": "!", "options": ["x", "y"]}]
    with pytest.raises(DeqioError) as caught:
        client.shared(STATE, twice)
    assert caught.value.status == 422 and "used twice" in str(caught.value.detail)
    assert set(DEQIO_ROUTES) >= {"noul", "choice", "decision", "shared", "score", "soam"}
