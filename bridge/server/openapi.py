"""The OpenAPI 3.1 description served at /openapi.json."""

from __future__ import annotations

from typing import Any

from ...head.declaration import json_schema
from ..catalogue.media import READABLE
from ..config.registry import Registry, ServerSpec
from .doors import openapi_paths as door_paths
from .context import OTHER_ERROR, VALIDATION_ERROR
from .doors import systemone
from .pages import FILES as PLAYGROUND_FILES
from .routes import PATHS

PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}


def _schemas(names: list[str], server: ServerSpec) -> dict[str, Any]:
    """The components; every limit is the one in force (models.toml's [server] table, else its default). The
    requests' and the Jev errors' are written from their declarations (SystemOneRequest, Question, Asset: what the
    validation checks; ValidationError, Error: what jev_error writes)."""
    declared: dict[str, Any] = {}
    for each in (systemone.declaration(server, names), VALIDATION_ERROR, OTHER_ERROR):
        json_schema(each, declared)
    return {
        **declared,
        "NoulAnswer": {"type": "object", "required": ["type", "noul"],
                       "properties": {"type": {"const": "noul"}, "noul": PROBABILITY}},
        "ChoiceAnswer": {"type": "object", "required": ["type", "choice", "confidence", "probabilities"],
                         "properties": {"type": {"const": "choice"}, "choice": {"type": "string"},
                                        "confidence": PROBABILITY,
                                        "probabilities": {"type": "object", "additionalProperties": PROBABILITY}}},
        "ScoreAnswer": {"type": "object", "required": ["type", "score", "confidence", "legend", "probabilities"],
                        "properties": {"type": {"const": "score"}, "score": {"type": "number", "minimum": 0},
                                       "confidence": PROBABILITY, "legend": {"type": "object"},
                                       "probabilities": {"type": "object", "additionalProperties": PROBABILITY}}},
        "SystemOneResponse": {
            "type": "object", "required": ["model", "answers", "usage"],
            "properties": {
                "model": {"type": "string"},
                "answers": {"type": "object", "additionalProperties": {"oneOf": [
                    {"$ref": "#/components/schemas/NoulAnswer"}, {"$ref": "#/components/schemas/ChoiceAnswer"},
                    {"$ref": "#/components/schemas/ScoreAnswer"}]}},
                "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                          "properties": {"input_tokens": {"type": "integer", "minimum": 0},
                                         "output_tokens": {"type": "integer", "minimum": 0}}},
                "x_latency_ms": {"type": "number"},
                "x_timings": {"type": "object", "additionalProperties": {"type": "number"}},
                "x_warnings": {"type": "array", "items": {"type": "string"},
                               "description": "what the server chose for the request (the default model, say) and what "
                                              "makes an answer doubtful: the built-in demo's random weights (with the "
                                              "header X-Clef-Demo: random-weights)"},
            },
        },
        "ModelList": {
            "type": "object", "required": ["models"],
            "properties": {"models": {"type": "array", "items": {
                "type": "object", "required": ["name", "description", "release_date"],
                "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                               "release_date": {"type": "string", "format": "date"},
                               "x_aliases": {"type": "array", "items": {"type": "string"}},
                               "x_status": {"enum": ["ready", "down"]},
                               "x_media": {"type": "array", "items": {"enum": list(READABLE)},
                                           "description": "what the model reads beside text"},
                               "x_lora": {"type": "object", "properties": {"adapter": {"type": "string"},
                                                                           "scale": {"type": "number"}},
                                          "description": "the LoRA adapter it runs over its GGUF (models.toml "
                                                         "`lora`, `lora_scale`); absent: none"},
                               "x_backbone_shared_with": {"type": "array", "items": {"type": "string"},
                                                          "description": "the other models served by the same "
                                                                         "loaded backbone (one GGUF in memory); "
                                                                         "absent: none"},
                               "x_warnings": {"type": "array", "items": {"type": "string"},
                                              "description": "what to know before any answer: the built-in "
                                                             "demo's random weights, its load's warnings"}}}}},
        },
    }


def _errors(*statuses: int) -> dict[str, Any]:
    out = {}
    for status in statuses:
        schema = "ValidationError" if status == 422 else "Error"
        out[str(status)] = {"description": f"error {status}",
                            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}
    return out


def openapi_spec(registry: Registry, names: dict[str, str]) -> dict[str, Any]:
    """The API description; with auth on it is public, so it names no served model (GET /v1/models does,
    with a key), and the routes that need one carry `security`."""
    security = [{"bearer": []}] if registry.server.api_keys_file else []
    return {
        "openapi": "3.1.0",
        "info": {"title": "clef-bridge", "version": "0.1.0",
                 "description": "Jev / TypeSafe System One API for self-hosted Clef decision models"},
        "paths": {
            **door_paths(security, registry.server),
            PATHS["models"]: {"get": {
                "operationId": "models", "security": security,
                "parameters": [{"name": "shape", "in": "query", "required": False,
                                "schema": {"enum": ["jev", "openai"]},
                                "description": "the body's shape; absent: OpenAI's list for OpenAI's SDKs (their "
                                               "X-Stainless-Lang header or User-Agent OpenAI/...), else Jev's"}],
                "responses": {
                    "200": {"description": "served models: Jev's shape, or OpenAI's (object list, data: one entry "
                                           "per model with id, created, owned_by, architecture.output_modalities "
                                           "[\"decisions\"] and the same x_ fields)",
                            "content": {"application/json": {"schema": {"oneOf": [
                                {"$ref": "#/components/schemas/ModelList"},
                                {"type": "object", "required": ["object", "data"],
                                 "properties": {"object": {"const": "list"}, "data": {"type": "array"}}}]}}}},
                    **_errors(401, 422)}}},
            PATHS["health"]: {"get": {"operationId": "health", "responses": {"200": {"description": "alive"}}}},
            PATHS["ready"]: {"get": {"operationId": "ready", "responses": {"200": {"description": "every model loaded"},
                                                                     "503": {"description": "not ready"}}}},
            PATHS["metrics"]: {"get": {"operationId": "metrics", "security": security, "responses": {
                "200": {"description": "Prometheus text format (labels name the models)",
                        "content": {"text/plain": {}}}, **_errors(401)}}},
            **{PATHS[name]: {"get": {"operationId": name, "responses": {"200": {
                "description": f"the playground: {file}", "content": {media: {}}}}}}
               for name, (file, media) in PLAYGROUND_FILES.items()},
        },
        "components": {
            "schemas": _schemas([] if registry.server.api_keys_file else list(names), registry.server),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
