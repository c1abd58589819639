"""The System One API over a real socket: contract, equality with decide(), concurrency, overload."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import time

import aiohttp
import numpy as np
import pytest
from clef_bridge.bridge.server.appstate import SERVED

from .conftest import tiny_spec
from .corpus import varied_requests
from .deciding import respond
from .serverkit import RunningServer, registry_for, slow_loader, strip_extensions, wait_until

pytestmark = pytest.mark.integration

REQUESTS = varied_requests()
NOUL = {"model": "tiny", "state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    path = tmp_path_factory.mktemp("srv") / "models.toml"
    with RunningServer(registry_for(tiny_spec(fx, release_date="2026-10-01", aliases=["clef-flash"]),
                                    path)) as srv:
        yield srv


def test_http_answers_equal_in_process_answers(server, tiny_model):
    for request in REQUESTS:
        reply = server.post(request)
        assert reply.status == 200, reply.body
        assert strip_extensions(reply.json()) == respond(tiny_model, request)


def test_response_extensions_and_headers(server):
    reply = server.post(REQUESTS[0])
    body = reply.json()
    assert reply.headers["content-type"].startswith("application/json")
    assert re.fullmatch(r"[0-9a-f]{32}", reply.headers["x-typesafe-request-id"])
    assert all(k in ("model", "answers", "usage") or k.startswith("x_") for k in body)
    assert isinstance(body["usage"]["input_tokens"], int) and body["usage"]["output_tokens"] == 0
    assert body["x_latency_ms"] > 0
    assert set(body["x_timings"]) == {"queue_ms", "tokenize_ms", "backbone_ms", "head_ms", "total_ms", "reused_tokens"}
    assert "NaN" not in reply.body.decode() and "Infinity" not in reply.body.decode()
    echoed = server.post(NOUL, headers={"x-typesafe-request-id": "abc-123"})
    assert echoed.headers["x-typesafe-request-id"] == "abc-123"
    failed = server.post({"model": "tiny"})
    assert failed.status == 422 and "x-typesafe-request-id" in failed.headers


def test_models_health_ready_openapi(server):
    [model] = server.request("GET", "/v1/models").json()["models"]
    warnings = model.pop("x_warnings")
    assert model == {"name": "tiny", "description": "Clef decision model tiny", "release_date": "2026-10-01",
                     "x_aliases": ["clef-flash", "jev-latest", "jev-preview"], "x_status": "ready", "x_media": []}
    assert [w.split(":")[0] for w in warnings] == ["pair.no_record"]  # the tiny pair has no pairing record
    assert server.request("GET", "/health").json() == {"status": "ok"}
    ready = server.request("GET", "/ready")
    assert ready.status == 200 and ready.json() == {"status": "ready", "models_ready": 1, "models_served": 1}
    spec = server.request("GET", "/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/systemone" in spec["paths"]


def test_unknown_model_is_404_naming_the_served_ones(server):
    reply = server.post({**NOUL, "model": "clef"})
    assert reply.status == 404
    detail = reply.json()["detail"]
    assert detail["error_type"] == "model_not_found"
    assert "'clef'" in detail["message"] and "tiny" in detail["message"] and "jev-latest" in detail["message"]


def test_aliases_and_latest(server):
    for name in ("jev-latest", "jev-preview", "clef-flash", "tiny"):
        reply = server.post({**NOUL, "model": name})
        assert reply.status == 200 and reply.json()["model"] == name


def test_a_request_without_model_gets_the_default_and_a_warning(server, tiny_model):
    """Clients that send no model (or null) get the registry's default, and are told so."""
    named = server.post(REQUESTS[0])
    assert named.status == 200 and "x_warnings" not in named.json()
    for body in ({k: v for k, v in REQUESTS[0].items() if k != "model"}, {**REQUESTS[0], "model": None}):
        reply = server.post(body)
        assert reply.status == 200, reply.body
        answer = reply.json()
        assert answer["model"] == "tiny"  # the default's own name, as if the client had named it
        assert strip_extensions(answer) == respond(tiny_model, {**REQUESTS[0], "model": "tiny"})
        [warning] = answer["x_warnings"]
        assert warning.startswith("request.no_model:") and "'tiny'" in warning and "default" in warning
    for bad, status in (("", 404), ("no-such-model", 404), (7, 422)):  # a name that is wrong stays refused
        assert server.post({**NOUL, "model": bad}).status == status


def test_workers_ai_route(server, tiny_model):
    body = {k: v for k, v in REQUESTS[0].items() if k != "model"}
    reply = server.request("POST", "/accounts/abc123/ai/run/@cf/cloudflare/clef-flash", body)
    assert reply.status == 200
    envelope = reply.json()
    assert envelope["success"] is True and envelope["errors"] == [] and envelope["messages"] == []
    assert strip_extensions(envelope["result"]) == respond(tiny_model, {**body, "model": "clef-flash"})
    # Cloudflare's REST base (https://api.cloudflare.com/client/v4) with only the host changed: the same route
    v4 = server.request("POST", "/client/v4/accounts/abc123/ai/run/@cf/cloudflare/clef-flash", body)
    assert v4.status == 200 and strip_extensions(v4.json()["result"]) == strip_extensions(envelope["result"])
    assert set(v4.json()) == {"result", "success", "errors", "messages"}
    assert server.access_line(lambda line: line["request_id"] == v4.headers["x-typesafe-request-id"])["route"] == \
        "/client/v4/accounts/{account_id}/ai/run/@cf/cloudflare/{model}"
    missing = server.request("POST", "/accounts/abc123/ai/run/@cf/cloudflare/clef", body)
    assert missing.status == 404
    assert missing.json()["success"] is False and missing.json()["errors"][0]["code"] == 404
    bad = server.request("POST", "/accounts/abc123/ai/run/@cf/cloudflare/clef-flash", {"state": 1})
    assert bad.status == 422 and bad.json()["success"] is False
    bogus = server.request("POST", "/accounts/abc123/ai/run/@cf/cloudflare/clef-flash", {**body, "model": "nope"})
    assert bogus.status == 200 and bogus.json()["result"]["model"] == "clef-flash"  # the route names the model
    for method, path in (("POST", "/accounts/abc123/ai/run/@cf/meta/llama"), ("GET", "/accounts/abc123/nothing"),
                         ("GET", "/accounts/abc123/ai/run/@cf/cloudflare/clef-flash"),
                         ("POST", "/client/v4/accounts/abc123/ai/run/@cf/meta/llama"), ("GET", "/client/v4/user"),
                         ("GET", "/client/v4/accounts/abc123/ai/run/@cf/cloudflare/clef-flash")):
        unmatched = server.request(method, path)
        assert unmatched.status in (404, 405)
        assert unmatched.json() == {"result": None, "success": False, "messages": [], "errors": [
            {"message": unmatched.json()["errors"][0]["message"], "code": unmatched.status}]}


def test_compressed_bodies(server, tiny_model):
    from backports import zstd

    raw = json.dumps(REQUESTS[5]).encode()  # the 255-option request
    for encoding, data in (("gzip", gzip.compress(raw)), ("zstd", zstd.compress(raw))):
        reply = server.post(None, raw=data, headers={"Content-Encoding": encoding})
        assert reply.status == 200, (encoding, reply.body)
        assert strip_extensions(reply.json()) == respond(tiny_model, REQUESTS[5])


def test_multipart_images_for_a_model_without_projector(server):
    """The official SDK's multipart body to a text-only model: a 422 that says how to add a projector."""
    from .fixturegen_vision import encoded, picture

    boundary = "xyz"
    request = {**NOUL, "assets": {"<img>": {"type": "image", "part": "asset-0"}}, "state": "see <img>"}
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n{json.dumps(request)}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"asset-0\"; filename=\"a.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + encoded(picture(64, 64), "PNG") + \
        f"\r\n--{boundary}--\r\n".encode()
    reply = server.post(None, raw=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status == 422
    [problem] = reply.json()["detail"]
    assert problem["type"] == "images_not_supported" and "no vision projector" in problem["msg"]
    assert "mmproj" in problem["msg"]


def test_over_length_is_413(fx, tmp_path):
    with RunningServer(registry_for(tiny_spec(fx, max_length=100, n_ctx=512), tmp_path / "m.toml")) as srv:
        reply = srv.post(REQUESTS[21])
        assert reply.status == 413
        detail = reply.json()["detail"]
        assert detail["error_type"] == "context_length_exceeded"
        assert "100" in detail["message"] and re.search(r"needs (at least )?\d{3,} tokens", detail["message"])


def _mixed(i: int) -> dict:
    return REQUESTS[[0, 1, 2, 3, 6, 8, 11, 14, 22, 24][i % 10]]


def _close(a: dict, b: dict, tol: float) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def test_concurrent_clients_are_batched_and_exact(fx, tmp_path, tiny_model):
    alone = {i: respond(tiny_model, _mixed(i)) for i in range(10)}
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml")) as srv:
        async def client(session: aiohttp.ClientSession, c: int) -> list[tuple[int, int, dict]]:
            out = []
            for r in range(10):
                i = (c + r) % 10
                async with session.post(f"{srv.url}/v1/systemone", json=_mixed(i)) as resp:
                    out.append((i, resp.status, await resp.json()))
            return out

        async def main():
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
                return await asyncio.gather(*(client(session, c) for c in range(32)))

        results = [r for rs in asyncio.run(main()) for r in rs]
        assert len(results) == 320
        assert all(status == 200 for _, status, _ in results)
        for i, _, body in results:
            # rounded to 4 decimals on both sides: a 1e-4 tolerance allows one rounding step
            assert _close(strip_extensions(body), alone[i], 1e-4 + 1e-9), i
        sizes = srv.request("GET", "/metrics").body.decode()
        big = [float(v) for le, v in re.findall(r'clef_batch_size_bucket\{le="([0-9.]+)",model="tiny"\} (\S+)',
                                                 sizes) if le == "1.0"]
        runs = srv.metric("clef_backbone_runs_total", model="tiny")
        assert big and runs > 0 and big[0] < runs  # some batches held more than one request
        assert srv.metric("clef_requests_total", route="/v1/systemone", status="200") == 320


def test_overload_gets_429_with_retry_after(fx, tmp_path):
    registry = registry_for(tiny_spec(fx, n_seq_max=1), tmp_path / "m.toml", max_queue=2)
    with RunningServer(registry, slow_loader(0.4)) as srv:
        async def main():
            async with aiohttp.ClientSession() as session:
                async def one(i):  # distinct bodies: identical ones would share one computation
                    async with session.post(f"{srv.url}/v1/systemone", json={**NOUL, "state": f"s{i}"}) as resp:
                        return resp.status, resp.headers.get("Retry-After"), await resp.json()
                return await asyncio.gather(*(one(i) for i in range(10)))

        results = asyncio.run(main())
        statuses = [s for s, _, _ in results]
        assert 200 in statuses and 429 in statuses and all(s in (200, 429) for s in statuses)
        for status, retry_after, body in results:
            if status == 429:
                assert retry_after == "1" and body["detail"]["error_type"] == "overloaded"
        assert srv.request("GET", "/health").status == 200


def test_deadline_gives_503(fx, tmp_path):
    registry = registry_for(tiny_spec(fx), tmp_path / "m.toml", request_timeout_s=0.3)
    with RunningServer(registry, slow_loader(1.0)) as srv:
        reply = srv.post(NOUL)
        assert reply.status == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["detail"]["error_type"] == "timeout"


def test_disconnected_client_is_dropped_from_the_queue(fx, tmp_path):
    registry = registry_for(tiny_spec(fx, n_seq_max=1), tmp_path / "m.toml")
    with RunningServer(registry, slow_loader(0.8)) as srv:
        worker = srv.app[SERVED]["tiny"].worker
        model = worker.model

        async def until(condition, what):
            await asyncio.to_thread(wait_until, condition, what)

        async def main():
            async with aiohttp.ClientSession() as session:
                first = asyncio.create_task(session.post(f"{srv.url}/v1/systemone", json=NOUL))
                await until(model.started.is_set, "the first request to occupy the worker")
                # a raw socket that sends another request and hangs up while it waits in the queue
                sock = socket.create_connection(("127.0.0.1", srv.port))
                payload = json.dumps({**NOUL, "state": "hung up"}).encode()  # not NOUL: it would share the first's
                sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await until(lambda: worker.depth == 1, "the second request in the queue")
                sock.close()
                await until(lambda: srv.metric("clef_requests_total", status="499") == 1, "the hang-up's 499")
                assert (await first).status == 200
                # queued behind the dropped request (one per batch): once answered, the worker has passed it
                async with session.post(f"{srv.url}/v1/systemone", json={**NOUL, "state": "third"}) as third:
                    assert third.status == 200

        asyncio.run(main())
        assert model.decided == 2  # the first and the third: the abandoned request never reached the backbone
        assert srv.metric("clef_requests_total", status="499") == 1


def test_health_answers_while_inference_is_busy(fx, tmp_path):
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml"), slow_loader(2.0)) as srv:
        model = srv.app[SERVED]["tiny"].worker.model

        async def main():
            async with aiohttp.ClientSession() as session:
                busy = asyncio.create_task(session.post(f"{srv.url}/v1/systemone", json=NOUL))
                await asyncio.to_thread(wait_until, model.started.is_set, "the 2 s batch to start")
                t0 = time.perf_counter()
                async with session.get(f"{srv.url}/health") as resp:
                    assert resp.status == 200
                elapsed = time.perf_counter() - t0
                assert (await busy).status == 200
                return elapsed

        assert asyncio.run(main()) < 1.0  # answered while the 2 s batch was still running


def test_auth(fx, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# clients\nkey-one\nkey-two\n")
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml", api_keys_file=keys)) as srv:
        missing = srv.post(NOUL)
        assert missing.status == 401 and missing.json()["detail"]["error_type"] == "authentication_error"
        wrong = srv.post(NOUL, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401 and wrong.json()["detail"]["message"] == "invalid API key"
        assert srv.post(NOUL, headers={"Authorization": "Bearer key-two"}).status == 200
        assert srv.request("GET", "/v1/models").status == 401
        assert srv.request("GET", "/health").status == 200
        keys.write_text("key-three\n")
        from clef_bridge.bridge.server.app import KEYS
        srv.app[KEYS].reload()  # what SIGHUP does
        assert srv.post(NOUL, headers={"Authorization": "Bearer key-two"}).status == 401
        assert srv.post(NOUL, headers={"Authorization": "Bearer key-three"}).status == 200
        check_playground_files(srv)  # public where /health is: the files name no model and hold no data


def check_playground_files(srv: RunningServer) -> None:
    """The playground's three files, from the installed package, under headers that keep the page on this origin."""
    from importlib import resources

    folder = resources.files("clef_bridge.bridge.server").joinpath("playground")
    scripts = ("playground.js", "playground-view.js", "playground-code.js")
    files = [("/", "index.html", "text/html"), ("/playground.css", "playground.css", "text/css")] + \
        [(f"/{name}", name, "text/javascript") for name in scripts]
    assert sorted(name for _, name, _ in files) == sorted(p.name for p in folder.iterdir())  # nothing unserved
    for path, name, content_type in files:
        reply = srv.request("GET", path)
        assert reply.status == 200 and reply.body == folder.joinpath(name).read_bytes(), path
        assert reply.headers["content-type"] == f"{content_type}; charset=utf-8"
        csp = reply.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
        assert (reply.headers["x-content-type-options"], reply.headers["x-frame-options"],
                reply.headers["referrer-policy"], reply.headers["cache-control"]) == \
            ("nosniff", "DENY", "no-referrer", "no-cache")
        head = srv.request("HEAD", path)
        assert head.status == 200 and head.body == b""
    page = folder.joinpath("index.html").read_bytes()
    assert page.count(b"<script") == 1 and b'<script type="module" src="playground.js"></script>' in page  # no inline
    assert srv.request("POST", "/").status == 405
    assert srv.request("GET", "/index.htm").status == (401 if srv.registry.server.api_keys_file else 404)


def test_the_playground_is_served(server):
    check_playground_files(server)


def test_auth_off_ignores_authorization(server):
    assert server.post(NOUL, headers={"Authorization": "Bearer whatever"}).status == 200
    assert server.post(NOUL, headers={"Authorization": "garbage"}).status == 200


def test_score_answers_are_consistent(server):
    body = server.post(REQUESTS[6]).json()
    for answer in body["answers"].values():
        p = np.array(list(answer["probabilities"].values()))
        assert abs(p.sum() - 1) < 1e-3
        assert abs(answer["score"] - (np.arange(len(p)) * p).sum()) < 1e-3
