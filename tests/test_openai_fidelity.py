"""POST /v1/decisions against Cloudflare's code: OpenAI's requests through the `openai` SDK to the tiny f32 model,
their answers against the reference's systemone() of the System One equivalent (written out by hand in
tests/test_openai_decisions.py), within the end-to-end tolerance."""

from __future__ import annotations

import openai
import pytest

from .reference import assert_same_answers
from .test_end_to_end import F32_TOLERANCE, oracle  # noqa: F401 - the reference model, a fixture
from .test_openai_decisions import MESSAGES, MESSAGES_STATE, QUESTIONS, STATE, SYSTEMONE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def as_systemone(answers: list, questions: dict) -> dict:
    """OpenAI's answers in System One's shape (by id, values as their texts) for the reference's comparison."""
    out = {}
    for answer, (qid, question) in zip(answers, questions.items()):
        a = answer.model_dump()
        if a["type"] == "predicate":
            out[qid] = {"type": "noul", "noul": a["probability"]}
            continue
        text = (lambda v: ("true" if v else "false") if isinstance(v, bool) else v) if a["type"] == "choice" \
            else str
        out[qid] = {"type": a["type"], "confidence": a["confidence"],
                    "probabilities": {text(p["value"]): p["probability"] for p in a["probabilities"]}}
        if a["type"] == "choice":
            out[qid]["choice"] = text(a["choice"])
        else:
            out[qid] |= {"score": a["score"], "legend": {str(i): level for i, level in enumerate(question["criteria"])}}
    return out


@pytest.mark.parametrize("given, state", [(STATE, STATE), (MESSAGES, MESSAGES_STATE)], ids=["text", "messages"])
def test_decisions_answer_as_the_reference_does(oracle, server, given, state):  # noqa: F811 - the fixture
    decision = openai.OpenAI(api_key="any", base_url=server.url + "/v1").decisions.create(
        model="tiny", input=given, questions=QUESTIONS)
    request = {"model": "tiny", "state": state, "questions": SYSTEMONE}
    expected = oracle.ref.systemone(oracle.model, oracle.processor, request, max_length=8192)
    assert decision.usage.input_tokens == expected["usage"]["input_tokens"]
    assert_same_answers(as_systemone(decision.answers, SYSTEMONE), expected["answers"], F32_TOLERANCE)
