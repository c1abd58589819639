"""bridge/server/middleware.py without a socket: each error category's status, headers and body in the
Jev and Workers AI shapes, aiohttp's own errors, the request id (bounded), the access-log line and the metrics;
the banner's lines (escaped)."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadStatusLine
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.server.app import banner
from clef_bridge.bridge.server.appstate import KEYS, METRICS, NAMES, REGISTRY, SERVED
from clef_bridge.bridge.server.auth import ApiKeys
from clef_bridge.bridge.server.context import INFO, EscapedArgs
from clef_bridge.bridge.server.doors.workers_ai import WORKERS_AI_CODES
from clef_bridge.bridge.server.errors import ANSWERS
from clef_bridge.bridge.server.middleware import REQUEST_ID_HEADER, SERVER_NAME, ProtocolLog, error_body
from clef_bridge.bridge.server.prometheus import create_metrics
from clef_bridge.head.errors import Category, ClefError, Problem, RequestInvalid

from .servertiny import access_lines, body, call, capture_access, tiny_app

pytestmark = pytest.mark.unit

JEV, WORKERS_AI = "/v1/systemone", "/accounts/acc/ai/run/@cf/cloudflare/clef-flash"
SERVER = ServerSpec(retry_after_s=7)


def error_of(category: Category) -> ClefError:
    if category is Category.INVALID:
        return RequestInvalid([Problem(("questions", "q", "type"), "unknown type 'x'", "value_error.type")])
    cls = type(f"Some{category.name.title()}", (ClefError,), {"category": category, "error_type": "some_error"})
    return cls(f"it is {category.value}")


def raising(exc: BaseException):
    async def handler(request):
        raise exc
    return handler


def answer(exc: BaseException, path: str = JEV):
    app = tiny_app({"systemone": raising(exc), "workers_ai": raising(exc)}, SERVER)
    return call(app, "POST", path)


@pytest.mark.parametrize("category", [c for c in Category if c is not Category.INVALID])
def test_each_category_answers_its_status_with_the_jev_detail(category):
    response = answer(error_of(category))
    assert response.status == ANSWERS[category].status
    assert body(response) == {"detail": {"error_type": "some_error", "message": f"it is {category.value}"}}


def test_an_invalid_request_lists_its_problems():
    response = answer(error_of(Category.INVALID))
    assert response.status == 422
    assert body(response) == {"detail": [{"loc": ["questions", "q", "type"], "msg": "unknown type 'x'",
                                          "type": "value_error.type"}]}


def test_media_too_large_answers_like_every_413_not_with_a_problem_list():
    from clef_bridge.bridge.media.images import ImageTooLarge

    response = answer(ImageTooLarge(("assets", 0), "12 MB, over max_image_bytes"))
    assert response.status == 413
    assert body(response)["detail"] == {"error_type": "image_too_large",
                                        "message": "assets.0: 12 MB, over max_image_bytes"}


@pytest.mark.parametrize("category", list(Category))
def test_workers_ai_routes_answer_in_cloudflares_envelope(category):
    status = ANSWERS[category].status
    response = answer(error_of(category), WORKERS_AI)
    assert response.status == status
    reply = body(response)
    assert reply["result"] is None and reply["success"] is False and reply["messages"] == []
    (error,) = reply["errors"]
    assert error["code"] == WORKERS_AI_CODES.get(status, status) and error["message"]


def test_cloudflares_codes_for_capacity_size_and_timeout():
    codes = {c: body(answer(error_of(c), WORKERS_AI))["errors"][0]["code"]
             for c in (Category.BUSY, Category.TOO_LARGE, Category.SLOW_CLIENT, Category.NOT_FOUND)}
    assert codes == {Category.BUSY: 3040, Category.TOO_LARGE: 3006, Category.SLOW_CLIENT: 3007, Category.NOT_FOUND: 404}


@pytest.mark.parametrize("category, header, value", [
    (Category.BUSY, "Retry-After", "7"), (Category.UNAVAILABLE, "Retry-After", "7"),
    (Category.UNAUTHORIZED, "WWW-Authenticate", 'Bearer realm="clef-bridge"'),
])
def test_statuses_come_with_the_headers_http_wants(category, header, value):
    for path in (JEV, WORKERS_AI):
        assert answer(error_of(category), path).headers[header] == value


def test_other_errors_carry_neither_retry_after_nor_a_challenge():
    headers = answer(error_of(Category.INVALID)).headers
    assert "Retry-After" not in headers and "WWW-Authenticate" not in headers


def test_a_bug_is_a_500_that_hides_its_text_and_logs_its_traceback(caplog):
    caplog.set_level(logging.ERROR, logger="clef_bridge.server")
    response = answer(KeyError("secret internals"))
    assert response.status == 500
    assert body(response) == {"detail": {"error_type": "internal_error", "message": "internal server error"}}
    assert "secret internals" not in response.text
    assert any(r.exc_info and r.name == "clef_bridge.server" for r in caplog.records)


def test_memory_running_out_is_a_503_worth_retrying_with_its_text_hidden():
    response = answer(MemoryError("host details"))
    assert (response.status, response.headers["Retry-After"]) == (503, "7")
    assert body(response) == {"detail": {"error_type": "internal_error", "message": "internal server error"}}


def test_a_clef_error_at_500_keeps_its_message():
    """ClefError messages are written for users (and printable by construction), even for a 5xx."""
    assert body(answer(ClefError("the playground's files are missing")))["detail"] == {
        "error_type": "clef_error", "message": "the playground's files are missing"}


def test_error_body_makes_a_foreign_message_printable():
    class Odd(ClefError):
        category, error_type = Category.INVALID, "odd"

    exc = Odd("x")
    exc.args = ("lone \ud800 surrogate",)
    assert error_body(exc, 400)["detail"]["message"] == "lone \\ud800 surrogate"


def test_aiohttps_own_errors_take_our_shapes():
    response = call(tiny_app({"unmatched": raising(web.HTTPNotFound())}), "GET", "/nowhere")
    assert response.status == 404
    assert body(response) == {"detail": {"error_type": "not_found", "message": "404: Not Found"}}


@pytest.mark.parametrize("path", [JEV, WORKERS_AI])
def test_a_405_keeps_its_allow_header(path):
    not_allowed = raising(web.HTTPMethodNotAllowed("PUT", ["POST"]))
    response = call(tiny_app({"systemone": not_allowed, "workers_ai": not_allowed}), "POST", path)
    assert response.status == 405 and response.headers["Allow"] == "POST"
    reply = body(response)
    assert reply == ({"detail": {"error_type": "method_not_allowed", "message": "405: Method Not Allowed"}}
                     if path == JEV else {"result": None, "success": False, "messages": [],
                                          "errors": [{"code": 405, "message": "405: Method Not Allowed"}]})


def test_unmatched_cloudflare_paths_answer_in_the_envelope():
    app = tiny_app({"unmatched": raising(web.HTTPNotFound())})
    for path in ("/accounts/x/nothing", "/client/v4/nothing"):
        reply = body(call(app, "GET", path))
        assert reply["success"] is False and reply["errors"][0]["code"] == 404


def test_the_request_id_is_echoed_or_made(caplog):
    capture_access(caplog)
    app = tiny_app()
    given = call(app, "GET", "/health", {REQUEST_ID_HEADER: "abc-123"})
    made = call(app, "GET", "/health")
    assert given.headers[REQUEST_ID_HEADER] == "abc-123"
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers[REQUEST_ID_HEADER])
    assert [line["request_id"] for line in access_lines(caplog)] == ["abc-123", made.headers[REQUEST_ID_HEADER]]
    assert given.headers["Server"] == made.headers["Server"] == SERVER_NAME


@pytest.mark.parametrize("given, why", [("a" * 129, "it is 129 characters long; send"),
                                        ("id-\u202e-evil", "it holds U+202E RIGHT-TO-LEFT OVERRIDE at position 3"),
                                        ("id\x7fx", "it holds U+007F at position 2"),
                                        ("caf\u00e9", "it holds U+00E9 LATIN SMALL LETTER E WITH ACUTE at position 3")])
def test_a_request_id_beyond_128_printable_ascii_characters_is_refused_unechoed(caplog, given, why):
    capture_access(caplog)
    response = call(tiny_app(), "GET", "/health", {REQUEST_ID_HEADER: given})
    assert response.status == 400
    detail = body(response)["detail"]
    assert detail["error_type"] == "invalid_request_id" and why in detail["message"]
    assert given not in response.text and given not in str(dict(response.headers))
    made = response.headers[REQUEST_ID_HEADER]
    assert re.fullmatch(r"[0-9a-f]{32}", made)  # the refusal carries an id of the server's own, as its log line does
    (line,) = access_lines(caplog)
    assert (line["request_id"], line["status"], line["error_type"]) == (made, 400, "invalid_request_id")


def test_a_request_id_of_128_printable_ascii_characters_is_echoed():
    given = "A" * 100 + " !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"[:28]
    assert len(given) == 128
    assert call(tiny_app(), "GET", "/health", {REQUEST_ID_HEADER: given}).headers[REQUEST_ID_HEADER] == given


def test_the_access_log_escapes_what_is_not_printable(caplog):
    async def evil(request):
        request[INFO].model = "m\u202e\u2028\x7f\U000e0041"  # names cannot be so (registry_names): the writer's guard
        return web.json_response({})

    capture_access(caplog)
    call(tiny_app({"systemone": evil}), "POST", JEV)
    (record,) = [r for r in caplog.records if r.name == "clef_bridge.access"]
    text = record.getMessage()
    assert text.isprintable() and "\\u202e\\u2028\\u007f\\udb40\\udc41" in text
    assert access_lines(caplog)[0]["model"] == "m\u202e\u2028\x7f\U000e0041"  # the same value once parsed


def test_one_access_line_per_request_with_its_fields(caplog):
    capture_access(caplog)
    app = tiny_app({"systemone": raising(error_of(Category.BUSY))}, SERVER)
    call(app, "GET", "/health")
    call(app, "POST", JEV)
    call(app, "POST", WORKERS_AI.replace("clef-flash", "clef"))
    ok, busy, workers_ai = access_lines(caplog)
    fields = {"request_id", "method", "route", "model", "status", "input_tokens", "batch_size", "total_ms"}
    assert set(ok) == fields and set(busy) == fields | {"error_type"}
    assert (ok["method"], ok["route"], ok["model"], ok["status"]) == ("GET", "/health", "-", 200)
    assert (busy["method"], busy["route"], busy["status"], busy["error_type"]) == ("POST", JEV, 429, "some_error")
    assert workers_ai["route"] == "/accounts/{account_id}/ai/run/@cf/cloudflare/{model}"  # the route, not the path
    assert ok["total_ms"] >= 0 and ok["input_tokens"] == ok["batch_size"] == 0


def test_unmatched_paths_are_logged_under_one_route(caplog):
    capture_access(caplog)
    call(tiny_app({"unmatched": raising(web.HTTPNotFound())}), "GET", "/wp-login.php")
    (line,) = access_lines(caplog)
    assert (line["route"], line["status"], line["error_type"]) == ("unmatched", 404, "not_found")


def test_requests_are_counted_by_route_model_and_status():
    app = tiny_app({"systemone": raising(error_of(Category.TOO_LARGE))})
    for _ in range(2):
        call(app, "POST", JEV)
    count = app[METRICS].registry.get_sample_value("clef_requests_total",
                                                   {"route": JEV, "model": "-", "status": "413"})
    assert count == 2


def test_a_client_gone_is_a_499_not_a_5xx(caplog):
    capture_access(caplog)
    app = tiny_app({"systemone": raising(ConnectionResetError("peer gone"))})
    call(app, "POST", JEV, closing=True)
    (line,) = access_lines(caplog)
    assert (line["status"], line["error_type"]) == (499, "client_closed_request")
    assert app[METRICS].registry.get_sample_value("clef_requests_total",
                                                  {"route": JEV, "model": "-", "status": "499"}) == 1


def test_requests_the_parser_refuses_are_one_line_and_counted(caplog):
    capture_access(caplog)
    metrics = create_metrics()
    ProtocolLog(metrics).log(logging.DEBUG, "Error handling request", exc_info=BadStatusLine("GARBAGE \x00 line"))
    (line,) = access_lines(caplog)
    assert (line["route"], line["status"], line["error_type"], line["method"]) == ("unparsed", 400,
                                                                                  "bad_http_request", "-")
    assert line["message"].startswith("Bad status line")
    assert metrics.registry.get_sample_value("clef_requests_total",
                                             {"route": "unparsed", "model": "-", "status": "400"}) == 1


def test_other_connection_logs_pass_through_to_aiohttp():
    adapter = ProtocolLog(create_metrics())
    with mock.patch.object(adapter.logger, "log") as log:
        adapter.log(logging.ERROR, "Unhandled exception", exc_info=RuntimeError("x"))
    log.assert_called_once()
    assert log.call_args.args[:2] == (logging.ERROR, "Unhandled exception")


def test_the_banner_keeps_each_line_one_line_whatever_a_path_or_warning_holds():
    served = SimpleNamespace(spec=SimpleNamespace(gguf="/models/x\n$(id)\u202e.gguf", builtin=""), head_path=None,
                             facts=SimpleNamespace(head_source="embedded", architecture="qwen35", embedding_length=8,
                                                   block_count=2), warnings=("line one\u2028line two",),
                             worker=SimpleNamespace(model=SimpleNamespace(backbone=None)))  # a backbone of its own
    decision_log = SimpleNamespace(path="/logs/a\nb.jsonl", max_mb=64, keep=5, states=False)
    app = {KEYS: ApiKeys(None), SERVED: {"m": served}, NAMES: {"m": "m", "alias": "m"},
           REGISTRY: SimpleNamespace(server=SimpleNamespace(decision_log=decision_log))}
    lines = banner(app, "http://127.0.0.1:8792")
    assert all(line.isprintable() for line in lines) and len(lines) == 6
    assert lines[1].startswith("  decision log /logs/a\\u000ab.jsonl (rotated at 64 MB")
    assert lines[2] == "  model m (also answers to alias)"
    assert lines[3].startswith("    gguf  /models/x\\u000a$(id)\\u202e.gguf (qwen35")
    assert lines[5] == "    warning: line one\\u2028line two"


def test_the_servers_log_escapes_what_a_record_interpolates():
    record = logging.LogRecord("clef_bridge.server", logging.INFO, __file__, 1, "loading model %s: %s (%d)",
                               ("x\u202e\nevil", "/m/a\u2028b.gguf", 3), None)
    assert EscapedArgs().filter(record) is True
    assert record.getMessage() == "loading model x\\u202e\\u000aevil: /m/a\\u2028b.gguf (3)"
