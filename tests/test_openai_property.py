"""POST /v1/decisions answers what POST /v1/systemone answers, for every request both can express: hypothesis draws
OpenAI requests (a string or a list of messages; predicate, choice and score questions, named or not, with or without
descriptions, instructions as text or text parts, string or boolean choice values) and writes each one's System One
equivalent here, from docs/api.md's table, not from the door's code; the `openai` SDK sends the one and typesafe-sdk
the other to the same server over a real socket, and every probability, confidence, score, choice and token count
must agree. The examples are derandomized (the same ones every run) and few: each is two requests to the tiny model."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient


pytestmark = pytest.mark.integration

TOL = 2e-4  # answers are rounded to 4 decimals; a prefix-cache hit moves hidden states by ~1e-5
TEXT = st.text(st.characters(categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=30)
WORD = st.text(st.characters(categories=("L", "N"), max_codepoint=0x24F), min_size=1, max_size=10)
# question names that never read as the id of an unnamed question (question_<i>)
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("question_"))
DESCRIPTION = st.none() | TEXT


@st.composite
def instructions(draw) -> tuple[Any, str]:
    """(as OpenAI takes them, as System One reads them): text, or text parts joined."""
    if draw(st.booleans()):
        text = draw(TEXT)
        return text, text
    parts = draw(st.lists(TEXT, min_size=1, max_size=3))
    return [{"type": "input_text", "text": p} for p in parts], "".join(parts)


@st.composite
def question(draw, name: str | None) -> tuple[dict, Any, dict]:
    """(the OpenAI question, typesafe-sdk's question, System One's question for the answer check)."""
    sent, read = draw(instructions())
    kind = draw(st.sampled_from(["predicate", "choice", "score"]))
    named = {"name": name} if name is not None else {}
    if kind == "predicate":
        return {"type": kind, "instructions": sent, **named}, Noul(instructions=read), {"type": "noul"}
    if kind == "choice":
        values = draw(st.permutations([True, False]) | st.lists(WORD, min_size=2, max_size=5, unique=True))
        descriptions = draw(st.lists(DESCRIPTION, min_size=len(values), max_size=len(values)))
        choices = [{"value": v, **({"description": d} if d is not None else {})} for v, d in zip(values, descriptions)]
        criteria = {("true" if v else "false") if isinstance(v, bool) else v: d for v, d in zip(values, descriptions)}
        return ({"type": kind, "instructions": sent, "choices": choices, **named},
                Choice(instructions=read, criteria=criteria), {"type": "choice", "values": list(values)})
    labels = draw(st.lists(WORD, min_size=2, max_size=5, unique=True))
    descriptions = draw(st.lists(DESCRIPTION, min_size=len(labels), max_size=len(labels)))
    pairs = list(zip(labels, descriptions))
    levels = [{"label": label, **({"description": d} if d is not None else {})} for label, d in pairs]
    criteria = [label if d is None else {"label": label, "description": d} for label, d in pairs]
    return ({"type": kind, "instructions": sent, "levels": levels, **named},
            Score(instructions=read, criteria=criteria), {"type": "score", "labels": labels})


@st.composite
def message(draw) -> tuple[dict, dict]:
    """(an input message, its element of the JSON state): a string content stays one, parts become their texts."""
    role = draw(st.sampled_from(["user", "system", "developer", "assistant"]))
    if draw(st.booleans()):
        content = draw(TEXT)
        return {"role": role, "content": content}, {"role": role, "content": content}
    texts = draw(st.lists(TEXT, min_size=1, max_size=3))
    part = "output_text" if role == "assistant" else "input_text"
    return {"role": role, "content": [{"type": part, "text": t} for t in texts]}, {"role": role, "content": texts}


@st.composite
def requests(draw) -> tuple[dict, dict]:
    """(the OpenAI request, what System One is sent and answers: state, questions by id, their kinds)."""
    if draw(st.booleans()):
        given = state = draw(TEXT)
    else:
        pairs = draw(st.lists(message(), min_size=1, max_size=3))
        given, state = [m for m, _ in pairs], [s for _, s in pairs]
    n = draw(st.integers(1, 4))
    names = draw(st.lists(st.none() | NAME, min_size=n, max_size=n).filter(
        lambda ns: len([x for x in ns if x]) == len({x for x in ns if x})))
    questions, sdk, kinds = [], {}, {}
    for i, name in enumerate(names):
        qid = name if name is not None else f"question_{i}"
        sent, typed, kind = draw(question(name))
        questions.append(sent)
        sdk[qid], kinds[qid] = typed, kind
    return {"input": given, "questions": questions}, {"state": state, "questions": sdk, "kinds": kinds}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def clients(server):
    with TypeSafeClient(api_key="any", base_url=server.url) as typesafe:
        yield openai.OpenAI(api_key="any", base_url=server.url + "/v1", max_retries=0), typesafe


def assert_same(answer: dict, expected: dict, kind: dict) -> None:
    """One OpenAI answer against System One's answer to its question, probability by probability."""
    if kind["type"] == "noul":
        assert answer["type"] == "predicate" and answer["probability"] == pytest.approx(expected["noul"], abs=TOL)
        return
    assert answer["type"] == kind["type"]
    assert answer["confidence"] == pytest.approx(expected["confidence"], abs=TOL)
    got = [p["probability"] for p in answer["probabilities"]]
    assert got == pytest.approx(list(expected["probabilities"].values()), abs=TOL)
    if kind["type"] == "choice":
        values = kind["values"]
        assert [p["value"] for p in answer["probabilities"]] == values  # each with the type it was sent with
        keys = list(expected["probabilities"])
        assert keys[values.index(answer["choice"])] == expected["choice"]
    else:
        assert answer["score"] == pytest.approx(expected["score"], abs=TOL)
        assert [(p["value"], p["label"]) for p in answer["probabilities"]] == list(enumerate(kind["labels"]))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_both_doors_answer_the_same_probabilities(clients, case):
    oai, typesafe = clients
    sent, equivalent = case
    decision = oai.decisions.create(model="tiny", **sent)
    expected = typesafe.system_one(state=equivalent["state"], questions=equivalent["questions"], model="tiny")
    assert decision.usage.input_tokens == expected.usage.input_tokens  # the same prompt
    ids = list(equivalent["questions"])
    assert [a.name for a in decision.answers] == [q.get("name") for q in sent["questions"]]
    for answer, qid in zip(decision.answers, ids):
        assert_same(answer.model_dump(), expected.answers[qid].model_dump(mode="json"), equivalent["kinds"][qid])
