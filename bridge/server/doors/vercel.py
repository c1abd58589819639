"""Vercel AI Gateway's evaluation-model route (`POST /v4/ai/evaluation-model`, the AI SDK's evaluation model
specification version 4, which jev-cli and the gateway's other clients post to) as a front door. The body is
`{state, questions}` without a model: the model is the `ai-model-id` header (`typesafe-ai/jev` from most clients,
served where a model has it among its aliases), and a yes/no question is `boolean` where Jev says `noul`. The answers
come back in the specification's shape: a boolean's `probability`, a choice's and a score's `probabilities`, each
question's confidence under `providerMetadata.typesafe.confidence`, `usage` in camelCase."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import cache
from typing import Any, Callable

from aiohttp import web

from ....head.answer import ChoiceAnswer, NoulAnswer, ScoreAnswer
from ....head.declaration import Node, check, check_field, json_schema, node
from ....head.errors import Problem, RequestInvalid
from ....head.schema import Limits, question_declaration, request_declaration
from ...config.registry import ServerSpec
from ...service.decision import Decision
from ..appstate import REGISTRY
from ..body import header
from ..context import Door, json_response
from ..routes import PATHS, VERCEL_SHAPE
from .decisions import decide, extensions, read_body, systemone_input
from .systemone import no_model_warning

MODEL_HEADER = "ai-model-id"
SPEC_HEADER, SPEC_VERSION = "ai-evaluation-model-specification-version", "4"
BOOLEAN = "boolean"  # the specification's name for Jev's noul
SPEC_TYPES = (BOOLEAN, "choice", "score")
TYPES = {BOOLEAN: "noul", "noul": "noul", "choice": "choice", "score": "score"}  # Jev's own name taken too


VERCEL_ERROR = node("object", required=("error",), fields={"error": node(
    "object", required=("message", "type"), fields={
        "message": node("string"), "type": node("string"),
        "issues": node("array", description="an invalid request's problems", items=node(
            "object", required=("path", "message", "type"), fields={
                "path": node("array", items=node("string", "integer")), "message": node("string"),
                "type": node("string")}))})})


def vercel_error(exc: BaseException | None, status: int, error_type: str, message: str) -> Any:
    """The gateway's error shape, {error: {message, type}}; an invalid request's problems, located, beside them."""
    error: dict[str, Any] = {"message": message, "type": error_type}
    if isinstance(exc, RequestInvalid) and status == 422:
        error["issues"] = [{"path": list(p.loc), "message": p.msg, "type": p.type} for p in exc.problems]
    return {"error": error}


@cache
def declaration(limits: Limits) -> Node:
    """The specification's body declared once: System One's text request without a model (it comes in a header),
    a yes/no question's type `boolean`; to_systemone checks what differs from System One's, parse_request the rest."""
    text = request_declaration(limits, name_resolved=True)
    question = question_declaration(limits)
    kind = node(enum=tuple(TYPES), enum_msg=f"type must be one of {', '.join(SPEC_TYPES)}; got {{got!r}}",
                missing=f"type must be one of {', '.join(SPEC_TYPES)}; got None", missing_type="value_error",
                published={"type": "string"})
    questions = replace(text.fields["questions"], values=question.with_fields(type=kind),
                        description="System One's questions, a yes/no question's type `boolean`")
    model = node("null", msg=f"the evaluation-model body takes no model: name it in the {MODEL_HEADER} header",
                 type_error="value_error")
    return replace(text.with_fields(("state", "questions"), model=model, questions=questions),
                   msg="the body must be a JSON object with state and questions")


def to_systemone(data: Any, model: Any) -> dict[str, Any]:
    """The specification's body as System One's: `boolean` questions as noul, the model from the header; what else
    is wrong is found (and located, at the same paths) by System One's validation."""
    declared, problems = declaration(Limits()), []  # the limits are System One's to check
    if not check(declared, data, ("body",), problems, deep=False):
        raise RequestInvalid(problems)
    check_field(declared, data, "model", ("body",), problems)
    questions = data.get("questions")
    if isinstance(questions, dict):
        question = declared.fields["questions"].values
        for qid, q in questions.items():  # in the specification's words; the rest is System One's to check
            if isinstance(q, dict):
                check_field(question, q, "type", ("body", "questions", qid), problems)
    if problems:  # before the mapping below: a type of [] or {} would not even hash
        raise RequestInvalid(problems)
    if isinstance(questions, dict):
        questions = {qid: {**q, "type": TYPES[q["type"]]} if isinstance(q, dict) else q
                     for qid, q in questions.items()}
    return {**data, "model": model, "questions": questions}


def answer(a: Any) -> dict[str, Any]:
    """One answer in the specification's shape (its confidence goes to providerMetadata)."""
    if isinstance(a, NoulAnswer):
        return {"type": BOOLEAN, "probability": a.probability}
    if isinstance(a, ChoiceAnswer):
        return {"type": "choice", "choice": a.choice, "probabilities": dict(a.probabilities)}
    if isinstance(a, ScoreAnswer):
        return {"type": "score", "score": a.score, "probabilities": dict(a.probabilities)}
    raise TypeError(f"no evaluation-model shape for {type(a).__name__}")


def to_vercel(decision: Decision, model: str, warnings: list[str]) -> dict[str, Any]:
    confidence = {a.id: a.confidence for a in decision.answers if not isinstance(a, NoulAnswer)}
    return {"answers": {a.id: answer(a) for a in decision.answers},
            "usage": {"inputTokens": decision.input_tokens, "outputTokens": 0},
            "warnings": [{"type": "other", "message": w} for w in warnings],
            "providerMetadata": {"typesafe": {"confidence": confidence},
                                 "gateway": {"routing": {"canonicalSlug": model}}}}


async def evaluation_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_body(request, kinds=())  # the specification's state is text or JSON: no media fields
    version = header(request, SPEC_HEADER)
    if version is not None and version != SPEC_VERSION:
        raise RequestInvalid([Problem(("header", SPEC_HEADER), f"this route speaks version {SPEC_VERSION} of the "
                                      f"evaluation model specification, not {version!r}", "value_error")])
    model, warnings = header(request, MODEL_HEADER), []
    if not model:  # as POST /v1/systemone: the default model, and a warning that says so
        model = request.app[REGISTRY].default
        warnings.append(no_model_warning(model) + f" (the {MODEL_HEADER} header)")
    decision = await decide(request, await systemone_input(request, body, to_systemone(body.data, model), model))
    extra, headers = extensions(request, decision, start, warnings)
    return json_response({**to_vercel(decision, model, extra.get("x_warnings", [])), **extra}, headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """POST /v4/ai/evaluation-model in /openapi.json: System One's state and questions (boolean for noul)."""
    request = json_schema(declaration(server.limits), {})
    ok = {"description": "the answers in the evaluation model specification's shape", "content": {
        "application/json": {"schema": {"type": "object", "required": ["answers", "usage"], "properties": {
            "answers": {"type": "object"}, "usage": {"type": "object"}, "warnings": {"type": "array"},
            "providerMetadata": {"type": "object"}}}}}}
    parameters = [{"name": MODEL_HEADER, "in": "header", "schema": {"type": "string"},
                   "description": "the model (a served name or alias); absent: the default model"},
                  {"name": SPEC_HEADER, "in": "header", "schema": {"type": "string", "enum": [SPEC_VERSION]}}]
    failed = "the gateway's error {error: {message, type}}"
    return {PATHS["vercel_evaluation"]: {"post": {
        "operationId": "vercel_evaluation", "security": security, "parameters": parameters,
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {"200": ok, **errors(400, 401, 404, 408, 413, 415, 422, 429, 503, description=failed)}}}}


DOOR = Door(VERCEL_SHAPE, {"vercel_evaluation": evaluation_handler}, vercel_error, VERCEL_ERROR, openapi_paths)
