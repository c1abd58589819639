"""The Jev / TypeSafe System One API over aiohttp.

App factory, state in web.AppKeys, models opened and closed in cleanup_ctx, routes in one place,
short handlers, and every domain error mapped to HTTP in one middleware.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from aiohttp import web

from ..head.answer import NonFiniteOutput
from ..head.errors import ClefError, ContextLengthExceeded, RequestInvalid
from .backbone import BackboneError, DecodeFailed
from .httpbody import (
    BadEncoding,
    BodyTooLarge,
    UnsupportedMediaType,
    check_content_type,
    decode,
    parse_json,
    read_capped,
)
from .integrity import ModelRefused, load_checked
from .metrics import Metrics, create_metrics
from .openapi import openapi_spec
from .pipeline import ClefModel, Decision
from .registry import Registry, UnknownModel
from .worker import BatchStats, InferenceWorker, Overloaded, WorkerStopped

log = logging.getLogger("clef_bridge.server")
access_log = logging.getLogger("clef_bridge.access")

REQUEST_ID_HEADER = "x-typesafe-request-id"
INLINE_PARSE_BYTES = 64 * 1024  # bigger bodies are parsed off the event loop


class Unauthorized(ClefError):
    error_type = "authentication_error"


class DeadlineExceeded(ClefError):
    error_type = "timeout"


class BodyTimeout(ClefError):
    error_type = "request_timeout"


# Domain error -> HTTP status, looked up along the class hierarchy; nothing else maps errors.
STATUS: dict[type[BaseException], int] = {
    RequestInvalid: 422, ContextLengthExceeded: 413, BodyTooLarge: 413, UnknownModel: 404, Unauthorized: 401,
    Overloaded: 429, DeadlineExceeded: 503, WorkerStopped: 503, DecodeFailed: 503, NonFiniteOutput: 503,
    BackboneError: 503, BadEncoding: 400, UnsupportedMediaType: 415, BodyTimeout: 408,
}
RETRY_STATUSES = (429, 503)


class ApiKeys:
    """Bearer keys from a file, one per line (# comments allowed); reloadable."""

    def __init__(self, path: Path | None):
        self.path = path
        self.keys: tuple[bytes, ...] = ()
        self.reload()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def reload(self) -> None:
        if self.path is None:
            return
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ClefError(f"api_keys_file {self.path}: cannot read: {exc}") from None
        keys = tuple(k.strip().encode() for k in lines if k.strip() and not k.strip().startswith("#"))
        if not keys:
            raise ClefError(f"{self.path}: no API keys in the file; add one per line or remove api_keys_file")
        self.keys = keys

    def check(self, header: str | None) -> None:
        if not self.enabled:
            return
        if not header or not header.startswith("Bearer ") or not header[7:].strip():
            raise Unauthorized("missing API key: send Authorization: Bearer YOUR_KEY")
        given = header[7:].strip().encode()
        ok = False
        for key in self.keys:  # compare with every key, in constant time each
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise Unauthorized("invalid API key")


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


REGISTRY = web.AppKey("registry", Registry)
WORKERS = web.AppKey("workers", dict)
METRICS = web.AppKey("metrics", Metrics)
KEYS = web.AppKey("keys", ApiKeys)
MODEL_LOADER = web.AppKey("model_loader", object)
INFLIGHT = web.AppKey("inflight", dict)
CACHE = web.AppKey("cache", OrderedDict)
INFO = web.RequestKey("clef_info", RequestLog)


# --- responses -------------------------------------------------------------------------------

def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


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


# --- middleware ------------------------------------------------------------------------------

@web.middleware
async def context_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Request id, domain errors -> HTTP, one access-log line and the request metrics."""
    info = RequestLog(id=request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex)
    request[INFO] = info
    resource = request.match_info.route.resource
    info.route = resource.canonical if resource is not None else "unmatched"
    workers_ai = request.match_info.route.name == "workers_ai"
    start = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # aiohttp's own: 404 unknown route, 405 method
        info.error_type = exc.reason.lower().replace(" ", "_")
        body = {"detail": {"error_type": info.error_type, "message": exc.text or exc.reason}}
        response = json_response(body, exc.status)
    except asyncio.CancelledError:
        info.status, info.error_type = 499, "client_closed_request"
        _finish(request, info, start)
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
    _finish(request, info, start)
    return response


def _finish(request: web.Request, info: RequestLog, start: float) -> None:
    info.timings.setdefault("total_ms", round((time.perf_counter() - start) * 1e3, 3))
    request.app[METRICS].requests.labels(info.route, info.model, str(info.status)).inc()
    line = {"request_id": info.id, "method": request.method, "route": info.route, "model": info.model,
            "status": info.status, "input_tokens": info.input_tokens, "batch_size": info.batch_size,
            **info.timings}
    if info.error_type:
        line["error_type"] = info.error_type
    access_log.info(orjson.dumps(line).decode())


PUBLIC = ("/health", "/ready", "/metrics", "/openapi.json")


@web.middleware
async def auth_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    if request.path not in PUBLIC:
        request.app[KEYS].check(request.headers.get("Authorization"))
    return await handler(request)


# --- the decision path -------------------------------------------------------------------------

async def read_json(request: web.Request) -> Any:
    server = request.app[REGISTRY].server
    limit = server.max_body_bytes
    check_content_type(request.content_type if request.body_exists else "")
    try:  # a client trickling its body is cut off; it never reaches a worker
        raw = await asyncio.wait_for(read_capped(request, limit), server.body_timeout_s)
    except asyncio.TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {server.body_timeout_s:g} s "
                          "(body_timeout_s)") from None
    data = decode(raw, request.headers.get("Content-Encoding", ""), limit)
    if len(data) <= INLINE_PARSE_BYTES:
        return parse_json(data)
    return await asyncio.get_running_loop().run_in_executor(None, parse_json, data)


@dataclass(eq=False)
class Shared:
    """One computation that identical in-flight requests wait on together."""

    job: Any
    waiters: int = 0


def _key(model: str, body: Any) -> tuple[str, bytes] | None:
    try:
        return model, orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return None


def _submit(app: web.Application, worker: InferenceWorker, key: tuple[str, bytes] | None, body: Any) -> Shared:
    """The computation for this body: a cached one, one in flight, or a new job (clients retry on timeouts)."""
    inflight, cache, metrics = app[INFLIGHT], app[CACHE], app[METRICS]
    if key is not None and key in cache:
        cache.move_to_end(key)
        metrics.coalesced.labels(worker.name, "cache").inc()
        done = asyncio.get_running_loop().create_future()
        done.set_result(cache[key])
        return Shared(SimpleNamespace(future=done, queue_s=0.0, cancelled=False))
    if key is not None and key in inflight:
        metrics.coalesced.labels(worker.name, "in_flight").inc()
        return inflight[key]
    shared = Shared(worker.submit(body))
    if key is not None:
        inflight[key] = shared
        size = app[REGISTRY].server.cache_size

        def finished(future: asyncio.Future) -> None:
            inflight.pop(key, None)
            if size and not future.cancelled() and future.exception() is None:
                cache[key] = future.result()
                while len(cache) > size:
                    cache.popitem(last=False)

        shared.job.future.add_done_callback(finished)
    return shared


async def decide(request: web.Request, body: Any, model_name: Any) -> Decision:
    """Queue a body on its model's worker and wait, within the deadline, for the decision."""
    info = request[INFO]
    if not isinstance(body, dict) or not isinstance(model_name, str):
        from ..head.schema import parse_request  # reports every problem of the body at once
        parse_request(body)
    spec = request.app[REGISTRY].resolve(model_name)
    info.model = spec.name
    worker: InferenceWorker = request.app[WORKERS][spec.name]
    shared = _submit(request.app, worker, _key(spec.name, body), body)
    shared.waiters += 1
    request.app[METRICS].queue_depth.labels(spec.name).set(worker.depth)
    timeout = request.app[REGISTRY].server.request_timeout_s
    job = shared.job
    try:
        decision: Decision = await asyncio.wait_for(asyncio.shield(job.future), timeout)
    except asyncio.TimeoutError:
        raise DeadlineExceeded(f"no answer within {timeout:g} s (request_timeout_s); the server is busy, "
                               "retry later") from None
    finally:
        shared.waiters -= 1
        if shared.waiters == 0 and not job.future.done():
            job.cancelled = True  # nobody waits any more: the worker skips it if it has not started
    t = decision.timings
    info.input_tokens, info.batch_size = decision.input_tokens, t.batch_size
    info.timings = {"queue_ms": job.queue_s * 1e3, "tokenize_ms": t.tokenize * 1e3,
                    "backbone_ms": t.backbone * 1e3, "head_ms": t.head * 1e3}
    info.timings = {k: round(v, 3) for k, v in info.timings.items()}
    metrics = request.app[METRICS]
    for stage, seconds in (("queue", job.queue_s), ("tokenize", t.tokenize), ("backbone", t.backbone),
                           ("head", t.head)):
        metrics.latency.labels(spec.name, stage).observe(seconds)
    metrics.tokens.labels(spec.name).inc(decision.input_tokens)
    return decision


def with_extensions(decision: Decision, info: RequestLog, start: float) -> dict[str, Any]:
    total_ms = round((time.perf_counter() - start) * 1e3, 3)
    info.timings["total_ms"] = total_ms
    return {**decision.response, "x_latency_ms": total_ms, "x_timings": dict(info.timings)}


async def systemone_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_json(request)
    decision = await decide(request, body, body.get("model") if isinstance(body, dict) else None)
    response = with_extensions(decision, request[INFO], start)
    request.app[METRICS].latency.labels(request[INFO].model, "total").observe(response["x_latency_ms"] / 1e3)
    return json_response(response)


async def workers_ai_handler(request: web.Request) -> web.Response:
    """Cloudflare's Workers AI route: the model comes from the path, the answer in its envelope."""
    start = time.perf_counter()
    body = await read_json(request)
    model = request.match_info["model"]
    if isinstance(body, dict):
        body = {**body, "model": body.get("model", model)}
    decision = await decide(request, body, model)
    response = with_extensions(decision, request[INFO], start)
    request.app[METRICS].latency.labels(request[INFO].model, "total").observe(response["x_latency_ms"] / 1e3)
    return json_response({"success": True, "result": response})


# --- the rest of the API ----------------------------------------------------------------------

async def models_handler(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    models = []
    for spec in registry.models.values():
        released = spec.release_date or date.fromtimestamp(spec.gguf.stat().st_mtime).isoformat()
        entry = {"name": spec.name, "description": spec.description or f"Clef decision model {spec.name}",
                 "release_date": released, "x_aliases": list(spec.aliases)}
        worker = request.app[WORKERS].get(spec.name)
        if worker is not None and worker.model.warnings:
            entry["x_warnings"] = list(worker.model.warnings)
        if spec.name == registry.default:
            entry["x_aliases"].append("jev-latest")
        models.append(entry)
    return json_response({"models": models})


async def health_handler(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready_handler(request: web.Request) -> web.Response:
    workers = request.app[WORKERS]
    state = {name: ("ready" if w.alive else "down") for name, w in workers.items()}
    ok = bool(workers) and all(w.alive for w in workers.values())
    return json_response({"status": "ready" if ok else "not_ready", "models": state}, 200 if ok else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    for name, worker in request.app[WORKERS].items():
        metrics.queue_depth.labels(name).set(worker.depth)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


async def openapi_handler(request: web.Request) -> web.Response:
    return json_response(openapi_spec(request.app[REGISTRY]))


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/systemone", systemone_handler, name="systemone")
    app.router.add_get("/v1/models", models_handler, name="models")
    app.router.add_post("/accounts/{account_id}/ai/run/@cf/cloudflare/{model}", workers_ai_handler, name="workers_ai")
    app.router.add_get("/health", health_handler, name="health")
    app.router.add_get("/ready", ready_handler, name="ready")
    app.router.add_get("/metrics", metrics_handler, name="metrics")
    app.router.add_get("/openapi.json", openapi_handler, name="openapi")


# --- resources ---------------------------------------------------------------------------------

def load_models(registry: Registry) -> dict[str, ClefModel]:
    """Every model of the registry, each checked (integrity.load_checked), or an error naming the one that failed."""
    models: dict[str, ClefModel] = {}
    try:
        for name, spec in registry.models.items():
            log.info("loading model %s: %s + %s", name, spec.gguf, spec.head)
            try:
                models[name] = load_checked(spec, registry.server.limits)
            except ModelRefused:
                raise
            except ClefError as exc:
                raise ModelLoadError(name, exc) from exc
            for warning in models[name].warnings:
                log.warning("model %s is served with a warning: %s", name, warning)
    except BaseException:
        for model in models.values():
            model.close()
        raise
    return models


class ModelLoadError(ClefError):
    error_type = "model_load_error"

    def __init__(self, name: str, cause: BaseException):
        self.name, self.cause = name, cause
        super().__init__(f"model {name!r} failed to load: {cause}")


async def workers_ctx(app: web.Application) -> AsyncIterator[None]:
    loader: Callable[[Registry], dict[str, ClefModel]] = app[MODEL_LOADER]
    models = await asyncio.get_running_loop().run_in_executor(None, loader, app[REGISTRY])
    metrics = app[METRICS]

    def on_batch(name: str) -> Callable[[BatchStats], None]:
        def record(stats: BatchStats) -> None:
            metrics.batch_size.labels(name).observe(stats.size)
            metrics.backbone_runs.labels(name).inc()
        return record

    workers = {name: InferenceWorker(model, app[REGISTRY].server.max_queue, on_batch(name))
               for name, model in models.items()}
    for worker in workers.values():
        worker.start()
    app[WORKERS].update(workers)
    _install_sighup(app)
    yield
    for worker in workers.values():
        await asyncio.get_running_loop().run_in_executor(None, worker.stop)
    for model in models.values():
        model.close()


def _install_sighup(app: web.Application) -> None:
    keys = app[KEYS]
    if not keys.enabled:
        return

    def reload() -> None:
        try:
            keys.reload()
            log.info("reloaded %d API keys from %s", len(keys.keys), keys.path)
        except (OSError, ClefError) as exc:
            log.error("keeping the old API keys: %s", exc)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no SIGHUP
        log.debug("SIGHUP key reload is not available in this thread")


RUNNER_OPTIONS = {"handler_cancellation": True, "access_log": None,
                  "auto_decompress": False}  # read_json decodes bodies itself, with the size cap


def connection_options(registry: Registry) -> dict[str, float]:
    # aiohttp closes a connection that has not completed a request within keepalive_timeout: that is
    # what cuts off a client trickling its headers, and idle keep-alive connections after as long
    return {"keepalive_timeout": registry.server.body_timeout_s}


def serve(registry: Registry, host: str, port: int) -> None:
    """Run the server until SIGINT/SIGTERM; in-flight requests finish before the exit."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if host not in ("127.0.0.1", "localhost", "::1") and not registry.server.api_keys_file:
        log.warning("WARNING: binding %s without API keys: anyone who can reach this address can run decisions "
                    "on your hardware and read your model list; set api_keys_file in models.toml [server], or "
                    "bind 127.0.0.1", host)
    app = create_app(registry)
    names = ", ".join(registry.models)
    auth = "on" if registry.server.api_keys_file else "off"
    web.run_app(app, host=host, port=port, **RUNNER_OPTIONS, **connection_options(registry),
                shutdown_timeout=registry.server.request_timeout_s,
                print=lambda _: log.info("clef-bridge serving %s on http://%s:%d (auth %s)", names, host, port, auth))


def create_app(registry: Registry, loader: Callable[[Registry], dict[str, ClefModel]] = load_models) -> web.Application:
    app = web.Application(middlewares=[context_middleware, auth_middleware],
                          client_max_size=registry.server.max_body_bytes)
    app[REGISTRY] = registry
    app[METRICS] = create_metrics()
    app[KEYS] = ApiKeys(registry.server.api_keys_file)
    app[MODEL_LOADER] = loader
    app[WORKERS] = {}
    app[INFLIGHT] = {}
    app[CACHE] = OrderedDict()
    app.cleanup_ctx.append(workers_ctx)
    setup_routes(app)
    return app
