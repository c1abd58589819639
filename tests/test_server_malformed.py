"""Malformed input over HTTP: every case is a 4xx with a JSON body of the right shape, and the
server is healthy afterwards."""

from __future__ import annotations

import gzip
import http.client
import json

import pytest
from backports import zstd

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration

NOUL = {"type": "noul", "instructions": "ok?"}


def req(**questions):
    return {"model": "tiny", "state": "s", "questions": questions or {"q": NOUL}}


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


def nested(depth: int) -> bytes:
    return b'{"model":"tiny","state":' + b"[" * depth + b"]" * depth + b',"questions":{"q":{"type":"noul"}}}'


LIMIT = 1 << 20  # max_body_bytes for this module's server

B, Q = ("body",), ("body", "questions", "q")
CRITERIA = Q + ("criteria",)


def why(loc: tuple, kind: str) -> list[tuple[tuple, str]]:
    """A 422 with one problem: its loc and type."""
    return [(loc, kind)]


# (name, body bytes, extra headers, status, reason): a 422's reason is the (loc, type) of each problem of
# its detail list, in order; other statuses' reason is the error_type
CASES = [
    ("empty body", b"", {}, 422, why(B, "json_invalid")),
    ("truncated JSON", b'{"model": "tiny", "state": "s", "questions": {"q": {"ty', {}, 422, why(B, "json_invalid")),
    ("not JSON", b"hello world", {}, 422, why(B, "json_invalid")),
    ("JSON null", b"null", {}, 422, why(B, "type_error")),
    ("JSON array", b"[1, 2]", {}, 422, why(B, "type_error")),
    ("JSON string", b'"text"', {}, 422, why(B, "type_error")),
    ("JSON number", b"42", {}, 422, why(B, "type_error")),
    ("invalid UTF-8", b'{"model":"tiny","state":"\xff\xfe","questions":{"q":{"type":"noul"}}}', {}, 422,
     why(B, "json_invalid")),
    ("NaN literal", b'{"model":"tiny","state":"s","x":NaN,"questions":{"q":{"type":"noul"}}}', {}, 422,
     why(B, "json_invalid")),
    ("Infinity literal", b'{"model":"tiny","state":"s","x":-Infinity,"questions":{"q":{"type":"noul"}}}', {},
     422, why(B, "json_invalid")),
    ("duplicate keys", b'{"model":"tiny","model":"x","state":"s","questions":{"q":{"type":"noul"}}}', {}, 422,
     why(B, "json_duplicate_key")),
    ("duplicate question ids", b'{"model":"tiny","state":"s","questions":{"q":{"type":"noul"},"q":{"type":"noul"}}}',
     {}, 422, why(B, "json_duplicate_key")),
    ("deep nesting", nested(100_000), {}, 422, why(B, "json_too_deep")),
    # a body without a model (or with null) is answered by the default model (test_server.py); a wrong one is refused
    ("model is an empty string", raw({"model": "", "state": "s", "questions": {"q": NOUL}}), {}, 404,
     "model_not_found"),
    ("model is a number", raw({"model": 7, "state": "s", "questions": {"q": NOUL}}), {}, 422,
     why(B + ("model",), "type_error")),
    ("model is an object", raw({"model": {"name": "tiny"}, "state": "s", "questions": {"q": NOUL}}), {}, 422,
     why(B + ("model",), "type_error")),
    ("state missing", raw({"model": "tiny", "questions": {"q": NOUL}}), {}, 422, why(B + ("state",), "missing")),
    ("state is a number", raw({"model": "tiny", "state": 1, "questions": {"q": NOUL}}), {}, 422,
     why(B + ("state",), "type_error")),
    ("state is a bool", raw({"model": "tiny", "state": True, "questions": {"q": NOUL}}), {}, 422,
     why(B + ("state",), "type_error")),
    ("questions missing", raw({"model": "tiny", "state": "s"}), {}, 422, why(B + ("questions",), "type_error")),
    ("questions is a list", raw({"model": "tiny", "state": "s", "questions": [NOUL]}), {}, 422,
     why(B + ("questions",), "type_error")),
    ("questions empty", raw({"model": "tiny", "state": "s", "questions": {}}), {}, 422,
     why(B + ("questions",), "type_error")),
    ("question is a string", raw(req(q="noul")), {}, 422, why(Q, "type_error")),
    ("type missing", raw(req(q={"instructions": "x"})), {}, 422, why(Q + ("type",), "value_error")),
    ("type unknown", raw(req(q={"type": "rank"})), {}, 422, why(Q + ("type",), "value_error")),
    ("type is a number", raw(req(q={"type": 1})), {}, 422, why(Q + ("type",), "value_error")),
    ("type is an object", raw(req(q={"type": {}})), {}, 422, why(Q + ("type",), "value_error")),
    ("type is a list", raw(req(q={"type": ["noul"]})), {}, 422, why(Q + ("type",), "value_error")),
    ("instructions is a number", raw(req(q={"type": "noul", "instructions": 3})), {}, 422,
     why(Q + ("instructions",), "type_error")),
    ("choice without criteria", raw(req(q={"type": "choice"})), {}, 422, why(CRITERIA, "missing")),
    # a list of option names is laya-serve's form (issue 54): one named twice is refused where it is
    ("choice criteria list naming one twice", raw(req(q={"type": "choice", "criteria": ["a", "b", "a"]})), {}, 422,
     why(CRITERIA + (2,), "value_error")),
    ("choice one option", raw(req(q={"type": "choice", "criteria": {"a": "x"}})), {}, 422,
     why(CRITERIA, "value_error")),
    ("choice description number", raw(req(q={"type": "choice", "criteria": {"a": 1, "b": 2}})), {}, 422,
     [(CRITERIA + ("a",), "type_error"), (CRITERIA + ("b",), "type_error")]),
    ("3,000 options", raw(req(q={"type": "choice", "criteria": {f"o{i}": "" for i in range(3000)}})), {}, 422,
     why(CRITERIA, "value_error")),
    ("score map form", raw(req(q={"type": "score", "criteria": {"0": "low", "1": "high"}})), {}, 422,
     why(CRITERIA, "type_error")),
    ("score one level", raw(req(q={"type": "score", "criteria": ["only"]})), {}, 422, why(CRITERIA, "value_error")),
    ("score eleven levels", raw(req(q={"type": "score", "criteria": [str(i) for i in range(11)]})), {}, 422,
     why(CRITERIA, "value_error")),
    ("noul criteria string", raw(req(q={"type": "noul", "criteria": "yes"})), {}, 422, why(CRITERIA, "type_error")),
    ("noul criteria extra key", raw(req(q={"type": "noul", "criteria": {"maybe": "x"}})), {}, 422,
     why(CRITERIA, "value_error")),
    ("5,000 questions", raw({"model": "tiny", "state": "s", "questions": {f"q{i}": NOUL for i in range(5000)}}), {},
     422, why(B + ("questions",), "too_many_questions")),
    ("empty id, no instructions", raw(req(**{"": {"type": "noul"}})), {}, 422,
     why(B + ("questions", ""), "value_error")),
    ("lone surrogate", b'{"model":"tiny","state":"\\ud800","questions":{"q":{"type":"noul"}}}', {}, 422,
     why(B + ("state",), "value_error.unicode")),
    ("unknown model", raw({**req(), "model": "gpt-4"}), {}, 404, "model_not_found"),
    # a model without vision refuses images before reading them (admission in cost order)
    ("images field", raw({**req(), "images": ["data:image/png;base64,AAAA"]}), {}, 422,
     why(B + ("images", 0), "images_not_supported")),
    ("20 MB body", b'{"model":"tiny","state":"' + b"x" * (20 * 1024 * 1024) + b'","questions":{}}', {}, 413,
     "request_too_large"),
    ("zstd bomb", zstd.compress(b'{"model":"tiny","state":"' + b"a" * (200 * LIMIT) + b'"}'),
     {"Content-Encoding": "zstd"}, 413, "request_too_large"),
    ("gzip bomb", gzip.compress(b" " * (100 * LIMIT)), {"Content-Encoding": "gzip"}, 413, "request_too_large"),
    ("bad zstd frame", b"\x28\xb5\x2f\xfd" + b"garbage" * 10, {"Content-Encoding": "zstd"}, 400,
     "invalid_content_encoding"),
    ("truncated zstd", zstd.compress(raw(req()))[:-6], {"Content-Encoding": "zstd"}, 400, "invalid_content_encoding"),
    ("bad gzip", b"\x1f\x8bnot really gzip", {"Content-Encoding": "gzip"}, 400, "invalid_content_encoding"),
    ("unknown encoding", raw(req()), {"Content-Encoding": "br-but-not"}, 400, "invalid_content_encoding"),
    ("text/plain", raw(req()), {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    ("form urlencoded", b"model=tiny&state=s", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
     "unsupported_media_type"),
    ("xml", b"<request/>", {"Content-Type": "application/xml"}, 415, "unsupported_media_type"),
    ("multipart with assets", b"--b\r\nContent-Disposition: form-data; name=\"asset-0\"\r\n\r\nPNG\r\n--b--\r\n",
     {"Content-Type": "multipart/form-data; boundary=b"}, 422, why(B + ("request",), "missing")),  # no `request` part
]


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    registry = registry_for(tiny_spec(fx), tmp_path_factory.mktemp("m") / "models.toml", max_body_bytes=LIMIT)
    with RunningServer(registry) as srv:
        yield srv


def test_there_are_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("name, body, headers, status, reason", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_gets_its_status_and_reason(server, name, body, headers, status, reason):
    reply = server.post(None, raw=body, headers=headers)
    assert reply.status == status, (reply.status, reply.body[:300])
    payload = reply.json()
    if status == 422:
        assert isinstance(payload["detail"], list)
        for problem in payload["detail"]:
            assert set(problem) == {"loc", "msg", "type"} and problem["msg"], problem
        assert [(tuple(p["loc"]), p["type"]) for p in payload["detail"]] == reason, payload["detail"]
    else:
        assert set(payload["detail"]) == {"error_type", "message"} and payload["detail"]["message"]
        assert payload["detail"]["error_type"] == reason
    assert "x-typesafe-request-id" in reply.headers


def test_wrong_method_and_route_are_json_4xx(server):
    for method, path in (("GET", "/v1/systemone"), ("POST", "/v1/nothing"), ("DELETE", "/v1/models")):
        reply = server.request(method, path)
        assert 400 <= reply.status < 500
        assert set(reply.json()["detail"]) == {"error_type", "message"}


def test_healthy_after_the_suite(server):
    for name, body, headers, *_ in CASES:  # once more, back to back, then a real request
        server.post(None, raw=body, headers=headers)
    assert server.request("GET", "/health").status == 200
    assert server.request("GET", "/ready").status == 200
    good = server.post(req())
    assert good.status == 200 and good.json()["answers"]["q"]["type"] == "noul"
    assert server.metric("clef_requests_total", status="500") == 0


def test_lying_content_length(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/v1/systemone")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(50 * LIMIT))
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 413
    conn.close()
