"""bridge/server/doors/__init__.py and context.py: every API shape is one Door whose routes, handlers, error shape and
OpenAPI paths agree with the route table; the error shapes' bodies."""

from __future__ import annotations

from functools import partial

import jsonschema
import pytest
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.server.app import HANDLERS
from clef_bridge.bridge.server.context import Door, error_responses, jev_error
from clef_bridge.bridge.server.doors import DOORS, ERROR_SHAPES, openapi_paths
from clef_bridge.bridge.server.doors.workers_ai import workers_ai_error
from clef_bridge.bridge.server.routes import JEV_SHAPE, PATHS, ROUTES, SHAPES, WORKERS_AI_SHAPE
from clef_bridge.head.declaration import check, json_schema
from clef_bridge.head.errors import Problem, RequestInvalid

pytestmark = pytest.mark.unit


def test_every_route_has_a_handler_and_its_shape_an_error_body():
    assert set(HANDLERS) == {r.name for r in ROUTES}
    assert {r.shape for r in ROUTES} <= set(ERROR_SHAPES)


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.shape)
def test_a_doors_routes_take_its_shape_and_its_paths_are_described(door: Door):
    assert door.handlers and all(SHAPES[name] == door.shape for name in door.handlers)
    assert all(HANDLERS[name] is handler for name, handler in door.handlers.items())
    paths = door.openapi_paths([], partial(error_responses, door.error_declared), ServerSpec())
    assert set(paths) == {PATHS[name] for name in door.handlers}


def test_doors_are_distinct_and_their_paths_merge():
    assert len({d.shape for d in DOORS}) == len(DOORS) and {JEV_SHAPE, WORKERS_AI_SHAPE} <= {d.shape for d in DOORS}
    merged = openapi_paths([{"bearer": []}], ServerSpec())
    assert set(merged) == {PATHS[name] for d in DOORS for name in d.handlers}
    assert all(op.get("security") == [{"bearer": []}] for item in merged.values() for op in item.values())


def test_the_jev_shape_lists_an_invalid_requests_problems_and_describes_other_errors():
    invalid = RequestInvalid([Problem(("body", "q"), "bad", "value_error")])
    assert jev_error(invalid, 422, "validation_error", str(invalid)) == {
        "detail": [{"loc": ["body", "q"], "msg": "bad", "type": "value_error"}]}
    # an invalid medium over its size answers 413 like every other 413: a type and a message
    assert jev_error(invalid, 413, "image_too_large", "m") == {"detail": {"error_type": "image_too_large",
                                                                          "message": "m"}}
    assert jev_error(None, 404, "not_found", "404: Not Found") == {"detail": {"error_type": "not_found",
                                                                              "message": "404: Not Found"}}


@pytest.mark.parametrize("status, code", [(429, 3040), (413, 3006), (408, 3007), (422, 422), (503, 503)])
def test_the_workers_ai_shape_carries_cloudflares_code_where_it_has_one(status, code):
    assert workers_ai_error(None, status, "any", "m") == {"result": None, "success": False,
                                                          "errors": [{"code": code, "message": "m"}], "messages": []}


ERRORS = [(RequestInvalid([Problem(("body", "questions", 0, "name"), "bad", "value_error"), Problem(("body",), "worse",
                                                                                                  "type_error")]),
           422, "validation_error", "invalid"),
          (RequestInvalid([Problem(("body", "images", 0), "too big", "image_too_large")]), 413, "image_too_large", "m"),
          (None, 404, "not_found", "404: Not Found"), (None, 429, "busy", "busy: retry"),
          (None, 503, "unavailable", "loading")]


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.shape)
def test_a_doors_error_bodies_are_what_it_declares_and_publishes(door: Door):
    """Every error a door writes (an invalid request at its own status, a medium too large, a 404, a 429, a 503)
    checks against the declaration its /openapi.json error responses are written from."""
    schema = json_schema(door.error_declared)
    for exc, status, error_type, message in ERRORS:
        body = door.error_body(exc, door.statuses.get(status, status), error_type, message)
        problems: list = []
        assert check(door.error_declared, body, (), problems), (body, problems)
        jsonschema.Draft202012Validator(schema).validate(body)
    responses = door.openapi_paths([], partial(error_responses, door.error_declared), ServerSpec())
    published = [r["content"]["application/json"]["schema"] for item in responses.values() for op in item.values()
                 for status, r in op["responses"].items() if status != "200"]
    assert published and all(p == schema for p in published)
