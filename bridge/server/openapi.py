"""The OpenAPI 3.1 description served at /openapi.json."""

from __future__ import annotations

from typing import Any

from ...head.schema import QUESTION_TYPES
from ..model.registry import LATEST, Registry
from .routes import PATHS

TEXT = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}, {"type": "null"}]}
PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}


def _schemas(names: list[str]) -> dict[str, Any]:
    limits_note = "2 to 255 options"
    return {
        "Question": {
            "type": "object", "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": list(QUESTION_TYPES)},
                "instructions": TEXT,
                "criteria": {"description": f"choice: object name -> description ({limits_note}); score: array of "
                                            "2 to 10 levels, lowest first; noul: null or {true?, false?}"},
            },
        },
        "SystemOneRequest": {
            "type": "object", "required": ["model", "state", "questions"],
            "properties": {
                "model": {"type": "string", "description": f"a served name, an alias, or {LATEST}",
                          "examples": names},
                "state": {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]},
                "questions": {"type": "object", "minProperties": 1,
                              "additionalProperties": {"$ref": "#/components/schemas/Question"}},
                "assets": {"type": "object", "description": "placeholder -> image; each placeholder inside a string "
                                                            "of the state, instructions or criteria reads [image N]",
                           "additionalProperties": {"$ref": "#/components/schemas/Asset"}},
                "images": {"type": "array", "items": {"type": "string"},
                           "description": "data: URLs or base64 (the reference's and Workers AI's shape)"},
            },
        },
        "Asset": {
            "type": "object",
            "properties": {"type": {"const": "image"}, "format": {"enum": ["png", "jpg", "jpeg", "webp"]},
                           "data_base64": {"type": "string"},
                           "part": {"type": "string", "description": "multipart/form-data: the image part's name"}},
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
                               "description": "what makes this answer doubtful: the built-in demo's random weights "
                                              "(with the header X-Clef-Demo: random-weights)"},
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
                               "release_date": {"type": "string", "format": "date"}}}}},
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
    decision_errors = _errors(400, 401, 404, 413, 415, 422, 429, 503)
    json_body = {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/SystemOneRequest"}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["request"], "properties": {
            "request": {"$ref": "#/components/schemas/SystemOneRequest"}},
            "additionalProperties": {"type": "string", "format": "binary"}}}}}
    ok = {"description": "the decision", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/SystemOneResponse"}}}}
    security = [{"bearer": []}] if registry.server.api_keys_file else []
    return {
        "openapi": "3.1.0",
        "info": {"title": "clef-bridge", "version": "0.1.0",
                 "description": "Jev / TypeSafe System One API for self-hosted Clef decision models"},
        "paths": {
            PATHS["systemone"]: {"post": {"operationId": "systemone", "requestBody": json_body, "security": security,
                                       "responses": {"200": ok, **decision_errors}}},
            PATHS["models"]: {"get": {"operationId": "models", "security": security, "responses": {
                "200": {"description": "served models", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ModelList"}}}}, **_errors(401)}}},
            PATHS["workers_ai"]: {"post": {
                "operationId": "workers_ai", "security": security,
                "parameters": [{"name": "account_id", "in": "path", "required": True, "schema": {"type": "string"}},
                               {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": {"description": "Workers AI envelope {success, result}"},
                              **{k: {"description": "Workers AI envelope {success: false, errors}"}
                                 for k in ("400", "401", "404", "413", "415", "422", "429", "503")}}}},
            PATHS["health"]: {"get": {"operationId": "health", "responses": {"200": {"description": "alive"}}}},
            PATHS["ready"]: {"get": {"operationId": "ready", "responses": {"200": {"description": "every model loaded"},
                                                                     "503": {"description": "not ready"}}}},
            PATHS["metrics"]: {"get": {"operationId": "metrics", "security": security, "responses": {
                "200": {"description": "Prometheus text format (labels name the models)",
                        "content": {"text/plain": {}}}, **_errors(401)}}},
        },
        "components": {
            "schemas": _schemas([] if registry.server.api_keys_file else list(names)),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
