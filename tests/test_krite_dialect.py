"""Why no answer carries a top-level latency_ms (issue 42, item 4), shown with Krite Protocol v1's client, krite-bench,
over a real socket: it sends nothing a server could read as asking for Krite's dialect (its Engine posts the Protocol
v1 body alone); through its `jev` dialect it reads POST /v1/systemone's answers as valid Protocol v1 as they are,
counting the missing latency_ms as no runtime report (so it times the HTTP call itself); its own `krite` dialect
refuses far more than a missing field (every x_ extension, score probabilities by index), so one added field would
satisfy neither."""

from __future__ import annotations

import pytest
from krite_bench.client import Engine


pytestmark = pytest.mark.integration

REQUEST = {  # a Protocol v1 request (krite-bench's request.schema.json: ids of [A-Za-z0-9_.-], no extra fields)
    "state": {"ticket": 7, "text": "I was charged twice for March."},
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "shipping": "parcels"}},
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
    },
}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def test_krite_benchs_jev_dialect_reads_the_answers_as_they_are(server):
    engine = Engine("clef-bridge", server.port, request_model="tiny", dialect="jev")
    try:
        result = engine.call(REQUEST)
    finally:
        engine.close()
    assert result.ok, result.error  # valid Protocol v1 once mapped, answers covering every question
    assert result.status == 200 and result.http_ms > 0
    assert result.runtime_ms is None  # no latency_ms: krite-bench counts it as no runtime report, not as 0 ms
    assert result.response["latency_ms"] == 0  # what its from_jev writes for a missing one


def test_the_answer_has_x_latency_ms_and_no_latency_ms(server):
    reply = server.post({"model": "tiny", **REQUEST})
    assert reply.status == 200
    assert "latency_ms" not in reply.json() and reply.json()["x_latency_ms"] > 0


def test_krites_own_dialect_asks_for_more_than_one_field(server):
    engine = Engine("clef-bridge", server.port, request_model="tiny")  # dialect "krite", its default
    try:
        result = engine.call(REQUEST)
    finally:
        engine.close()
    assert not result.ok and result.error.startswith("schema: ")
    payload = result.response
    assert {k for k in payload if k.startswith("x_")}  # extensions its response schema forbids
    assert set(payload["answers"]["anger"]["probabilities"]) == {"0", "1", "2"}  # Krite keys them by level name
