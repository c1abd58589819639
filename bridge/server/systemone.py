"""The Jev / TypeSafe System One route (POST /v1/systemone): the body names its model (or gets the default)."""

from __future__ import annotations

import time

from aiohttp import web

from .appstate import REGISTRY
from .decisions import decide, decision_input, read_body, reply
from .middleware import json_response


def no_model_warning(default: str) -> str:
    return (f"request.no_model: the request names no model, so the default model {default!r} answered (models.toml "
            "`default`); send \"model\" to choose one")


async def systemone_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_body(request)
    data, warnings = body.data, []
    if isinstance(data, dict) and data.get("model") is None:  # clients that leave it out get the default
        data = {**data, "model": request.app[REGISTRY].default}
        warnings.append(no_model_warning(data["model"]))
    model = data.get("model") if isinstance(data, dict) else None
    decision = await decide(request, decision_input(body, data, model))
    response, headers = reply(request, decision, start, warnings)
    return json_response(response, headers=headers)
