"""The OpenAPI description (bridge/server/openapi.py), built from a registry without a socket: the limits it
states are the ones in force, the media words are the catalogue's, and auth hides the served names."""

from __future__ import annotations

from pathlib import Path

import pytest
from clef_bridge.bridge.catalogue.media import MEDIA_KINDS, READABLE, VIDEO
from clef_bridge.bridge.config.registry import parse_registry
from clef_bridge.bridge.server.openapi import openapi_spec
from clef_bridge.bridge.server.routes import PATHS
from clef_bridge.head.schema import Limits

pytestmark = pytest.mark.unit

DEFAULTS = Limits()


def registry(**server):
    return parse_registry({"models": {"m": {"gguf": "m.gguf"}}, "server": server}, Path("/srv/models.toml"))


def schemas(**server) -> dict:
    return openapi_spec(registry(**server), {"m": "m", "jev-latest": "m"})["components"]["schemas"]


def examples(spec: dict) -> list[str]:
    return spec["components"]["schemas"]["SystemOneRequest"]["properties"]["model"]["examples"]


def test_the_limits_come_from_the_server_table():
    """A models.toml [server] limit reaches /openapi.json (the description once said 255 options and 10 levels
    whatever the file set)."""
    spec = schemas(max_options=7, max_levels=5, max_questions=3, max_state_bytes=1000, max_images=2,
                   max_audio_clips=1)
    criteria = spec["Question"]["properties"]["criteria"]["description"]
    assert "2 to 7 options" in criteria and "2 to 5 levels" in criteria
    assert str(DEFAULTS.max_options) not in criteria and f"to {DEFAULTS.max_levels} levels" not in criteria
    request = spec["SystemOneRequest"]["properties"]
    assert request["questions"]["maxProperties"] == 3
    assert "1000 bytes" in request["state"]["description"]
    assert (request["images"]["maxItems"], request["audio"]["maxItems"]) == (2, 1)


def test_the_defaults_are_stated_without_a_server_table():
    spec = schemas()
    criteria = spec["Question"]["properties"]["criteria"]["description"]
    assert f"2 to {DEFAULTS.max_options} options" in criteria and f"2 to {DEFAULTS.max_levels} levels" in criteria
    assert spec["SystemOneRequest"]["properties"]["questions"]["maxProperties"] == DEFAULTS.max_questions


def test_media_words_are_the_catalogues():
    spec = schemas()
    request = spec["SystemOneRequest"]["properties"]
    assert {kind.field for kind in MEDIA_KINDS.values()} <= set(request)
    assert "x_media lists \"video\"" in request[VIDEO.field]["description"]
    # a null type reads as an image (the Jev API's default), as the validation always took it
    assert spec["Asset"]["properties"]["type"]["enum"] == [*READABLE, None] == ["image", "audio", "video", None]
    media = spec["ModelList"]["properties"]["models"]["items"]["properties"]["x_media"]
    assert media["items"]["enum"] == list(READABLE)


def test_auth_hides_the_served_names_and_marks_the_routes(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k\n")
    open_spec = openapi_spec(registry(), {"m": "m"})
    secured = openapi_spec(registry(api_keys_file=str(keys)), {"m": "m"})
    assert examples(open_spec) == ["m"] and examples(secured) == []
    systemone = PATHS["systemone"]
    assert open_spec["paths"][systemone]["post"]["security"] == []
    assert secured["paths"][systemone]["post"]["security"] == [{"bearer": []}]


def test_every_supported_medium_is_described_from_its_own_tables():
    """A medium's body field, its count limit, its formats and its marker come from bridge/media/kinds.py's table: a new
    medium is described without editing openapi.py."""
    from clef_bridge.bridge.media.kinds import TABLE
    from clef_bridge.bridge.media.request import FIELDS, MARKERS

    supported = {kind.name for kind in MEDIA_KINDS.values() if kind.supported}
    assert set(TABLE) == supported == set(FIELDS)
    spec = schemas(max_images=3, max_audio_clips=2)
    fields = spec["SystemOneRequest"]["properties"]
    assert fields[FIELDS["image"]]["maxItems"] == 3 and fields[FIELDS["audio"]]["maxItems"] == 2
    for kind, doc in TABLE.items():
        assert fields[FIELDS[kind]]["description"] == doc.description
        assert set(doc.formats) <= set(spec["Asset"]["properties"]["format"]["enum"])
        assert doc.noun in fields["assets"]["description"] and MARKERS[kind].format("N") in fields["assets"][
            "description"]


def test_each_door_publishes_its_own_request_from_its_declaration():
    """Workers AI's routes take System One's body with `options` and without `model` (the path names it): their
    schema is their own, not SystemOneRequest under another name (a derived declaration once kept the name)."""
    spec = openapi_spec(registry(), {"m": "m"})
    body = spec["paths"][PATHS["workers_ai"]]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "$ref" not in body and "options" in body["properties"] and "model" not in body["properties"]
    assert body["properties"]["questions"]["additionalProperties"] == {"$ref": "#/components/schemas/Question"}
    request = spec["components"]["schemas"]["SystemOneRequest"]
    assert "options" not in request["properties"] and "model" in request["properties"]
    jev = spec["paths"][PATHS["systemone"]]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert jev == {"$ref": "#/components/schemas/SystemOneRequest"}
