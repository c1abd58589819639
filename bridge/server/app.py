"""The Jev / TypeSafe System One API over aiohttp.

App factory, state in typed web.AppKeys (appstate.py), models opened and closed in cleanup_ctx,
routes in one place, short handlers; the decision routes are thin adapters (systemone.py, workers_ai.py)
over the decision service (bridge/service); errors become HTTP in one middleware (middleware.py), keys
are checked by auth.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import date, datetime, time, timezone
from typing import Any, AsyncIterator

from aiohttp import web

from ...head.errors import Problem, RequestInvalid
from ..catalogue.releases import REAL_RELEASES, RELEASES
from ..config.registry import ModelSpec, Registry, name_table
from ..llama.adapters import BackboneView
from ..model.worker import BatchStats, InferenceWorker
from ..service.coalesce import Coalescer
from ..service.decision import DecisionService
from ..service.models import head_shadows, load_models
from .appstate import (
    DECISION_LOG,
    KEYS,
    LOADER,
    METRICS,
    NAMES,
    PLAYGROUND,
    REGISTRY,
    SERVED,
    SERVICE,
    SHADOW_TASKS,
    Loader,
    Served,
)
from .auth import ApiKeys, auth_middleware, install_sighup
from .context import EscapedArgs, escaped, json_response
from .decision_log import DecisionLog
from .doors import HANDLERS as DOOR_HANDLERS
from .doors.decisions import demo_warning
from .middleware import ProtocolLog, context_middleware
from .openapi import openapi_spec
from .pages import FILES as PLAYGROUND_FILES
from .pages import PAGE_HEADERS, load_playground
from .prometheus import Metrics, PrefixCacheCollector, create_metrics
from .routes import ROUTES, UNMATCHED

log = logging.getLogger("clef_bridge.server")


def backbone_sharing(spec: ModelSpec, backbone: Any) -> dict[str, Any]:
    """/v1/models' x_lora and x_backbone_shared_with of a model whose backbone is a shared view (else nothing)."""
    if not isinstance(backbone, BackboneView):
        return {}
    out: dict[str, Any] = {}
    if spec.lora is not None:
        out["x_lora"] = {"adapter": spec.lora.name, "scale": spec.lora_scale}
    others = [v.name for v in backbone.shared.views if v is not backbone]
    if others:
        out["x_backbone_shared_with"] = others
    return out


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
        entry |= backbone_sharing(spec, served.worker.model.backbone)
        # a demo says so here too: a client (the playground) warns before its first answer
        warnings = ([demo_warning(spec.builtin)] if spec.builtin else []) + list(served.warnings)
        if warnings:
            entry["x_warnings"] = warnings
        models.append(entry)
    return json_response(openai_model_list(models) if wants_openai_list(request) else {"models": models})


# Which body /v1/models answers: Jev's {"models": [...]} unless the client is one of OpenAI's SDKs (all of them
# Stainless-generated: X-Stainless-Lang on every request, User-Agent "OpenAI/<lang> <version>"), whose
# models.list() reads OpenAI's {"object": "list", "data": [...]}; ?shape= says it outright (curl, other clients).
SHAPES = ("jev", "openai")


def wants_openai_list(request: web.Request) -> bool:
    shape = request.query.get("shape")
    if shape is not None and shape not in SHAPES:
        raise RequestInvalid([Problem(("query", "shape"), f"shape must be one of {', '.join(SHAPES)}, not "
                                      f"{shape[:40]!r}", "value_error")])
    if shape is not None:
        return shape == "openai"
    return "X-Stainless-Lang" in request.headers or request.headers.get("User-Agent", "").startswith("OpenAI/")


def openai_model_list(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Jev's model entries in OpenAI's list shape, each marked as llama-server marks a decision model."""
    return {"object": "list", "data": [{
        "id": m["name"], "object": "model", "owned_by": "clef-bridge",
        "created": int(datetime.combine(date.fromisoformat(m["release_date"]), time(), timezone.utc).timestamp()),
        "architecture": {"input_modalities": ["text", *m["x_media"]], "output_modalities": ["decisions"]},
        "description": m["description"], **{k: v for k, v in m.items() if k.startswith("x_")}} for m in models]}


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


HANDLERS = {**DOOR_HANDLERS, "models": models_handler, "health": health_handler, "ready": ready_handler,
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

    heads = head_shadows(registry, {name: item.model for name, item in loaded.items()})
    for name, item in loaded.items():
        spec = registry.models[name]
        if heads[name]:  # before its worker starts: every checkpoint of its prefix cache carries them
            item.model.keep_hidden_states()
        worker = InferenceWorker(item.model, registry.server.max_queue, on_batch(name),
                                 max_per_tenant=registry.server.tenant_queue)
        worker.start()
        app[SERVICE].workers[name] = worker
        app[SERVED][name] = Served(spec, worker, item.warnings, item.model.head.config.hidden_size,
                                   _release_date(spec), item.report.facts, item.report.head_path, heads[name])
    workers = list(app[SERVICE].workers.values())
    for worker in workers:  # shadow scorings run on idle capacity: no request of this server under way
        worker.busy_elsewhere = functools.partial(_others_busy, worker, workers, app[SERVICE])
    app[NAMES].update(name_table(registry, {n: s.hidden_size for n, s in app[SERVED].items()},
                                 {n: s.facts.architecture or "" for n, s in app[SERVED].items()}))
    caches: dict[str, Any] = {}
    for name, item in loaded.items():
        cache = item.model.backbone.prefix_cache
        if cache is not None and all(c is not cache for c in caches.values()):
            caches[name] = cache  # a backbone shared by several models has one cache: counted once, under the first
    metrics.registry.register(PrefixCacheCollector(lambda: {name: c.stats() for name, c in caches.items()}))
    install_sighup(app[KEYS])
    yield
    for served in app[SERVED].values():
        await asyncio.get_running_loop().run_in_executor(None, served.worker.stop)
    for item in loaded.values():
        item.model.close()


async def decoders_ctx(app: web.Application) -> AsyncIterator[None]:
    """The media decoder processes (bridge/media/decoders.py), forked in the background once the models are loaded."""
    decoders = app[SERVICE].decoders
    decoders.start()
    yield
    decoders.close()


async def decision_log_ctx(app: web.Application) -> AsyncIterator[None]:
    """The decision log's writer thread, where models.toml names one; at shutdown, once the requests in flight are
    answered, it writes the lines still queued and closes the file."""
    writer = app.get(DECISION_LOG)
    if writer is None:
        yield
        return
    writer.start()
    yield
    await asyncio.get_running_loop().run_in_executor(None, writer.close)


def _others_busy(worker: InferenceWorker, workers: list[InferenceWorker], service: DecisionService) -> bool:
    """Whether the server has a request under way (decoded, queued or decided: shadows would take the CPU, or the
    backbone itself, from it), or another model has requests waiting."""
    return service.active > 0 or any(other.depth for other in workers if other is not worker)


async def shadows_ctx(app: web.Application) -> AsyncIterator[None]:
    """Shadow models' scorings still running at shutdown are cancelled before the models stop (nobody waits for
    them: the answers they shadow are sent)."""
    app[SHADOW_TASKS] = set()
    yield
    tasks = list(app[SHADOW_TASKS])
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


RUNNER_OPTIONS = {"handler_cancellation": True}  # a client that hangs up cancels its request (499)


def handler_args(registry: Registry, metrics: Metrics) -> dict[str, Any]:
    """aiohttp's per-connection options, held by the app so that every runner gets them."""
    return {
        # aiohttp closes a connection that has not completed a request within keepalive_timeout: that is
        # what cuts off a client trickling its headers, and idle keep-alive connections after as long
        "keepalive_timeout": registry.server.body_timeout_s,
        "auto_decompress": False,  # decisions.read_body decodes bodies itself, with the size cap
        "access_log": None,  # the middleware writes one line per request
        "logger": ProtocolLog(metrics),  # parser errors: one line each, counted
    }


def banner(app: web.Application, url: str) -> list[str]:
    """What is running, said once at start: every model, its files, its names, its warnings; auth. One line each,
    whatever a path or warning holds."""
    lines = [f"clef-bridge serving on {url} (auth {'on' if app[KEYS].enabled else 'off'})"]
    log_spec = app[REGISTRY].server.decision_log
    if log_spec.path is not None:  # where each decision goes, and whether the states' text with it
        lines.append(f"  decision log {log_spec.path} (rotated at {log_spec.max_mb:g} MB, {log_spec.keep} kept; "
                     f"states {'written' if log_spec.states else 'by sha256 only'})")
    for name, served in app[SERVED].items():
        spec, facts = served.spec, served.facts
        others = [n for n, m in app[NAMES].items() if m == name and n != name]
        head = "embedded in the GGUF" if facts.head_source == "embedded" else str(served.head_path or "beside the GGUF")
        lines += [f"  model {name}" + (f" (also answers to {', '.join(others)})" if others else ""),
                  f"    gguf  {spec.gguf} ({facts.architecture}, hidden {facts.embedding_length}, "
                  f"{facts.block_count} layers)",
                  f"    head  {head}"]
        sharing = backbone_sharing(spec, served.worker.model.backbone)
        if "x_lora" in sharing:
            lines.append(f"    lora  {spec.lora} (scale {spec.lora_scale:g})")
        if "x_backbone_shared_with" in sharing:
            lines.append(f"    ONE loaded backbone shared with {', '.join(sharing['x_backbone_shared_with'])} "
                         "(each batch runs its own model's adapter)")
        if spec.builtin:
            lines.append("    DEMO MODEL: RANDOM weights, its answers are meaningless; configure a real one with "
                         f"`{RELEASES[REAL_RELEASES[spec.builtin]].pull_command}` (docs/serving.md names GGUFs)")
        lines += [f"    warning: {w}" for w in served.warnings]
    return [escaped(line) for line in lines]  # a path or warning with a newline or bidi control stays on its line


def serve(registry: Registry, host: str, port: int) -> None:
    """Run the server until SIGINT/SIGTERM; in-flight requests finish before the exit."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(EscapedArgs())
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
    coalescer = Coalescer(registry.server.cache_size,
                          lambda model, source: metrics.coalesced.labels(model, source).inc())
    app[SERVICE] = DecisionService(registry.server, coalescer, registry.server.request_timeout_s, names=app[NAMES],
                                   on_queued=lambda model, depth: metrics.queue_depth.labels(model).set(depth))
    log_spec = registry.server.decision_log
    if log_spec.path is not None:
        app[DECISION_LOG] = DecisionLog(log_spec, log_spec.path, metrics)
    app.cleanup_ctx.append(decision_log_ctx)  # first, so closed last: every answered decision is in it by then
    app.cleanup_ctx.append(models_ctx)
    app.cleanup_ctx.append(decoders_ctx)  # after the models: the forkserver's imports do not slow their loading
    app.cleanup_ctx.append(shadows_ctx)  # last, so cleaned first: shadow scorings end before the models stop
    setup_routes(app)
    return app
