"""Request input: header values decoded in one place, capped body reading (Expect: 100-continue
answered only after the size check), gzip/zstd decoding of every member with a bomb guard, strict JSON."""

from __future__ import annotations

import json
import math
import zlib
from typing import Any, Callable

from aiohttp import hdrs, web

from ...head.errors import Category, ClefError, Problem, RequestInvalid
from ..media.request import UnsupportedMediaType
from ..service.errors import BodyTooLarge  # the service refuses a too large text as well

try:
    from compression import zstd  # Python >= 3.14
except ImportError:
    from backports import zstd


class BadEncoding(ClefError):
    """A Content-Encoding we cannot decode, or a corrupt compressed body."""

    category = Category.MALFORMED
    error_type = "invalid_content_encoding"


class BadHeader(ClefError):
    """A header value that is not UTF-8 text."""

    category = Category.MALFORMED
    error_type = "invalid_header"

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"the {name} header is not valid UTF-8; send it as UTF-8 (ASCII for HTTP's own headers)")


class ExpectationFailed(ClefError):
    category = Category.EXPECTATION
    error_type = "expectation_failed"


class _Duplicate(ValueError):
    pass


def header(request: web.BaseRequest, name: str) -> str | None:
    """The one place a header value is read: its text, or BadHeader when its bytes are not UTF-8.

    aiohttp decodes header bytes with surrogateescape, so a stray byte arrives as a lone surrogate
    that no JSON writer, log line or encoder takes; undoing that and decoding strictly finds them.
    """
    value = request.headers.get(name)
    if value is None or value.isascii():
        return value
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeError:
        raise BadHeader(name) from None


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body exceeds {limit} bytes (max_body_bytes in models.toml [server])")


async def _continue(request: web.Request) -> None:
    """Answer Expect: 100-continue once the body is wanted (routes defer it: see server.defer_expect)."""
    expect = header(request, hdrs.EXPECT)
    if expect is None or request.version < (1, 1):
        return
    if expect.strip().lower() != "100-continue":
        raise ExpectationFailed(f"Expect: {expect!r} is not supported; send Expect: 100-continue or none")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the real response has not started


async def read_capped(request: web.Request, limit: int) -> bytes:
    """The raw body, refusing more than limit bytes before reading them all (or asking for them)."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    await _continue(request)
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _gzip_member(data: bytes, budget: int) -> tuple[bytes, bool, bytes]:
    d = zlib.decompressobj(wbits=47)  # gzip or zlib header
    out = d.decompress(data, budget + 1)
    return out, d.eof, d.unused_data


def _zstd_frame(data: bytes, budget: int) -> tuple[bytes, bool, bytes]:
    d = zstd.ZstdDecompressor()
    out = d.decompress(data, max_length=budget + 1)
    return out, d.eof, d.unused_data


# Content-Encoding -> one member (gzip) or frame (zstd): (output up to budget + 1 bytes, ended, the rest)
DECODERS: dict[str, Callable[[bytes, int], tuple[bytes, bool, bytes]]] = {
    "gzip": _gzip_member, "x-gzip": _gzip_member, "zstd": _zstd_frame}


def decode(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding, every gzip member and zstd frame (RFC 1952 and 8878 allow several);
    output beyond limit bytes is a 413, whatever the input size."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in DECODERS:
        raise BadEncoding(f"Content-Encoding {encoding!r} is not supported; send identity, gzip or zstd")
    parts: list[bytes] = []
    size, rest = 0, raw
    try:
        while True:
            out, ended, rest = DECODERS[encoding](rest, limit - size)
            size += len(out)
            if size > limit:
                raise _too_large(limit)
            if not ended:
                raise BadEncoding(f"the {encoding} body is truncated")
            parts.append(out)
            if not rest:
                break
    except (zlib.error, zstd.ZstdError) as exc:
        raise BadEncoding(f"the {encoding} body cannot be decoded: {exc}") from None
    return b"".join(parts)


def media_type(request: web.BaseRequest) -> str:
    """The Content-Type's media type, lowercased, without parameters ('' when absent)."""
    return (header(request, hdrs.CONTENT_TYPE) or "").partition(";")[0].strip().lower()


def check_content_type(content_type: str) -> None:
    """JSON bodies; multipart/form-data (images) is read by bridge/server/multipart.py before this is asked."""
    if content_type not in ("", "application/json", "application/octet-stream") and \
            not content_type.endswith("+json"):
        raise UnsupportedMediaType(f"Content-Type {content_type!r} is not supported; send application/json")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Duplicate(f"duplicate key {dup!r}")
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 would be infinity, and reach the prompt as "Infinity"
        raise ValueError(f"the number {literal[:40]} is out of range for a 64-bit float")
    return value


def parse_json(data: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN/Infinity, no duplicate keys; errors are 422s at loc body."""
    def invalid(msg: str, kind: str = "json_invalid") -> RequestInvalid:
        return RequestInvalid([Problem(("body",), msg, kind)])

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"the body is not valid UTF-8: {exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite)
    except _Duplicate as exc:
        raise invalid(f"the JSON object has a {exc}", "json_duplicate_key") from None
    except RecursionError:
        raise invalid("the JSON is nested too deeply", "json_too_deep") from None
    except ValueError as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None
