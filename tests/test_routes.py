"""bridge/server/routes.py, the route table's invariants: one name and one (method, path) each, the
catch-all last and shadowing nothing, public routes that name no model, Cloudflare's paths under its prefixes."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp.test_utils import make_mocked_request
from clef_bridge.bridge.server.routes import (
    PATHS,
    PUBLIC,
    ROUTES,
    UNMATCHED,
    WORKERS_AI_BARE,
    WORKERS_AI_PREFIXES,
    WORKERS_AI_ROUTES,
    WORKERS_AI_RUN,
)

from .servertiny import tiny_app

pytestmark = pytest.mark.unit

SAMPLE = {"account_id": "acc", "model": "clef-flash", "path:.*": "no/such/thing"}


def sample_path(path: str) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: SAMPLE[m.group(1)], path)


def test_names_and_method_paths_are_unique():
    assert len({r.name for r in ROUTES}) == len(ROUTES)
    assert len({(r.method, r.path) for r in ROUTES}) == len(ROUTES)
    assert PATHS["systemone"] == "/v1/systemone" and PATHS["openai_decisions"] == "/v1/decisions"


def test_the_catch_all_comes_last():
    assert ROUTES[-1].name == UNMATCHED and ROUTES[-1].method == "*" and not ROUTES[-1].public
    assert [r for r in ROUTES if r.name == UNMATCHED] == [ROUTES[-1]]


def test_each_route_resolves_to_itself_not_to_the_catch_all():
    app = tiny_app()

    async def resolve(method: str, path: str) -> str:
        return (await app.router.resolve(make_mocked_request(method, path, app=app))).route.name

    for route in ROUTES[:-1]:
        assert asyncio.run(resolve(route.method, sample_path(route.path))) == route.name
    assert asyncio.run(resolve("DELETE", "/v1/systemone")) == UNMATCHED


def test_public_routes_are_reads_that_name_no_model():
    # what answers without a key, named: making a route public is a decision this list records
    assert PUBLIC == {"/health", "/ready", "/openapi.json", "/", "/playground.css", "/playground.js",
                      "/playground-view.js", "/playground-code.js"}
    for route in (r for r in ROUTES if r.public):
        assert route.method == "GET" and "{" not in route.path, route
    assert {"/v1/systemone", "/v1/models", "/metrics"}.isdisjoint(PUBLIC)


def test_cloudflares_routes_live_under_its_prefixes_and_nothing_else_does():
    assert WORKERS_AI_ROUTES == {"workers_ai", "workers_ai_v4", "workers_ai_bare"}
    for route in ROUTES:
        under = route.path.startswith(WORKERS_AI_PREFIXES)
        assert under == (route.shape == "workers_ai"), route
        if route.shape == "workers_ai":
            assert route.method == "POST" and not route.public
            assert route.path.endswith(WORKERS_AI_RUN) or route.path == WORKERS_AI_BARE
