"""The Jev / TypeSafe System One route (POST /v1/systemone): the body names its model (or gets the default)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from aiohttp import web

from ....head.answer import systemone_answers
from ....head.declaration import Node, json_schema, node
from ....head.schema import request_declaration
from ...config.registry import LATEST, ServerSpec
from ...media.fields import media_declarations
from ...service.decision import Decision
from ..appstate import REGISTRY
from ..context import JEV_ERROR, Door, jev_error, json_response
from ..routes import JEV_SHAPE, PATHS
from ..multipart import RequestBody
from .decisions import decide, extensions, read_body, systemone_input


def systemone_body(decision: Decision) -> dict[str, Any]:
    """The System One response (the reference's shape): Jev's answer, Workers AI's result, the CLI's output."""
    return {"model": decision.requested, "answers": systemone_answers(decision.answers),
            "usage": {"input_tokens": decision.input_tokens, "output_tokens": 0}}


def no_model_warning(default: str) -> str:
    return (f"request.no_model: the request names no model, so the default model {default!r} answered (models.toml "
            "`default`); send \"model\" to choose one")


async def systemone_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    return await systemone_answer(request, await read_body(request), start)


async def systemone_answer(request: web.Request, body: RequestBody, start: float) -> web.Response:
    """A read System One body's answer (also where another door found one: OpenAI's route given a System One
    body)."""
    data, warnings = body.data, []
    if isinstance(data, dict) and data.get("model") is None:  # clients that leave it out get the default
        data = {**data, "model": request.app[REGISTRY].default}
        warnings.append(no_model_warning(data["model"]))
    model = data.get("model") if isinstance(data, dict) else None
    decision = await decide(request, await systemone_input(request, body, data, model))
    extra, headers = extensions(request, decision, start, warnings)
    return json_response({**systemone_body(decision), **extra}, headers=headers)


def declaration(server: ServerSpec, names: Sequence[str] = ()) -> Node:
    """System One's request as this route takes it, declared once: head/'s text request (parse_request checks it; a
    model left out gets the default) and the media fields (find_references checks them). /openapi.json publishes it
    as SystemOneRequest; names: the served names it gives as examples."""
    model = node("string", "null", description=f"a served name, an alias, or {LATEST}; left out (or null): the "
                                               "default model, said in x_warnings", published={"examples": list(names)})
    text = request_declaration(server.limits, name_resolved=True)
    return replace(text.with_fields(("state", "questions"), model=model, **media_declarations(server.media_limits)),
                   ref="SystemOneRequest")


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """POST /v1/systemone in /openapi.json: a JSON body, or multipart with a `request` part and media parts."""
    schema = json_schema(declaration(server), {})  # a $ref to the components' copy
    body = {"required": True, "content": {
        "application/json": {"schema": schema},
        "multipart/form-data": {"schema": {"type": "object", "required": ["request"], "properties": {
            "request": schema}, "additionalProperties": {"type": "string", "format": "binary"}}}}}
    ok = {"description": "the decision", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/SystemOneResponse"}}}}
    return {PATHS[name]: {"post": {"operationId": name, "requestBody": body, "security": security,
                                   "responses": {"200": ok, **errors(400, 401, 404, 413, 415, 422, 429, 503)}}}
            for name in NAMES}


NAMES = ("systemone", *(name for name in PATHS if name.startswith("systemone_at_")))
DOOR = Door(JEV_SHAPE, dict.fromkeys(NAMES, systemone_handler), jev_error, JEV_ERROR, openapi_paths)
