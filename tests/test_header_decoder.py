"""The one header decoder (bridge/server/body.py's `header`) on the strings aiohttp hands it: header bytes
decoded with surrogateescape, so UTF-8 text comes back whole and any other byte is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from clef_bridge.bridge.server.body import BadHeader, header
from multidict import CIMultiDict, CIMultiDictProxy

pytestmark = pytest.mark.unit


def as_aiohttp_reads(raw: bytes) -> str:
    """A header value as aiohttp's parser gives it: its bytes decoded with surrogateescape."""
    return raw.decode("utf-8", "surrogateescape")


def request_with(name: str, raw: bytes | None):
    """What `header` reads of a request: its headers (aiohttp's test request would encode them strictly)."""
    headers = {} if raw is None else {name: as_aiohttp_reads(raw)}
    return SimpleNamespace(headers=CIMultiDictProxy(CIMultiDict(headers)))


@pytest.mark.parametrize("raw, text", [
    (b"application/json", "application/json"),
    ("Bearer clé-€-🔑".encode(), "Bearer clé-€-🔑"),  # UTF-8 text comes back as the text it spells
    (b"", ""),
])
def test_utf8_header_bytes_give_their_text(raw, text):
    assert header(request_with("X-Typesafe-Request-Id", raw), "X-Typesafe-Request-Id") == text


@pytest.mark.parametrize("raw", [b"caf\xe9", b"\xff\xfe", "ok".encode() + b"\xc3", b"\xed\xa0\x80"],
                         ids=["latin-1", "bom bytes", "cut sequence", "utf-8 surrogate"])
def test_other_bytes_are_refused_naming_the_header(raw):
    with pytest.raises(BadHeader) as refused:
        header(request_with("Authorization", raw), "Authorization")
    assert refused.value.name == "Authorization" and "not valid UTF-8" in str(refused.value)


def test_a_missing_header_is_none():
    assert header(request_with("Content-Encoding", None), "Content-Encoding") is None
