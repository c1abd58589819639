"""OpenAI's Decisions API (POST /v1/decisions) with the real clients, over a real socket: the `openai` SDK (sync
and async, base_url pointed at the server) and langchain-openai's OpenAIDecisions. Each answer equals the same
request sent to POST /v1/systemone (its System One equivalent, written out by hand here); bad requests raise the
SDK's typed exceptions with our messages; prompt_cache_key partitions the prefix cache."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from langchain_openai.decisions import Choice, Level, OpenAIDecisions, Predicate, Score

from . import fixturegen_vision
from .conftest import tiny_spec
from .fixturegen_vision import data_url, encoded, picture
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration

TOL = 2e-4  # answers are rounded to 4 decimals; a prefix-cache hit moves hidden states by ~1e-5
KEY = "sk-test-key"
STATE = "My parcel never arrived and nobody answers the phone. I want my money back."
QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "Does the customer ask for a refund?"},
    {"type": "choice", "instructions": "Which team?",
     "choices": [{"value": "billing", "description": "payments"}, {"value": "shipping"}, {"value": "other"}]},
    {"type": "choice", "name": "flag", "instructions": [{"type": "input_text", "text": "Is it "},
                                                         {"type": "input_text", "text": "urgent?"}],
     "choices": [{"value": True, "description": "act now"}, {"value": False}]},
    {"type": "score", "name": "anger", "instructions": "How angry?",
     "levels": [{"label": "calm"}, {"label": "annoyed", "description": "some heat"}, {"label": "furious"}]},
]
# The same request in System One's shape: predicate -> noul, choice -> choice (a value's text names it), score ->
# score (a level with a description as {label, description}), unnamed questions asked as question_<index>
SYSTEMONE = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "question_1": {"type": "choice", "instructions": "Which team?",
                   "criteria": {"billing": "payments", "shipping": None, "other": None}},
    "flag": {"type": "choice", "instructions": "Is it urgent?", "criteria": {"true": "act now", "false": None}},
    "anger": {"type": "score", "instructions": "How angry?",
              "criteria": ["calm", {"label": "annoyed", "description": "some heat"}, "furious"]},
}
MESSAGES = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": [{"type": "input_text", "text": STATE},
                                 {"type": "input_json", "data": {"order": 42}}]},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{\"order\": 42}"},
    {"type": "function_call_output", "call_id": "c1", "output": "status: lost"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Sorry about that."}]},
]
MESSAGES_STATE = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": [STATE, {"order": 42}]},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{\"order\": 42}"},
    {"type": "function_call_output", "call_id": "c1", "output": "status: lost"},
    {"role": "assistant", "content": ["Sorry about that."]},
]


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("openai")
    (folder / "keys").write_text(KEY + "\n")
    registry = registry_for(tiny_spec(fx), folder / "models.toml", api_keys_file=folder / "keys")
    with RunningServer(registry, api_key=KEY) as srv:
        yield srv


def client(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(api_key=KEY, base_url=server.url + "/v1", **kw)


def systemone(server, state, questions=None, **extra) -> dict:
    reply = server.post({"model": "tiny", "state": state, "questions": questions or SYSTEMONE, **extra},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status == 200, reply.body[:400]
    return reply.json()


def assert_equivalent(answers: list, expected: dict, values: dict | None = None) -> None:
    """OpenAI's answers (in question order) against System One's (by id), probability by probability."""
    assert len(answers) == len(expected)
    for answer, (qid, want) in zip(answers, expected.items()):
        answer = answer if isinstance(answer, dict) else answer.model_dump()
        kind = {"noul": "predicate"}.get(want["type"], want["type"])
        assert answer["type"] == kind
        if kind == "predicate":
            assert answer["probability"] == pytest.approx(want["noul"], abs=TOL)
            continue
        got = [p["probability"] for p in answer["probabilities"]]
        assert got == pytest.approx(list(want["probabilities"].values()), abs=TOL)
        assert answer["confidence"] == pytest.approx(want["confidence"], abs=TOL)
        if kind == "score":
            assert answer["score"] == pytest.approx(want["score"], abs=TOL)
            assert [(p["value"], p["label"]) for p in answer["probabilities"]] == [
                (i, level if isinstance(level, str) else level["label"])
                for i, level in enumerate(SYSTEMONE[qid]["criteria"])]
        else:
            typed = (values or {}).get(qid, list(want["probabilities"]))
            assert [p["value"] for p in answer["probabilities"]] == typed
            assert answer["choice"] == typed[list(want["probabilities"]).index(want["choice"])]


def test_the_sdk_gets_the_system_one_answers_with_typed_values(server):
    sent = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    decision = client(server, http_client=http).decisions.create(model="tiny", input=STATE, questions=QUESTIONS)
    expected = systemone(server, STATE)
    assert decision.model == "tiny"
    assert [a.name for a in decision.answers] == ["refund", None, "flag", "anger"]
    assert_equivalent(decision.answers, expected["answers"], {"flag": [True, False]})
    flag = decision.answers[2]
    assert all(type(p.value) is bool for p in flag.probabilities) and type(flag.choice) is bool
    usage = decision.usage
    assert usage.input_tokens == expected["usage"]["input_tokens"] == usage.total_tokens
    assert usage.output_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
    # what the SDK sends by default (x-stainless-*, its retry count and timeout, its user agent) is taken as is
    [post] = sent
    assert {"x-stainless-lang", "x-stainless-retry-count"} <= set(post.headers)
    assert post.url.path == "/v1/decisions"


def test_string_values_that_read_like_booleans_stay_strings(server):
    questions = [{"type": "choice", "name": "q", "instructions": "Yes or no?",
                  "choices": [{"value": "true"}, {"value": "false"}, {"value": "maybe"}]}]
    decision = client(server).decisions.create(model="tiny", input=STATE, questions=questions)
    [answer] = decision.answers
    assert [p.value for p in answer.probabilities] == ["true", "false", "maybe"]
    assert all(type(p.value) is str for p in answer.probabilities)
    expected = systemone(server, STATE, {"q": {"type": "choice", "instructions": "Yes or no?",
                                               "criteria": {"true": None, "false": None, "maybe": None}}})
    assert [p.probability for p in answer.probabilities] == pytest.approx(
        list(expected["answers"]["q"]["probabilities"].values()), abs=TOL)


def test_the_async_sdk_sends_a_message_list_rendered_as_a_json_state(server):
    async def main():
        async with openai.AsyncOpenAI(api_key=KEY, base_url=server.url + "/v1") as aclient:
            return await aclient.decisions.create(model="tiny", input=MESSAGES, questions=QUESTIONS)

    decision = asyncio.run(main())
    expected = systemone(server, MESSAGES_STATE)
    assert_equivalent(decision.answers, expected["answers"], {"flag": [True, False]})
    assert decision.usage.input_tokens == expected["usage"]["input_tokens"]


def test_langchain_openai_decisions(server):
    decisions = OpenAIDecisions(model="tiny", api_key=KEY, base_url=server.url + "/v1")
    response = decisions.invoke({"input": STATE, "questions": {
        "refund": Predicate(instructions="Does the customer ask for a refund?"),
        "team": Choice(instructions="Which team?", choices={"billing": "payments", "shipping": None}),
        "anger": Score(instructions="How angry?", levels=["calm", Level(label="annoyed", description="some heat")]),
    }})
    expected = systemone(server, STATE, {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {"type": "choice", "instructions": "Which team?",
                 "criteria": {"billing": "payments", "shipping": None}},
        "anger": {"type": "score", "instructions": "How angry?",
                  "criteria": ["calm", {"label": "annoyed", "description": "some heat"}]}})["answers"]
    assert response.model == "tiny"
    assert response.predicates["refund"].probability == pytest.approx(expected["refund"]["noul"], abs=TOL)
    assert response.choices["team"].probabilities == pytest.approx(expected["team"]["probabilities"], abs=TOL)
    assert response.scores["anger"].legend == {0: "calm", 1: "annoyed"}
    assert response.scores["anger"].score == pytest.approx(expected["anger"]["score"], abs=TOL)


def bad(server, match: str, param: str | None, exc=openai.BadRequestError, **request):
    """The SDK's typed exception, our message and the offending field."""
    body = {"model": "tiny", "input": STATE, "questions": QUESTIONS, **request}
    with pytest.raises(exc) as info:
        client(server, max_retries=0).decisions.create(**body)
    error = info.value.body
    assert set(error) == {"message", "type", "param", "code"}, error
    assert match in error["message"] and error["param"] == param, error
    return error


def choice(values: list) -> list[dict]:
    return [{"type": "choice", "name": "c", "instructions": "pick", "choices": [{"value": v} for v in values]}]


def test_bad_requests_raise_the_sdks_exceptions_with_our_messages(server):
    assert bad(server, "questions must be a non-empty array", "questions", questions=[])["code"] == "type_error"
    bad(server, "a choice needs 2 to 255 options", "questions[0].choices", questions=choice(["only"]))
    bad(server, "got 256", "questions[0].choices", questions=choice([f"o{i}" for i in range(256)]))
    bad(server, "duplicate choice \"a\"", "questions[0].choices[2].value", questions=choice(["a", "b", "a"]))
    bad(server, "read the same to Clef", "questions[0].choices[1].value", questions=choice([True, "true"]))
    error = bad(server, "type must be predicate, choice or score; got 'poll'", "questions[1].type",
                questions=[QUESTIONS[0], {"type": "poll", "instructions": "x"}])
    assert error["type"] == "invalid_request_error"
    bad(server, "Clef has no box head", "questions[0].type", questions=[{"type": "box", "instructions": "where?"}])
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]
    bad(server, "clef-bridge fetches nothing", "input[0].content[0].image_url", input=image)
    bad(server, "no earlier function_call has call_id 'x'", "input[0].call_id",
        input=[{"type": "function_call_output", "call_id": "x", "output": "o"}])
    error = bad(server, "model 'nope'", None, openai.NotFoundError, model="nope")
    assert error["code"] == "model_not_found"
    # the image goes to a model without a vision projector: refused before any work, param the image
    png = data_url(encoded(picture(64, 64), "PNG"))
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": png}]}]
    bad(server, "no vision projector", "input[0].content[0].image_url", input=image)


def test_a_prompt_over_max_length_is_a_bad_request_langchain_reads_as_a_context_overflow(server):
    long = "word " * 9000
    assert bad(server, "tokens but this model accepts at most 8192", None, input=long)["code"] == \
        "context_length_exceeded"
    from langchain_openai.chat_models.base import OpenAIContextOverflowError

    decisions = OpenAIDecisions(model="tiny", api_key=KEY, base_url=server.url + "/v1", max_retries=0)
    with pytest.raises(OpenAIContextOverflowError):
        decisions.invoke({"input": long, "questions": {"q": Predicate(instructions="ok?")}})


def test_a_missing_or_wrong_key_is_the_sdks_authentication_error(server):
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(api_key="wrong", base_url=server.url + "/v1", max_retries=0).decisions.create(
            model="tiny", input=STATE, questions=QUESTIONS)
    assert info.value.body["type"] == "authentication_error" and "invalid API key" in info.value.body["message"]


def test_prompt_cache_key_partitions_the_prefix_cache(server):
    state = "A long history of the conversation. " * 60
    ask = [{"type": "predicate", "instructions": "Is it long?"}]

    def cached(**kw) -> int:
        decision = client(server).decisions.create(model="tiny", input=state, questions=ask, **kw)
        return decision.usage.input_tokens_details.cached_tokens

    assert cached(prompt_cache_key="alice", safety_identifier="user-1",
                  prompt_cache_options={"mode": "implicit", "ttl": "30m"}) == 0
    assert cached(prompt_cache_key="alice") > 0  # her own prefix, restored
    assert cached(prompt_cache_key="bob") == 0  # never alice's
    assert cached() == 0  # nor the unpartitioned cache's
    assert cached() > 0


def test_typesafe_headers_of_jev_1_14_are_accepted_and_a_box_question_is_refused_by_name(server):
    headers = {"Authorization": f"Bearer {KEY}", "TypeSafe-Danger-Zone-Images": "true",
               "TypeSafe-Danger-Zone-Long-Context": "true"}
    ok = server.post({"model": "tiny", "state": "s", "questions": {"q": {"type": "noul"}}}, headers=headers)
    assert ok.status == 200, ok.body[:300]
    box = server.post({"model": "tiny", "state": "s", "questions": {"where": {"type": "box"}}}, headers=headers)
    assert box.status == 422
    [problem] = box.json()["detail"]
    assert problem["loc"] == ["body", "questions", "where", "type"] and problem["type"] == "box_not_supported"
    assert "Clef has no box head" in problem["msg"]


def test_the_route_is_in_openapi(server):
    spec = server.request("GET", "/openapi.json").json()
    operation = spec["paths"]["/v1/decisions"]["post"]
    assert operation["operationId"] == "openai_decisions" and "400" in operation["responses"]
    assert json.dumps(operation)  # serializable


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    vfx = fixturegen_vision.build()
    spec = tiny_spec(vfx.base, gguf=vfx.gguf_f32, head=vfx.head, mmproj=vfx.mmproj_f32)
    with RunningServer(registry_for(spec, tmp_path_factory.mktemp("openai-vl") / "models.toml")) as srv:
        yield srv


def test_input_images_are_seen_where_the_message_puts_them(vision_server):
    png = data_url(encoded(picture(64, 64, seed=5), "PNG"))
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "Here is the receipt:"},
                                             {"type": "input_image", "image_url": png}]}]
    ask = [{"type": "predicate", "name": "legible", "instructions": "Is the receipt legible?"}]
    decision = openai.OpenAI(api_key="any", base_url=vision_server.url + "/v1").decisions.create(
        model="tiny", input=messages, questions=ask)
    assets = {"<receipt>": {"type": "image", "format": "png", "data_base64": png.split(",", 1)[1]}}
    reply = vision_server.post({"model": "tiny", "questions": {"legible": ask[0] | {"type": "noul"}},
                                "state": [{"role": "user", "content": ["Here is the receipt:", "<receipt>"]}],
                                "assets": assets})
    assert reply.status == 200, reply.body[:300]
    expected = reply.json()
    assert decision.answers[0].probability == pytest.approx(expected["answers"]["legible"]["noul"], abs=TOL)
    assert decision.usage.input_tokens == expected["usage"]["input_tokens"]


def test_a_text_over_max_body_bytes_is_refused_though_the_images_allowance_would_take_it(vision_server):
    """With a vision model served the body may be larger (its images' base64); its text alone must fit."""
    png = data_url(encoded(picture(64, 64), "PNG"))
    ask = [{"type": "predicate", "instructions": "x" * (4 * 1024 * 1024)}]
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": png}]}]
    with pytest.raises(openai.BadRequestError) as info:
        openai.OpenAI(api_key="any", base_url=vision_server.url + "/v1", max_retries=0).decisions.create(
            model="tiny", input=image, questions=ask)
    assert info.value.code == "context_length_exceeded" and "exceeds 4194304 bytes without its images" in \
        info.value.message, info.value.body


def test_a_lone_surrogate_anywhere_is_a_400_naming_its_field(server, vision_server):
    """An image's surrogate goes to the model with vision: a model without it refuses any image first (admission in
    cost order, issue 39)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    for where, request, field in (
            (server, {"input": "\ud800"}, "input"), (server, {"prompt_cache_key": "\udfff"}, None),
            (server, {"questions": [{"type": "predicate", "name": "\ud800", "instructions": "?"}]},
             "questions[0].name"),
            (vision_server, {"input": [{"role": "user", "content": [{"type": "input_image",
                                                                    "image_url": "data:image/png;base64,\ud800"}]}]},
             "input[0].content[0].image_url")):
        body = json.dumps({"model": "tiny", "input": STATE, "questions": QUESTIONS, **request}).encode()
        reply = where.request("POST", "/v1/decisions", raw=body, headers=auth)
        assert reply.status in (200, 400), (request, reply.status, reply.body[:300])
        if reply.status == 400:
            assert reply.json()["error"]["param"] == field, (request, reply.json())
