"""The media of a request body: found in its fields (the Jev API's `assets`, the reference's and Workers
AI's `images` and `audio`, the official SDK's form parts), checked from their header bytes, and decoded
(images to pixels here, audio clips to samples in audio.py).

Media go where the reference puts them, after `STATE:\\n`: all images, then all audio clips, each
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
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...head import media as media_kinds
from ...head.errors import Category, ClefError, Problem, RequestInvalid
from ...head.schema import MEDIA_FIELDS, Limits, json_depth, option_order
from ..gguf.projector import PROJECTOR_HOME
from . import audio as audio_files
from . import video as video_files
from .audio import AudioInput, AudioLimits, AudioRejected, AudioTooLarge
from .errors import MediaRejected, MediaTooLarge, detached
from .images import (
    ImageGeometry,
    ImageHeader,
    ImageLimits,
    ImageRejected,
    ImageTooLarge,
    check,
    decode,
    sniff,
)
from .video import VideoInput, VideoLimits, VideoRejected, VideoTooLarge

FORM = "multipart/form-data"

IMAGE, AUDIO = media_kinds.IMAGE.name, media_kinds.AUDIO.name  # an asset's `type`, its marker's word, a Media kind
VIDEO = media_kinds.VIDEO.name
KINDS = (IMAGE, AUDIO, VIDEO)  # the prompt's order of kinds: images, audio clips, then videos (the reference's)
FIELDS = {kind: media_kinds.MEDIA_KINDS[kind].field for kind in KINDS}  # each kind's body field and decode stage
MARKERS = {kind: f"[{kind} {{}}]" for kind in KINDS}
MARKER = MARKERS[IMAGE]
FORMATS = ("png", "jpeg", "jpg", "webp")  # what an image's `format` may declare; the bytes decide
_SPACE = re.compile(rb"\s+")
_DATA_URL = re.compile(r"data:([^,;]*)((?:;[^,;]*)*),", re.ASCII | re.IGNORECASE)
DATA_URL_HEAD = 1024  # a data: URL's media type and parameters come within this many characters of its start


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, checked from its header, not decoded yet."""

    loc: tuple[str | int, ...]
    data: bytes
    header: ImageHeader
    digest: bytes  # sha256 of the bytes: the answer cache's key


@dataclass(frozen=True)
class Media:
    """A request's media, ONE value from the body to the model: its items by kind (KINDS order), each kind in
    prompt order, and the sha256 of every medium's bytes (the answer cache's key). Found and checked from
    their headers (ImageInput, AudioInput) by extract(), or decoded (pixels, samples) by decode_kind()."""

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


def no_projector(model: str) -> RequestInvalid:
    return RequestInvalid([Problem(("body", "images"), f"model {model!r} has no vision projector, so it takes no "
                                   f"images; {PROJECTOR_HOME}", "images_not_supported")])


def no_audio(model: str) -> RequestInvalid:
    return RequestInvalid([Problem(("body", "audio"), f"model {model!r} takes no audio: it has no audio encoder "
                                   "(Clef-omni's projector has one; Clef's and Clef-flash's do not); send the audio "
                                   "to a Clef-omni model, or leave it out", "audio_not_supported")])


def no_video(model: str) -> RequestInvalid:
    return RequestInvalid([Problem(("body", "videos"), f"model {model!r} takes no videos: Clef-omni reads them "
                                   "(frames through its vision tower, the soundtrack through its audio encoder); Clef "
                                   "and Clef-flash do not: send key frames as images, or send the video to a "
                                   "Clef-omni model", media_kinds.VIDEO.error_type)])


REFUSALS = {IMAGE: no_projector, AUDIO: no_audio, VIDEO: no_video}  # a kind's 422 for a model that cannot take it


def refuse_unsupported(media: Media, takes: Sequence[str], model: str) -> None:
    """A 422 for the first kind of media this model cannot take (takes: ClefModel.media)."""
    for kind in media.kinds:
        if kind not in takes:
            raise REFUSALS[kind](model)


@dataclass(frozen=True)
class DecodeSettings:
    """What decoding needs beside the bytes: the projector's image geometry, each medium's limits by kind."""

    geometry: ImageGeometry | None
    limits: Mapping[str, Any]  # each kind's limits by its name: ServerSpec.media_limits


def decode_kind(kind: str, inputs: Sequence[Any], settings: DecodeSettings) -> tuple[Any, ...]:
    """One kind's media decoded (Pillow, PyAV: run it off the event loop): pixels, samples or a video's frames and
    soundtrack (DecodedVideo), all failures at once; picklable, for a decoder in another process."""
    if kind == IMAGE:
        return decode_all(inputs, settings.geometry)
    if kind == VIDEO:
        return video_files.decode_video_all(inputs, settings.limits[VIDEO])
    return audio_files.decode_audio_all(inputs, settings.limits[AUDIO])


@dataclass(frozen=True)
class _Medium:
    """What differs between images and audio clips while finding them in a body."""

    kind: str  # IMAGE or AUDIO
    field: str  # the list field of the reference's and Workers AI's shape
    noun: str  # one of them, in messages
    formats: tuple[str, ...]
    max_count: int
    count_key: str
    max_bytes: int
    bytes_key: str
    rejected: type[MediaRejected]
    too_large: type[MediaTooLarge]
    content_type: str  # a typical one, for messages

    @property
    def example(self) -> str:
        return f"data:{self.content_type};base64,..."


@dataclass(frozen=True)
class MediumDoc:
    """How a kind's body field is described to clients (its /openapi.json entry) and in messages."""

    noun: str  # one of them, in messages
    content_type: str  # a typical one
    formats: tuple[str, ...]  # what an asset's `format` may declare; the bytes decide
    count_key: str  # the [server] key of its count per request
    description: str


MEDIUM_DOCS = {
    IMAGE: MediumDoc("image", "image/png", FORMATS, "max_images",
                     "PNG, JPEG or WebP images as data: URLs, base64 or {content_type, base64} (the reference's and "
                     "Workers AI's shape); needs a vision projector; max_images counts the assets' images too"),
    AUDIO: MediumDoc("audio clip", "audio/wav", audio_files.FORMATS, "max_audio_clips",
                     "WAV or MP3 clips as data: URLs, base64 or {content_type, base64}, heard after the images; needs "
                     "a model with audio (x_media lists \"audio\"); max_audio_clips counts the assets' clips too"),
    VIDEO: MediumDoc("video", "video/mp4", video_files.FORMATS, "max_videos",
                     "MP4, WebM or Matroska videos as data: URLs, base64 or {content_type, base64}, seen after the "
                     "audio clips: frames at 2 fps and, when every video has one, the soundtrack; needs a model with "
                     "video (x_media lists \"video\"); max_videos counts the assets' videos too"),
}


def _media(limits: ImageLimits, audio_limits: AudioLimits, video_limits: VideoLimits) -> dict[str, _Medium]:
    image, audio, video = MEDIUM_DOCS[IMAGE], MEDIUM_DOCS[AUDIO], MEDIUM_DOCS[VIDEO]
    return {IMAGE: _Medium(IMAGE, FIELDS[IMAGE], image.noun, image.formats, limits.max_count, image.count_key,
                           limits.max_bytes, "max_image_bytes", ImageRejected, ImageTooLarge, image.content_type),
            AUDIO: _Medium(AUDIO, FIELDS[AUDIO], audio.noun, audio.formats, audio_limits.max_count,
                           audio.count_key, audio_limits.max_bytes, "max_audio_bytes", AudioRejected,
                           AudioTooLarge, audio.content_type),
            VIDEO: _Medium(VIDEO, FIELDS[VIDEO], video.noun, video.formats, video_limits.max_count, video.count_key,
                           video_limits.max_bytes, "max_video_bytes", VideoRejected, VideoTooLarge,
                           video.content_type)}


def _rejected(errors: list[MediaRejected]) -> MediaRejected:
    """Several media's problems as one error: too large (413) when every one is about size, else 422; typed by
    its medium when they share one."""
    too_large = all(isinstance(e, MediaTooLarge) for e in errors)
    for base, big in ((ImageRejected, ImageTooLarge), (AudioRejected, AudioTooLarge), (VideoRejected, VideoTooLarge),
                      (MediaRejected, MediaTooLarge)):
        if all(isinstance(e, base) for e in errors):
            return (big if too_large else base)(errors[0].loc, problems=[p for e in errors for p in e.problems])
    raise TypeError("not media errors")  # unreachable: every error is a MediaRejected


# --- finding the media ---------------------------------------------------------------------------

class _Problems(list):
    def add(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error") -> None:
        self.append(Problem(loc, msg, kind))


def _sized(n_bytes: int, loc: tuple[str | int, ...], medium: _Medium, about: str = "") -> None:
    """Refuse a medium over its max bytes from its size alone: before its base64 is decoded or its bytes parsed."""
    if n_bytes > medium.max_bytes:
        raise medium.too_large(loc, f"holds {about}{n_bytes} bytes of {medium.kind}; the limit is {medium.max_bytes} "
                                    f"bytes per {medium.noun} ({medium.bytes_key})", f"value_error.{medium.kind}.bytes")


def _b64(text: str, loc: tuple[str | int, ...], medium: _Medium) -> bytes:
    raw = text.encode("ascii", "replace")
    _sized(len(raw) * 3 // 4 - raw[-2:].count(b"="), loc, medium, "about ")  # its size, exact without whitespace
    try:
        return base64.b64decode(_SPACE.sub(b"", raw), validate=True)
    except (binascii.Error, ValueError):
        raise medium.rejected(loc, "is not valid base64 (standard alphabet, with padding)",
                              f"value_error.{medium.kind}.base64") from None


def _inline(entry: Any, loc: tuple[str | int, ...], medium: _Medium) -> bytes:
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
        raise medium.rejected(loc, "must be a data: URL, base64, or an object {\"content_type\", \"base64\"}",
                              "type_error")
    if entry.startswith(("http://", "https://")):
        raise medium.rejected(loc, f"is a URL; clef-bridge fetches nothing: inline the {medium.noun} as a data: URL "
                                   "or base64", f"value_error.{medium.kind}.url")
    if entry[:5].lower() == "data:":
        match = _DATA_URL.match(entry, 0, DATA_URL_HEAD)
        if match is None or "base64" not in match.group(2).lower().split(";"):
            raise medium.rejected(loc, f"is a data: URL without ;base64; send {medium.example}",
                                  f"value_error.{medium.kind}.data_url")
        entry = entry[match.end():]
    return _b64(entry, loc, medium)


def _kind(asset: Any) -> str:
    """The medium an asset claims to be (images by default, as the Jev API's `type` is optional)."""
    kind = asset.get("type") if isinstance(asset, dict) else None
    return kind if kind in (AUDIO, VIDEO) else IMAGE


def _asset(name: str, asset: Any, parts: dict[str, FormPart] | None, claimed: set[str], media: dict[str, _Medium],
           problems: _Problems) -> bytes | None:
    loc = ("body", "assets", name)
    if not isinstance(asset, dict):
        problems.add(loc, "an asset must be an object: {\"type\": \"image\", \"audio\" or \"video\", \"format\", "
                          "\"data_base64\"} "
                          f"or, in a {FORM} request, {{\"type\", \"part\"}}", "type_error")
        return None
    if asset.get("type") not in (*KINDS, None):
        problems.add(loc + ("type",), f"type must be \"image\", \"audio\" or \"video\", got {asset.get('type')!r}")
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


def _shape(body: dict[str, Any], media: dict[str, _Medium]) -> _Problems:
    """The media fields' types and counts (max_images, max_audio_clips), before anything is decoded."""
    problems = _Problems()
    assets = body.get("assets")
    lists = {kind: body.get(m.field) for kind, m in media.items()}
    if assets and any(lists.values()):
        problems.add(("body",), "send media in `images`, `audio` and `videos` or in `assets`, not both")
    for kind, value in lists.items():
        if value is not None and not isinstance(value, list):
            problems.add(("body", media[kind].field), f"{media[kind].field} must be an array of data: URLs, base64 "
                         "strings or {\"content_type\", \"base64\"} objects", "type_error")
    if assets is not None and not isinstance(assets, dict):
        problems.add(("body", "assets"), "assets must be an object of placeholder -> asset", "type_error")
    if problems:
        return problems
    for kind, medium in media.items():
        count = sum(_kind(a) == kind for a in assets.values()) if assets else len(lists[kind] or [])
        if count > medium.max_count:
            problems.add(("body", "assets" if assets else medium.field), f"at most {medium.max_count} "
                         f"{medium.noun}s per request ({medium.count_key}), got {count}",
                         f"too_many_{medium.noun.replace(' ', '_')}s")
    return problems


def extract(body: Any, parts: dict[str, FormPart] | None, limits: ImageLimits, text_limits: Limits = Limits(),
            audio_limits: AudioLimits = AudioLimits(), video_limits: VideoLimits = VideoLimits()) -> Extracted:
    """The body's media, each kind in prompt order, checked from their headers; parts: a multipart body's media
    parts."""
    if not isinstance(body, dict):
        return Extracted(body, NO_MEDIA)
    media = _media(limits, audio_limits, video_limits)
    problems = _shape(body, media)
    if problems:
        raise RequestInvalid(problems)
    assets = body.get("assets")
    lists = [body.get(m.field) for m in media.values()]
    text = {k: v for k, v in body.items() if k not in MEDIA_FIELDS}
    inline = sum(len(v) for v in _inline_strings(lists, assets))
    sources: dict[str, list[tuple[tuple[str | int, ...], bytes]]] = {kind: [] for kind in media}
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
                    sources[medium.kind].append((loc, _inline(entry, loc, medium)))
                except MediaRejected as exc:
                    errors.append(detached(exc))
        for name in sorted(parts or {}):
            problems.add(("body", name), f"the part {name!r} is claimed by no asset (this request has no assets)")
    if problems:
        raise RequestInvalid(problems + [p for e in errors for p in e.problems])
    images = _images(sources[IMAGE], limits, errors, "assets" if assets else "images")
    clips = _clips(sources[AUDIO], audio_limits, errors)
    videos = _videos(sources[VIDEO], video_limits, errors, sum(len(d) for s in sources.values() for _, d in s),
                     "assets" if assets else FIELDS[VIDEO])
    if errors:
        raise _rejected(errors)
    if parts is not None and not images and not clips and not videos:
        raise UnsupportedMediaType(f"a {FORM} body carries images, audio or videos; send a request without them as "
                                   "application/json")
    return Extracted(text, found_media({IMAGE: images, AUDIO: clips, VIDEO: videos}), inline)


Sources = list[tuple[tuple[str | int, ...], bytes]]


def _checked(sources: Sources, inspect: Callable[[tuple[str | int, ...], bytes], Any], rejected: type[MediaRejected],
             errors: list[MediaRejected]) -> tuple[Any, ...]:
    """Each medium checked from its header and against the limits by inspect (loc, bytes -> its input); refusals
    appended to errors, detached from their frames (a kept traceback would hold the request's bytes)."""
    checked = []
    for loc, data in sources:
        try:
            checked.append(inspect(loc, data))
        except rejected as exc:
            errors.append(detached(exc))
    return tuple(checked)


def _image(loc: tuple[str | int, ...], data: bytes, limits: ImageLimits) -> ImageInput:
    header = sniff(data, loc)
    check(header, len(data), limits, loc)
    return ImageInput(loc, data, header, hashlib.sha256(data).digest())


def _clip(loc: tuple[str | int, ...], data: bytes, limits: AudioLimits) -> AudioInput:
    audio_files.check_bytes(len(data), limits, loc)  # before anything parses the bytes
    header = audio_files.sniff(data, loc, limits)
    audio_files.check(header, len(data), limits, loc)
    return AudioInput(loc, data, header, hashlib.sha256(data).digest())


def _video(loc: tuple[str | int, ...], data: bytes, limits: VideoLimits) -> VideoInput:
    header = video_files.sniff(data, loc)
    video_files.check(header, len(data), limits, loc)
    return VideoInput(loc, data, header, hashlib.sha256(data).digest())


def _images(sources: Sources, limits: ImageLimits, errors: list[MediaRejected], field: str) -> tuple[ImageInput, ...]:
    """The images checked from their headers and against the limits; problems appended to errors."""
    checked = _checked(sources, lambda loc, data: _image(loc, data, limits), ImageRejected, errors)
    total = sum(len(d) for _, d in sources)
    if total > limits.max_total_bytes:
        errors.append(ImageTooLarge(("body", field), f"the images hold {total} bytes together; the limit is "
                                    f"{limits.max_total_bytes} bytes per request (max_image_total_bytes)",
                                    "value_error.image.total_bytes"))
    return checked


def _clips(sources: Sources, limits: AudioLimits, errors: list[MediaRejected]) -> tuple[AudioInput, ...]:
    """The audio clips checked from their headers and against the limits; problems appended to errors."""
    return _checked(sources, lambda loc, data: _clip(loc, data, limits), AudioRejected, errors)


def _videos(sources: Sources, limits: VideoLimits, errors: list[MediaRejected], media_bytes: int,
            field: str) -> tuple[VideoInput, ...]:
    """The videos checked from their container headers and against the limits (media_bytes: all the request's media
    together); problems appended to errors."""
    if sources and media_bytes > limits.max_media_bytes:
        errors.append(VideoTooLarge(("body", field), f"the media of this request hold {media_bytes} bytes together; "
                                    f"with videos the limit is {limits.max_media_bytes} bytes (max_media_bytes)",
                                    "value_error.video.total_bytes"))
    return _checked(sources, lambda loc, data: _video(loc, data, limits), VideoRejected, errors)


def decode_all(images: Sequence[ImageInput], geometry: ImageGeometry) -> tuple[np.ndarray, ...]:
    """Every image's pixels at the projector's size (Pillow; run it off the event loop); all failures at once."""
    pixels, errors = [], []
    for image in images:
        try:
            pixels.append(decode(image.data, image.header, image.loc, geometry))
        except ImageRejected as exc:
            errors.append(detached(exc))
    if errors:
        raise _rejected(errors)
    return tuple(pixels)
