"""The API shapes this server speaks, each a front door over the one decision service: Jev's System One,
Cloudflare's Workers AI, OpenAI's Decisions, laya-serve's batch, AINode's decide, Deqio's and Vercel AI Gateway's
evaluation model, one module a door in this
folder, and what they share (decisions.py: the body read, the service called, the reply timed). A new shape is a
module here holding its Door (its handlers, the shape of its errors and its declaration, its paths in /openapi.json,
its request declared: head/declaration.py), its rows in ../routes.py, and its line below: three files."""

from __future__ import annotations

from functools import partial
from typing import Any

from ...config.registry import ServerSpec
from ..context import Door, ErrorShape, Handler, error_responses, jev_error
from ..routes import JEV_SHAPE
from . import ainode, deqio, openai_decisions, systemone, systemone_batch, vercel, workers_ai

DOORS: tuple[Door, ...] = (systemone.DOOR, workers_ai.DOOR, openai_decisions.DOOR, systemone_batch.DOOR, ainode.DOOR,
                           deqio.DOOR, vercel.DOOR)

HANDLERS: dict[str, Handler] = {name: handler for door in DOORS for name, handler in door.handlers.items()}
# every route's errors take their door's shape; the routes of no door (models, health, ...) Jev's
ERROR_SHAPES: dict[str, ErrorShape] = {JEV_SHAPE: jev_error, **{door.shape: door.error_body for door in DOORS}}
# a shape's statuses in place of errors.py's, where its protocol has its own
STATUSES: dict[str, dict[int, int]] = {door.shape: door.statuses for door in DOORS}


def openapi_paths(security: list[dict[str, Any]], server: ServerSpec) -> dict[str, Any]:
    """Every door's paths in /openapi.json, under the server's limits, its errors as it declares them."""
    return {path: item for door in DOORS
            for path, item in door.openapi_paths(security, partial(error_responses, door.error_declared),
                                                 server).items()}
