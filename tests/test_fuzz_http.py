"""Property-based tests over a real socket: any bytes in a header value, and a lone surrogate in any
string of a request, get a 4xx of the right shape (or an answer), never a 5xx or a traceback."""

from __future__ import annotations

import json

import pytest
from clef_bridge.head.errors import printable
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for
from .test_server_adversarial import http

pytestmark = pytest.mark.slow

KEY, METRICS_KEY = "fuzz-key", "fuzz-metrics-key"
NOUL = {"model": "tiny", "state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
HEADERS = [b"x-typesafe-request-id", b"Authorization", b"Content-Type", b"Content-Encoding", b"Expect", b"Accept",
           b"User-Agent"]
ROUTES = [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/systemone"),
          ("POST", "/accounts/a/ai/run/@cf/cloudflare/tiny"), ("GET", "/nowhere"), ("POST", "/health")]


@pytest.fixture(scope="module")
def secured(fx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "keys.txt").write_text(f"{KEY}\n{METRICS_KEY} name=prometheus scope=metrics\n")
    registry = registry_for(tiny_spec(fx, n_ctx=4096, max_length=4096), folder / "m.toml",
                            api_keys_file=folder / "keys.txt")
    with RunningServer(registry, api_key=METRICS_KEY) as srv:
        yield srv


def _check_shape(reply, workers_ai: bool) -> None:
    if "x-typesafe-request-id" not in reply.headers:  # refused by aiohttp's parser, before the app
        assert reply.status == 400
        return
    assert reply.headers["server"] == "clef-bridge"
    body = reply.json()
    if reply.status == 200:
        return
    if workers_ai:
        assert body["success"] is False and body["errors"][0]["code"] == reply.status
    elif reply.status == 422:
        assert all(set(p) == {"loc", "msg", "type"} for p in body["detail"])
    else:
        assert set(body["detail"]) == {"error_type", "message"}


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(HEADERS), value=st.binary(max_size=48), route=st.sampled_from(ROUTES))
def test_any_header_bytes_get_a_4xx_or_an_answer(secured, name, value, route):
    method, path = route
    headers = [(name, value)]
    if name != b"Authorization":
        headers.append((b"Authorization", f"Bearer {KEY}".encode()))
    body = json.dumps(NOUL).encode() if method == "POST" else b""
    data = http(method, path, headers, body)
    if name == b"Content-Type":
        data = data.replace(b"Content-Type: application/json\r\n", b"", 1)
    reply = secured.raw(data, timeout=30)
    assert reply.status < 500, (reply.status, reply.body[:300])
    _check_shape(reply, path.startswith("/accounts/"))


# (where the lone surrogate goes, the body, the loc the 422 must name); {bad} marks the spot
SURROGATE_SPOTS = {
    "model": ({**NOUL, "model": "{bad}"}, ["body", "model"]),
    "question id": ({**NOUL, "questions": {"{bad}": {"type": "noul"}}}, ["body", "questions", "{bad}"]),
    "instructions": ({**NOUL, "questions": {"q": {"type": "noul", "instructions": "{bad}"}}},
                     ["body", "questions", "q", "instructions"]),
    "nested instructions": ({**NOUL, "questions": {"q": {"type": "noul", "instructions": {"k": ["{bad}"]}}}},
                            ["body", "questions", "q", "instructions", "k", 0]),
    "option key": ({**NOUL, "questions": {"c": {"type": "choice", "criteria": {"{bad}": None, "b": None}}}},
                   ["body", "questions", "c", "criteria", "{bad}"]),
    "option description": ({**NOUL, "questions": {"c": {"type": "choice", "criteria": {"a": "{bad}", "b": None}}}},
                           ["body", "questions", "c", "criteria", "a"]),
    "score level": ({**NOUL, "questions": {"s": {"type": "score", "criteria": ["lo", "{bad}"]}}},
                    ["body", "questions", "s", "criteria", 1]),
    "noul criterion": ({**NOUL, "questions": {"n": {"type": "noul", "criteria": {"true": "{bad}"}}}},
                       ["body", "questions", "n", "criteria", "true"]),
    "question type": ({**NOUL, "questions": {"q": {"type": "{bad}"}}}, ["body", "questions", "q", "type"]),
    "state": ({**NOUL, "state": "{bad}"}, ["body", "state"]),
    "state key": ({**NOUL, "state": {"{bad}": 1}}, ["body", "state", "{bad}"]),
    "state nested": ({**NOUL, "state": {"history": [{"text": "{bad}"}]}}, ["body", "state", "history", 0, "text"]),
}


def _place(template, bad: str):
    if isinstance(template, str):
        return bad if template == "{bad}" else template
    if isinstance(template, dict):
        return {_place(k, bad): _place(v, bad) for k, v in template.items()}
    if isinstance(template, list):
        return [_place(v, bad) for v in template]
    return template


@st.composite
def lone_surrogate_text(draw) -> str:
    """Text (surrogate-free, as hypothesis makes it) with one lone surrogate at any position."""
    text = draw(st.text(max_size=12))
    at = draw(st.integers(0, len(text)))
    return text[:at] + chr(draw(st.integers(0xD800, 0xDFFF))) + text[at:]


@settings(max_examples=150, deadline=None)
@given(spot=st.sampled_from(sorted(SURROGATE_SPOTS)), bad=lone_surrogate_text(),
       route=st.sampled_from(["/v1/systemone", "/accounts/a/ai/run/@cf/cloudflare/tiny"]))
def test_a_lone_surrogate_anywhere_is_a_422_naming_its_field(secured, spot, bad, route):
    template, loc = SURROGATE_SPOTS[spot]
    if spot == "model" and route.startswith("/accounts/"):
        route = "/v1/systemone"  # Workers AI takes the model from its path
    data = json.dumps(_place(template, bad)).encode()  # ASCII: the surrogate travels as a \\uXXXX escape
    reply = secured.request("POST", route, raw=data, headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status == 422, reply.body[:300]
    expected = [printable(p) if isinstance(p, str) else p for p in _place(loc, bad)]
    if route.startswith("/accounts/"):
        assert "unpaired surrogate" in reply.json()["errors"][0]["message"]
    else:
        problems = reply.json()["detail"]
        assert expected in [p["loc"] for p in problems] and problems[0]["type"] == "value_error.unicode"


def test_the_fuzzing_left_no_5xx_and_no_traceback(secured):
    assert secured.metric("clef_requests_total", status="500") == 0
    assert not secured.tracebacks()
    assert secured.request("GET", "/health").status == 200
