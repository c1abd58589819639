"""Request context: the request id, domain errors -> HTTP (the one place), access-log lines and metrics."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from ..head.answer import NonFiniteOutput
from ..head.errors import ClefError, ContextLengthExceeded, RequestInvalid
from .appstate import METRICS, REGISTRY
from .auth import Unauthorized
from .backbone import BackboneError, DecodeFailed
from .gpu import DeviceOutOfMemory
from .httpbody import BadEncoding, BodyTooLarge, UnsupportedMediaType
from .registry import UnknownModel
from .worker import Overloaded, WorkerStopped

log = logging.getLogger("clef_bridge.server")
access_log = logging.getLogger("clef_bridge.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"


class DeadlineExceeded(ClefError):
    error_type = "timeout"


class BodyTimeout(ClefError):
    error_type = "request_timeout"


# Domain error -> HTTP status, looked up along the class hierarchy; nothing else maps errors.
STATUS: dict[type[BaseException], int] = {
    RequestInvalid: 422, ContextLengthExceeded: 413, BodyTooLarge: 413, UnknownModel: 404, Unauthorized: 401,
    Overloaded: 429, DeadlineExceeded: 503, WorkerStopped: 503, DecodeFailed: 503, NonFiniteOutput: 503,
    BackboneError: 503, MemoryError: 503, DeviceOutOfMemory: 503, BadEncoding: 400, UnsupportedMediaType: 415,
    BodyTimeout: 408,
}
RETRY_STATUSES = (429, 503)


@dataclass
class RequestLog:
    """What the access log line and the metrics say about one request."""

    id: str
    route: str = ""
    model: str = "-"
    status: int = 0
    input_tokens: int = 0
    batch_size: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    error_type: str | None = None


INFO = web.RequestKey("clef_info", RequestLog)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def is_workers_ai(request: web.Request) -> bool:
    """Cloudflare's routes answer in the Workers AI envelope, unmatched ones included."""
    return request.match_info.route.name == "workers_ai" or request.path.startswith("/accounts/")


def error_body(exc: BaseException, status: int, workers_ai: bool) -> Any:
    error_type = getattr(exc, "error_type", "internal_error")
    if isinstance(exc, RequestInvalid):
        detail: Any = [{"loc": list(p.loc), "msg": p.msg, "type": p.type} for p in exc.problems]
        message = str(exc)
    else:
        message = str(exc) if status < 500 or isinstance(exc, ClefError) else "internal server error"
        detail = {"error_type": error_type, "message": message}
    if workers_ai:
        return {"success": False, "errors": [{"message": message, "code": status}]}
    return {"detail": detail}


def status_for(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _http_error(exc: web.HTTPException, info: RequestLog, workers_ai: bool) -> web.Response:
    """aiohttp's own errors (404 unknown route, 405 method) in our body shapes."""
    info.error_type = exc.reason.lower().replace(" ", "_")
    message = exc.text or exc.reason
    if workers_ai:
        body: Any = {"success": False, "errors": [{"message": message, "code": exc.status}]}
    else:
        body = {"detail": {"error_type": info.error_type, "message": message}}
    return json_response(body, exc.status)


@web.middleware
async def context_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Request id, domain errors -> HTTP, one access-log line and the request metrics."""
    info = RequestLog(id=request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex)
    request[INFO] = info
    resource = request.match_info.route.resource
    info.route = resource.canonical if resource is not None else "unmatched"
    workers_ai = is_workers_ai(request)
    start = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = _http_error(exc, info, workers_ai)
    except asyncio.CancelledError:
        info.status, info.error_type = 499, "client_closed_request"
        finish(request, info, start)
        raise
    except Exception as exc:  # noqa: BLE001 - the one place errors become HTTP
        status = status_for(exc)
        info.error_type = getattr(exc, "error_type", "internal_error")
        if status >= 500 and not isinstance(exc, ClefError):
            log.exception("request %s failed", info.id)
        headers = {"Retry-After": str(request.app[REGISTRY].server.retry_after_s)} if status in RETRY_STATUSES \
            else None
        response = json_response(error_body(exc, status, workers_ai), status, headers)
    response.headers[REQUEST_ID_HEADER] = info.id
    info.status = response.status
    finish(request, info, start)
    return response


def finish(request: web.Request, info: RequestLog, start: float) -> None:
    """The request's metrics and its one access-log line."""
    info.timings.setdefault("total_ms", round((time.perf_counter() - start) * 1e3, 3))
    request.app[METRICS].requests.labels(info.route, info.model, str(info.status)).inc()
    line = {"request_id": info.id, "method": request.method, "route": info.route, "model": info.model,
            "status": info.status, "input_tokens": info.input_tokens, "batch_size": info.batch_size,
            **info.timings}
    if info.error_type:
        line["error_type"] = info.error_type
    access_log.info(orjson.dumps(line).decode())
