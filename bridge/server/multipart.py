"""multipart/form-data request bodies (RFC 7578), as the official SDK sends images: a `request` part
holding the JSON body, then one part per image, named by its asset's `part`.

The body is parsed from bytes already read under the size cap and undone from its Content-Encoding
(the SDK zstd-compresses the whole multipart body), so parsing never waits on the network.
"""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass
from typing import Any

from ...head.errors import Problem, RequestInvalid
from ..media.request import FORM, FormPart, UnsupportedMediaType
from .body import parse_json

REQUEST_PART = "request"
MAX_PARTS = 64  # far above any valid request (a request part and max_images images); bounds parsing work
# A part's header block: two or three lines (Content-Disposition, Content-Type) in every client; the email
# package parses header lines slowly (8 MB of them took 7 s), so a longer block is refused before it is parsed.
MAX_PART_HEAD = 16 * 1024
_HEADERS = email.parser.BytesHeaderParser(policy=email.policy.HTTP)


def is_form(content_type: str) -> bool:
    """True for multipart/form-data; any other multipart type is refused (415)."""
    if content_type == FORM:
        return True
    if content_type.startswith("multipart/"):
        raise UnsupportedMediaType(f"Content-Type {content_type!r} is not supported; send application/json, or "
                                   f"{FORM} with a `request` part and image parts")
    return False


def _invalid(msg: str, kind: str = "multipart_invalid", loc: tuple[str | int, ...] = ("body",)) -> RequestInvalid:
    return RequestInvalid([Problem(loc, msg, kind)])


def _boundary(content_type_header: str) -> bytes:
    params = _HEADERS.parsebytes(f"Content-Type: {content_type_header}\r\n\r\n".encode("latin-1", "replace"))
    boundary = params.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70:
        raise _invalid(f"{FORM} needs a boundary parameter of 1 to 70 characters in its Content-Type")
    return boundary.encode("latin-1", "replace")


def _part(block: bytes) -> FormPart:
    """One part: its header block, an empty line, its content."""
    if block.startswith(b"\r\n"):
        head, data = b"", block[2:]
    else:
        end = block.find(b"\r\n\r\n", 0, MAX_PART_HEAD + 4)
        if end < 0 and len(block) > MAX_PART_HEAD:
            raise _invalid(f"a part's headers are longer than {MAX_PART_HEAD} bytes")
        if end < 0:
            raise _invalid("a part's headers are not followed by an empty line")
        head, data = block[:end + 2], block[end + 4:]
    try:
        headers = _HEADERS.parsebytes(head + b"\r\n")
        disposition = headers.get_content_disposition()
        name = headers.get_param("name", header="content-disposition")
        encoding = str(headers.get("content-transfer-encoding", "binary")).strip().lower()
    except (ValueError, TypeError, LookupError) as exc:  # the email package's header errors
        raise _invalid(f"a part's headers cannot be read: {exc}") from None
    if disposition != "form-data" or not isinstance(name, str) or not name:
        raise _invalid("every part needs Content-Disposition: form-data with a name")
    if encoding not in ("binary", "8bit", "7bit"):
        raise _invalid(f"part {name!r} has Content-Transfer-Encoding {encoding}; send its bytes as they are (binary)",
                       loc=("body", name))
    return FormPart(name, headers.get_content_type() if "content-type" in headers else "", data)


def parse_form(raw: bytes, content_type_header: str) -> dict[str, FormPart]:
    """The parts of a multipart/form-data body by name; a malformed body is a 422 at loc body."""
    delimiter = b"--" + _boundary(content_type_header)
    at = 0 if raw.startswith(delimiter) else raw.find(b"\r\n" + delimiter) + 2  # a preamble is allowed
    if at == 1:
        raise _invalid(f"the body holds no part: its boundary {delimiter[2:].decode('latin-1')!r} never occurs")
    parts: dict[str, FormPart] = {}
    while True:
        at += len(delimiter)
        if raw.startswith(b"--", at):
            return parts  # the close delimiter; anything after it is an epilogue
        line_end = raw.find(b"\r\n", at)
        if line_end < 0 or raw[at:line_end].strip(b" \t"):
            raise _invalid("a boundary line is malformed or the body ends without its close delimiter (--BOUNDARY--)")
        end = raw.find(b"\r\n" + delimiter, line_end)
        if end < 0:
            raise _invalid("the body ends inside a part, without its close delimiter (--BOUNDARY--): truncated?")
        part = _part(raw[line_end + 2:end])
        if part.name in parts:
            raise _invalid(f"two parts are named {part.name!r}", loc=("body", part.name))
        if len(parts) >= MAX_PARTS:
            raise _invalid(f"more than {MAX_PARTS} parts")
        parts[part.name] = part
        at = end + 2


@dataclass(frozen=True)
class RequestBody:
    """A decision request's body: its JSON (a multipart body's `request` part) and a multipart body's other parts."""

    data: Any
    parts: dict[str, FormPart] | None  # None: a JSON body
    json_bytes: int  # size of the JSON text, images inlined as base64 included


def parse_body(raw: bytes, form: str = "", containers: int | None = None) -> RequestBody:
    """A JSON body, or with form (the multipart/form-data Content-Type header) a multipart one; containers: the
    most objects and arrays its JSON may open (body.check_containers)."""
    if not form:
        return RequestBody(parse_json(raw, containers), None, len(raw))
    parts = parse_form(raw, form)
    request = parts.pop(REQUEST_PART, None)
    if request is None:
        raise _invalid(f"a {FORM} body needs a part named {REQUEST_PART!r} holding the JSON request", "missing",
                       ("body", REQUEST_PART))
    ctype = request.content_type
    if ctype not in ("", "application/json", "text/plain") and not ctype.endswith("+json"):
        raise _invalid(f"the {REQUEST_PART!r} part is {request.content_type}; it must hold the JSON request "
                       "(application/json)", "type_error", ("body", REQUEST_PART))
    return RequestBody(parse_json(request.data, containers), parts, len(request.data))
