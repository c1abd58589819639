"""laya-serve's batch route (POST /v1/systemone/batch) over a real socket: the body clausal-decide's laya_serve
backend posts (clausal-decide needs Python 3.13, so its POST is restated here from its source,
clausal/modules/py/decide.py `_ServeBackend._post`: urllib, JSON, the states grouped under shared questions),
answered state by state as typesafe-sdk's POST /v1/systemone answers each state alone, the states batched into fewer
backbone runs than there are states; refusals located at the state that caused them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from clef_bridge.bridge.server.doors.systemone_batch import REFUSED, batch_problems, parse_batch
from clef_bridge.head.encoder import encode
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import Limits
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration

TOL = 2e-4  # answers are rounded to 4 decimals; a batch's or a prefix-cache hit's hidden states differ by ~1e-5
MAX_STATES = 16
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "shipping": None}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
}
SDK_QUESTIONS = {"refund": Noul(instructions=QUESTIONS["refund"]["instructions"]),
                 "team": Choice(instructions="Which team?", criteria={"billing": "payments", "shipping": None}),
                 "anger": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"])}
STATES = ["My parcel never arrived. I want my money back.", "Thanks, all good!", {"ticket": 7, "text": "Charged twice"},
          "Where is my order?", ["a", "list", "state"], "The courier was rude.", "Refund now!!!", "Hello?"]


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    # n_ubatch: on the CPU a batch of requests holds one ubatch of tokens (Backbone.batch_budget); all the states
    registry = registry_for(tiny_spec(fx, max_length=4096, n_ubatch=4096),
                            tmp_path_factory.mktemp("batch") / "models.toml", max_queue=MAX_STATES)
    with RunningServer(registry) as srv:
        yield srv


def laya_serve_post(url: str, body: dict) -> dict:
    """What clausal-decide's _ServeBackend._post sends and reads: a 400 or 422 is its ValueError, the rest its
    RuntimeError."""
    request = urllib.request.Request(url + "/v1/systemone/batch", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps(body).encode("utf-8"))
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")
        if exc.code in (400, 422):
            raise ValueError(f"laya-serve refused the request: {detail}") from exc
        raise RuntimeError(f"laya-serve error {exc.code}: {detail}") from exc


def probabilities(answer: dict) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


def test_clausal_decides_batch_is_answered_state_by_state_as_system_one_answers_each(server):
    runs = server.metric("clef_backbone_runs_total")
    got = laya_serve_post(server.url, {"model": "tiny", "questions": QUESTIONS, "states": STATES})
    batched = server.metric("clef_backbone_runs_total") - runs
    assert got["model"] == "tiny" and len(got["results"]) == len(STATES)
    # the states were submitted together: the worker batched them, fewer llama_decode runs than states
    assert 1 <= batched < len(STATES)
    with TypeSafeClient(api_key="any", base_url=server.url) as client:
        alone = [client.system_one(state=state, questions=SDK_QUESTIONS, model="tiny") for state in STATES]
    for result, expected in zip(got["results"], alone):
        assert result["model"] == "tiny" and set(result["answers"]) == set(QUESTIONS)
        for qid, answer in result["answers"].items():
            want = expected.answers[qid].model_dump()
            assert answer["type"] == want["type"]
            assert probabilities(answer) == pytest.approx(probabilities(want), abs=TOL), (qid, result)
        assert result["usage"]["input_tokens"] == expected.usage.input_tokens
        assert result["x_timings"]["reused_tokens"] >= 0
    assert got["total_usage"] == {"input_tokens": sum(r["usage"]["input_tokens"] for r in got["results"]),
                                  "output_tokens": 0}
    assert got["x_latency_ms"] > 0 and got["x_timings"]["total_ms"] == got["x_latency_ms"]


def test_states_that_begin_alike_share_that_prefill(server):
    """Four states with the same long beginning (over 1,024 tokens: a checkpoint of the prefix cache) and their own
    ends: the beginning is decoded once, by the first, and the others restore it (in the same batch, or from the
    cache if the worker took the first alone)."""
    common = "The conversation so far, told again and again by the customer. " * 100
    states = [common + tail for tail in ("Refund!", "Thanks.", "Where is it?", "Cancel it.")]
    reused = server.metric("clef_prefix_cache_tokens_reused_total")
    got = laya_serve_post(server.url, {"model": "tiny", "questions": QUESTIONS, "states": states})
    assert min(r["usage"]["input_tokens"] for r in got["results"]) > 1_100
    assert server.metric("clef_prefix_cache_tokens_reused_total") - reused >= 3 * 1_024


def test_laya_controls_that_only_shape_its_passes_change_nothing_and_no_model_gets_the_default(server):
    plain = laya_serve_post(server.url, {"model": "tiny", "questions": QUESTIONS, "states": STATES[:2]})
    shaped = laya_serve_post(server.url, {"questions": QUESTIONS, "states": STATES[:2], "batch_size": 1,
                                          "sort_by_length": True})
    assert shaped["model"] == "tiny" and shaped["x_warnings"][0].startswith("request.no_model")
    for a, b in zip(plain["results"], shaped["results"]):
        for qid in QUESTIONS:
            assert probabilities(a["answers"][qid]) == pytest.approx(probabilities(b["answers"][qid]), abs=TOL)


def refusal(server, body: dict, status: int = 422) -> list[dict]:
    reply = server.request("POST", "/v1/systemone/batch", body)
    assert reply.status == status, reply.body[:400]
    return reply.json()["detail"]


def test_refusals_name_the_state_or_the_field(server):
    bad_state = refusal(server, {"model": "tiny", "questions": QUESTIONS, "states": ["fine", "fine too", 5]})
    assert [p["loc"] for p in bad_state] == [["body", "states", 2]]
    bad_question = refusal(server, {"model": "tiny", "questions": {"q": {"type": "poll"}}, "states": ["a", "b"]})
    assert bad_question[0]["loc"][:3] == ["body", "questions", "q"]
    too_many = refusal(server, {"model": "tiny", "questions": QUESTIONS, "states": ["s"] * (MAX_STATES + 1)})
    assert too_many[0]["type"] == "too_many_states" and f"at most {MAX_STATES} states" in too_many[0]["msg"]
    controls = refusal(server, {"model": "tiny", "questions": QUESTIONS, "states": ["s"], "max_len": 64,
                                "min_confidence": 0.5})
    assert {p["loc"][1] for p in controls} == {"max_len", "min_confidence"}
    assert [p["type"] for p in refusal(server, {"model": "tiny", "questions": QUESTIONS, "states": []})] == \
        ["type_error"]
    with pytest.raises(ValueError, match="laya-serve refused the request"):  # what clausal-decide raises
        laya_serve_post(server.url, {"model": "tiny", "questions": QUESTIONS, "states": [None]})
    missing = server.request("POST", "/v1/systemone/batch", {"model": "nope", "questions": QUESTIONS,
                                                               "states": ["s"]})
    assert missing.status == 404 and missing.json()["detail"]["error_type"] == "model_not_found"


def test_a_state_too_long_is_a_413_naming_it(server):
    long = "word " * 6000
    reply = server.request("POST", "/v1/systemone/batch", {"model": "tiny", "questions": QUESTIONS,
                                                           "states": ["short", long]})
    assert reply.status == 413, reply.body[:300]
    detail = reply.json()["detail"]
    assert detail["error_type"] == "context_length_exceeded" and "(states[1])" in detail["message"]
    assert "at most 4096" in detail["message"]


def test_the_route_is_in_openapi(server):
    spec = server.request("GET", "/openapi.json").json()
    post = spec["paths"]["/v1/systemone/batch"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["required"] == ["states", "questions"]
    assert set(REFUSED) <= set(post["requestBody"]["content"]["application/json"]["schema"]["properties"])


@pytest.mark.parametrize("body, types", [
    ([], ["type_error"]),
    ({"states": "one", "questions": {}}, ["type_error"]),
    ({"states": ["a"], "lang": "en", "images": ["x"]}, ["control_not_supported", "images_not_supported"]),
])
def test_the_batch_bodys_own_problems(body, types):
    assert [p.type for p in batch_problems(body, 4)] == types


def test_list_form_choices_top_level_model_and_each_states_warnings(server):
    """Issue 54: laya-serve's list of option names answers as the object of undescribed options; the batch's model is
    the name the body used, as each result says (an alias here, the served name before); each state's warnings stay
    in its own result (only the first state's survived)."""
    named = {"team": {"type": "choice", "criteria": ["shipping", "billing"]}}
    described = {"team": {"type": "choice", "criteria": {"billing": None, "shipping": None}}}
    png = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEklEQVR4nGNgYGBgYGBgYGBgYAAA"
    states = ["Where is my parcel?", f"pasted: {png}"]
    as_list = laya_serve_post(server.url, {"model": "jev-latest", "questions": named, "states": states})
    as_object = laya_serve_post(server.url, {"model": "jev-latest", "questions": described, "states": states})
    assert [r["answers"] for r in as_list["results"]] == [r["answers"] for r in as_object["results"]]
    assert as_list["model"] == "jev-latest" == as_list["results"][0]["model"]
    warned = [[w for w in r.get("x_warnings", []) if w.startswith("state.embedded_media")] for r in as_list["results"]]
    assert [len(w) for w in warned] == [0, 1]
    assert not [w for w in as_list.get("x_warnings", []) if w.startswith("state.embedded_media")]


def test_the_questions_are_parsed_once_and_every_bad_state_is_named():
    """Issue 51: the door parses the batch once into one typed request per state, the questions' one parse shared;
    every state's problem comes in the one 422, at its own index."""
    parsed = parse_batch({"states": ["a", {"b": 1}], "questions": QUESTIONS}, "tiny", Limits(), 4)
    assert parsed[0].questions is parsed[1].questions and [p.state for p in parsed] == ["a", {"b": 1}]
    assert {p.model for p in parsed} == {"tiny"} and [q.id for q in parsed[0].questions] == list(QUESTIONS)
    with pytest.raises(RequestInvalid) as caught:
        parse_batch({"states": [5, "fine", "x" * 100, "\ud800"], "questions": {"q": {"type": "poll"}}}, "tiny",
                    Limits(max_state_bytes=10), 4)
    assert [(p.loc, p.type) for p in caught.value.problems] == [
        (("body", "states", 3), "value_error.unicode"), (("body", "states", 0), "type_error"),
        (("body", "states", 2), "state_too_large"), (("body", "questions", "q", "type"), "value_error")]
    with pytest.raises(RequestInvalid) as caught:
        parse_batch({"states": ["a"], "questions": QUESTIONS}, 7, Limits(), 4)
    assert [p.loc for p in caught.value.problems] == [("body", "model")]


def test_a_state_the_encoder_refuses_is_named_at_its_index():
    """Each state's typed request says where the batch holds it, so a refusal past the door names states[i]."""
    parsed = parse_batch({"states": ["fine", "cannot encode"], "questions": QUESTIONS}, "tiny", Limits(), 4)

    def tokenize(text: str, special: bool) -> list[int]:
        if text == "cannot encode":
            raise ValueError("no")
        return [1] * len(text)

    encode(parsed[0], tokenize)
    with pytest.raises(RequestInvalid) as caught:
        encode(parsed[1], tokenize)
    assert [p.loc for p in caught.value.problems] == [("body", "states", 1)]
