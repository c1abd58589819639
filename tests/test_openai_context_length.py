"""Every input too long for POST /v1/decisions answers OpenAI's context_length_exceeded with the limit in its message,
so langchain-openai's OpenAIDecisions raises its OpenAIContextOverflowError (what it does for OpenAI's own overflow)
and the `openai` SDK a BadRequestError whose code says so: a body over max_body_bytes, a state over max_state_bytes,
a prompt over max_length. Over a real socket, with small limits so that each is met on its own."""

from __future__ import annotations

import openai
import pytest
from clef_bridge.bridge.server.doors.openai_decisions import CONTEXT_LENGTH_EXCEEDED, openai_error
from clef_bridge.bridge.service.errors import BodyTooLarge
from clef_bridge.head.errors import Problem, RequestInvalid
from langchain_openai.chat_models.base import OpenAIContextOverflowError
from langchain_openai.decisions import OpenAIDecisions, Predicate

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration

MAX_BODY, MAX_STATE, MAX_LENGTH = 24_000, 6_000, 1_024
QUESTIONS = [{"type": "predicate", "name": "q", "instructions": "Is it urgent?"}]
# each input meets one limit: the body's bytes (before any parsing), the state's bytes, the prompt's tokens
TOO_LONG = {
    "body": ("x" * (MAX_BODY + 1), f"exceeds {MAX_BODY} bytes", None),
    "state": ("x" * (MAX_STATE + 1), f"larger than {MAX_STATE} bytes", "input"),
    "messages": ([{"role": "user", "content": "x" * (MAX_STATE // 2)}] * 3, f"larger than {MAX_STATE} bytes", "input"),
    "prompt": ("word " * 1_100, f"accepts at most {MAX_LENGTH}", None),
}


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    registry = registry_for(tiny_spec(fx, max_length=MAX_LENGTH), tmp_path_factory.mktemp("overflow") / "models.toml",
                            max_body_bytes=MAX_BODY, max_state_bytes=MAX_STATE)
    with RunningServer(registry) as srv:
        yield srv


@pytest.mark.parametrize("case", TOO_LONG)
def test_the_sdk_reads_context_length_exceeded_with_the_limit(server, case):
    given, limit, param = TOO_LONG[case]
    client = openai.OpenAI(api_key="any", base_url=server.url + "/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.decisions.create(model="tiny", input=given, questions=QUESTIONS)
    error = info.value
    assert error.code == CONTEXT_LENGTH_EXCEEDED and error.param == param, error.body
    assert limit in error.message and error.type == "invalid_request_error"


@pytest.mark.parametrize("case", TOO_LONG)
def test_langchain_reads_each_as_a_context_overflow(server, case):
    given, limit, _ = TOO_LONG[case]
    decisions = OpenAIDecisions(model="tiny", api_key="any", base_url=server.url + "/v1", max_retries=0)
    with pytest.raises(OpenAIContextOverflowError) as info:
        decisions.invoke({"input": given, "questions": {"q": Predicate(instructions="Is it urgent?")}})
    assert limit in info.value.message


def test_an_input_within_the_limits_is_answered(server):
    decision = openai.OpenAI(api_key="any", base_url=server.url + "/v1").decisions.create(
        model="tiny", input="x" * (MAX_STATE // 4), questions=QUESTIONS)
    assert 0 <= decision.answers[0].probability <= 1


def test_other_problems_keep_their_codes_and_a_too_long_one_leads():
    other = Problem(("body", "questions", 0, "type"), "bad", "invalid_value")
    long = Problem(("body", "input"), "the state is larger than 8 bytes (max_state_bytes)", "state_too_large")
    assert openai_error(RequestInvalid([other]), 400, "validation_error", "")["error"]["code"] == "invalid_value"
    both = openai_error(RequestInvalid([other, long]), 400, "validation_error", "")["error"]
    assert (both["code"], both["param"]) == (CONTEXT_LENGTH_EXCEEDED, "input")
    assert both["message"].startswith(f"{CONTEXT_LENGTH_EXCEEDED}: ")  # the SDK's exception text is the message
    assert "questions[0].type: bad" in both["message"]  # every problem is still said
    body = openai_error(BodyTooLarge("the request body exceeds 9 bytes"), 400, "request_too_large", "the request "
                        "body exceeds 9 bytes")["error"]
    assert body["code"] == CONTEXT_LENGTH_EXCEEDED and body["message"].startswith(f"{CONTEXT_LENGTH_EXCEEDED}: ")
