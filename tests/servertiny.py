"""A tiny app with the server's middlewares and route table around handlers a test gives, and a request
through it without a socket (aiohttp's mocked request, resolved by the real router): the unit tests of
the middleware, auth and routes use it."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable
from unittest import mock

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from clef_bridge.bridge.config.registry import Registry, ServerSpec
from clef_bridge.bridge.server.appstate import KEYS, METRICS, REGISTRY
from clef_bridge.bridge.server.auth import ApiKeys, auth_middleware
from clef_bridge.bridge.server.middleware import context_middleware
from clef_bridge.bridge.server.prometheus import create_metrics
from clef_bridge.bridge.server.routes import ROUTES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"route": request.match_info.route.name})


def tiny_app(handlers: dict[str, Handler] | None = None, server: ServerSpec = ServerSpec(),
             keys: Path | None = None) -> web.Application:
    """The middlewares in create_app's order; each route answers `ok` unless handlers names another."""
    app = web.Application()
    app[REGISTRY] = Registry(Path("models.toml"), "tiny", {}, server)
    app[METRICS] = create_metrics()
    app[KEYS] = ApiKeys(keys)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, (handlers or {}).get(route.name, ok), name=route.name)
    app.freeze()
    return app


def _transport(closing: bool) -> mock.Mock:
    transport = mock.Mock()
    transport.is_closing.return_value = closing
    transport.get_extra_info.return_value = None
    return transport


async def _call(app: web.Application, method: str, path: str, headers: dict[str, str] | None,
                closing: bool) -> web.StreamResponse:
    request = make_mocked_request(method, path, headers, app=app, transport=_transport(closing))
    match = await app.router.resolve(request)
    match.add_app(app)
    request._match_info = match  # what aiohttp's request handler does before the middlewares run
    auth = auth_middleware(KEYS)
    return await context_middleware(request, lambda r: auth(r, match.handler))


def call(app: web.Application, method: str, path: str, headers: dict[str, str] | None = None,
         closing: bool = False) -> web.StreamResponse:
    """The response the middlewares give (already written to a mocked transport)."""
    return asyncio.run(_call(app, method, path, headers, closing))


def body(response: web.StreamResponse) -> Any:
    return json.loads(response.body)


def access_lines(caplog: Any) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "clef_bridge.access"]


def capture_access(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="clef_bridge.access")
