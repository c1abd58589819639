"""Request bodies: capped reading, gzip/zstd decoding with a bomb guard, strict JSON."""

from __future__ import annotations

import json
import zlib
from typing import Any

from aiohttp import web

from ..head.errors import ClefError, Problem, RequestInvalid

try:
    from compression import zstd  # Python >= 3.14
except ImportError:
    from backports import zstd


class BodyTooLarge(ClefError):
    error_type = "request_too_large"


class BadEncoding(ClefError):
    """A Content-Encoding we cannot decode, or a corrupt compressed body."""

    error_type = "invalid_content_encoding"


class UnsupportedMediaType(ClefError):
    error_type = "unsupported_media_type"


class _Duplicate(ValueError):
    pass


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body exceeds {limit} bytes (max_body_bytes in models.toml [server])")


async def read_capped(request: web.Request, limit: int) -> bytes:
    """The raw body, refusing more than limit bytes before reading them all."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def decode(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding; output beyond limit bytes is a 413, whatever the input size."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding in ("gzip", "x-gzip"):
            d = zlib.decompressobj(wbits=47)  # gzip or zlib header
            out = d.decompress(raw, limit + 1)
            if len(out) > limit or d.unconsumed_tail:
                raise _too_large(limit)
            if not d.eof:
                raise BadEncoding("the gzip body is truncated")
            return out
        if encoding == "zstd":
            d = zstd.ZstdDecompressor()
            out = d.decompress(raw, max_length=limit + 1)
            if len(out) > limit or not d.needs_input and not d.eof:
                raise _too_large(limit)
            if not d.eof:
                raise BadEncoding("the zstd body is truncated")
            return out
    except (zlib.error, zstd.ZstdError) as exc:
        raise BadEncoding(f"the {encoding} body cannot be decoded: {exc}") from None
    raise BadEncoding(f"Content-Encoding {encoding!r} is not supported; send identity, gzip or zstd")


def check_content_type(content_type: str) -> None:
    """JSON bodies; multipart/form-data (images) is read by bridge/multipart.py."""
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


def parse_json(data: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN/Infinity, no duplicate keys; errors are 422s at loc body."""
    def invalid(msg: str, kind: str = "json_invalid") -> RequestInvalid:
        return RequestInvalid([Problem(("body",), msg, kind)])

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"the body is not valid UTF-8: {exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _Duplicate as exc:
        raise invalid(f"the JSON object has a {exc}", "json_duplicate_key") from None
    except RecursionError:
        raise invalid("the JSON is nested too deeply", "json_too_deep") from None
    except ValueError as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None
