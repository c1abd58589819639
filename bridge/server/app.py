"""The Jev / TypeSafe System One API over aiohttp.

App factory, state in typed web.AppKeys (appstate.py), models opened and closed in cleanup_ctx,
routes in one place, short handlers; errors become HTTP in one middleware (middleware.py), keys are
checked by auth.py, and identical requests share one computation (coalesce.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import date
from typing import Any, AsyncIterator

from aiohttp import hdrs, web

from ...head.errors import Category, ClefError
from ...head.schema import is_unicode, parse_request
from ..model.clef_model import Decision
from ..demo.builtins import REAL_RELEASES
from ..config.integrity import ModelRefused
from ..model.loading import Loaded, load_checked
from ..config.registry import ModelSpec, Registry, name_table, resolve
from ..model.worker import BatchStats, InferenceWorker
from . import workers_ai
from .appstate import COALESCER, KEYS, LOADER, METRICS, NAMES, PLAYGROUND, REGISTRY, SERVED, Loader, Served
from .assets import body_limit, check_media, decode_audio_for, decode_for, find_images
from .auth import ApiKeys, auth_middleware, install_sighup
from .body import INLINE_BYTES, BodyTooLarge, check_content_type, decode, header, media_type, parse_json, read_capped
from .coalesce import Coalescer
from .middleware import (
    INFO,
    BodyTimeout,
    DeadlineExceeded,
    ProtocolLog,
    context_middleware,
    json_response,
    workers_ai_envelope,
)
from .multipart import RequestBody, is_form, parse_body
from .openapi import openapi_spec
from .pages import FILES as PLAYGROUND_FILES
from .pages import PAGE_HEADERS, load_playground
from .prometheus import Metrics, PrefixCacheCollector, create_metrics
from .routes import ROUTES, UNMATCHED
from .workers_ai import HostedOptions

log = logging.getLogger("clef_bridge.server")


# --- the decision path -------------------------------------------------------------------------

async def read_json(request: web.Request, cap: int | None = None) -> RequestBody:
    """The body: JSON, or multipart/form-data (a `request` part and media parts), capped for text and media;
    cap: a route's own lower ceiling (Workers AI's 13 MiB)."""
    server = request.app[REGISTRY].server
    models = [served.worker.model for served in request.app[SERVED].values()]
    takes_images = any(model.projector is not None for model in models)
    takes_audio = any(model.takes_audio for model in models)
    limit = body_limit(server.max_body_bytes, server.images, takes_images, server.audio if takes_audio else None)
    capped = cap is not None and cap < limit
    content_type = media_type(request) if request.body_exists else ""
    form = (header(request, hdrs.CONTENT_TYPE) or "") if is_form(content_type) else ""
    if not form:
        check_content_type(content_type)
    try:
        return await _read(request, cap if capped else limit, form)
    except BodyTooLarge:
        if not capped:
            raise
        raise BodyTooLarge(f"the request body exceeds {cap} bytes, the most Workers AI takes; POST /v1/systemone "
                           f"takes up to {limit} bytes here") from None


async def _read(request: web.Request, limit: int, form: str) -> RequestBody:
    server = request.app[REGISTRY].server
    try:  # a client trickling its body is cut off; it never reaches a worker
        raw = await asyncio.wait_for(read_capped(request, limit), server.body_timeout_s)
    except asyncio.TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {server.body_timeout_s:g} s "
                          "(body_timeout_s)") from None
    encoding = header(request, hdrs.CONTENT_ENCODING) or ""
    if not form and len(raw) <= INLINE_BYTES and encoding in ("", "identity"):
        return RequestBody(parse_json(raw), None, len(raw))
    return await asyncio.get_running_loop().run_in_executor(None, lambda: parse_body(decode(raw, encoding, limit),
                                                                                      form))


async def decide(request: web.Request, body: RequestBody, model_name: Any, hosted: HostedOptions | None = None
                 ) -> Decision:
    """Queue a body on its model's worker (media decoded first) and wait, within the deadline, for the decision;
    hosted: a Workers AI request's options, its body held to the hosted limits."""
    info = request[INFO]
    server = request.app[REGISTRY].server
    media = await find_images(body, server.max_body_bytes, server.images, server.limits, server.audio)
    if hosted is not None:
        workers_ai.check(media.body, server.limits)
    if not isinstance(media.body, dict) or not isinstance(model_name, str) or not is_unicode(model_name):
        parse_request(media.body)  # reports every problem of the body at once
    served = request.app[SERVED][resolve(request.app[NAMES], model_name)]
    info.model = served.spec.name
    check_media(served.worker.model, media)  # media the model cannot take: 422 before any work
    served.worker.check_image_room(bool(media.images or media.audio))  # a full queue refuses before decoding
    t0 = time.perf_counter()
    pixels = await decode_for(served.worker.model, media)
    t1 = time.perf_counter()
    samples = await decode_audio_for(served.worker.model, media, server.audio)
    images_s, audio_s = t1 - t0, time.perf_counter() - t1
    shared = request.app[COALESCER].submit(served.worker, media.body, pixels, media.digests, audio=samples,
                                           reject_if_busy=hosted is not None and hosted.reject_if_busy)
    metrics = request.app[METRICS]
    metrics.queue_depth.labels(served.spec.name).set(served.worker.depth)
    timeout = request.app[REGISTRY].server.request_timeout_s
    try:
        decision: Decision = await asyncio.wait_for(asyncio.shield(shared.future), timeout)
    except asyncio.TimeoutError:
        raise DeadlineExceeded(f"no answer within {timeout:g} s (request_timeout_s); the server is busy, "
                               "retry later") from None
    finally:
        shared.leave()
    t = decision.timings
    info.input_tokens, info.batch_size = decision.input_tokens, t.batch_size
    stages = {"queue": shared.queue_s, "tokenize": t.tokenize, "backbone": t.backbone, "head": t.head}
    if media.images:
        stages.update(images=images_s, vision=t.vision)  # Pillow decoding here, the vision tower in the worker
    if media.audio:
        stages.update(audio=audio_s)  # PyAV decoding and resampling here
    info.timings = {f"{stage}_ms": round(seconds * 1e3, 3) for stage, seconds in stages.items()}
    info.timings["reused_tokens"] = t.reused_tokens  # prompt tokens restored from the prefix cache
    for stage, seconds in stages.items():
        metrics.latency.labels(served.spec.name, stage).observe(seconds)
    metrics.tokens.labels(served.spec.name).inc(decision.input_tokens)
    return decision


def no_model_warning(default: str) -> str:
    return (f"request.no_model: the request names no model, so the default model {default!r} answered (models.toml "
            "`default`); send \"model\" to choose one")


# every answer of the built-in demo says what the banner says: its weights are random
DEMO_HEADER, DEMO_HEADER_VALUE = "X-Clef-Demo", "random-weights"
DEMO_WARNING = ("demo: the built-in demo model has RANDOM weights, this answer is meaningless; serve a real model "
                "(clef-bridge pull {release} writes its models.toml entry)")


async def answer(request: web.Request, path_model: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Both decision routes: read, decide; the response with its x_ extensions, and its extra headers."""
    start = time.perf_counter()
    hosted = path_model is not None
    body = await read_json(request, workers_ai.MAX_BODY_BYTES if hosted else None)
    data, options, warnings = body.data, HostedOptions() if hosted else None, []
    if hosted and isinstance(data, dict):  # Workers AI: the route names the model, options say how to wait
        options, data = workers_ai.take_options(data)
        data["model"] = path_model
    elif isinstance(data, dict) and data.get("model") is None:  # clients that leave it out get the default
        data = {**data, "model": request.app[REGISTRY].default}
        warnings.append(no_model_warning(data["model"]))
    body = dataclasses.replace(body, data=data)
    model = data.get("model") if isinstance(data, dict) else None
    decision = await decide(request, body, model, options)
    info = request[INFO]
    total_ms = round((time.perf_counter() - start) * 1e3, 3)
    info.timings["total_ms"] = total_ms
    request.app[METRICS].latency.labels(info.model, "total").observe(total_ms / 1e3)
    extensions: dict[str, Any] = {"x_latency_ms": total_ms, "x_timings": dict(info.timings)}
    headers = {}
    builtin = request.app[SERVED][info.model].spec.builtin
    if builtin:
        warnings.append(DEMO_WARNING.format(release=REAL_RELEASES[builtin]))
        headers[DEMO_HEADER] = DEMO_HEADER_VALUE
    if warnings:
        extensions["x_warnings"] = warnings
    return {**decision.response, **extensions}, headers


async def systemone_handler(request: web.Request) -> web.Response:
    response, headers = await answer(request, None)
    return json_response(response, headers=headers)


async def workers_ai_handler(request: web.Request) -> web.Response:
    """Cloudflare's Workers AI routes: the model comes from the path, the answer in its envelope."""
    response, headers = await answer(request, request.match_info["model"])
    return json_response(workers_ai_envelope(response), headers=headers)


# --- the rest of the API ----------------------------------------------------------------------

async def models_handler(request: web.Request) -> web.Response:
    names = request.app[NAMES]
    models = []
    for name, served in request.app[SERVED].items():
        spec = served.spec
        entry: dict[str, Any] = {
            "name": name, "description": spec.description or f"Clef decision model {name}",
            "release_date": served.release_date, "x_aliases": [n for n, m in names.items() if m == name and n != name],
            "x_status": "ready" if served.worker.alive else "down",
            "x_media": list(served.worker.model.media)}  # what the model reads beside text (the playground asks)
        if served.warnings:
            entry["x_warnings"] = list(served.warnings)
        models.append(entry)
    return json_response({"models": models})


async def health_handler(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready_handler(request: web.Request) -> web.Response:
    """Counts only: /ready is public under auth, and no public route names a model (/v1/models has x_status)."""
    served = request.app[SERVED]
    up = sum(s.worker.alive for s in served.values())
    ok = bool(served) and up == len(served)
    return json_response({"status": "ready" if ok else "not_ready", "models_ready": up, "models_served": len(served)},
                         200 if ok else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    for name, served in request.app[SERVED].items():
        metrics.queue_depth.labels(name).set(served.worker.depth)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


async def openapi_handler(request: web.Request) -> web.Response:
    return json_response(openapi_spec(request.app[REGISTRY], request.app[NAMES]))


async def playground_handler(request: web.Request) -> web.Response:
    """The playground's files (bridge/server/playground/), read once at start, under their strict headers."""
    page = request.app[PLAYGROUND][request.match_info.route.name]
    return web.Response(body=page.body, content_type=page.content_type, charset="utf-8", headers=PAGE_HEADERS)


async def unmatched_handler(request: web.Request) -> web.Response:
    """Any path no route serves: 404, or 405 with Allow where the path exists under other methods.

    A route of ours rather than aiohttp's system route, so that every request takes our path (our
    Expect handling above all: aiohttp's own answers a non-UTF-8 Expect with a 500).
    """
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not request.match_info.route.resource:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


async def defer_expect(request: web.Request) -> None:
    """Expect: 100-continue is answered by body.read_capped, after auth and the size check, so a
    client announcing 10 MB gets its 413 (or 401) at once instead of an invitation to send them."""


HANDLERS = {"systemone": systemone_handler, "models": models_handler, "workers_ai": workers_ai_handler,
            "workers_ai_v4": workers_ai_handler, "health": health_handler, "ready": ready_handler,
            "metrics": metrics_handler, "openapi": openapi_handler, UNMATCHED: unmatched_handler,
            **{name: playground_handler for name in PLAYGROUND_FILES}}


def setup_routes(app: web.Application) -> None:
    for route in ROUTES:
        handler = HANDLERS[route.name]
        if route.method == "GET":
            app.router.add_get(route.path, handler, name=route.name, expect_handler=defer_expect)
        else:
            app.router.add_route(route.method, route.path, handler, name=route.name, expect_handler=defer_expect)


# --- resources ---------------------------------------------------------------------------------

class ModelLoadError(ClefError):
    category = Category.CONFIG
    error_type = "model_load_error"

    def __init__(self, name: str, cause: ClefError):
        self.name, self.cause = name, cause
        super().__init__(f"model {name!r} failed to load: {cause}", fix=cause.fix)


def load_models(registry: Registry) -> dict[str, Loaded]:
    """Every model of the registry, each checked (loading.load_checked), or an error naming the one that failed."""
    models: dict[str, Loaded] = {}
    try:
        for name, spec in registry.models.items():
            # the head is named once checked (the banner): a clef GGUF embeds it, a qwen35 one has it beside it
            log.info("loading model %s: %s%s", name, spec.gguf, f" + {spec.head_path}" if spec.head_path else "")
            try:
                models[name] = load_checked(spec, registry.server.limits)
            except ModelRefused:
                raise
            except ClefError as exc:
                raise ModelLoadError(name, exc) from exc
            for warning in models[name].warnings:
                log.warning("model %s is served with a warning: %s", name, warning)
    except BaseException:
        for loaded in models.values():
            loaded.model.close()
        raise
    return models


def _release_date(spec: ModelSpec) -> str:
    return spec.release_date or date.fromtimestamp(spec.gguf.stat().st_mtime).isoformat()


async def models_ctx(app: web.Application) -> AsyncIterator[None]:
    registry = app[REGISTRY]
    loaded = await asyncio.get_running_loop().run_in_executor(None, app[LOADER], registry)
    metrics = app[METRICS]

    def on_batch(name: str):
        def record(stats: BatchStats) -> None:
            metrics.batch_size.labels(name).observe(stats.size)
            metrics.backbone_runs.labels(name).inc()
        return record

    for name, item in loaded.items():
        spec = registry.models[name]
        worker = InferenceWorker(item.model, registry.server.max_queue, on_batch(name))
        worker.start()
        app[SERVED][name] = Served(spec, worker, item.warnings, item.model.head.config.hidden_size,
                                   _release_date(spec), item.report.facts, item.report.head_path)
    app[NAMES].update(name_table(registry, {n: s.hidden_size for n, s in app[SERVED].items()},
                                 {n: s.facts.architecture or "" for n, s in app[SERVED].items()}))
    caches = {name: item.model.backbone.prefix_cache for name, item in loaded.items()
              if item.model.backbone.prefix_cache is not None}
    metrics.registry.register(PrefixCacheCollector(lambda: {name: c.stats() for name, c in caches.items()}))
    install_sighup(app[KEYS])
    yield
    for served in app[SERVED].values():
        await asyncio.get_running_loop().run_in_executor(None, served.worker.stop)
    for item in loaded.values():
        item.model.close()


RUNNER_OPTIONS = {"handler_cancellation": True}  # a client that hangs up cancels its request (499)


def handler_args(registry: Registry, metrics: Metrics) -> dict[str, Any]:
    """aiohttp's per-connection options, held by the app so that every runner gets them."""
    return {
        # aiohttp closes a connection that has not completed a request within keepalive_timeout: that is
        # what cuts off a client trickling its headers, and idle keep-alive connections after as long
        "keepalive_timeout": registry.server.body_timeout_s,
        "auto_decompress": False,  # read_json decodes bodies itself, with the size cap
        "access_log": None,  # the middleware writes one line per request
        "logger": ProtocolLog(metrics),  # parser errors: one line each, counted
    }


def banner(app: web.Application, url: str) -> list[str]:
    """What is running, said once at start: every model, its files, its names, its warnings; auth."""
    lines = [f"clef-bridge serving on {url} (auth {'on' if app[KEYS].enabled else 'off'})"]
    for name, served in app[SERVED].items():
        spec, facts = served.spec, served.facts
        others = [n for n, m in app[NAMES].items() if m == name and n != name]
        head = "embedded in the GGUF" if facts.head_source == "embedded" else str(served.head_path or "beside the GGUF")
        lines += [f"  model {name}" + (f" (also answers to {', '.join(others)})" if others else ""),
                  f"    gguf  {spec.gguf} ({facts.architecture}, hidden {facts.embedding_length}, "
                  f"{facts.block_count} layers)",
                  f"    head  {head}"]
        if spec.builtin:
            lines.append("    DEMO MODEL: RANDOM weights, its answers are meaningless; configure a real one with "
                         f"`clef-bridge pull {REAL_RELEASES[spec.builtin]}` and a models.toml")
        lines += [f"    warning: {w}" for w in served.warnings]
    return lines


def serve(registry: Registry, host: str, port: int) -> None:
    """Run the server until SIGINT/SIGTERM; in-flight requests finish before the exit."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if host not in ("127.0.0.1", "localhost", "::1") and not registry.server.api_keys_file:
        log.warning("WARNING: binding %s without API keys: anyone who can reach this address can run decisions "
                    "on your hardware and read your model list; set api_keys_file in models.toml [server], or "
                    "bind 127.0.0.1", host)
    app = create_app(registry)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    web.run_app(app, host=host, port=port, **RUNNER_OPTIONS,
                shutdown_timeout=registry.server.request_timeout_s,
                print=lambda _: log.info("\n".join(banner(app, url))))


def create_app(registry: Registry, loader: Loader = load_models) -> web.Application:
    metrics = create_metrics()
    app = web.Application(middlewares=[context_middleware, auth_middleware(KEYS)],
                          client_max_size=registry.server.max_body_bytes,
                          handler_args=handler_args(registry, metrics))
    app[REGISTRY] = registry
    app[METRICS] = metrics
    app[KEYS] = ApiKeys(registry.server.api_keys_file)
    app[LOADER] = loader
    app[PLAYGROUND] = load_playground()
    app[SERVED] = {}
    app[NAMES] = {}
    app[COALESCER] = Coalescer(registry.server.cache_size,
                               lambda model, source: metrics.coalesced.labels(model, source).inc())
    app.cleanup_ctx.append(models_ctx)
    setup_routes(app)
    return app
