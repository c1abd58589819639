"""AINode's decide shape (POST /v1/decide) with its real client, jebadiah-decide's systemone backend
(`Jeb("systemone").decide_ainode`), over a real socket: each decision is the System One equivalent's answer
(options -> choice, boolean -> noul answered yes/no, score min..max -> a score over those levels) as typesafe-sdk's
POST /v1/systemone gives it; `calibration: "raw"` is the answer before the model's temperatures; what Clef's prompt
has no place for is a 400 naming it, which jebadiah-decide raises as its JebError."""

from __future__ import annotations

from dataclasses import replace

import pytest
from clef_bridge.bridge.config.registry import Registry, ServerSpec
from clef_bridge.bridge.server.doors.ainode import parse
from clef_bridge.head.answer import AnswerOptions
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import Limits
from jebadiah_decide.backends import JebError
from jebadiah_decide.client import Jeb
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from .conftest import tiny_spec
from .serverkit import RunningServer

pytestmark = pytest.mark.integration

TOL = 2e-4  # answers are rounded to 4 decimals; a prefix-cache hit moves hidden states by ~1e-5
STATE = {"ticket": 42, "text": "My parcel never arrived and nobody answers the phone. I want my money back."}
QUESTIONS = {
    "team": {"question": "  Which team should take it? ", "options": ["shipping", "billing", "other"]},
    "refund": {"question": "Does the customer ask for a refund?", "type": "boolean"},
    "anger": {"question": "How angry is the customer?", "type": "score", "min": 0, "max": 3},
    "size": {"question": "How big is the problem?", "type": "score"},
}
# the same questions through typesafe-sdk, as POST /v1/decide asks them
EQUIVALENT = {
    "team": Choice(instructions="Which team should take it?", criteria={"shipping": None, "billing": None,
                                                                          "other": None}),
    "refund": Noul(instructions="Does the customer ask for a refund?"),
    "anger": Score(instructions="How angry is the customer?", criteria=["0", "1", "2", "3"]),
    "size": Score(instructions="How big is the problem?", criteria=["1", "2", "3", "4", "5"]),
}
HOT = {"noul": 0.4, "choice": 2.5, "score": 3.0}  # the temperatures of the second model


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    tiny = tiny_spec(fx)
    hot = replace(tiny, name="tiny-hot", answer=AnswerOptions(temperature=HOT))
    registry = Registry(path=tmp_path_factory.mktemp("ainode") / "models.toml", default="tiny",
                        models={"tiny": tiny, "tiny-hot": hot}, server=ServerSpec())
    with RunningServer(registry) as srv:
        yield srv


def jeb(server, model: str | None = "tiny") -> Jeb:
    return Jeb("systemone", url=server.url, model=model)


def distributions(answers: dict) -> dict[str, dict[str, float]]:
    """System One's answers (typesafe-sdk's) as AINode distributions: by option, noul as yes and no."""
    out = {}
    for qid, answer in answers.items():
        a = answer.model_dump()
        if a["type"] == "noul":
            out[qid] = {"yes": a["noul"], "no": 1 - a["noul"]}
        elif a["type"] == "choice":
            out[qid] = a["probabilities"]
        else:
            out[qid] = {a["legend"][k]: p for k, p in a["probabilities"].items()}
    return out


def assert_decisions(decisions: dict, expected: dict[str, dict[str, float]]) -> None:
    assert list(decisions) == list(expected)
    for qid, dist in expected.items():
        got = decisions[qid]
        assert list(got["distribution"]) == list(dist)
        assert list(got["distribution"].values()) == pytest.approx(list(dist.values()), abs=TOL), qid
        top = max(got["distribution"].values())
        assert got["distribution"][got["answer"]] == top == got["confidence"]


def systemone(server, model: str) -> dict[str, dict[str, float]]:
    with TypeSafeClient(api_key="any", base_url=server.url) as client:
        return distributions(client.system_one(state=STATE, questions=EQUIVALENT, model=model).answers)


def test_jebadiah_decides_ainode_shape_gets_the_system_one_answers(server):
    got = jeb(server).decide_ainode({"state": STATE, "questions": QUESTIONS})
    assert got["model"] == "tiny" and got["latency_ms"] > 0
    assert_decisions(got["decisions"], systemone(server, "tiny"))
    assert all(d["latency_ms"] == got["latency_ms"] for d in got["decisions"].values())  # one joint pass
    assert got["usage"]["calls"] == 1 and got["usage"]["completion_tokens"] == 0 and got["usage"]["prompt_tokens"] > 0


def test_raw_calibration_is_the_answer_before_the_temperatures(server):
    calibrated = jeb(server, "tiny-hot").decide_ainode({"state": STATE, "questions": QUESTIONS})
    assert_decisions(calibrated["decisions"], systemone(server, "tiny-hot"))
    raw = jeb(server, "tiny-hot").decide_ainode({"state": STATE, "questions": QUESTIONS, "calibration": "raw"})
    # the same head without temperatures: tiny serves the same files with none
    assert_decisions(raw["decisions"], systemone(server, "tiny"))
    moved = max(abs(raw["decisions"][q]["distribution"][o] - p) for q, d in calibrated["decisions"].items()
                for o, p in d["distribution"].items())
    assert moved > 0.01  # the temperatures really changed the calibrated answer, so raw is not it


def test_no_model_is_the_default_said_in_a_warning(server):
    # jebadiah-decide always names one (its own default), so a body without: AINode's shape allows it
    reply = server.request("POST", "/v1/decide", {"state": "Hi", "questions": {"q": QUESTIONS["refund"]}})
    assert reply.status == 200 and reply.json()["model"] == "tiny"
    assert reply.json()["x_warnings"][0].startswith("request.no_model")


@pytest.mark.parametrize("body, fragment", [
    ({"state": "s", "instructions": "Be strict.", "questions": {"q": QUESTIONS["refund"]}},
     "no request-wide instructions"),
    ({"state": "s", "questions": {"q": {"question": "ok?", "type": "boolean", "options": ["y", "n"]}}},
     "a boolean question is a noul here"),
    ({"state": "s", "questions": {"q": {"question": "which?", "options": ["a", "b", "a"]}}},
     "duplicate options ['a']"),
    ({"state": "s", "questions": {"q": {"question": "which?", "type": "poll"}}}, "needs options, or a type"),
    ({"state": "s", "questions": {"q": {"question": "how big?", "type": "score", "min": 1, "max": 20}}},
     "questions.q.options"),  # the service's level limit, located at the AINode field
    ({"state": "s", "questions": {"q": QUESTIONS["refund"]}, "calibration": "cooked"}, "calibration must be"),
    ({"state": "s", "questions": {"q": {"question": "how big?", "type": "score", "max": 10**12}}},
     "more than the 255 allowed"),  # refused before a level is written out
])
def test_what_has_no_place_in_clefs_prompt_is_a_400_naming_it(server, body, fragment):
    with pytest.raises(JebError, match="HTTP 400") as info:
        jeb(server).decide_ainode(body)
    assert fragment in str(info.value)
    assert '"type":"invalid_request_error"' in str(info.value)


def test_an_unknown_model_is_a_404_in_ainodes_shape(server):
    body = {"model": "nope", "state": "s", "questions": {"q": QUESTIONS["refund"]}}
    reply = server.request("POST", "/v1/decide", body)
    assert reply.status == 404 and reply.json()["error"]["type"] == "model_not_found"


def test_the_parse_keeps_every_question_located_and_refuses_all_problems_at_once():
    parsed, warnings = parse({"model": "m", "questions": QUESTIONS}, "default", Limits())
    assert not warnings and parsed.request.state == ""  # AINode reads a missing state as empty
    team = parsed.request.questions[0]
    assert (team.id, team.type, team.instructions) == ("team", "choice", "Which team should take it?")
    assert team.options == (("billing", None), ("other", None), ("shipping", None))  # the prompt's order
    assert team.where.instructions == ("body", "questions", "team", "question")
    assert team.where.option("other") == ("body", "questions", "team", "options", 2)
    assert parsed.options["size"] == ["1", "2", "3", "4", "5"] and parsed.options["refund"] == ["yes", "no"]
    with pytest.raises(RequestInvalid) as info:  # Clef's limit, at the AINode field
        parse({"model": "m", "questions": {"anger": QUESTIONS["anger"]}}, "default", Limits(max_levels=3))
    assert [p.loc for p in info.value.problems] == [("body", "questions", "anger", "options")]
    with pytest.raises(RequestInvalid) as info:
        parse({"instructions": "x", "calibration": 1, "questions": {"a": 1, "b": {"question": ""}}}, "d", Limits())
    assert [p.loc[1:] for p in info.value.problems] == [("instructions",), ("calibration",), ("questions", "a"),
                                                        ("questions", "b", "question"), ("questions", "b", "type")]
