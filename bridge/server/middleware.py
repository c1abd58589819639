"""Request context: the request id, domain errors -> HTTP (the one place, by errors.py's table), the response
written within write_timeout_s, one access-log line and the request metrics per request, parser errors included."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from ...head.errors import Category, ClefError, printable
from ..config.registry import ServerSpec
from ..config.registry_names import code_point
from .appstate import METRICS, REGISTRY
from .auth import CHALLENGE
from .body import header
from .context import INFO, RequestLog, escaped, json_response
from .doors import ERROR_SHAPES, STATUSES
from .errors import answer_for, error_type_of
from .prometheus import Metrics
from .routes import JEV_SHAPE, SHAPE_PREFIXES, SHAPES, UNMATCHED

log = logging.getLogger("clef_bridge.server")
access_log = logging.getLogger("clef_bridge.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"
ECHOED_ID_HEADER = "x-request-id"  # the same id under the name every other client reads, on every route
# a client's request id is echoed in the answer's header and the access log: 1 to 128 printable ASCII characters,
# else the request is refused (400) under an id of the server's own; the refusal never quotes it
MAX_REQUEST_ID_CHARS = 128
MAX_LOGGED_PATH = 200  # an unmatched path's characters in its access-log line
REQUEST_ID = re.compile(rf"[\x20-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")
SERVER_NAME = "clef-bridge"  # the Server header: no Python or aiohttp version for scanners to match
CLIENT_CLOSED = 499  # nginx's status for a client gone before its answer: counted apart from 5xx


# Status -> the headers HTTP wants with it (Allow comes with aiohttp's own 405).
ERROR_HEADERS: dict[int, Callable[[ServerSpec], dict[str, str]]] = {
    401: lambda server: {hdrs.WWW_AUTHENTICATE: CHALLENGE},
    429: lambda server: {hdrs.RETRY_AFTER: str(server.retry_after_s)},
    503: lambda server: {hdrs.RETRY_AFTER: str(server.retry_after_s)},
}


class BadRequestId(ClefError):
    category = Category.MALFORMED
    error_type = "invalid_request_id"


def request_id(request: web.Request) -> str | None:
    """The client's request id (x-typesafe-request-id), or None when it sends none; BadRequestId when it is not 1 to
    MAX_REQUEST_ID_CHARS printable ASCII characters (it would be echoed into a header, an answer and the log)."""
    value = header(request, REQUEST_ID_HEADER)
    if not value:
        return None
    if not REQUEST_ID.fullmatch(value):
        bad = next((f"; it holds {code_point(ch)} at position {i}" for i, ch in enumerate(value[:MAX_REQUEST_ID_CHARS])
                    if not " " <= ch <= "~"), "")
        raise BadRequestId(f"the {REQUEST_ID_HEADER} header must be 1 to {MAX_REQUEST_ID_CHARS} printable ASCII "
                           f"characters; it is {len(value)} characters long{bad}; send a shorter id, such as a UUID")
    return value


def shape_of(request: web.Request) -> str:
    """The API shape a request's errors take: its route's, or for a path no route serves, the shape of the API
    whose base it is under (a Workers AI client's typo still gets Cloudflare's envelope)."""
    shape = SHAPES.get(request.match_info.route.name, JEV_SHAPE)
    if shape == JEV_SHAPE:
        return next((s for s, prefixes in SHAPE_PREFIXES.items() if request.path.startswith(prefixes)), shape)
    return shape


def client_gone(request: web.BaseRequest) -> bool:
    """The client closed its connection: whatever failed after that, nobody is left to answer."""
    return request.transport is None or request.transport.is_closing()


def error_body(exc: BaseException, status: int, shape: str = JEV_SHAPE) -> Any:
    """The error in its API's shape (doors.ERROR_SHAPES); a bug's message stays hidden. ClefError and Problem texts
    are printable by construction, any other message is made so."""
    message = str(exc) if status < 500 or isinstance(exc, ClefError) else "internal server error"
    return ERROR_SHAPES[shape](exc, status, error_type_of(exc), printable(message))


def _http_error(exc: web.HTTPException, info: RequestLog, shape: str) -> web.Response:
    """aiohttp's own errors (404 unknown route, 405 method) in our body shapes, keeping their headers (Allow)."""
    info.error_type = exc.reason.lower().replace(" ", "_")
    body = ERROR_SHAPES[shape](None, exc.status, info.error_type, printable(exc.text or exc.reason))
    kept = {k: v for k, v in exc.headers.items() if k not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
    return json_response(body, exc.status, kept)


def _error_response(request: web.Request, exc: Exception, info: RequestLog, shape: str) -> web.Response:
    if client_gone(request):  # a hang-up mid-body surfaces as a read error: the client's doing, not a 5xx
        info.error_type = "client_closed_request"
        return json_response({"detail": {"error_type": info.error_type, "message": "client closed"}}, CLIENT_CLOSED)
    status = answer_for(exc).status
    status = STATUSES.get(shape, {}).get(status, status)
    info.error_type = error_type_of(exc)
    if status >= 500 and not isinstance(exc, ClefError):
        log.exception("request %s failed", info.id)
    headers = ERROR_HEADERS[status](request.app[REGISTRY].server) if status in ERROR_HEADERS else None
    return json_response(error_body(exc, status, shape), status, headers)


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
    shape = shape_of(request)
    start = time.perf_counter()
    try:
        try:
            info.id = request_id(request) or info.id
            response = await handler(request)
        except web.HTTPException as exc:
            response = _http_error(exc, info, shape)
        except Exception as exc:  # noqa: BLE001 - the one place errors become HTTP
            response = _error_response(request, exc, info, shape)
            _forget(exc)  # logged (if it is a bug) by now
        response.headers[REQUEST_ID_HEADER] = info.id
        response.headers[ECHOED_ID_HEADER] = info.id  # what OpenAI's clients and most others read (clef-compactor)
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
    access_log.info(escaped(orjson.dumps(line).decode()))


def finish(request: web.Request, info: RequestLog, start: float) -> None:
    """The request's metrics and its one access-log line."""
    info.timings.setdefault("total_ms", round((time.perf_counter() - start) * 1e3, 3))
    request.app[METRICS].requests.labels(info.route, info.model, str(info.status)).inc()
    line = {"request_id": info.id, "method": request.method, "route": info.route, "model": info.model,
            "status": info.status, "input_tokens": info.input_tokens, "batch_size": info.batch_size,
            **info.timings}
    if info.route == UNMATCHED:  # the path tried (its route label stays "unmatched": metrics stay bounded)
        line["path"] = request.path[:MAX_LOGGED_PATH]  # the whole line is escaped (_access): one line, printable
    if info.tenant:
        line["tenant"] = info.tenant
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
