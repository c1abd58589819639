"""The OpenAPI 3.1 description served at /openapi.json."""

from __future__ import annotations

from typing import Any

from ...head.schema import QUESTION_TYPES
from ..catalogue.media import IMAGE, READABLE
from ..config.registry import LATEST, Registry, ServerSpec
from ..media.kinds import TABLE
from ..media.request import FIELDS, MARKERS
from .doors import openapi_paths as door_paths
from .pages import FILES as PLAYGROUND_FILES
from .routes import PATHS

TEXT = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}, {"type": "null"}]}
PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}


def _inline(kind: str, example: str) -> dict[str, Any]:
    """An `images` or `audio` entry: a data: URL or base64 string, or Workers AI's object."""
    return {"anyOf": [{"type": "string", "examples": [f"data:{example};base64,..."]},
                      {"type": "object", "required": ["base64"],
                       "properties": {"content_type": {"type": "string", "pattern": f"^{kind}/"},
                                      "base64": {"type": "string"}}}]}


def _schemas(names: list[str], server: ServerSpec) -> dict[str, Any]:
    """The components; every limit is the one in force (models.toml's [server] table, else its default)."""
    limits = server.limits
    return {
        "Question": {
            "type": "object", "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": list(QUESTION_TYPES)},
                "instructions": TEXT,
                "criteria": {"description": f"choice: object name -> description (2 to {limits.max_options} options, "
                                            f"max_options); score: array of 2 to {limits.max_levels} levels "
                                            "(max_levels), lowest first; noul: null or {true?, false?}"},
            },
        },
        "SystemOneRequest": {
            "type": "object", "required": ["state", "questions"],
            "properties": {
                "model": {"type": "string", "description": f"a served name, an alias, or {LATEST}; left out (or "
                                                           "null): the default model, said in x_warnings",
                          "examples": names},
                "state": {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}],
                          "description": f"at most {limits.max_state_bytes} bytes rendered (max_state_bytes)"},
                "questions": {"type": "object", "minProperties": 1, "maxProperties": limits.max_questions,
                              "description": "max_questions; the Workers AI routes take fewer (see their 422)",
                              "additionalProperties": {"$ref": "#/components/schemas/Question"}},
                "assets": {"type": "object",
                           "description": f"placeholder -> {' or '.join(d.noun for d in TABLE.values())}; each "
                                          "placeholder inside a string of the state, instructions or criteria reads "
                                          f"{' or '.join(MARKERS[kind].format('N') for kind in TABLE)}",
                           "additionalProperties": {"$ref": "#/components/schemas/Asset"}},
                **{FIELDS[kind]: {"type": "array", "items": _inline(kind, doc.content_type),
                                  "maxItems": server.media_limits[kind].max_count, "description": doc.description}
                   for kind, doc in TABLE.items()},
                "options": {"type": "object", "description": "Workers AI routes only: {rejectIfBusy: true} answers "
                                                            "429 (code 3040) instead of waiting behind other requests",
                            "properties": {"rejectIfBusy": {"type": "boolean"}}},
            },
        },
        "Asset": {
            "type": "object",
            "properties": {"type": {"enum": list(READABLE), "default": IMAGE.name},
                           "format": {"enum": [f for doc in TABLE.values() for f in doc.formats],
                                      "description": "required with data_base64; the bytes decide the real format"},
                           "data_base64": {"type": "string"},
                           "part": {"type": "string", "description": "multipart/form-data: the medium's part name"}},
        },
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
        "ValidationError": {
            "type": "object", "required": ["detail"],
            "properties": {"detail": {"type": "array", "items": {
                "type": "object", "required": ["loc", "msg", "type"],
                "properties": {"loc": {"type": "array", "items": {"anyOf": [{"type": "string"},
                                                                            {"type": "integer"}]}},
                               "msg": {"type": "string"}, "type": {"type": "string"}}}}},
        },
        "Error": {
            "type": "object", "required": ["detail"],
            "properties": {"detail": {"type": "object", "required": ["error_type", "message"],
                                      "properties": {"error_type": {"type": "string"},
                                                     "message": {"type": "string"}}}},
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
            **door_paths(security, _errors),
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
