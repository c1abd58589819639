"""The media of a request body: found in its fields (the Jev API's `assets`, the reference's and Workers
AI's `images`, `audio` and `videos`, the official SDK's form parts), each one's base64 decoded once, sized, then
checked from its header bytes by its kind's row of kinds.py (which also decodes and hashes it, once).

Media go where the reference puts them, after `STATE:\\n`: all images, then all audio clips, then videos, each
medium in order of first reference: the prompt's order (the state as rendered, then each question's
instructions and criteria), then assets that no text names, in their `assets` order. Every placeholder
inside a string of the state, the instructions or the criteria becomes its medium's marker with its
number ("[image 2]", "[audio 1]"), so the text reads the same whatever random placeholder a client
picked (answers, and the answer cache, do not move with it), stays a few plain tokens (never a control
token), and can tell the media apart ("[image 2]" is the second image shown).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ...head.declaration import Node, check, check_field
from ...head.errors import Category, ClefError, Problem, RequestInvalid
from ...head.schema import MEDIA_FIELDS, Limits, json_depth, option_order
from . import frames, media_kwargs
from .errors import MediaRejected, detached
from .fields import ASSET, FIELDS, FORM, KINDS, MARKER, MARKERS, either, media_declarations
from .kinds import AUDIO, IMAGE, TABLE, VIDEO, DecodeSettings, Kind, combined

_FIELDS_TEXT = either([f"`{row.field}`" for row in TABLE.values()], " and ")  # `images`, `audio` and `videos`
_SPACE = re.compile(rb"\s+")
_DATA_URL = re.compile(r"data:([^,;]*)((?:;[^,;]*)*),", re.ASCII | re.IGNORECASE)
DATA_URL_HEAD = 1024  # a data: URL's media type and parameters come within this many characters of its start


@dataclass(frozen=True)
class Media:
    """A request's media, ONE value from the body to the model: its items by kind (KINDS order), each kind in
    prompt order, and the sha256 of every medium's bytes (the answer cache's key). Checked from their headers
    (ImageInput, AudioInput) by referenced() (or extract(), the tools' way), or decoded (pixels, samples) by
    decode_kind()."""

    items: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    digests: tuple[bytes, ...] = ()

    def of(self, kind: str) -> tuple[Any, ...]:
        return self.items.get(kind, ())

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this request holds, in prompt order."""
        return tuple(kind for kind in KINDS if self.of(kind))

    @property
    def images(self) -> tuple[Any, ...]:
        return self.of(IMAGE)

    @property
    def audio(self) -> tuple[Any, ...]:
        return self.of(AUDIO)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def decoded(self, items: dict[str, tuple[Any, ...]]) -> "Media":
        """The same media, decoded: the digests stay those of the bytes."""
        return Media(items, self.digests)


NO_MEDIA = Media()

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class References:
    """A request's media as its front door found them, nothing decoded yet (the service admits the request first):
    each kind's (location, payload) in prompt order, a payload being base64 text (sized from its length only), a
    multipart part's bytes or a frame array; where the door's body holds each kind (a total's refusal); the base64
    and frame-array characters they take in the JSON (not the text that max_body_bytes caps); and media_kwargs."""

    sources: Mapping[str, tuple[tuple[Loc, Any], ...]] = field(default_factory=dict)
    held: Mapping[str, Loc] = field(default_factory=dict)  # kind -> where the body holds them all (default: body)
    inline_chars: int = 0
    options: Any = None  # media_kwargs.parse's, for the videos; None: the reference's own
    # media refused while found (a URL, a size over the limit): raised with the rest once the request is admitted
    refused: tuple[MediaRejected, ...] = ()
    named: tuple[str, ...] = ()  # the kinds the body names (named_kinds), refused ones among them: what the model
    # must take

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in KINDS if self.sources.get(kind))

    def __bool__(self) -> bool:
        return bool(self.sources or self.refused)

    @property
    def size(self) -> int:
        """Their payloads' size: characters of base64, bytes of parts and frame arrays."""
        return sum(_nbytes(payload) for kind in self.kinds for _, payload in self.of(kind))

    def of(self, kind: str) -> tuple[tuple[Loc, Any], ...]:
        return self.sources.get(kind, ())

    def loc(self, kind: str) -> Loc:
        return self.held.get(kind, ("body",))


NO_REFERENCES = References()


def found_media(items: dict[str, tuple[Any, ...]]) -> Media:
    """Media whose items carry their own digests: every medium's, in KINDS order, a kind's name between kinds (an
    image's bytes never key as audio)."""
    digests: list[bytes] = []
    for kind in (k for k in KINDS if items.get(k)):
        digests += ([kind.encode()] if kind != KINDS[0] else []) + [m.digest for m in items[kind]]
    return Media({kind: tuple(items[kind]) for kind in KINDS if items.get(kind)}, tuple(digests))


@dataclass(frozen=True)
class Extracted:
    """A request body without its media fields (placeholders replaced by markers), and its media."""

    body: Any
    media: Media
    inline_chars: int = 0  # characters of base64 taken out of the JSON (its text is what max_body_bytes caps)


class UnsupportedMediaType(ClefError):
    category = Category.UNSUPPORTED_FORMAT
    error_type = "unsupported_media_type"


@dataclass(frozen=True)
class FormPart:
    name: str
    content_type: str  # as labelled by the client; the format is judged from the bytes
    data: bytes


def named_kinds(body: Any) -> tuple[str, ...]:
    """The kinds of media a body names, in KINDS order, read from its fields alone: nothing decoded or checked, so a
    model that cannot take them refuses before any of that work (find_references() and referenced() then refuse
    what is malformed)."""
    if not isinstance(body, dict):
        return ()
    assets = body.get("assets")
    named = {_kind(a) for a in assets.values() if isinstance(a, dict) and a.get("type") in (*KINDS, None)} if (
        isinstance(assets, dict)) else set()
    return tuple(kind for kind in KINDS if kind in named or body.get(FIELDS[kind]))


def chat_images(body: Any) -> Any:
    """llama-server's chat-message state read as llama-server reads it (its server-decision.cpp parse_state): the
    state is a list of messages (or {"messages": [...]}), and every `image_url` part of a message's content is taken
    out, in order, and follows the body's own `images`: the same request as one that sent them there. Any other body
    is returned as it is."""
    if not isinstance(body, dict):
        return body
    state = body.get("state")
    wrapped = isinstance(state, dict) and "messages" in state
    messages = state["messages"] if wrapped else state
    if not isinstance(messages, list):
        return body
    found, out = [], []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        kept = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url" and "image_url" in part:
                url = part["image_url"]
                found.append(url["url"] if isinstance(url, dict) and "url" in url else url)
            else:
                kept.append(part)
        out.append({**message, "content": kept})
    images = body.get(FIELDS[IMAGE]) or []
    if not found or not isinstance(images, list):  # a malformed images field is refused as it is
        return body
    return {**body, "state": {**state, "messages": out} if wrapped else out, FIELDS[IMAGE]: [*images, *found]}


def refuse_unsupported(kinds: Sequence[str], takes: Sequence[str], model: str,
                       located: References = NO_REFERENCES) -> None:
    """A 422 for the first of these kinds of media (named_kinds) that this model cannot take (ClefModel.media), at
    its first medium where a door located it, else at its body field."""
    for kind in kinds:
        if kind not in takes:
            found = located.of(kind)
            raise TABLE[kind].refusal(model, found[0][0] if found else ("body", TABLE[kind].field))


def decode_kind(kind: str, inputs: Sequence[Any], settings: DecodeSettings) -> tuple[Any, ...]:
    """One kind's media decoded (Pillow, PyAV: run it off the event loop): pixels, samples or a video's frames and
    soundtrack (DecodedVideo), all failures at once; picklable, for a decoder in another process."""
    return TABLE[kind].decode(inputs, settings)


@dataclass(frozen=True)
class _Medium:
    """A kind's row with this server's limits on it, while finding media in a body."""

    row: Kind
    limits: Any  # its limits dataclass (ImageLimits, AudioLimits, VideoLimits)

    kind = property(lambda self: self.row.name)
    field = property(lambda self: self.row.field)
    noun = property(lambda self: self.row.noun)
    formats = property(lambda self: self.row.formats)
    count_key = property(lambda self: self.row.count_key)
    bytes_key = property(lambda self: self.row.bytes_key)
    rejected = property(lambda self: self.row.rejected)
    too_large = property(lambda self: self.row.too_large)
    content_type = property(lambda self: self.row.content_type)
    example = property(lambda self: self.row.example)
    max_count = property(lambda self: self.limits.max_count)
    max_bytes = property(lambda self: self.limits.max_bytes)


# --- finding the media ---------------------------------------------------------------------------

class _Problems(list):
    def add(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error") -> None:
        self.append(Problem(loc, msg, kind))


def _sized(n_bytes: int, loc: tuple[str | int, ...], medium: _Medium, about: str = "") -> None:
    """Refuse a medium over its max bytes from its size alone: before its base64 is decoded or its bytes parsed."""
    if n_bytes > medium.max_bytes:
        raise medium.too_large(loc, f"holds {about}{n_bytes} bytes of {medium.kind}; the limit is {medium.max_bytes} "
                                    f"bytes per {medium.noun} ({medium.bytes_key})", f"value_error.{medium.kind}.bytes")


def _b64(text: str, loc: tuple[str | int, ...], medium: _Medium) -> str:
    """base64 text refused over its medium's max bytes from its length alone (decoded later: _decoded)."""
    _sized(len(text) * 3 // 4 - text[-2:].count("="), loc, medium, "about ")  # its size, exact without whitespace
    return text


def _decoded(text: str, loc: tuple[str | int, ...], medium: _Medium) -> bytes:
    raw = text.encode("ascii", "replace")
    try:
        return base64.b64decode(_SPACE.sub(b"", raw), validate=True)
    except (binascii.Error, ValueError):
        raise medium.rejected(loc, "is not valid base64 (standard alphabet, with padding)",
                              f"value_error.{medium.kind}.base64") from None


def _inline(entry: Any, loc: tuple[str | int, ...], medium: _Medium) -> str:
    """An `images` or `audio` entry: a data: URL, bare base64, or Workers AI's {content_type, base64} object (the
    reference also fetches URLs and reads files; we don't)."""
    if isinstance(entry, dict):
        data, content_type = entry.get("base64"), entry.get("content_type")
        if not isinstance(data, str):
            raise medium.rejected(loc + ("base64",), f"an {medium.noun} object needs base64: the {medium.noun}'s bytes "
                                  "in base64 "
                                  f"(with content_type, e.g. \"{medium.content_type}\")",
                                  "missing" if data is None else "type_error")
        if content_type is not None and not (isinstance(content_type, str)
                                             and content_type.startswith(f"{medium.kind}/")):
            raise medium.rejected(loc + ("content_type",), f"content_type must name an {medium.kind} type such as "
                                  f"\"{medium.content_type}\", got {content_type!r}",
                                  f"value_error.{medium.kind}.content_type")
        return _b64(data, loc, medium)
    if not isinstance(entry, str):
        arrays = f", a frame array {frames.SHAPE}" if medium.row.array is not None else ""
        raise medium.rejected(loc, f"must be a data: URL, base64{arrays}, or an object {{\"content_type\", "
                              "\"base64\"}", "type_error")
    if entry.startswith(("http://", "https://")):
        raise medium.rejected(loc, f"is a URL; clef-bridge fetches nothing: inline the {medium.noun} as a data: URL "
                                   "or base64", f"value_error.{medium.kind}.url")
    if entry[:5].lower() == "data:":
        parsed = data_url(entry)
        if parsed is None or not parsed.base64:
            raise medium.rejected(loc, f"is a data: URL without ;base64; send {medium.example}",
                                  f"value_error.{medium.kind}.data_url")
        entry = entry[parsed.start:]
    return _b64(entry, loc, medium)


@dataclass(frozen=True)
class DataUrl:
    media_type: str  # lower case, as "image/png"
    base64: bool  # ;base64 among its parameters
    start: int  # where its data begins


def data_url(text: str) -> DataUrl | None:
    """A data: URL's head, read within its first DATA_URL_HEAD characters (the one parser of them: the bodies' and
    OpenAI's input_image); None when text is no data: URL."""
    match = _DATA_URL.match(text, 0, DATA_URL_HEAD)
    if match is None:
        return None
    return DataUrl(match.group(1).lower(), "base64" in match.group(2).lower().split(";"), match.end())


def _kind(asset: Any) -> str:
    """The medium an asset claims to be (images by default, as the Jev API's `type` is optional)."""
    kind = asset.get("type") if isinstance(asset, dict) else None
    return kind if isinstance(kind, str) and kind in TABLE else IMAGE  # any other JSON value: a 422 later, not here


def _asset(name: str, asset: Any, parts: dict[str, FormPart] | None, claimed: set[str], media: dict[str, _Medium],
           problems: _Problems) -> str | bytes | None:
    loc = ("body", "assets", name)
    if not (check(ASSET, asset, loc, problems, deep=False) and check_field(ASSET, asset, "type", loc, problems)):
        return None
    medium = media[_kind(asset)]
    part = asset.get("part")
    if part is not None:  # with part, data_base64 is ignored (the API's contract)
        if not isinstance(part, str):
            problems.add(loc + ("part",), "part must be the name of a multipart part", "type_error")
        elif parts is None:
            problems.add(loc + ("part",), f"names a part, but the request is not {FORM}: send the {medium.noun} as "
                                          "data_base64, or send the request as multipart")
        elif part not in parts:
            problems.add(loc + ("part",), f"names the part {part!r}, which the body does not hold", "missing")
        elif part in claimed:
            problems.add(loc + ("part",), f"the part {part!r} is claimed by two assets; send it once per asset")
        else:
            claimed.add(part)
            _sized(len(parts[part].data), loc, medium)
            return parts[part].data
        return None
    data, fmt = asset.get("data_base64"), asset.get("format")
    if not isinstance(data, str):
        problems.add(loc + ("data_base64",), f"an asset needs data_base64 (the {medium.noun}, base64) or, in a "
                                             "multipart request, part", "missing" if data is None else "type_error")
    elif not isinstance(fmt, str) or fmt.lower() not in medium.formats:
        problems.add(loc + ("format",), f"format is required with data_base64: one of {', '.join(medium.formats)} "
                                        f"(the {medium.noun}'s bytes decide its real format), got {fmt!r}")
    else:
        return _b64(data, loc, medium)
    return None


def _inline_strings(lists: Sequence[Any], assets: Any) -> list[str]:
    if isinstance(assets, dict) and assets:
        return [a["data_base64"] for a in assets.values()
                if isinstance(a, dict) and a.get("part") is None and isinstance(a.get("data_base64"), str)]
    entries = [entry for value in lists if isinstance(value, list) for entry in value]
    return [entry if isinstance(entry, str) else entry["base64"] for entry in entries
            if isinstance(entry, str) or (isinstance(entry, dict) and isinstance(entry.get("base64"), str))]


def _order(body: dict[str, Any], kinds: dict[str, str], max_depth: int) -> tuple[dict[str, Any], list[str]]:
    """The body with every placeholder replaced by its medium's marker, and the names in order of first reference
    (numbered per medium)."""
    names = list(kinds)
    numbers: dict[str, int] = {}
    counts = dict.fromkeys(MARKERS, 0)
    if not names or json_depth(body) > max_depth:  # parse_request refuses the too deep body
        return body, []
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))

    def number(match: re.Match) -> str:
        name = match.group(0)
        if name not in numbers:
            counts[kinds[name]] += 1
            numbers[name] = counts[kinds[name]]
        return MARKERS[kinds[name]].format(numbers[name])

    def walk(value: Any) -> Any:  # in the order the prompt renders (sort_keys JSON)
        if isinstance(value, str):
            return pattern.sub(number, value)
        if isinstance(value, dict):
            replaced = {k: walk(value[k]) for k in sorted(value)}
            return {k: replaced[k] for k in value}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    out = dict(body)
    if "state" in out:
        out["state"] = walk(out["state"])
    questions = out.get("questions")
    if isinstance(questions, dict):
        out["questions"] = {qid: _question(q, walk) for qid, q in questions.items()}
    return out, sorted(names, key=lambda n: numbers.get(n, len(names) + names.index(n)))


def _question(question: Any, walk) -> Any:
    if not isinstance(question, dict):
        return question
    out = dict(question)
    if "instructions" in out:
        out["instructions"] = walk(out["instructions"])
    criteria = out.get("criteria")
    if isinstance(criteria, dict):
        replaced = {k: walk(criteria[k]) for k in option_order(out.get("type"), criteria)}
        out["criteria"] = {k: replaced.get(k, v) for k, v in criteria.items()}
    elif isinstance(criteria, list):
        out["criteria"] = walk(criteria)
    return out


def _shape(body: dict[str, Any], media: dict[str, _Medium], declared: Mapping[str, Node]) -> _Problems:
    """The media fields' types and counts (max_images, max_audio_clips), before anything is decoded."""
    problems = _Problems()
    assets = body.get("assets")
    lists = {kind: body.get(m.field) for kind, m in media.items()}
    if assets and any(lists.values()):
        problems.add(("body",), f"send media in {_FIELDS_TEXT} or in `assets`, not both")
    for name, field_declared in declared.items():  # each optional: absent or null is none of that medium
        check(field_declared, body.get(name), ("body", name), problems, deep=False)
    if problems or not assets:
        return problems
    for kind, medium in media.items():
        _count(medium, sum(_kind(a) == kind for a in assets.values()), ("body", "assets"), problems)
    return problems


def _count(medium: _Medium, count: int, loc: tuple[str | int, ...], problems: _Problems) -> None:
    if count > medium.max_count:
        problems.add(loc, f"at most {medium.max_count} {medium.noun}s per request ({medium.count_key}), got {count}",
                     f"too_many_{medium.noun.replace(' ', '_')}s")


def _media(limits: Mapping[str, Any]) -> dict[str, _Medium]:
    """Each kind's row with the server's limits on it (its row's defaults where the server names none)."""
    return {kind: _Medium(row, limits[kind] if kind in limits else row.limits()) for kind, row in TABLE.items()}


Sources = list[tuple[tuple[str | int, ...], Any]]  # each medium's bytes, or a frame array (numpy)


def _nbytes(data: Any) -> int:
    """A medium's size: a file's bytes (or its base64's characters), or a frame array's (uint8, one byte a
    value)."""
    return data.nbytes if hasattr(data, "nbytes") else len(data)


def extract(body: Any, parts: dict[str, FormPart] | None = None, limits: Mapping[str, Any] = MappingProxyType({}),
            text_limits: Limits = Limits()) -> Extracted:
    """The body's media, each kind in prompt order, decoded from base64 and checked from their headers (the tools'
    way, all at once: the server finds them at its door and decodes them once the request is admitted)."""
    text, references = find_references(body, parts, limits, text_limits)
    return Extracted(text, referenced(references, limits), references.inline_chars)


def find_references(body: Any, parts: dict[str, FormPart] | None = None,
                    limits: Mapping[str, Any] = MappingProxyType({}),
                    text_limits: Limits = Limits()) -> tuple[Any, References]:
    """The body without its media fields (placeholders replaced by markers) and its media's references, each kind
    in prompt order, their counts and sizes checked from the body alone: no base64 decoded. parts: a multipart
    body's media parts; limits: each kind's by its name (ServerSpec.media_limits), its row's defaults where
    absent."""
    if not isinstance(body, dict):
        return body, NO_REFERENCES
    media = _media(limits)
    problems = _shape(body, media, media_declarations(limits))
    options = media_kwargs.parse(body.get(media_kwargs.FIELD), problems)
    if problems:
        raise RequestInvalid(problems)
    assets = body.get("assets")
    lists = [body.get(m.field) for m in media.values()]
    text = {k: v for k, v in body.items() if k not in MEDIA_FIELDS}
    inline = sum(len(v) for v in _inline_strings(lists, assets))
    sources: dict[str, Sources] = {kind: [] for kind in media}
    errors: list[MediaRejected] = []
    if isinstance(assets, dict) and assets:
        claimed: set[str] = set()
        if "" in assets:
            problems.add(("body", "assets", ""), "a placeholder must be a non-empty string")
        text, order = _order(text, {n: _kind(a) for n, a in assets.items() if n}, text_limits.max_json_depth)
        for name in order:
            try:
                data = _asset(name, assets[name], parts, claimed, media, problems)
            except MediaRejected as exc:
                errors.append(detached(exc))
                continue
            if data is not None:
                sources[_kind(assets[name])].append((("body", "assets", name), data))
        for name in sorted(set(parts or {}) - claimed):
            problems.add(("body", name), f"the part {name!r} is claimed by no asset: name it in an asset's `part`, "
                                         "or leave it out")
    else:
        for medium, value in zip(media.values(), lists):
            for i, entry in enumerate(value or []):
                loc = ("body", medium.field, i)
                try:
                    if isinstance(entry, list) and medium.row.array is not None:  # values, not a file: a video's frames
                        data, chars = medium.row.array(entry, loc, medium.limits)
                        inline += chars  # media, as base64 is: not the body's text that max_body_bytes caps
                    else:
                        data = _inline(entry, loc, medium)
                    sources[medium.kind].append((loc, data))
                except MediaRejected as exc:
                    errors.append(detached(exc))
        for name in sorted(parts or {}):
            problems.add(("body", name), f"the part {name!r} is claimed by no asset (this request has no assets)")
    if problems:
        raise RequestInvalid(problems + [p for e in errors for p in e.problems])
    if parts is not None and not any(sources.values()) and not errors:
        raise UnsupportedMediaType(f"a {FORM} body carries {either(list(FIELDS.values()))}; send a request without "
                                   "them as application/json")
    held = {kind: ("body", "assets" if assets else medium.field) for kind, medium in media.items()}
    return text, References({kind: tuple(found) for kind, found in sources.items() if found}, held, inline, options,
                            tuple(errors), named_kinds(body))


def located(sources: Mapping[str, Sources], limits: Mapping[str, Any], loc: Loc) -> References:
    """The references a front door found in its own shape, each kind's (location, base64) in prompt order, their
    counts and sizes checked from the body alone (loc: where the door's body holds them all)."""
    media = _media(limits)
    problems, errors = _Problems(), []
    for kind, found in sources.items():
        _count(media[kind], len(found), loc, problems)
    if problems:
        raise RequestInvalid(problems)
    kept: dict[str, Sources] = {kind: [] for kind in sources}
    for kind, found in sources.items():
        for at, text in found:
            try:
                kept[kind].append((at, _b64(text, at, media[kind])))
            except MediaRejected as exc:
                errors.append(detached(exc))
    inline = sum(len(text) for found in sources.values() for _, text in found)
    return References({kind: tuple(found) for kind, found in kept.items() if found}, dict.fromkeys(sources, loc),
                      inline, refused=tuple(errors), named=tuple(kind for kind in KINDS if sources.get(kind)))


def referenced(references: References, limits: Mapping[str, Any]) -> Media:
    """The media of an admitted request: each one's base64 decoded and hashed once, checked from its header and
    against the limits (the request's total, then each item's size), every refusal where its door found it."""
    media = _media(limits)
    errors: list[MediaRejected] = list(references.refused)
    data: dict[str, Sources] = {kind: [] for kind in references.kinds}
    for kind in references.kinds:
        for at, payload in references.of(kind):
            try:
                data[kind].append((at, _decoded(payload, at, media[kind]) if isinstance(payload, str) else payload))
            except MediaRejected as exc:
                errors.append(detached(exc))
    media_bytes = sum(_nbytes(d) for s in data.values() for _, d in s)
    found = {kind: _checked(data[kind], media[kind], media_bytes, references.loc(kind), errors) for kind in data}
    if errors:
        raise combined(errors)
    if found.get(VIDEO):
        found[VIDEO] = media_kwargs.applied(found[VIDEO], references.options)
    return found_media(found)


def _checked(sources: Sources, medium: _Medium, media_bytes: int, loc: tuple[str | int, ...],
             errors: list[MediaRejected]) -> tuple[Any, ...]:
    """A kind's media checked, cheapest first: their total (media_bytes: all the request's media), then each one
    from its header and against the limits; refusals appended to errors, detached from their frames (a kept
    traceback would hold the request's bytes)."""
    if not sources:
        return ()
    too_much = medium.row.total(sum(_nbytes(d) for _, d in sources), media_bytes, medium.limits, loc)
    if too_much is not None:
        errors.append(too_much)
    checked = []
    for loc, data in sources:
        try:
            checked.append(medium.row.inspect(loc, data, medium.limits))
        except medium.rejected as exc:
            errors.append(detached(exc))
    return tuple(checked)
