"""Property-based tests: any JSON value gives a 4xx or a valid answer, never an uncaught exception;
and schemathesis against /openapi.json finds no 5xx and no response that breaks the schema."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from clef_bridge.head.encoder import EncodeOptions, encode
from clef_bridge.head.errors import ContextLengthExceeded, RequestInvalid
from clef_bridge.head.schema import parse_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.slow

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25)
TEXTISH = st.none() | st.text(max_size=30) | st.lists(st.text(max_size=8), max_size=3) | \
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3) | st.integers()


@st.composite
def near_valid(draw):
    """Bodies close to the contract, so the fuzzing reaches the encoder as well as the validator."""
    questions = {}
    for qid in draw(st.lists(st.text(max_size=12), max_size=5, unique=True)):
        kind = draw(st.sampled_from(["noul", "choice", "score", "other", None]) | JSON)
        q = {"type": kind, "instructions": draw(TEXTISH)}
        if kind == "choice" or draw(st.booleans()):
            q["criteria"] = draw(st.dictionaries(st.text(max_size=10), TEXTISH, max_size=6) | JSON)
        if kind == "score":
            q["criteria"] = draw(st.lists(TEXTISH, max_size=12) | JSON)
        if kind == "noul" and draw(st.booleans()):
            q["criteria"] = draw(st.fixed_dictionaries({}, optional={"true": TEXTISH, "false": TEXTISH}) | JSON)
        questions[qid] = q
    body = {"model": draw(st.sampled_from(["tiny", "jev-latest", "", 3])), "state": draw(JSON),
            "questions": questions}
    if draw(st.booleans()):
        body[draw(st.text(max_size=6))] = draw(JSON)
    return body


def byte_tokenize(text: str, parse_special: bool) -> list[int]:
    return list(text.encode("utf-8"))


def _validate_and_encode(body) -> None:
    try:
        request = parse_request(body)
        encoded = encode(request, byte_tokenize, EncodeOptions(max_length=4096))
    except (RequestInvalid, ContextLengthExceeded):
        return
    assert len(encoded.layout.question_spans) == len(request.questions)
    assert all(e > s for s, e in encoded.layout.option_spans)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_any_json_value_is_refused_or_encoded(body):
    _validate_and_encode(body)


@settings(max_examples=400, deadline=None)
@given(near_valid())
def test_near_valid_bodies_are_refused_or_encoded(body):
    _validate_and_encode(body)


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    registry = registry_for(tiny_spec(fx, n_ctx=4096, max_length=4096), tmp_path_factory.mktemp("f") / "m.toml")
    with RunningServer(registry) as srv:
        yield srv


def _check_answer(body, response):
    request = parse_request(body if body.get("model") is not None else {**body, "model": "tiny"})  # the default
    assert set(response["answers"]) == {q.id for q in request.questions}
    for q in request.questions:
        answer = response["answers"][q.id]
        assert answer["type"] == q.type
        values = [answer["noul"]] if q.type == "noul" else list(answer["probabilities"].values())
        assert all(0 <= v <= 1 and math.isfinite(v) for v in values)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(near_valid(), JSON))
def test_any_body_over_http_is_a_4xx_or_a_valid_answer(server, body):
    reply = server.post(None, raw=json.dumps(body).encode())
    assert reply.status == 200 or 400 <= reply.status < 500, (reply.status, reply.body[:300])
    if reply.status == 200:
        _check_answer(body, reply.json())


def test_openapi_conformance(server, tmp_path):
    """schemathesis (its CLI) against /openapi.json: no 5xx, every response matches the published schema."""
    done = subprocess.run(["schemathesis", "run", f"{server.url}/openapi.json", "--checks",
                           "not_a_server_error,response_schema_conformance", "--max-examples", "40", "--seed", "1"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]))
    assert done.returncode == 0, done.stdout[-4000:]
    assert "Tested: 28" in done.stdout  # every operation: the API's 23 routes and the playground's five files
