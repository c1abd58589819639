"""Cloudflare's hosted contract on the Workers AI routes: the request's `options` (rejectIfBusy), and the
hosted limits (1 to 64 questions, question ids of letters, digits, `_`, `.` and `-` up to 100 characters,
a 13 MiB body) that a client written against Cloudflare relies on. POST /v1/systemone keeps the Jev API's
wider contract (any question id, models.toml's limits)."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Callable

from aiohttp import web

from ....head.declaration import check, json_schema, node
from ....head.errors import Problem, RequestInvalid
from ....head.schema import MAX_TEXT_PROBLEMS, Limits
from ...config.registry import ServerSpec
from ...model.worker import RequestOptions
from ...service.systemone import Contract
from ..context import Door, json_response
from ..routes import PATHS, WORKERS_AI_ROUTES, WORKERS_AI_SHAPE
from .decisions import decide, extensions, read_body, systemone_input
from .systemone import declaration, systemone_body

MAX_QUESTIONS = 64
MAX_BODY_BYTES = 13 * 2**20
QUESTION_ID = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
# Status -> Cloudflare's own error code where its Workers AI error table has one for that status (out of
# capacity, request too large, timeout); the Workers AI envelope carries it, any other error carries its status.
WORKERS_AI_CODES: dict[int, int] = {429: 3040, 413: 3006, 408: 3007}


def workers_ai_envelope(result: Any = None, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Cloudflare's API envelope: {result, success, errors, messages}."""
    return {"result": result, "success": not errors, "errors": errors or [], "messages": []}


WORKERS_AI_ERROR = node("object", required=("result", "success", "errors", "messages"), fields={
    "result": node("null"), "success": node(enum=(False,)), "messages": node("array"),
    "errors": node("array", nonempty=True, items=node("object", required=("code", "message"), fields={
        "code": node("integer"), "message": node("string")}))})


def workers_ai_error(exc: BaseException | None, status: int, error_type: str, message: str) -> dict[str, Any]:
    """An error in the envelope: Cloudflare's code for the status where it has one, and the message."""
    return workers_ai_envelope(errors=[{"code": WORKERS_AI_CODES.get(status, status), "message": message}])


OPTIONS = node("object", "null", msg='options must be an object, such as {"rejectIfBusy": true}',
               description="{rejectIfBusy: true} answers 429 (code 3040) instead of waiting behind other requests",
               fields={"rejectIfBusy": node("boolean", msg="rejectIfBusy must be true or false, got {got!r}",
                                            shows_value=True)})


def take_options(body: dict[str, Any]) -> tuple[RequestOptions, dict[str, Any]]:
    """The request's options and the body without them (they change no answer, so identical requests still
    share one computation); a malformed `options` is a 422."""
    raw, problems = body.get("options"), []
    rest = {k: v for k, v in body.items() if k != "options"}
    if not check(OPTIONS, raw, ("body", "options"), problems):
        raise RequestInvalid(problems)
    if raw is None:
        return RequestOptions(), rest
    return RequestOptions(reject_if_busy=raw.get("rejectIfBusy", False)), rest  # busy: 429, code 3040, not waiting


def hosted_problems(body: Any, limits: Limits) -> list[Problem]:
    """What the hosted contract refuses in a body that the Jev route may take."""
    questions = body.get("questions") if isinstance(body, dict) else None
    if not isinstance(questions, dict):
        return []  # parse_request says what a body without a questions object lacks
    if len(questions) > MAX_QUESTIONS:
        return [Problem(("body", "questions"), f"Workers AI takes 1 to {MAX_QUESTIONS} questions per request, got "
                        f"{len(questions)}; split the request, or send it to POST /v1/systemone (up to "
                        f"{limits.max_questions}, max_questions)", "too_many_questions")]
    bad = [qid for qid in questions if not QUESTION_ID.fullmatch(qid)][:MAX_TEXT_PROBLEMS]
    return [Problem(("body", "questions", qid), "Workers AI takes question ids of 1 to 100 letters, digits, '_', '.' "
                    "or '-'; rename the question (POST /v1/systemone takes any id)", "value_error.question_id")
            for qid in bad]


CONTRACT = Contract(hosted_problems, frozenset({"too_many_questions"}))  # the hosted count replaces the server's


async def workers_ai_handler(request: web.Request) -> web.Response:
    """Cloudflare's Workers AI routes: the model comes from the path, options say how to wait, the answer comes in
    its envelope."""
    start = time.perf_counter()
    body = await read_body(request, MAX_BODY_BYTES)
    data, options, model = body.data, RequestOptions(), request.match_info["model"]
    if isinstance(data, dict):
        options, data = take_options(data)
        data["model"] = model
    call = await systemone_input(request, body, data, model if isinstance(body.data, dict) else None, options,
                                 CONTRACT)
    decision = await decide(request, replace(call, model_at=("path", "model")))
    extra, headers = extensions(request, decision, start, [])
    return json_response(workers_ai_envelope({**systemone_body(decision), **extra}), headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """Cloudflare's routes (the account's, the REST API's /client/v4 one, and /ai/run/... alone, where clients given
    the server root post) in /openapi.json: the model from the path, every answer in the envelope."""
    envelope = "Workers AI envelope {result, success, errors: [{code, message}], messages}"
    # System One's request with options, its model from the path (a body's is replaced)
    schema = json_schema(declaration(server).without("model").with_fields(options=OPTIONS), {})
    return {PATHS[name]: {"post": {
        "operationId": name, "security": security,
        "parameters": [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                       for p in ("account_id", "model") if "{" + p + "}" in PATHS[name]],
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": envelope},
                      **errors(400, 401, 404, 408, 413, 415, 422, 429, 503, description=f"{envelope}; code 3040 with "
                               "429, 3006 with 413, 3007 with 408, else the status")}}}
        for name in sorted(WORKERS_AI_ROUTES)}


DOOR = Door(WORKERS_AI_SHAPE, dict.fromkeys(sorted(WORKERS_AI_ROUTES), workers_ai_handler), workers_ai_error,
            WORKERS_AI_ERROR, openapi_paths)
