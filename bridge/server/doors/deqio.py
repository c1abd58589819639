"""Deqio's routes (deqio-client 0.6.5 posts to them, with no model and no key of its own) as a front door: one yes/no
question (`POST /v1/noul`), one choice among options (`/v1/choice`, and `/v1/decision` the same), several choices
decided jointly in one pass (`/v1/shared`), one System One question by name (`/v1/score`), and a System One body
without a model (`/v1/soam`). Each becomes its System One request to the default model; noul and choice answer
Deqio's {id, decision, probabilities, top_probability, option_logits, input_tokens, timing}, the rest System One's.
What Deqio asks that has no place in Clef's prompt is refused by name: `facts: "auto"` (Deqio's fact extraction), an
`input_policy` whose overflow is not "reject" (a Clef prompt is never cut: over max_length it is refused)."""

from __future__ import annotations

import time
from functools import cache
from typing import Any, Callable

from aiohttp import web

from ....head.answer import NoulAnswer
from ....head.declaration import Node, check, check_field, json_schema, node
from ....head.errors import Problem, RequestInvalid
from ....head.schema import Limits, questions_declaration
from ...config.registry import ServerSpec
from ...service.decision import Decision
from ..appstate import REGISTRY
from ..context import INFO, JEV_ERROR, Door, jev_error, json_response
from ..routes import DEQIO_SHAPE, PATHS
from .decisions import decide, extensions, read_body, systemone_input
from .systemone import no_model_warning, systemone_body

DEQIO_ROUTES = ("noul", "choice", "decision", "shared", "score", "soam")
NAME = "decision"  # the question's name where Deqio's request has one question and names it not
MODES = ("serial", "direct")  # Deqio's ways of reading one question: with one question, one pass either way


OVERFLOW = ("a Clef prompt is read whole or refused (413 over max_length): input_policy takes overflow \"reject\" "
            "only")
# the fields every Deqio route takes that change nothing here, or that Clef cannot do
COMMON = {
    "state": node(description="System One's state (System One's validation checks it)"),
    "id": node(description="given back as the answer's id when a string"),
    "mode": node(enum=(*MODES, None), enum_msg=f"mode must be one of {', '.join(MODES)}"),
    "input_policy": node("object", "null", msg=OVERFLOW, type_error="value_error",
                         fields={"overflow": node(enum=("reject",), enum_msg=OVERFLOW)}),
    "facts": node(enum=("off", None), enum_msg="facts \"auto\" is Deqio's own fact extraction, which Clef does not do: "
                  "send facts \"off\" or leave it out")}
OPTIONS = node("array", msg="options must be an array of at least 2 {id, description}", fewest=2,
               missing_type="type_error", published={
    "items": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string", "minLength": 1}, "description": {}}}]}})
DECISION = node("object", msg="a decision must be an object", required=("options",), fields={
    "question": node(description="System One's instructions"), "id": node(description="its answer's id (its index "
                                                                                        "when left out)"),
    "options": OPTIONS})


@cache
def declarations(limits: Limits) -> dict[str, Node]:
    """Each route's body declared once: what to_systemone checks (the state, a question's text and soam's questions
    are System One's validation's, the same declarations) and /openapi.json publishes."""
    question = node(description="the question's text: System One's instructions")
    choice = node("object", msg="the body must be a JSON object", required=("state", "options"), fields={
        **COMMON, "question": question, "options": OPTIONS})
    return {
        "noul": choice.without("options"),
        "choice": choice, "decision": choice,
        "shared": choice.without("options", "question").with_fields(("state", "decisions"), decisions=node(
            "array", msg="decisions must be a non-empty array", missing_type="type_error", nonempty=True,
            items=DECISION)),
        "score": choice.without("options").with_fields(("state", "question"), name=node(
            description="the question's name (decision when left out)"), question=node(
            "object", msg="question must be a score question's object {instructions, criteria}",
            missing_type="type_error", fields={"type": node(enum=("score",), enum_msg="question must be a score "
                                                            "question's object {instructions, criteria}",
                                                            enum_type="type_error")})),
        "soam": choice.without("options", "question").with_fields(("state", "questions"),
                                                                  questions=questions_declaration(limits))}


def _criteria(raw: Any, loc: tuple, problems: list[Problem]) -> dict[str, Any]:
    """Deqio's options [{id, description}] (or ids) as a choice's criteria."""
    criteria: dict[str, Any] = {}
    if not check(OPTIONS, raw, loc, problems):
        return criteria
    for i, option in enumerate(raw):
        option = {"id": option, "description": option} if isinstance(option, str) else option
        oid = option.get("id") if isinstance(option, dict) else None
        if not isinstance(oid, str) or not oid:
            problems.append(Problem(loc + (i, "id"), "an option needs a non-empty string id", "type_error"))
        elif oid in criteria:
            problems.append(Problem(loc + (i, "id"), f"option {oid!r} is named twice", "value_error"))
        else:
            criteria[oid] = option.get("description")
    return criteria


def to_systemone(route: str, data: Any) -> dict[str, Any]:
    """A Deqio body as System One's questions (the state and the model come after); every problem at once."""
    declared, problems = declarations(Limits())[route], []  # the limits are System One's validation's
    if not check(declared, data, ("body",), problems, deep=False):
        raise RequestInvalid(problems)
    for name in ("mode", "input_policy", "facts"):
        check_field(declared, data, name, ("body",), problems)
    questions: dict[str, Any] = {}
    if route == "noul":
        questions[NAME] = {"type": "noul", "instructions": data.get("question")}
    elif route in ("choice", "decision"):
        criteria = _criteria(data.get("options"), ("body", "options"), problems)
        questions[NAME] = {"type": "choice", "instructions": data.get("question"), "criteria": criteria}
    elif route == "shared":
        if check_field(declared, data, "decisions", ("body",), problems, deep=False):
            for i, item in enumerate(data["decisions"]):
                if not check(DECISION, item, ("body", "decisions", i), problems, deep=False):
                    continue
                criteria = _criteria(item.get("options"), ("body", "decisions", i, "options"), problems)
                qid = str(item.get("id", i))
                if qid in questions:  # one answer per id: a second would be lost
                    problems.append(Problem(("body", "decisions", i, "id"), f"decision id {qid!r} is used twice",
                                            "value_error"))
                questions[qid] = {"type": "choice", "instructions": item.get("question"), "criteria": criteria}
    elif route == "score":
        if check_field(declared, data, "question", ("body",), problems):
            questions[str(data.get("name", NAME))] = {**data["question"], "type": "score"}
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
    bodies = {route: json_schema(declared, {}) for route, declared in declarations(server.limits).items()}
    return {PATHS[f"deqio_{route}"]: {"post": {
        "operationId": f"deqio_{route}", "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": "Deqio's answer (System One's for score and soam)"},
                      **errors(400, 401, 413, 415, 422, 429, 503)}}}
        for route, schema in bodies.items()}


DOOR = Door(DEQIO_SHAPE, {f"deqio_{route}": deqio_handler for route in DEQIO_ROUTES}, jev_error, JEV_ERROR,
            openapi_paths)
