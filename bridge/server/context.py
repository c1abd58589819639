"""What a request carries through the server: its log record (INFO), the JSON response, the Jev error shape (every
route's unless its door has another), what a front door is (Door), the slow-body refusal, and log text escaped
(escaped, EscapedArgs). Below the middleware and the doors, so that both import it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from ...head.declaration import Node, json_schema, node
from ...head.errors import Category, ClefError, RequestInvalid


class BodyTimeout(ClefError):
    category = Category.SLOW_CLIENT
    error_type = "request_timeout"


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
    tenant: str = ""  # the name of the key that authenticated it (never the key); "" with auth off


INFO = web.RequestKey("clef_info", RequestLog)


def _escape(ch: str) -> str:
    """A character as JSON escapes it (\\u202e; beyond the BMP, its UTF-16 surrogate pair)."""
    units = ch.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))


def escaped(text: str) -> str:
    """text with every character that str.isprintable refuses (controls, bidi and other format characters, line
    and paragraph separators) written as its JSON escape: a log or banner line stays one line that reads as it is,
    and a JSON line still parses to the same value. Names cannot hold such characters (registry_names); this is the
    writer's own guard for anything else a line quotes."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


class EscapedArgs(logging.Filter):
    """A log handler's filter: each str a record interpolates (a name, a path, a warning, an id) is escaped, so no
    value breaks or reorders a line; the message's own text is the code's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(escaped(a) if isinstance(a, str) else a for a in record.args)
        return True


JSON_HEADERS = {"X-Content-Type-Options": "nosniff"}  # a browser never runs an answer or an error as another type


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json",
                        headers={**JSON_HEADERS, **(headers or {})})


# An error's body in one API's shape: (the error, or None for aiohttp's own 404/405; its status; its error type;
# its message, printable) -> the JSON body
ErrorShape = Callable[[BaseException | None, int, str, str], Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A door's paths in /openapi.json: (the security requirement of routes that need a key, the error responses by
# status: errors(401, 422, ...), the server's settings (its limits, declared)) -> {path: path item}
OpenApiPaths = Callable[[list[dict[str, Any]], Callable[..., dict[str, Any]], Any], dict[str, Any]]


TEXT = node("string")
# The Jev shape declared: an invalid request's problems (ValidationError, 422) or any other error (Error)
PROBLEM = node("object", required=("loc", "msg", "type"), fields={
    "loc": node("array", items=node("string", "integer")), "msg": TEXT, "type": TEXT})
VALIDATION_ERROR = node("object", ref="ValidationError", required=("detail",),
                        fields={"detail": node("array", items=PROBLEM)})
OTHER_ERROR = node("object", ref="Error", required=("detail",), fields={"detail": node(
    "object", required=("error_type", "message"), fields={"error_type": TEXT, "message": TEXT})})
# either, as one value: detail is an array of problems or an object (what a check of any Jev error body reads)
JEV_ERROR = node("object", required=("detail",), fields={"detail": node(
    "array", "object", items=PROBLEM, required=OTHER_ERROR.fields["detail"].required,
    fields=OTHER_ERROR.fields["detail"].fields)})


def error_responses(declared: Node, *statuses: int, description: str = "") -> dict[str, Any]:
    """A door's error statuses in /openapi.json, each answering its declared error body."""
    schema = json_schema(declared)
    return {str(status): {"description": description or f"error {status}",
                          "content": {"application/json": {"schema": schema}}} for status in statuses}


def jev_error(exc: BaseException | None, status: int, error_type: str, message: str) -> Any:
    """The Jev shape: an invalid request's problems, each with its location; any other error's type and message."""
    if isinstance(exc, RequestInvalid) and status == 422:  # media too large (413) answer like other 413s
        return {"detail": [{"loc": list(p.loc), "msg": p.msg, "type": p.type} for p in exc.problems]}
    return {"detail": {"error_type": error_type, "message": message}}


@dataclass(frozen=True)
class Door:
    """One API shape the server speaks over the decision service: its routes' handlers (by their names in
    routes.py), the shape of its errors (routes.py's `shape` of its rows) and that shape declared (what
    /openapi.json publishes for its error statuses), its paths in /openapi.json, and the statuses its protocol
    answers in place of errors.py's (OpenAI's 400 for an invalid request)."""

    shape: str
    handlers: dict[str, Handler]
    error_body: ErrorShape
    error_declared: Node
    openapi_paths: OpenApiPaths
    statuses: dict[int, int] = field(default_factory=dict)
