"""The media fields of a request body as declared (head/declaration.py): what request.py checks of them before any
medium is read, and what /openapi.json publishes; the words every refusal of a medium uses (its field, its marker)."""

from __future__ import annotations

from functools import cache
from types import MappingProxyType
from typing import Any, Mapping

from ...head.declaration import Bound, Node, node
from . import frames
from .kinds import IMAGE, TABLE, Kind

FORM = "multipart/form-data"

KINDS = tuple(TABLE)  # the prompt's order of kinds: images, audio clips, then videos (the reference's)
FIELDS = {kind: row.field for kind, row in TABLE.items()}  # each kind's body field and decode stage
MARKERS = {kind: f"[{kind} {{}}]" for kind in KINDS}
MARKER = MARKERS[IMAGE]


def either(words: list[str], last: str = " or ") -> str:
    return ", ".join(words[:-1]) + last + words[-1]


TYPES_TEXT = either([f'"{kind}"' for kind in KINDS])  # "image", "audio" or "video"


def _entry(kind: str, row: Kind) -> dict[str, Any]:
    """An `images`, `audio` or `videos` entry as published: a data: URL or base64 string, or Workers AI's object (each
    entry is read, and refused as its medium, by _inline)."""
    return {"anyOf": [{"type": "string", "examples": [f"data:{row.content_type};base64,..."]},
                      {"type": "object", "required": ["base64"],
                       "properties": {"content_type": {"type": "string", "pattern": f"^{kind}/"},
                                      "base64": {"type": "string"}}}]}


ASSET = node("object", msg=f"an asset must be an object: {{\"type\": {TYPES_TEXT}, \"format\", \"data_base64\"}} or, "
             f"in a {FORM} request, {{\"type\", \"part\"}}", ref="Asset", fields={
                 "type": node(enum=(*KINDS, None), enum_msg=f"type must be {TYPES_TEXT}, got {{got!r}}",
                              published={"default": IMAGE}),
                 "format": node("string", description="required with data_base64; the bytes decide the real format",
                                published={"enum": [f for row in TABLE.values() for f in row.formats]}),
                 "data_base64": node("string"),
                 "part": node("string", description="multipart/form-data: the medium's part name")})


def media_declarations(limits: Mapping[str, Any] = MappingProxyType({})) -> Mapping[str, Node]:
    """The body's media fields as declared, under the server's limits (each kind's by its name, its row's defaults
    where absent): each kind's array and `assets` (request.py reads each entry's bytes and each asset's data)."""
    return _declared(tuple(limits[kind] if kind in limits else row.limits() for kind, row in TABLE.items()))


@cache  # each kind's limits are frozen: one server's declarations are built once
def _declared(counted: tuple[Any, ...]) -> Mapping[str, Node]:
    declared = {"assets": node("object", "null", msg="assets must be an object of placeholder -> asset", values=ASSET,
                               description=f"placeholder -> {' or '.join(row.noun for row in TABLE.values())}; each "
                                           "placeholder inside a string of the state, instructions or criteria reads "
                                           f"{' or '.join(MARKERS[kind].format('N') for kind in TABLE)}")}
    for (kind, row), limits in zip(TABLE.items(), counted):
        arrays = f", frame arrays {frames.SHAPE}" if row.array is not None else ""
        most = limits.max_count
        declared[row.field] = node(
            "array", "null", msg=f"{row.field} must be an array of data: URLs, base64 strings{arrays} or "
                                 "{\"content_type\", \"base64\"} objects",
            bound=Bound(most, f"at most {{most}} {row.noun}s per request ({row.count_key}), got {{got}}",
                        f"too_many_{row.noun.replace(' ', '_')}s"),
            description=row.description, published={"items": _entry(kind, row)})
    return MappingProxyType(declared)
