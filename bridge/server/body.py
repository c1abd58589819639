"""Request input: header values decoded in one place, capped body reading (Expect: 100-continue
answered only after the size check), gzip/zstd decoding of every member with a bomb guard, strict JSON."""

from __future__ import annotations

import json
import math
import zlib
from typing import Any, Callable, Iterator

from aiohttp import hdrs, web

from ...head.errors import Category, ClefError, Problem, RequestInvalid
from ...head.schema import Limits
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


TEXT_CAP = "max_body_bytes in models.toml [server]"


def _too_large(limit: int, why: str) -> BodyTooLarge:
    return BodyTooLarge(f"the request body exceeds {limit} bytes ({why})")


async def _continue(request: web.Request) -> None:
    """Answer Expect: 100-continue once the body is wanted (routes defer it: see server.defer_expect)."""
    expect = header(request, hdrs.EXPECT)
    if expect is None or request.version < (1, 1):
        return
    if expect.strip().lower() != "100-continue":
        raise ExpectationFailed(f"Expect: {expect!r} is not supported; send Expect: 100-continue or none")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the real response has not started


async def read_capped(request: web.Request, limit: int, why: str = TEXT_CAP) -> bytes:
    """The raw body, refusing more than limit bytes before reading them all (or asking for them); why: what sets
    the limit, for the 413."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit, why)
    await _continue(request)
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, why)
        chunks.append(chunk)
    return b"".join(chunks)


# Input is handed to a decoder FEED bytes at a time, so a member's or frame's leftover (what the next one starts
# with) is at most that: many small members cost linear time, not a copy of the rest of the body per member.
# Output comes PIECE bytes at a time, so a bomb is refused after one piece past the limit, never inflated whole.
FEED, PIECE = 64 * 1024, 1 << 20


class _Truncated(Exception):
    pass


def _gzip_pieces(raw: bytes) -> Iterator[bytes]:
    """Every gzip member's (or zlib stream's) output, PIECE bytes at most at a time."""
    view, at = memoryview(raw), 0
    while at < len(view):
        d = zlib.decompressobj(wbits=47)  # gzip or zlib header
        while not d.eof:
            if at >= len(view):
                yield d.flush()  # what zlib still holds of input it took (at most its window)
                if not d.eof:
                    raise _Truncated
                break
            chunk = view[at:at + FEED]
            yield d.decompress(chunk, PIECE)
            at += len(chunk) - len(d.unconsumed_tail) - len(d.unused_data)


def _zstd_pieces(raw: bytes) -> Iterator[bytes]:
    """Every zstd frame's output, PIECE bytes at most at a time."""
    view, at = memoryview(raw), 0
    while at < len(view):
        d = zstd.ZstdDecompressor()
        while not d.eof:
            if d.needs_input:
                if at >= len(view):
                    raise _Truncated
                chunk, at = view[at:at + FEED], at + FEED
            else:
                chunk = b""
            yield d.decompress(chunk, max_length=PIECE)
        at = min(at, len(view)) - len(d.unused_data)  # the next frame starts in what this one left


# Content-Encoding -> the output of every gzip member (RFC 1952) or zstd frame (RFC 8878), piece by piece
DECODERS: dict[str, Callable[[bytes], Iterator[bytes]]] = {"gzip": _gzip_pieces, "x-gzip": _gzip_pieces,
                                                           "zstd": _zstd_pieces}


def decode(raw: bytes, encoding: str, limit: int, containers: int | None = None, why: str = TEXT_CAP) -> bytes:
    """Undo Content-Encoding, every gzip member and zstd frame, in time linear in the input: output beyond limit
    bytes is a 413, and with `containers` output holding more JSON objects and arrays than that a 413 too, both
    refused as soon as the output shows it (check_containers)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in DECODERS:
        raise BadEncoding(f"Content-Encoding {encoding!r} is not supported; send identity, gzip or zstd")
    parts: list[bytes] = []
    size = opened = 0
    try:
        for piece in DECODERS[encoding](raw):
            size += len(piece)
            if size > limit:
                raise _too_large(limit, why)
            if containers is not None:
                opened += piece.count(b"[") + piece.count(b"{")
                check_containers(opened, containers)
            parts.append(piece)
    except _Truncated:
        raise BadEncoding(f"the {encoding} body is truncated") from None
    except (zlib.error, zstd.ZstdError) as exc:
        raise BadEncoding(f"the {encoding} body cannot be decoded: {exc}") from None
    return b"".join(parts)


def json_containers(limits: Limits) -> int:
    """The most JSON objects and arrays a valid body holds: a state of max_state_bytes made of nothing else (two
    bytes each), every question with its options, and the body around them; far below what a body of
    max_body_bytes could build (a 4 MiB body of `[]` is 1.4 million lists, about 100 MB of Python objects)."""
    return limits.max_state_bytes // 2 + limits.max_questions * (limits.max_options + 4) + 1024


def check_containers(opened: int, most: int) -> None:
    """Refuse a body whose `[` and `{` (brackets inside strings counted too) pass most, before it is built."""
    if opened > most:
        raise BodyTooLarge(f"the request's JSON opens more than {most} objects and arrays (brackets in strings "
                           "counted); a valid request holds fewer (max_state_bytes / 2, plus max_questions x "
                           "(max_options + 4))")


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


def parse_json(data: bytes, containers: int | None = None) -> Any:
    """Strict JSON: UTF-8 only, no NaN/Infinity, no duplicate keys; errors are 422s at loc body. With containers,
    a body opening more objects and arrays is refused before any is built (check_containers); json's own
    recursion guard bounds the depth it builds (about 1,000 levels), max_json_depth the depth it accepts."""
    def invalid(msg: str, kind: str = "json_invalid") -> RequestInvalid:
        return RequestInvalid([Problem(("body",), msg, kind)])

    if containers is not None:
        check_containers(data.count(b"[") + data.count(b"{"), containers)

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
