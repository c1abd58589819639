"""bridge/server/auth.py: the key file, the Bearer check, the public routes and the 401 challenge."""

from __future__ import annotations

import asyncio

import pytest
from clef_bridge.bridge.server.appstate import KEYS
from clef_bridge.bridge.server.auth import (
    ANONYMOUS,
    CHALLENGE,
    ApiKeys,
    ApiKeysError,
    Tenant,
    Unauthorized,
    auth_middleware,
)
from clef_bridge.bridge.server.routes import PUBLIC, ROUTES

from .servertiny import body, call, ok, tiny_app

pytestmark = pytest.mark.unit


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("# the team's keys\n\n  key-one  \nkey-two\n", encoding="utf-8")
    return path


def test_the_file_holds_one_key_a_line_comments_and_blanks_skipped(key_file):
    keys = ApiKeys(key_file)
    assert keys.enabled and [k for k, _ in keys.keys] == [b"key-one", b"key-two"]


def test_a_key_is_a_tenant_by_its_name_never_the_key(tmp_path):
    """Unnamed keys are named by a digest prefix; name= and scope= after the key; a trailing comment is no field."""
    path = tmp_path / "keys.txt"
    path.write_text("s3cr3t-a name=alice\ns3cr3t-b   # bob's, unnamed\ns3cr3t-p name=prom scope=metrics\n"
                    "k#1 name=hash  # a key may hold #\n")
    keys = ApiKeys(path)
    assert keys.check("Bearer k#1") == Tenant("hash")
    with pytest.raises(Unauthorized):
        keys.check("Bearer k")  # never a shorter key than the one in the file
    alice, bob, prom = (keys.check(f"Bearer {k}") for k in ("s3cr3t-a", "s3cr3t-b", "s3cr3t-p"))
    assert (alice, prom) == (Tenant("alice"), Tenant("prom", metrics=True))
    assert bob.name.startswith("key-") and len(bob.name) == 12 and "s3cr3t" not in bob.name and not bob.metrics
    assert ApiKeys(None).check(None) == ANONYMOUS


@pytest.mark.parametrize("line, message", [("k name=a b\n", "unknown field"), ("k colour=red\n", "unknown field"),
                                           ("k name=sp@ce\n", "must be 1 to 64"), ("k scope=admin\n", "scope"),
                                           ("k1 name=a\nk2 name=a\n", "names two keys")])
def test_a_malformed_key_line_is_refused_naming_it(tmp_path, line, message):
    path = tmp_path / "keys.txt"
    path.write_text(line)
    with pytest.raises(ApiKeysError, match=message) as caught:
        ApiKeys(path)
    assert "line " in str(caught.value)


@pytest.mark.parametrize("authorization", ["Bearer key-one", "bearer key-two", "BEARER  key-one ", " Bearer key-two"])
def test_a_known_key_passes_whatever_the_schemes_case(key_file, authorization):
    ApiKeys(key_file).check(authorization)


@pytest.mark.parametrize("authorization, message", [
    (None, "missing API key"), ("", "missing API key"), ("Bearer", "missing API key"), ("Bearer   ", "missing API key"),
    ("Basic a2V5LW9uZQ==", "missing API key"), ("key-one", "missing API key"),
    ("Bearer key-three", "invalid API key"), ("Bearer key-on", "invalid API key"),
    ("Bearer key-one2", "invalid API key"),
])
def test_anything_else_is_unauthorized(key_file, authorization, message):
    with pytest.raises(Unauthorized, match=message):
        ApiKeys(key_file).check(authorization)


def test_without_a_key_file_auth_is_off():
    keys = ApiKeys(None)
    assert not keys.enabled
    keys.check(None)
    keys.reload()


def test_reload_reads_the_file_again(key_file):
    keys = ApiKeys(key_file)
    key_file.write_text("key-three\n", encoding="utf-8")
    keys.reload()
    keys.check("Bearer key-three")
    with pytest.raises(Unauthorized):
        keys.check("Bearer key-one")


@pytest.mark.parametrize("content, message", [("# only a comment\n\n", "no API keys"), (b"\xff\xfe", "cannot read"),
                                              (None, "cannot read")])
def test_a_key_file_without_keys_is_refused(tmp_path, content, message):
    path = tmp_path / "keys.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ApiKeysError, match=message):
        ApiKeys(path)


def test_a_failed_reload_keeps_the_old_keys(key_file):
    keys = ApiKeys(key_file)
    key_file.write_text("", encoding="utf-8")
    with pytest.raises(ApiKeysError):
        keys.reload()
    keys.check("Bearer key-one")


def test_public_routes_answer_without_a_key_and_the_others_do_not(key_file):
    app = tiny_app(keys=key_file)
    for route in ROUTES:
        path = route.path.replace("{account_id}", "acc").replace("{model}", "clef").replace("{path:.*}", "anything")
        method = "POST" if route.method == "*" else route.method
        response = call(app, method, path)
        assert response.status == (200 if route.public else 401), (route, response.text)
        assert (path in PUBLIC) == route.public


@pytest.mark.parametrize("path", ["/v1/systemone", "/accounts/acc/ai/run/@cf/cloudflare/clef"])
def test_the_401_challenges_for_a_bearer_key(key_file, path):
    response = call(tiny_app(keys=key_file), "POST", path, {"Authorization": "Bearer wrong"})
    assert response.status == 401 and response.headers["WWW-Authenticate"] == CHALLENGE
    reply = body(response)
    message = reply["detail"]["message"] if "detail" in reply else reply["errors"][0]["message"]
    assert message == "invalid API key"
    if "detail" in reply:
        assert reply["detail"]["error_type"] == "authentication_error"


def test_a_key_that_is_not_utf8_is_unauthorized_not_a_400(key_file):
    # aiohttp decodes header bytes with surrogateescape: a stray byte arrives as a lone surrogate
    class Request(dict):  # aiohttp's requests hold the middleware's per-request values by key
        app, path, headers = {KEYS: ApiKeys(key_file)}, "/v1/systemone", {"Authorization": "Bearer k\udcffy"}

    request = Request()
    with pytest.raises(Unauthorized, match="not valid UTF-8"):
        asyncio.run(auth_middleware(KEYS)(request, ok))


def test_metrics_are_read_with_a_metrics_key_and_only_with_one(tmp_path):
    """/metrics shows every tenant's traffic: a tenant's key gets a 403 naming the fix there, and a scope=metrics key
    (Prometheus's) reads it and nothing else."""
    path = tmp_path / "keys.txt"
    path.write_text("key-one name=alice\nkey-prom name=prometheus scope=metrics\n")
    app = tiny_app(keys=path)
    scraped = call(app, "GET", "/metrics", {"Authorization": "Bearer key-prom"})
    assert scraped.status == 200 and body(scraped) == {"route": "metrics"}
    tenant = call(app, "GET", "/metrics", {"Authorization": "Bearer key-one"})
    assert tenant.status == 403 and "scope=metrics" in tenant.text
    assert call(app, "GET", "/v1/models", {"Authorization": "Bearer key-one"}).status == 200
    assert call(app, "GET", "/v1/models", {"Authorization": "Bearer key-prom"}).status == 403
