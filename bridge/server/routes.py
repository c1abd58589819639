"""The server's routes as data: method, path, name and whether a route is public under auth. The app
binds a handler to each name; auth, the middleware and the OpenAPI description read paths from here."""

from __future__ import annotations

from dataclasses import dataclass

UNMATCHED = "unmatched"
JEV_SHAPE, WORKERS_AI_SHAPE, OPENAI_SHAPE = "jev", "workers_ai", "openai"  # the shape of a route's answers, errors
BATCH_SHAPE, AINODE_SHAPE = "laya_batch", "ainode"  # laya-serve's batch route, AINode's /v1/decide
DEQIO_SHAPE = "deqio"  # Deqio's routes: its errors are Jev's (deqio-client reads `detail`)
VERCEL_SHAPE = "vercel"  # Vercel AI Gateway's evaluation-model route: {answers, usage, providerMetadata}, {error}
# Cloudflare's paths, matched or not, answer in the Workers AI envelope: its clients call either the bare
# route or the REST API's, whose base is https://api.cloudflare.com/client/v4 (they change only the host)
WORKERS_AI_PREFIXES = ("/accounts/", "/client/v4/", "/ai/run/")
WORKERS_AI_RUN = "accounts/{account_id}/ai/run/@cf/cloudflare/{model}"
WORKERS_AI_BARE = "/ai/run/@cf/cloudflare/{model}"  # what clients given the server root as their base post to


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    public: bool = False  # answered without an API key when auth is on (names no model)
    shape: str = JEV_SHAPE  # its door's shape (bridge/server/doors/): Cloudflare's routes answer in its envelope


# System One's route under the paths other providers' clients post it to (issue 54): OpenRouter's alpha decisions
# (pydecide, fuzzy-jev and litellm's openrouter provider), Azure AI Foundry's (litellm's azure_ai)
SYSTEMONE_ALIASES = ("/alpha/decisions", "/api/alpha/decisions", "/providers/microsoft/v1/systemone")
# OpenAI's Decisions route under the paths clients given another base post to: pydecide's openai_decisions with the
# server root, litellm's azure provider (Azure OpenAI's v1 path; its key in an api-key header)
OPENAI_ALIASES = ("/decisions", "/openai/v1/decisions")

ROUTES = (
    Route("POST", "/v1/systemone", "systemone"),
    *(Route("POST", path, f"systemone_at{path.replace('/', '_')}") for path in SYSTEMONE_ALIASES),
    Route("GET", "/v1/models", "models"),
    Route("POST", "/" + WORKERS_AI_RUN, "workers_ai", shape=WORKERS_AI_SHAPE),
    Route("POST", "/client/v4/" + WORKERS_AI_RUN, "workers_ai_v4", shape=WORKERS_AI_SHAPE),
    Route("POST", WORKERS_AI_BARE, "workers_ai_bare", shape=WORKERS_AI_SHAPE),
    Route("POST", "/v1/decisions", "openai_decisions", shape=OPENAI_SHAPE),
    *(Route("POST", path, f"openai_decisions_at{path.replace('/', '_')}", shape=OPENAI_SHAPE)
      for path in OPENAI_ALIASES),
    Route("POST", "/v1/systemone/batch", "systemone_batch", shape=BATCH_SHAPE),
    Route("POST", "/v1/decide", "ainode_decide", shape=AINODE_SHAPE),
    # Deqio's routes (deqio-client): one question, several decided jointly, System One without a model
    *(Route("POST", f"/v1/{route}", f"deqio_{route}", shape=DEQIO_SHAPE)
      for route in ("noul", "choice", "decision", "shared", "score", "soam")),
    Route("POST", "/v4/ai/evaluation-model", "vercel_evaluation", shape=VERCEL_SHAPE),
    Route("GET", "/health", "health", public=True),
    Route("GET", "/ready", "ready", public=True),
    Route("GET", "/metrics", "metrics"),  # labels carry model names, so it needs a key like /v1/models
    Route("GET", "/openapi.json", "openapi", public=True),
    # the playground: static files that name no model and hold no data; everything they call needs the key
    Route("GET", "/", "playground", public=True),
    Route("GET", "/playground.css", "playground_css", public=True),
    Route("GET", "/playground.js", "playground_js", public=True),
    Route("GET", "/playground-view.js", "playground_view_js", public=True),
    Route("GET", "/playground-code.js", "playground_code_js", public=True),
    Route("*", "/{path:.*}", UNMATCHED),  # last: the router tries it after every other
)
PATHS = {r.name: r.path for r in ROUTES}
PUBLIC = frozenset(r.path for r in ROUTES if r.public)
SHAPES = {r.name: r.shape for r in ROUTES}
WORKERS_AI_ROUTES = frozenset(r.name for r in ROUTES if r.shape == WORKERS_AI_SHAPE)
# paths no route serves still answer in the shape of the API whose base they are under
SHAPE_PREFIXES = {WORKERS_AI_SHAPE: WORKERS_AI_PREFIXES}
