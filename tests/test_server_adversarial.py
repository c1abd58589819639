"""What an adversarial client tried (issue 18), over a real socket: each refusal's status, body shape,
access-log line and counter, and /health answering afterwards."""

from __future__ import annotations

import gc
import gzip
import json
import socket
import time
import types
from typing import Any, Callable

import pytest
from backports import zstd
from clef_bridge.bridge.server.appstate import SERVED

from .conftest import tiny_spec
from .deciding import respond
from .serverkit import Reply, RunningServer, registry_for, strip_extensions, wait_until

pytestmark = pytest.mark.integration

NOUL = {"model": "tiny", "state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
KEY, METRICS_KEY = "key-1", "metrics-key-1"
ALIAS = "secret-alias"  # a name only clients with a key may learn
WORKERS_AI = "/accounts/{account_id}/ai/run/@cf/cloudflare/{model}"  # the route, as access lines name it


def workers_ai(model: str) -> str:
    return f"/accounts/acct/ai/run/@cf/cloudflare/{model}"


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    registry = registry_for(tiny_spec(fx, aliases=["clef-flash"]), tmp_path_factory.mktemp("adv") / "m.toml")
    with RunningServer(registry) as srv:
        yield srv


@pytest.fixture(scope="module")
def secured(fx, tmp_path_factory):
    folder = tmp_path_factory.mktemp("auth")
    (folder / "keys.txt").write_text(f"{KEY}\n{METRICS_KEY} name=prometheus scope=metrics\n")
    registry = registry_for(tiny_spec(fx, aliases=[ALIAS]), folder / "m.toml", api_keys_file=folder / "keys.txt")
    with RunningServer(registry, api_key=METRICS_KEY) as srv:
        yield srv


def http(method: str, path: str, headers: list[tuple[bytes, bytes]] = (), body: bytes = b"") -> bytes:
    """A request as raw bytes: header values go on the wire exactly as given."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: x", *(k + b": " + v for k, v in headers)]
    if body or method == "POST":
        lines += [b"Content-Type: application/json", f"Content-Length: {len(body)}".encode()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def counted(srv: RunningServer, route: str, status: int) -> float:
    return srv.metric("clef_requests_total", route=route, status=str(status))


def refused(srv: RunningServer, send: Callable[[], Reply], status: int, error_type: str, route: str) -> Any:
    """send() is refused: status, body shape, request id, Server header, its access-log line and its
    counter, and /health answers afterwards. Returns the detail (the envelope's errors on Workers AI)."""
    before = counted(srv, route, status)
    reply = send()
    assert reply.status == status, reply.body[:300]
    body = reply.json()
    if route.startswith("/accounts/"):
        assert body["success"] is False and body["errors"][0]["code"] == status
        detail = body["errors"]
    elif status == 422:
        detail = body["detail"]
        assert detail and all(set(p) == {"loc", "msg", "type"} and p["loc"][0] == "body" for p in detail)
    else:
        detail = body["detail"]
        assert set(detail) == {"error_type", "message"} and detail["error_type"] == error_type
    assert reply.headers["server"] == "clef-bridge"
    rid = reply.headers["x-typesafe-request-id"]
    line = srv.access_line(lambda entry: entry["request_id"] == rid)
    assert (line["status"], line["error_type"], line["route"]) == (status, error_type, route)
    assert counted(srv, route, status) == before + 1
    assert srv.request("GET", "/health").status == 200
    return detail


# --- bad bytes in headers ----------------------------------------------------------------------

@pytest.mark.parametrize("method, path, body", [("GET", "/health", b""), ("GET", "/openapi.json", b""),
                                                ("POST", "/v1/systemone", json.dumps(NOUL).encode())])
def test_a_request_id_that_is_not_utf8_is_a_400_on_any_route(server, method, path, body):
    runs = server.metric("clef_backbone_runs_total")
    detail = refused(server, lambda: server.raw(http(method, path, [(b"x-typesafe-request-id", b"id-\xff\xfe")], body)),
                     400, "invalid_header", path)
    assert "x-typesafe-request-id" in detail["message"]
    assert server.metric("clef_backbone_runs_total") == runs  # refused before any decision is computed


@pytest.mark.parametrize("name", [b"Content-Type", b"Content-Encoding"])
def test_body_headers_that_are_not_utf8_are_a_400(server, name):
    request = http("POST", "/v1/systemone", [(name, b"application/\xe9json")], json.dumps(NOUL).encode())
    request = request.replace(b"Content-Type: application/json\r\n", b"") if name == b"Content-Type" else request
    detail = refused(server, lambda: server.raw(request), 400, "invalid_header", "/v1/systemone")
    assert name.decode() in detail["message"]


def test_authorization_under_auth(secured):
    for value in (b"Bearer \xff\xfe", b"Basic a2V5LTE6", b"Bearer", b"Bearer wrong"):
        refused(secured, lambda: secured.raw(http("POST", "/v1/systemone", [(b"Authorization", value)],
                                                   json.dumps(NOUL).encode())),
                401, "authentication_error", "/v1/systemone")
    missing = secured.post(NOUL)
    assert missing.status == 401 and missing.headers["www-authenticate"] == 'Bearer realm="clef-bridge"'
    for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
        assert secured.post(NOUL, headers={"Authorization": f"{scheme} {KEY}"}).status == 200


# --- lone surrogates ---------------------------------------------------------------------------

SURROGATE_CASES = [
    ("question id", {**NOUL, "questions": {"\ud800": {"type": "noul"}}}, ["body", "questions", "\\ud800"]),
    ("option key", {**NOUL, "questions": {"c": {"type": "choice", "criteria": {"a\udfff": None, "b": None}}}},
     ["body", "questions", "c", "criteria", "a\\udfff"]),
    ("model", {**NOUL, "model": "tiny\udc80"}, ["body", "model"]),
    ("state key", {**NOUL, "state": {"\udbff": "x"}}, ["body", "state", "\\udbff"]),
]


@pytest.mark.parametrize("body, loc", [c[1:] for c in SURROGATE_CASES], ids=[c[0] for c in SURROGATE_CASES])
def test_lone_surrogates_are_a_422_naming_the_field(server, body, loc):
    data = json.dumps(body).encode()  # ASCII, with the lone surrogate as a \\uXXXX escape
    [problem] = refused(server, lambda: server.post(None, raw=data), 422, "validation_error", "/v1/systemone")
    assert problem["loc"] == loc and problem["type"] == "value_error.unicode"
    if loc != ["body", "model"]:  # on Workers AI the route names the model, the body's is ignored
        [error] = refused(server, lambda: server.request("POST", workers_ai("tiny"), raw=data), 422,
                          "validation_error", WORKERS_AI)
        assert "unpaired surrogate" in error["message"]


# --- client hang-ups ---------------------------------------------------------------------------

def test_a_hang_up_mid_body_is_a_499_without_a_traceback(server):
    before, tracebacks = counted(server, "/v1/systemone", 499), len(server.tracebacks())
    earlier = {e["request_id"] for e in server.access_lines()}
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(http("POST", "/v1/systemone", body=b"x" * 5000)[:-4900])  # 100 of 5,000 body bytes
        # hang up only once the handler is reading the body (aiohttp's connection holds the request meanwhile)
        wait_until(lambda: any(c._current_request is not None for c in server.runner.server.connections),
                   "the handler to start reading the body")
    line = server.access_line(lambda e: e["request_id"] not in earlier and e["route"] == "/v1/systemone")
    assert (line["status"], line["error_type"]) == (499, "client_closed_request")
    assert counted(server, "/v1/systemone", 499) == before + 1
    assert server.metric("clef_requests_total", status="500") == 0
    assert len(server.tracebacks()) == tracebacks
    assert server.request("GET", "/health").status == 200


# --- who may read what under auth --------------------------------------------------------------

def test_public_routes_under_auth_name_no_model(secured):
    for path in ("/health", "/ready", "/openapi.json"):
        reply = secured.request("GET", path)
        assert reply.status == 200 and reply.headers["server"] == "clef-bridge"
        assert b"tiny" not in reply.body and ALIAS.encode() not in reply.body, path
    for path, key in (("/metrics", METRICS_KEY), ("/v1/models", KEY)):
        refused(secured, lambda: secured.request("GET", path), 401, "authentication_error", path)
        with_key = secured.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        assert with_key.status == 200 and b"tiny" in with_key.body
    spec = secured.request("GET", "/openapi.json").json()
    assert spec["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]


# --- slow readers ------------------------------------------------------------------------------

def _non_reader(srv: RunningServer) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills the server's buffers soon
    sock.connect(("127.0.0.1", srv.port))
    sock.setblocking(False)
    return sock


def test_a_client_that_pipelines_and_never_reads_is_cut_off(fx, tmp_path):
    registry = registry_for(tiny_spec(fx), tmp_path / "m.toml", write_timeout_s=1.0)
    with RunningServer(registry) as srv:
        sock = _non_reader(srv)
        pipelined = http("GET", "/openapi.json") * 4000
        started = time.monotonic()
        sent = 0
        while sent < len(pipelined) and time.monotonic() - started < 5:
            try:
                sent += sock.send(pipelined[sent:sent + 65536])
            except BlockingIOError:  # the server stopped reading: its answers are not being taken
                time.sleep(0.05)
        line = srv.access_line(lambda e: e.get("error_type") == "write_timeout", timeout=20)
        cut_after = time.monotonic() - started
        deadline = time.monotonic() + 10
        while srv.runner.server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        sock.close()
        assert not srv.runner.server.connections and cut_after < 15
        assert line["status"] == 499 and line["route"] == "/openapi.json"
        assert srv.metric("clef_requests_total", route="/openapi.json", status="499") == 1
        assert srv.request("GET", "/health").status == 200


def test_a_client_that_stops_reading_with_a_little_left_to_send_is_cut_off(fx, tmp_path):
    """Answers that fill the kernel's buffers and leave less than asyncio's high-water mark in the
    transport: no drain blocks, and the idle close later would wait forever to flush them."""
    registry = registry_for(tiny_spec(fx), tmp_path / "m.toml", write_timeout_s=1.0, body_timeout_s=1.0)
    with RunningServer(registry) as srv:
        sock = _non_reader(srv)
        sock.settimeout(5)
        five = http("GET", "/openapi.json") * 5  # 31 KB of answers: under the 64 KiB high-water mark

        def buffered() -> int:
            return sum(c.transport.get_write_buffer_size() for c in srv.runner.server.connections if c.transport)

        for _ in range(400):  # until some of an answer waits in user space (the kernel's buffers are full)
            sock.sendall(five)
            time.sleep(0.03)
            if buffered() or not srv.runner.server.connections:
                break
        deadline = time.monotonic() + 10
        while srv.runner.server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        sock.close()
        assert not srv.runner.server.connections
        line = srv.access_line(lambda e: e.get("error_type") == "write_timeout")
        assert line["status"] == 499 and line["route"] == "/openapi.json"
        assert srv.metric("clef_requests_total", route="/openapi.json", status="499") == 1
        assert srv.request("GET", "/health").status == 200


# --- expensive refusals ------------------------------------------------------------------------

def big_choice(options: int = 255, size: int = 15_000) -> dict:
    """A 3.8 MB body: 255 options of 15 KB of varied words each."""
    words = "invoice refund printer outage password upgrade contract delivery dashboard export".split()
    text = " ".join(words[(i * 7) % len(words)] + str(i) for i in range(size // 8))[:size]
    return {"model": "tiny", "state": "s",
            "questions": {"c": {"type": "choice", "criteria": {f"o{i}": text for i in range(options)}}}}


def test_an_oversized_request_is_refused_before_it_is_tokenized(server):
    backbone = server.app[SERVED]["tiny"].worker.model.backbone
    tokenized: list[int] = []
    real = backbone.tokenize

    def counting(text: str, parse_special: bool) -> list[int]:
        tokenized.append(len(text))
        return real(text, parse_special)

    data = json.dumps(big_choice()).encode()
    assert len(data) > 3_800_000
    backbone.tokenize = counting
    try:
        detail = refused(server, lambda: server.post(None, raw=data), 413, "context_length_exceeded", "/v1/systemone")
    finally:
        del backbone.tokenize
    assert "needs at least" in detail["message"] and "8192" in detail["message"]
    assert sum(tokenized) < 1000  # the prompt's own markup only: no option text was tokenized


def test_refusals_leave_no_reference_cycles(server):
    """A handled error's traceback would tie the frames it passed (holding the body and its rendered
    texts) to the future holding the error: a cycle only the GC's rare full passes free, which let
    RSS climb by hundreds of MB under big refusals (tests/bench_refusals.py measures the RSS)."""
    bodies = [{**NOUL, "state": "x " * 40_000}, {**NOUL, "questions": {"\ud800": {"type": "noul"}}},
              {**NOUL, "model": "nope"}, {"model": "tiny"}]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        statuses = [server.post(body).status for body in bodies * 3]
        gc.collect()
        cycles = [o for o in gc.garbage if isinstance(o, (types.FrameType, types.TracebackType, BaseException))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert statuses == [413, 422, 404, 422] * 3
    assert not cycles


# --- the lesser items --------------------------------------------------------------------------

def test_405_names_the_allowed_methods(server):
    refused(server, lambda: server.request("POST", "/health", raw=b"{}"), 405, "method_not_allowed", "unmatched")
    reply = server.request("DELETE", "/v1/models")
    assert reply.status == 405 and set(reply.headers["allow"].split(",")) == {"GET", "HEAD"}


def _first_bytes(srv: RunningServer, request: bytes, then: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(request)
        first = sock.recv(65536)
        if then:
            sock.sendall(then)
            while first.count(b"HTTP/1.1 ") < 2:  # until the answer's status line follows the 100 Continue
                more = sock.recv(65536)
                if not more:
                    break
                first += more
        return first


def test_expect_100_continue_is_answered_after_the_checks(server, secured):
    announce = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n")
    before = counted(server, "/v1/systemone", 413)
    too_large = _first_bytes(server, announce % 10_000_000)
    assert too_large.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in too_large
    detail = json.loads(too_large.split(b"\r\n\r\n", 1)[1])["detail"]
    assert detail["error_type"] == "request_too_large" and "max_body_bytes" in detail["message"]
    rid = too_large.split(b"x-typesafe-request-id: ")[1].split(b"\r\n")[0].decode()
    assert server.access_line(lambda e: e["request_id"] == rid)["error_type"] == "request_too_large"
    assert counted(server, "/v1/systemone", 413) == before + 1
    no_key = _first_bytes(secured, announce % 100)
    assert no_key.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in no_key
    body = json.dumps(NOUL).encode()
    answered = _first_bytes(server, announce % len(body), then=body)
    assert answered.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert server.request("GET", "/health").status == 200


def test_every_gzip_member_and_zstd_frame_is_decoded(server):
    data = json.dumps(NOUL).encode()
    plain = strip_extensions(server.post(NOUL).json())
    half = len(data) // 2
    for encoding, compress in (("gzip", gzip.compress), ("zstd", zstd.compress)):
        members = compress(data[:half]) + compress(data[half:])
        reply = server.post(None, raw=members, headers={"Content-Encoding": encoding})
        assert reply.status == 200 and strip_extensions(reply.json()) == plain, reply.body[:300]
        bomb = compress(b" " * 3_000_000) * 2  # each member under max_body_bytes, together over it
        refused(server, lambda: server.post(None, raw=bomb, headers={"Content-Encoding": encoding}), 413,
                "request_too_large", "/v1/systemone")


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400"])
def test_an_out_of_range_number_is_refused_like_nan(server, number):
    data = b'{"model":"tiny","state":{"x":%s},"questions":{"q":{"type":"noul"}}}' % number.encode()
    [problem] = refused(server, lambda: server.post(None, raw=data), 422, "validation_error", "/v1/systemone")
    assert problem["loc"] == ["body"] and "out of range" in problem["msg"]


def test_multipart_without_images_is_a_415(server):
    body = (b'--b\r\nContent-Disposition: form-data; name="request"\r\n\r\n' + json.dumps(NOUL).encode()
            + b"\r\n--b--\r\n")
    detail = refused(server, lambda: server.post(None, raw=body, headers={
        "Content-Type": "multipart/form-data; boundary=b"}), 415, "unsupported_media_type", "/v1/systemone")
    assert "application/json" in detail["message"]


def test_the_workers_ai_result_names_the_routes_model(server, tiny_model):
    reply = server.request("POST", workers_ai("clef-flash"), {**NOUL, "model": "bogus-model"})
    assert reply.status == 200 and reply.headers["server"] == "clef-bridge"
    result = reply.json()["result"]
    assert result["model"] == "clef-flash"
    assert strip_extensions(result) == respond(tiny_model, {**NOUL, "model": "clef-flash"})


@pytest.mark.parametrize("garbage", [b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Here\r\n\r\n",
                                     b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n",
                                     b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"],
                         ids=["bad header", "TLS hello", "long line"])
def test_a_parser_error_is_one_log_line(server, garbage):
    before = counted(server, "unparsed", 400)
    n = len(server.tap.records)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(garbage)
        reply = sock.recv(65536)
    assert reply.split(b" ")[1] == b"400"
    served = '"route":"unparsed"'  # the other new records are access lines of requests that were served

    def unparsed():
        return [r for r in server.tap.records[n:] if r.name != "clef_bridge.access" or served in r.getMessage()]

    wait_until(unparsed, "the parser error's log line")
    [record] = unparsed()
    line = json.loads(record.getMessage())
    assert record.name == "clef_bridge.access" and not record.exc_info
    assert (line["status"], line["route"], line["error_type"]) == (400, "unparsed", "bad_http_request")
    assert counted(server, "unparsed", 400) == before + 1
    assert server.request("GET", "/health").status == 200
