"""AINode's decide shape (POST /v1/decide; jebadiah-decide's systemone backend posts to it) as a front door: each
question becomes its System One equivalent (options -> a choice, `type: "boolean"` -> a noul answered yes or no,
`type: "score"` -> a score over its levels, min to max), the service decides them jointly, and each decision comes
back as {answer, confidence, distribution, latency_ms}. `calibration: "raw"` answers the head's probabilities before
the model's temperatures (the Decision's unrounded logits), so nothing AINode's shape asks for is lost. What has no
place in Clef's prompt (request-wide instructions, options for a boolean) is refused by name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from aiohttp import web

from ....head.answer import softmax64
from ....head.declaration import check, check_field, json_schema, node
from ....head.errors import Problem, RequestInvalid
from ....head.schema import (
    DecisionRequest,
    Limits,
    Question,
    Where,
    checked_state,
    parse_questions,
    unpaired_surrogates,
)
from ...config.registry import ServerSpec
from ...media.request import UnsupportedMediaType
from ...service.decision import Decision, DecisionInput
from ..appstate import REGISTRY
from ..context import Door, json_response
from ..routes import AINODE_SHAPE, PATHS
from .decisions import decide, extensions, read_body
from .systemone import no_model_warning, systemone_body

Loc = tuple[str | int, ...]
YES_NO = ("yes", "no")  # a boolean question's options, AINode's BOOLEAN_OPTIONS
SCORE_RANGE = (1, 5)  # a score question's min and max when it sends none (AINode's defaults)
MAX_OPTIONS = 255  # AINode's ceiling on a question's options, a score's range included (the model's limits follow)
RAW = "raw"  # calibration: the probabilities before the model's temperatures
# AINode's request declared once: parse() checks it (a question's options, type and range are read by _options,
# which the declaration describes), /openapi.json publishes it
QUESTION = node("object", msg="a question must be an object {question, options | type}", required=("question",),
                fields={
                    "question": node("string", msg="needs a non-empty question string", null_missing=True,
                                     nonblank=True, published={"pattern": "\\S"}),
                    "options": node(description="a choice of these (unique)", published={
                        "type": "array", "minItems": 2, "items": {"type": "string", "minLength": 1}}),
                    "type": node(description="without options: boolean is a noul answered yes or no; score asks "
                                             "levels min..max (with options: ignored unless boolean, refused then)"),
                    "min": node(published={"type": "integer", "default": SCORE_RANGE[0]}),
                    "max": node(published={"type": "integer", "default": SCORE_RANGE[1]})})
REQUEST = node("object", msg="the body must be a JSON object with state and questions", required=("questions",),
               fields={
                   "model": node("string", "null", msg="model must be a non-empty string", nonblank=True,
                                 description="left out: the default model, said in x_warnings"),
                   "state": node(description="a string, or JSON rendered compact with sorted keys (checked as System "
                                             "One's state); left out: empty"),
                   "questions": node("object", msg="questions must be a non-empty object of {key: {question, options "
                                     "| type}}", null_missing=True, nonempty=True, values=QUESTION),
                   "instructions": node(description="refused when not empty: Clef's prompt has no request-wide "
                                                    "instructions"),
                   "calibration": node(enum=(RAW, None), enum_msg=f'calibration must be "{RAW}" when given, got '
                                       "{got!r}", enum_type="invalid_value", description="the probabilities before "
                                       "the model's temperatures")})


AINODE_ERROR = node("object", required=("error",), fields={"error": node(
    "object", required=("message", "type"), fields={"message": node("string"), "type": node("string")})})


def ainode_error(exc: BaseException | None, status: int, error_type: str, message: str) -> dict[str, Any]:
    """AINode's error shape, {"error": {message, type}}; an invalid request's message lists every problem."""
    if isinstance(exc, RequestInvalid) and exc.problems:
        message = "; ".join(f"{'.'.join(map(str, p.loc[1:])) or 'body'}: {p.msg}" for p in exc.problems)
        return {"error": {"message": message, "type": "invalid_request_error"}}
    return {"error": {"message": message, "type": error_type}}


@dataclass
class Parsed:
    """An AINode request parsed once, at this door: the typed request (each question located in the AINode body),
    each question's options as AINode names them (in the order the answer lists them), and whether the answer is
    raw."""

    request: DecisionRequest | None = None
    options: dict[str, list[str]] = field(default_factory=dict)
    raw: bool = False
    where: dict[str, Where] = field(default_factory=dict)  # question key -> its parts' places in the AINode body


def _options(key: str, spec: dict[str, Any], loc: Loc, problems: list[Problem]) -> list[str] | None:
    """The options the question is asked with: sent, yes and no, or the score's levels from min to max."""
    kind = spec.get("type")
    if "options" in spec:
        options = spec["options"]
        if kind == "boolean":
            problems.append(Problem(loc + ("options",), "a boolean question is a noul here, answered yes or no: leave "
                                    "its options out, or its type to ask a choice of them", "options_not_supported"))
        elif not isinstance(options, list) or not all(isinstance(o, str) and o.strip() for o in options):
            problems.append(Problem(loc + ("options",), "options must be an array of non-empty strings", "type_error"))
        elif len(set(options)) != len(options):
            dupes = sorted({o for o in options if options.count(o) > 1})
            problems.append(Problem(loc + ("options",), f"duplicate options {dupes}: every option must be distinct",
                                    "duplicate_option"))
        else:
            return list(options)
        return None
    if kind == "boolean":
        return list(YES_NO)
    if kind != "score":
        problems.append(Problem(loc + ("type",), f"question {key!r} needs options, or a type of boolean or score; got "
                                f"{kind!r}", "missing" if kind is None else "invalid_value"))
        return None
    lo, hi = spec.get("min", SCORE_RANGE[0]), spec.get("max", SCORE_RANGE[1])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or hi <= lo:
        problems.append(Problem(loc + ("max",), "a score's min and max must be integers, max above min",
                                "invalid_value"))
        return None
    if hi - lo + 1 > MAX_OPTIONS:  # checked before the levels are written out
        problems.append(Problem(loc + ("max",), f"a score's range spans {hi - lo + 1} values, more than the "
                                f"{MAX_OPTIONS} allowed", "too_many_options"))
        return None
    return [str(v) for v in range(lo, hi + 1)]


def _question(key: str, spec: Any, t: Parsed, problems: list[Problem]) -> dict[str, Any] | None:
    loc = ("body", "questions", key)
    if not check(QUESTION, spec, loc, problems, deep=False):
        return None
    text = spec.get("question")
    if check_field(QUESTION, spec, "question", loc, problems) and not text.strip():  # blank: no question either
        problems.append(Problem(loc + ("question",), QUESTION.fields["question"].msg, "type_error"))
    options = _options(key, spec, loc, problems)
    if options is None or not isinstance(text, str):
        return None
    t.options[key] = options
    # its text is `question`, its criteria `options` (a score's levels come from min and max: no option of its own)
    t.where[key] = Where(loc, loc + ("question",), loc + ("options",), {} if spec.get("type") in ("boolean", "score")
                         else {name: loc + ("options", j) for j, name in enumerate(options)})
    if spec.get("type") == "boolean" and "options" not in spec:
        return {"type": "noul", "instructions": text.strip()}
    kind = "score" if spec.get("type") == "score" else "choice"
    criteria = options if kind == "score" else dict.fromkeys(options)
    return {"type": kind, "instructions": text.strip(), "criteria": criteria}


def parse(data: Any, default_model: str, limits: Limits) -> tuple[Parsed, list[str]]:
    """The typed request and its warnings; every problem of the AINode request at once (RequestInvalid, located in
    it): its own shape's first, then Clef's limits on what it asks."""
    problems: list[Problem] = []
    if not check(REQUEST, data, ("body",), problems, deep=False):
        raise RequestInvalid(problems)
    t, warnings = Parsed(), []
    model = data.get("model")
    if model is None:  # AINode's body may leave it out: the default model, said as POST /v1/systemone says it
        model = default_model
        warnings.append(no_model_warning(model))
    if data.get("instructions"):
        problems.append(Problem(("body", "instructions"), "Clef's prompt has no request-wide instructions: write them "
                                "into each question's question", "instructions_not_supported"))
    check_field(REQUEST, data, "calibration", ("body",), problems)
    t.raw = data.get("calibration") == RAW
    questions: dict[str, dict[str, Any]] = {}
    if check_field(REQUEST, data, "questions", ("body",), problems, deep=False):
        for key, spec in data["questions"].items():
            question = _question(key, spec, t, problems)
            if question is not None:
                questions[key] = question
    check_field(REQUEST, data, "model", ("body",), problems)  # null: the default model, above
    if problems:
        raise RequestInvalid(problems)
    state = data.get("state")
    state = "" if state is None else state  # AINode reads a missing state as empty
    problems += unpaired_surrogates([(data[f], ("body", f)) for f in ("model", "state", "questions") if f in data])
    text = checked_state(state, limits, problems)
    typed = parse_questions(questions, limits, problems, t.where.__getitem__)
    if problems:
        raise RequestInvalid(problems)
    t.request = DecisionRequest(model, state, typed, rendered=text)
    return t, warnings


def _distribution(answer: dict[str, Any], options: list[str]) -> dict[str, float]:
    """An answer's probabilities by AINode's option names (noul: yes and no)."""
    if answer["type"] == "noul":
        return {YES_NO[0]: answer["noul"], YES_NO[1]: round(1 - answer["noul"], 4)}
    return dict(zip(options, answer["probabilities"].values()))  # in the request's order, as System One answers


def _raw(question: Question, logits: np.ndarray, options: list[str]) -> dict[str, float]:
    """The head's probabilities before any temperature: softmax of the unrounded logits, which come in prompt
    order (a choice's by code point), put in the answer's order."""
    p = {oid: float(x) for (oid, _), x in zip(question.options, softmax64(logits))}
    if question.type == "noul":
        return {YES_NO[0]: round(p["true"], 4), YES_NO[1]: round(p["false"], 4)}
    return {name: round(p[key], 4) for name, key in zip(options, question.answer_keys)}


def to_ainode(t: Parsed, decision: Decision, response: dict[str, Any]) -> dict[str, Any]:
    """The Decision in AINode's shape: each question's answer (the first most likely option), its probability as the
    confidence, its distribution; every question was decided in the one pass, so each latency is the request's."""
    logits = {q.id: (q, z) for q, z in decision.logits}
    latency = response["x_latency_ms"]
    decisions = {}
    for key, answer in response["answers"].items():
        options = t.options[key]
        dist = _raw(*logits[key], options) if t.raw else _distribution(answer, options)
        picked = max(dist, key=dist.__getitem__)
        decisions[key] = {"answer": picked, "confidence": dist[picked], "distribution": dist, "latency_ms": latency}
    extensions = {k: v for k, v in response.items() if k.startswith("x_")}
    return {"model": response["model"], "latency_ms": latency, "decisions": decisions,
            "usage": {"prompt_tokens": response["usage"]["input_tokens"], "completion_tokens": 0, "calls": 1},
            **extensions}


async def decide_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_body(request, kinds=())  # text only: its body is capped at max_body_bytes
    if body.parts is not None:
        raise UnsupportedMediaType("POST /v1/decide takes application/json")
    registry = request.app[REGISTRY]
    parsed, warnings = parse(body.data, registry.default, registry.server.limits)
    decision = await decide(request, DecisionInput(parsed.request, parsed.request.model))
    extra, headers = extensions(request, decision, start, warnings)
    return json_response(to_ainode(parsed, decision, {**systemone_body(decision), **extra}), headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """POST /v1/decide in /openapi.json: AINode's request and answer, its errors as {error: {message, type}}."""
    request = json_schema(REQUEST)
    verdict = {"type": "object", "required": ["answer", "confidence", "distribution", "latency_ms"], "properties": {
        "answer": {"type": "string"}, "confidence": {"type": "number"},
        "distribution": {"type": "object", "additionalProperties": {"type": "number"}},
        "latency_ms": {"type": "number"}}}
    ok = {"description": "AINode's decisions", "content": {"application/json": {"schema": {
        "type": "object", "required": ["model", "latency_ms", "decisions", "usage"], "properties": {
            "model": {"type": "string"}, "latency_ms": {"type": "number"},
            "decisions": {"type": "object", "additionalProperties": verdict}, "usage": {"type": "object"}}}}}}
    failed = "AINode's error {error: {message, type}}; an invalid request is a 400"
    return {PATHS["ainode_decide"]: {"post": {
        "operationId": "ainode_decide", "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {"200": ok, **errors(400, 401, 404, 408, 413, 415, 429, 503, description=failed)}}}}


# AINode answers a request it cannot decide as asked 400, where the Jev API answers 422
DOOR = Door(AINODE_SHAPE, {"ainode_decide": decide_handler}, ainode_error, AINODE_ERROR, openapi_paths, {422: 400})
