"""The server's routes as data: method, path, name and whether a route is public under auth. The app
binds a handler to each name; auth, the middleware and the OpenAPI description read paths from here."""

from __future__ import annotations

from dataclasses import dataclass

UNMATCHED = "unmatched"
WORKERS_AI_PREFIX = "/accounts/"  # Cloudflare's routes, matched or not, answer in the Workers AI envelope


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    public: bool = False  # answered without an API key when auth is on (names no model)


ROUTES = (
    Route("POST", "/v1/systemone", "systemone"),
    Route("GET", "/v1/models", "models"),
    Route("POST", WORKERS_AI_PREFIX + "{account_id}/ai/run/@cf/cloudflare/{model}", "workers_ai"),
    Route("GET", "/health", "health", public=True),
    Route("GET", "/ready", "ready", public=True),
    Route("GET", "/metrics", "metrics"),  # labels carry model names, so it needs a key like /v1/models
    Route("GET", "/openapi.json", "openapi", public=True),
    Route("*", "/{path:.*}", UNMATCHED),  # last: the router tries it after every other
)
PATHS = {r.name: r.path for r in ROUTES}
PUBLIC = frozenset(r.path for r in ROUTES if r.public)
