"""GET /v1/models for two kinds of clients: the official openai SDK's models.list() reads OpenAI's list shape
(each decision model marked as llama-server marks one), Jev's typesafe-sdk and plain HTTP get Jev's shape."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.server.app import openai_model_list

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("list-key\n")
    registry = registry_for(tiny_spec(fx), tmp_path_factory.mktemp("m") / "m.toml", api_keys_file=keys)
    with RunningServer(registry, api_key="list-key") as srv:
        yield srv


AUTH = {"Authorization": "Bearer list-key"}


def test_the_openai_sdk_lists_the_models_with_their_output_modality(server):
    openai = pytest.importorskip("openai")
    seen = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [seen.append]})
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="list-key", http_client=http)
    [model] = list(client.models.list())
    assert model.id == "tiny" and model.object == "model" and model.owned_by == "clef-bridge"
    extra = model.to_dict()
    assert extra["architecture"] == {"input_modalities": ["text"], "output_modalities": ["decisions"]}
    assert extra["x_status"] == "ready"
    assert "x-stainless-lang" in seen[0].headers  # what told the server this client wants OpenAI's shape


def test_the_jev_sdk_and_plain_http_get_jevs_shape(server):
    pytest.importorskip("httpx2")
    from typesafe_sdk import TypeSafeClient

    with TypeSafeClient(api_key="list-key", base_url=server.url, model="tiny") as client:
        assert [m.name for m in client.models.list().models] == ["tiny"]
    plain = server.request("GET", "/v1/models", headers=AUTH)
    assert plain.status == 200 and list(plain.json()) == ["models"]
    assert [m["name"] for m in plain.json()["models"]] == ["tiny"]


@pytest.mark.parametrize("query, headers, key", [
    ("?shape=openai", {}, "data"),  # said outright: curl, a llama-server script
    ("?shape=jev", {"User-Agent": "OpenAI/Python 3.51.0"}, "models"),  # the query wins over the headers
    ("", {"User-Agent": "OpenAI/Python 3.51.0"}, "data"),
    ("", {"X-Stainless-Lang": "js"}, "data"),  # openai-node
    ("", {"User-Agent": "typesafe-sdk/1.14.0", "X-TypeSafe-SDK": "python"}, "models"),
])
def test_the_shape_follows_the_client(server, query, headers, key):
    reply = server.request("GET", "/v1/models" + query, headers=AUTH | headers)
    assert reply.status == 200 and key in reply.json()
    if key == "data":
        assert reply.json()["object"] == "list" and reply.json()["data"][0]["id"] == "tiny"


def test_an_unknown_shape_is_a_422_naming_the_choices(server):
    reply = server.request("GET", "/v1/models?shape=ollama", headers=AUTH)
    assert reply.status == 422
    [problem] = reply.json()["detail"]
    assert problem["loc"] == ["query", "shape"] and "jev, openai" in problem["msg"]


def test_openai_entries_carry_what_jevs_do():
    jev = [{"name": "clef-flash", "description": "d", "release_date": "2026-09-15", "x_aliases": ["@cf/x"],
            "x_status": "ready", "x_media": ["image", "audio"]}]
    [entry] = openai_model_list(jev)["data"]
    assert entry["created"] == 1789430400  # 2026-09-15T00:00:00Z
    assert entry["architecture"]["input_modalities"] == ["text", "image", "audio"]
    assert entry["x_aliases"] == ["@cf/x"] and entry["description"] == "d"
