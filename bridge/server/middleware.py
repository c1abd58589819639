"""Request context: the request id, domain errors -> HTTP (the one place, by errors.py's table), the response
written within write_timeout_s, one access-log line and the request metrics per request, parser errors included."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from ...head.errors import Category, ClefError, RequestInvalid, printable
from ..config.registry import ServerSpec
from .appstate import METRICS, REGISTRY
from .auth import CHALLENGE
from .body import header
from .errors import answer_for, error_type_of
from .prometheus import Metrics
from .routes import UNMATCHED, WORKERS_AI_PREFIXES, WORKERS_AI_ROUTES

log = logging.getLogger("clef_bridge.server")
access_log = logging.getLogger("clef_bridge.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"
SERVER_NAME = "clef-bridge"  # the Server header: no Python or aiohttp version for scanners to match
CLIENT_CLOSED = 499  # nginx's status for a client gone before its answer: counted apart from 5xx


class BodyTimeout(ClefError):
    category = Category.SLOW_CLIENT
    error_type = "request_timeout"


# Status -> Cloudflare's own error code where its Workers AI error table has one for that status (out of
# capacity, request too large, timeout); the Workers AI envelope carries it, any other error carries its status.
WORKERS_AI_CODES: dict[int, int] = {429: 3040, 413: 3006, 408: 3007}
# Status -> the headers HTTP wants with it (Allow comes with aiohttp's own 405).
ERROR_HEADERS: dict[int, Callable[[ServerSpec], dict[str, str]]] = {
    401: lambda server: {hdrs.WWW_AUTHENTICATE: CHALLENGE},
    429: lambda server: {hdrs.RETRY_AFTER: str(server.retry_after_s)},
    503: lambda server: {hdrs.RETRY_AFTER: str(server.retry_after_s)},
}


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
    return request.match_info.route.name in WORKERS_AI_ROUTES or request.path.startswith(WORKERS_AI_PREFIXES)


def workers_ai_envelope(result: Any = None, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Cloudflare's API envelope: {result, success, errors, messages}."""
    return {"result": result, "success": not errors, "errors": errors or [], "messages": []}


def workers_ai_error(message: str, status: int) -> dict[str, Any]:
    return workers_ai_envelope(errors=[{"code": WORKERS_AI_CODES.get(status, status), "message": message}])


def client_gone(request: web.BaseRequest) -> bool:
    """The client closed its connection: whatever failed after that, nobody is left to answer."""
    return request.transport is None or request.transport.is_closing()


def error_body(exc: BaseException, status: int, workers_ai: bool) -> Any:
    """The error in the Jev (or Workers AI) shape; ClefError and Problem texts are printable by construction."""
    error_type = error_type_of(exc)
    if isinstance(exc, RequestInvalid) and status == 422:  # media too large (413) answer like other 413s
        detail: Any = [{"loc": list(p.loc), "msg": p.msg, "type": p.type} for p in exc.problems]
        message = str(exc)
    else:
        message = str(exc) if status < 500 or isinstance(exc, ClefError) else "internal server error"
        detail = {"error_type": error_type, "message": printable(message)}
    if workers_ai:
        return workers_ai_error(printable(message), status)
    return {"detail": detail}


def _http_error(exc: web.HTTPException, info: RequestLog, workers_ai: bool) -> web.Response:
    """aiohttp's own errors (404 unknown route, 405 method) in our body shapes, keeping their headers (Allow)."""
    info.error_type = exc.reason.lower().replace(" ", "_")
    message = exc.text or exc.reason
    if workers_ai:
        body: Any = workers_ai_error(message, exc.status)
    else:
        body = {"detail": {"error_type": info.error_type, "message": message}}
    kept = {k: v for k, v in exc.headers.items() if k not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
    return json_response(body, exc.status, kept)


def _error_response(request: web.Request, exc: Exception, info: RequestLog, workers_ai: bool) -> web.Response:
    if client_gone(request):  # a hang-up mid-body surfaces as a read error: the client's doing, not a 5xx
        info.error_type = "client_closed_request"
        return json_response({"detail": {"error_type": info.error_type, "message": "client closed"}}, CLIENT_CLOSED)
    status = answer_for(exc).status
    info.error_type = error_type_of(exc)
    if status >= 500 and not isinstance(exc, ClefError):
        log.exception("request %s failed", info.id)
    headers = ERROR_HEADERS[status](request.app[REGISTRY].server) if status in ERROR_HEADERS else None
    return json_response(error_body(exc, status, workers_ai), status, headers)


def _forget(exc: BaseException | None) -> None:
    """Drop the tracebacks of a handled error and of the errors it chains to.

    A traceback holds every frame it passed through, and the frames hold the request (a 3.8 MB body,
    its rendered texts) and the future that holds the error: a reference cycle that only the cyclic
    GC's rare full passes free, so memory rose by hundreds of MB under big refusals. Without the
    traceback, reference counting frees it all when the request ends.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


async def _write(request: web.Request, response: web.StreamResponse) -> None:
    await response.prepare(request)
    await response.write_eof()


async def _send(request: web.Request, response: web.StreamResponse, info: RequestLog, timeout: float) -> None:
    """Write the response here rather than after the middleware, so that a client which never reads
    (pipelining without reading its answers, say) is cut off after write_timeout_s and logged."""
    if client_gone(request):
        info.status, info.error_type = CLIENT_CLOSED, info.error_type or "client_closed_request"
        return
    # Written means handed to the kernel: with no user-space buffer allowed, the final drain waits for
    # all of it, within the timeout. Otherwise up to 64 KiB could stay buffered, and the idle close
    # that comes later would wait, with no timeout, for a client that never reads.
    request.transport.set_write_buffer_limits(high=0)
    try:
        await asyncio.wait_for(_write(request, response), timeout)
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.abort()  # close() would wait for the unread buffer to drain: forever
        info.status, info.error_type = CLIENT_CLOSED, "write_timeout"
    except ConnectionError:
        info.status, info.error_type = CLIENT_CLOSED, "client_closed_request"


@web.middleware
async def context_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Request id, domain errors -> HTTP, the response written, one access-log line and the request metrics."""
    info = RequestLog(id=uuid.uuid4().hex)
    request[INFO] = info
    route = request.match_info.route
    info.route = route.resource.canonical if route.resource is not None and route.name != UNMATCHED else UNMATCHED
    workers_ai = is_workers_ai(request)
    start = time.perf_counter()
    try:
        try:
            info.id = header(request, REQUEST_ID_HEADER) or info.id
            response = await handler(request)
        except web.HTTPException as exc:
            response = _http_error(exc, info, workers_ai)
        except Exception as exc:  # noqa: BLE001 - the one place errors become HTTP
            response = _error_response(request, exc, info, workers_ai)
            _forget(exc)  # logged (if it is a bug) by now
        response.headers[REQUEST_ID_HEADER] = info.id
        response.headers[hdrs.SERVER] = SERVER_NAME
        info.status = response.status
        await _send(request, response, info, request.app[REGISTRY].server.write_timeout_s)
    except asyncio.CancelledError:  # the client hung up while its request was queued or computed
        info.status, info.error_type = CLIENT_CLOSED, "client_closed_request"
        raise
    finally:
        finish(request, info, start)
    return response


def _access(line: dict[str, Any]) -> None:
    access_log.info(orjson.dumps(line).decode())


def finish(request: web.Request, info: RequestLog, start: float) -> None:
    """The request's metrics and its one access-log line."""
    info.timings.setdefault("total_ms", round((time.perf_counter() - start) * 1e3, 3))
    request.app[METRICS].requests.labels(info.route, info.model, str(info.status)).inc()
    line = {"request_id": info.id, "method": request.method, "route": info.route, "model": info.model,
            "status": info.status, "input_tokens": info.input_tokens, "batch_size": info.batch_size,
            **info.timings}
    if info.error_type:
        line["error_type"] = info.error_type
    _access(line)


class ProtocolLog(logging.LoggerAdapter):
    """aiohttp's connection logger (handler_args["logger"]): a request its parser refuses never reaches
    the app, so it is counted and logged here, as one access-log line and no traceback (garbage traffic
    must not flood the log); everything else passes through to aiohttp.server unchanged."""

    def __init__(self, metrics: Metrics):
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.metrics = metrics

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            super().log(level, msg, *args, exc_info=exc_info, **kwargs)
            return
        status = 400  # what aiohttp answers every request its parser refuses
        self.metrics.requests.labels("unparsed", "-", str(status)).inc()
        lines = printable(str(exc_info.message)).strip().splitlines() or [type(exc_info).__name__]
        _access({"request_id": uuid.uuid4().hex, "method": "-", "route": "unparsed", "model": "-", "status": status,
                 "error_type": "bad_http_request", "message": lines[0][:200]})
