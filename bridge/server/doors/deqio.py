"""Deqio's routes (deqio-client 0.6.5 posts to them, with no model and no key of its own) as a front door: one yes/no
question (`POST /v1/noul`), one choice among options (`/v1/choice`, and `/v1/decision` the same), several choices
decided jointly in one pass (`/v1/shared`), one System One question by name (`/v1/score`), and a System One body
without a model (`/v1/soam`). Each becomes its System One request to the default model; noul and choice answer
Deqio's {id, decision, probabilities, top_probability, option_logits, input_tokens, timing}, the rest System One's.
What Deqio asks that has no place in Clef's prompt is refused by name: `facts: "auto"` (Deqio's fact extraction), an
`input_policy` whose overflow is not "reject" (a Clef prompt is never cut: over max_length it is refused)."""

from __future__ import annotations

import time
from typing import Any, Callable

from aiohttp import web

from ....head.answer import NoulAnswer
from ....head.errors import Problem, RequestInvalid
from ...config.registry import ServerSpec
from ...service.decision import Decision
from ..appstate import REGISTRY
from ..context import INFO, Door, jev_error, json_response
from ..routes import DEQIO_SHAPE, PATHS
from .decisions import decide, extensions, read_body, systemone_input
from .systemone import no_model_warning, systemone_body

DEQIO_ROUTES = ("noul", "choice", "decision", "shared", "score", "soam")
NAME = "decision"  # the question's name where Deqio's request has one question and names it not
MODES = ("serial", "direct")  # Deqio's ways of reading one question: with one question, one pass either way


def _criteria(raw: Any, loc: tuple) -> tuple[dict[str, Any], list[Problem]]:
    """Deqio's options [{id, description}] (or ids) as a choice's criteria."""
    if not isinstance(raw, list) or len(raw) < 2:
        return {}, [Problem(loc, "options must be an array of at least 2 {id, description}", "type_error")]
    criteria, problems = {}, []
    for i, option in enumerate(raw):
        option = {"id": option, "description": option} if isinstance(option, str) else option
        oid = option.get("id") if isinstance(option, dict) else None
        if not isinstance(oid, str) or not oid:
            problems.append(Problem(loc + (i, "id"), "an option needs a non-empty string id", "type_error"))
        elif oid in criteria:
            problems.append(Problem(loc + (i, "id"), f"option {oid!r} is named twice", "value_error"))
        else:
            criteria[oid] = option.get("description")
    return criteria, problems


def _common(data: dict[str, Any], problems: list[Problem]) -> None:
    """The fields every Deqio route takes that change nothing here, or that Clef cannot do."""
    if data.get("mode") not in (None, *MODES):
        problems.append(Problem(("body", "mode"), f"mode must be one of {', '.join(MODES)}", "value_error"))
    policy = data.get("input_policy")
    if policy is not None and (not isinstance(policy, dict) or policy.get("overflow", "reject") != "reject"):
        problems.append(Problem(("body", "input_policy"), "a Clef prompt is read whole or refused (413 over max_length): "
                                "input_policy takes overflow \"reject\" only", "value_error"))
    if data.get("facts") not in (None, "off"):
        problems.append(Problem(("body", "facts"), "facts \"auto\" is Deqio's own fact extraction, which Clef does not "
                                "do: send facts \"off\" or leave it out", "value_error"))


def to_systemone(route: str, data: Any) -> dict[str, Any]:
    """A Deqio body as System One's questions (the state and the model come after); every problem at once."""
    if not isinstance(data, dict):
        raise RequestInvalid([Problem(("body",), "the body must be a JSON object", "type_error")])
    problems: list[Problem] = []
    _common(data, problems)
    questions: dict[str, Any] = {}
    if route == "noul":
        questions[NAME] = {"type": "noul", "instructions": data.get("question")}
    elif route in ("choice", "decision"):
        criteria, found = _criteria(data.get("options"), ("body", "options"))
        problems += found
        questions[NAME] = {"type": "choice", "instructions": data.get("question"), "criteria": criteria}
    elif route == "shared":
        decisions = data.get("decisions")
        if not isinstance(decisions, list) or not decisions:
            problems.append(Problem(("body", "decisions"), "decisions must be a non-empty array", "type_error"))
        for i, item in enumerate(decisions if isinstance(decisions, list) else []):
            if not isinstance(item, dict):
                problems.append(Problem(("body", "decisions", i), "a decision must be an object", "type_error"))
                continue
            criteria, found = _criteria(item.get("options"), ("body", "decisions", i, "options"))
            problems += found
            qid = str(item.get("id", i))
            if qid in questions:  # one answer per id: a second would be lost
                problems.append(Problem(("body", "decisions", i, "id"), f"decision id {qid!r} is used twice",
                                        "value_error"))
            questions[qid] = {"type": "choice", "instructions": item.get("question"), "criteria": criteria}
    elif route == "score":
        question = data.get("question")
        if not isinstance(question, dict) or question.get("type", "score") != "score":
            problems.append(Problem(("body", "question"), "question must be a score question's object "
                                    "{instructions, criteria}", "type_error"))
        else:
            questions[str(data.get("name", NAME))] = {**question, "type": "score"}
    else:  # soam: System One's questions as they are
        questions = data.get("questions")
    if problems:
        raise RequestInvalid(problems)
    return questions


def answer(decision: Decision, qid: str, given_id: Any, request_id: str, total_ms: float) -> dict[str, Any]:
    """Deqio's answer to one noul or choice question: the most likely option, every option's probability, and its
    unrounded logit (a noul's options named yes and no, as Deqio names them)."""
    got = next(a for a in decision.answers if a.id == qid)
    if isinstance(got, NoulAnswer):
        probabilities = {"yes": got.probability, "no": round(1 - got.probability, 4)}
        best = "yes" if got.probability >= 0.5 else "no"
    else:
        probabilities, best = dict(got.probabilities), got.choice
    question, logits = next((q, z) for q, z in decision.logits if q.id == qid)
    named = {"true": "yes", "false": "no"} if isinstance(got, NoulAnswer) else {}
    option_logits = {named.get(key, key): round(float(z), 6) for (key, _), z in zip(question.options, logits)}
    return {"id": given_id if isinstance(given_id, str) else request_id, "decision": best,
            "probabilities": probabilities, "top_probability": probabilities[best], "option_logits": option_logits,
            "input_tokens": decision.input_tokens, "timing": {"total_ms": total_ms}}


async def deqio_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    route = request.match_info.route.name.removeprefix("deqio_")
    body = await read_body(request, kinds=())  # text only
    questions = to_systemone(route, body.data)
    model = request.app[REGISTRY].default  # Deqio names no model: the default one, said in x_warnings
    data = {"model": model, "state": body.data.get("state"), "questions": questions}
    decision = await decide(request, await systemone_input(request, body, data, model))
    extra, headers = extensions(request, decision, start, [no_model_warning(model)])
    total_ms = extra["x_latency_ms"]
    if route in ("soam", "score"):
        return json_response({**systemone_body(decision), **extra}, headers=headers)
    request_id = request[INFO].id
    if route == "shared":
        results = [answer(decision, qid, qid, request_id, total_ms) for qid in questions]
        return json_response({"results": results, "shared_timing": {"total_ms": total_ms}, **extra}, headers=headers)
    return json_response({**answer(decision, NAME, body.data.get("id"), request_id, total_ms), **extra},
                         headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """Deqio's routes in /openapi.json: its request bodies, and its answers (System One's for score and soam)."""
    option = {"anyOf": [{"type": "string"}, {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string"}, "description": {}}}]}
    common = {"state": {}, "id": {"type": "string"}, "mode": {"type": "string", "enum": list(MODES)},
              "input_policy": {"type": "object"}, "facts": {"type": "string", "enum": ["off"]}}
    choice = {"type": "object", "required": ["state", "question", "options"], "properties": {
        **common, "question": {}, "options": {"type": "array", "minItems": 2, "items": option}}}
    bodies = {
        "noul": {"type": "object", "required": ["state", "question"], "properties": {**common, "question": {}}},
        "choice": choice, "decision": choice,
        "shared": {"type": "object", "required": ["state", "decisions"], "properties": {**common, "decisions": {
            "type": "array", "minItems": 1, "items": {"type": "object", "required": ["question", "options"],
                                                        "properties": {"question": {}, "id": {"type": "string"},
                                                                       "options": choice["properties"]["options"]}}}}},
        "score": {"type": "object", "required": ["state", "question"], "properties": {
            **common, "question": {"type": "object"}, "name": {"type": "string"}}},
        "soam": {"type": "object", "required": ["state", "questions"], "properties": {
            **common, "questions": {"type": "object"}}}}
    return {PATHS[f"deqio_{route}"]: {"post": {
        "operationId": f"deqio_{route}", "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": "Deqio's answer (System One's for score and soam)"},
                      **errors(400, 401, 413, 415, 422, 429, 503)}}}
        for route, schema in bodies.items()}


DOOR = Door(DEQIO_SHAPE, {f"deqio_{route}": deqio_handler for route in DEQIO_ROUTES}, jev_error, openapi_paths)
