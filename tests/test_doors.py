"""bridge/server/doors/__init__.py and context.py: every API shape is one Door whose routes, handlers, error shape and
OpenAPI paths agree with the route table; the error shapes' bodies."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.server.app import HANDLERS
from clef_bridge.bridge.server.context import Door, jev_error
from clef_bridge.bridge.server.doors import DOORS, ERROR_SHAPES, openapi_paths
from clef_bridge.bridge.server.doors.workers_ai import workers_ai_error
from clef_bridge.bridge.server.openapi import _errors
from clef_bridge.bridge.server.routes import JEV_SHAPE, PATHS, ROUTES, SHAPES, WORKERS_AI_SHAPE
from clef_bridge.head.errors import Problem, RequestInvalid

pytestmark = pytest.mark.unit


def test_every_route_has_a_handler_and_its_shape_an_error_body():
    assert set(HANDLERS) == {r.name for r in ROUTES}
    assert {r.shape for r in ROUTES} <= set(ERROR_SHAPES)


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.shape)
def test_a_doors_routes_take_its_shape_and_its_paths_are_described(door: Door):
    assert door.handlers and all(SHAPES[name] == door.shape for name in door.handlers)
    assert all(HANDLERS[name] is handler for name, handler in door.handlers.items())
    paths = door.openapi_paths([], _errors, ServerSpec())
    assert set(paths) == {PATHS[name] for name in door.handlers}


def test_doors_are_distinct_and_their_paths_merge():
    assert len({d.shape for d in DOORS}) == len(DOORS) and {JEV_SHAPE, WORKERS_AI_SHAPE} <= {d.shape for d in DOORS}
    merged = openapi_paths([{"bearer": []}], _errors, ServerSpec())
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
