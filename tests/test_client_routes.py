"""Routes and headers real clients expect (issue 54), over a real socket on the tiny model: Workers AI's run route
without /accounts/{id} (litellm's cloudflare provider and trustcall-system-one given the server root), `x-request-id`
on every route, and a 404's access-log line naming the path tried."""

from __future__ import annotations

import pytest


pytestmark = pytest.mark.integration

BODY = {"state": "I was charged twice.", "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def test_the_bare_workers_ai_run_route_answers_in_its_envelope(server):
    bare = server.request("POST", "/ai/run/@cf/cloudflare/tiny", BODY)
    full = server.request("POST", "/client/v4/accounts/acc/ai/run/@cf/cloudflare/tiny", BODY)
    assert bare.status == 200 and bare.json()["success"] is True, bare.body[:300]
    assert bare.json()["result"]["answers"] == full.json()["result"]["answers"]
    missing = server.request("POST", "/ai/run/@cf/cloudflare/nope", BODY)  # in the envelope too
    assert missing.status == 404 and missing.json()["success"] is False


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/systemone", {"model": "tiny", **BODY}), ("GET", "/v1/models", None), ("GET", "/health", None),
    ("POST", "/ai/run/@cf/cloudflare/tiny", BODY), ("GET", "/no/such/path", None), ("POST", "/v1/systemone", {}),
])
def test_every_answer_carries_x_request_id(server, method, path, body):
    reply = server.request(method, path, body)
    assert reply.headers["x-request-id"] == reply.headers["x-typesafe-request-id"]
    sent = server.request(method, path, body, headers={"x-typesafe-request-id": "client-id-7"})
    assert sent.headers["x-request-id"] == "client-id-7"


def test_a_404_is_logged_with_the_path_tried(server):
    server.request("GET", "/v2/decide?key=1", headers={"x-typesafe-request-id": "lost-404"})
    line = server.access_line(lambda a: a["request_id"] == "lost-404")
    assert line["status"] == 404 and line["route"] == "unmatched" and line["path"] == "/v2/decide"
    server.request("GET", "/" + "a" * 500 + "%E2%80%AE", headers={"x-typesafe-request-id": "long-404"})
    long = server.access_line(lambda a: a["request_id"] == "long-404")
    assert len(long["path"]) == 200
