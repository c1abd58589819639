"""The media of a request body: found in its fields (the Jev API's `assets`, the reference's and Workers
AI's `images`, the official SDK's form parts), checked from their header bytes, and decoded to pixels.

Images go where the reference puts them, after `STATE:\\n`, in order of first reference: the prompt's
order (the state as rendered, then each question's instructions and criteria), then assets that no
text names, in their `assets` order. Every placeholder inside a string of the state, the instructions
or the criteria becomes MARKER with the image's number, so the text reads the same whatever random
placeholder a client picked (answers, and the answer cache, do not move with it), stays a few plain
tokens (never a control token), and can tell images apart ("[image 2]" is the second image shown).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...head.errors import ClefError, Problem, RequestInvalid
from ...head.schema import Limits, json_depth, option_order
from ..gguf.projector import PROJECTOR_HOME
from .images import (
    ImageGeometry,
    ImageHeader,
    ImageLimits,
    ImageRejected,
    ImageTooLarge,
    check,
    decode,
    rejected,
    sniff,
)

FORM = "multipart/form-data"

MARKER = "[image {}]"
FORMATS = ("png", "jpeg", "jpg", "webp")  # what `format` may declare; the bytes decide
NO_VIDEO = ("videos are not supported: Qwen3.5's video path through llama.cpp is not proven equal to the "
            "reference's; send key frames as images")
_SPACE = re.compile(rb"\s+")
_DATA_URL = re.compile(r"data:([^,;]*)((?:;[^,;]*)*),", re.ASCII)


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, checked from its header, not decoded yet."""

    loc: tuple[str | int, ...]
    data: bytes
    header: ImageHeader
    digest: bytes  # sha256 of the bytes: the answer cache's key


@dataclass(frozen=True)
class Media:
    """A request body without its media fields (placeholders replaced by markers), and its images in prompt order."""

    body: Any
    images: tuple[ImageInput, ...]
    inline_chars: int = 0  # characters of base64 taken out of the JSON (its text is what max_body_bytes caps)


class UnsupportedMediaType(ClefError):
    error_type = "unsupported_media_type"


@dataclass(frozen=True)
class FormPart:
    name: str
    content_type: str  # as labelled by the client; the image format is judged from the bytes
    data: bytes


def no_projector(model: str) -> RequestInvalid:
    return RequestInvalid([Problem(("body", "images"), f"model {model!r} has no vision projector, so it takes no "
                                   f"images; {PROJECTOR_HOME}", "images_not_supported")])


def no_audio(model: str) -> RequestInvalid:
    return RequestInvalid([Problem(("body", "audio"), f"model {model!r} takes no audio: it has no audio encoder "
                                   "(Clef-omni's projector has one; Clef's and Clef-flash's do not); send the audio "
                                   "to a Clef-omni model, or leave it out", "audio_not_supported")])


# --- finding the images ------------------------------------------------------------------------

class _Problems(list):
    def add(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error") -> None:
        self.append(Problem(loc, msg, kind))


def _b64(text: str, loc: tuple[str | int, ...], limits: ImageLimits) -> bytes:
    raw = text.encode("ascii", "replace")
    if len(raw) * 3 // 4 > limits.max_bytes + 2:  # refused before decoding
        raise ImageTooLarge(loc, f"holds about {len(raw) * 3 // 4} bytes of image; the limit is {limits.max_bytes} "
                                 "bytes per image (max_image_bytes)", "value_error.image.bytes")
    try:
        return base64.b64decode(_SPACE.sub(b"", raw), validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected(loc, "is not valid base64 (standard alphabet, with padding)",
                            "value_error.image.base64") from None


def _from_url(entry: Any, loc: tuple[str | int, ...], limits: ImageLimits) -> bytes:
    """An `images` entry: a data: URL or bare base64 (the reference also fetches URLs and reads files; we don't)."""
    if not isinstance(entry, str):
        raise ImageRejected(loc, "must be a string: a data: URL or base64", "type_error")
    if entry.startswith(("http://", "https://")):
        raise ImageRejected(loc, "is a URL; clef-bridge fetches nothing: inline the image as a data: URL or base64",
                            "value_error.image.url")
    if entry.startswith("data:"):
        match = _DATA_URL.match(entry)
        if match is None or "base64" not in match.group(2).split(";"):
            raise ImageRejected(loc, "is a data: URL without ;base64; send data:image/png;base64,...",
                                "value_error.image.data_url")
        entry = entry[match.end():]
    return _b64(entry, loc, limits)


def _asset(name: str, asset: Any, parts: dict[str, FormPart] | None, claimed: set[str], limits: ImageLimits,
           problems: _Problems) -> bytes | None:
    loc = ("body", "assets", name)
    if not isinstance(asset, dict):
        problems.add(loc, "an asset must be an object: {\"type\": \"image\", \"format\", \"data_base64\"} or, in a "
                          f"{FORM} request, {{\"type\": \"image\", \"part\"}}", "type_error")
        return None
    if asset.get("type") == "video":
        problems.add(loc + ("type",), NO_VIDEO, "videos_not_supported")
        return None
    if asset.get("type") not in ("image", None):
        problems.add(loc + ("type",), f"type must be \"image\", got {asset.get('type')!r}")
        return None
    part = asset.get("part")
    if part is not None:  # with part, data_base64 is ignored (the API's contract)
        if not isinstance(part, str):
            problems.add(loc + ("part",), "part must be the name of a multipart part", "type_error")
        elif parts is None:
            problems.add(loc + ("part",), f"names a part, but the request is not {FORM}: send the image as "
                                          "data_base64, or send the request as multipart")
        elif part not in parts:
            problems.add(loc + ("part",), f"names the part {part!r}, which the body does not hold", "missing")
        elif part in claimed:
            problems.add(loc + ("part",), f"the part {part!r} is claimed by two assets; send it once per asset")
        else:
            claimed.add(part)
            return parts[part].data
        return None
    data, fmt = asset.get("data_base64"), asset.get("format")
    if not isinstance(data, str):
        problems.add(loc + ("data_base64",), "an asset needs data_base64 (the image, base64) or, in a multipart "
                                             "request, part", "missing" if data is None else "type_error")
    elif not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        problems.add(loc + ("format",), f"format is required with data_base64: one of {', '.join(FORMATS)} (the "
                                        f"image's bytes decide its real format), got {fmt!r}")
    else:
        return _b64(data, loc, limits)
    return None


def _inline_strings(images: Any, assets: Any) -> list[str]:
    if isinstance(assets, dict) and assets:
        return [a["data_base64"] for a in assets.values()
                if isinstance(a, dict) and a.get("part") is None and isinstance(a.get("data_base64"), str)]
    return [entry for entry in images or [] if isinstance(entry, str)]


def _order(body: dict[str, Any], names: Sequence[str], max_depth: int) -> tuple[dict[str, Any], list[str]]:
    """The body with every placeholder replaced by its image's marker, and the names in order of first reference."""
    numbers: dict[str, int] = {}
    if not names or json_depth(body) > max_depth:  # parse_request refuses the too deep body
        return body, []
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))

    def number(match: re.Match) -> str:
        return MARKER.format(numbers.setdefault(match.group(0), len(numbers) + 1))

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


def extract(body: Any, parts: dict[str, FormPart] | None, limits: ImageLimits,
            text_limits: Limits = Limits()) -> Media:
    """The body's images, in prompt order, checked from their headers; parts: a multipart body's image parts."""
    if not isinstance(body, dict):
        return Media(body, ())
    problems = _Problems()
    if body.get("videos"):
        problems.add(("body", "videos"), NO_VIDEO, "videos_not_supported")
    images, assets = body.get("images"), body.get("assets")
    if images and assets:
        problems.add(("body",), "send images in `images` or in `assets`, not both")
    if images is not None and not isinstance(images, list):
        problems.add(("body", "images"), "images must be an array of data: URLs or base64 strings", "type_error")
    if assets is not None and not isinstance(assets, dict):
        problems.add(("body", "assets"), "assets must be an object of placeholder -> asset", "type_error")
    count = len(images or assets or []) if not problems else 0
    if count > limits.max_images:
        problems.add(("body", "images" if images else "assets"), f"at most {limits.max_images} images per request "
                     f"(max_images), got {count}", "too_many_images")
    if problems:
        raise RequestInvalid(problems)
    text = {k: v for k, v in body.items() if k not in ("images", "assets", "videos")}
    inline = sum(len(v) for v in _inline_strings(images, assets))
    sources: list[tuple[tuple[str | int, ...], bytes]] = []
    errors: list[ImageRejected] = []
    if isinstance(assets, dict) and assets:
        claimed: set[str] = set()
        if "" in assets:
            problems.add(("body", "assets", ""), "a placeholder must be a non-empty string")
        text, order = _order(text, [n for n in assets if n], text_limits.max_json_depth)
        for name in order:
            try:
                data = _asset(name, assets[name], parts, claimed, limits, problems)
            except ImageRejected as exc:
                errors.append(exc)
                continue
            if data is not None:
                sources.append((("body", "assets", name), data))
        for name in sorted(set(parts or {}) - claimed):
            problems.add(("body", name), f"the part {name!r} is claimed by no asset: name it in an asset's `part`, "
                                         "or leave it out")
    else:
        for i, entry in enumerate(images or []):
            try:
                sources.append((("body", "images", i), _from_url(entry, ("body", "images", i), limits)))
            except ImageRejected as exc:
                errors.append(exc)
        for name in sorted(parts or {}):
            problems.add(("body", name), f"the part {name!r} is claimed by no asset (this request has no assets)")
    if problems:
        raise RequestInvalid(problems + [p for e in errors for p in e.problems])
    checked = []
    for loc, data in sources:
        try:
            header = sniff(data, loc)
            check(header, len(data), limits, loc)
            checked.append(ImageInput(loc, data, header, hashlib.sha256(data).digest()))
        except ImageRejected as exc:
            errors.append(exc)
    total = sum(len(d) for _, d in sources)
    if total > limits.max_total_bytes:
        field = "assets" if isinstance(assets, dict) and assets else "images"
        errors.append(ImageTooLarge(("body", field), f"the images hold {total} bytes together; the limit is "
                                    f"{limits.max_total_bytes} bytes per request (max_image_total_bytes)",
                                    "value_error.image.total_bytes"))
    if errors:
        raise rejected(errors)
    if parts is not None and not checked:
        raise UnsupportedMediaType(f"a {FORM} body carries images; send a request without images as "
                                   "application/json")
    return Media(text, tuple(checked), inline)


def decode_all(images: Sequence[ImageInput], geometry: ImageGeometry) -> tuple[np.ndarray, ...]:
    """Every image's pixels at the projector's size (Pillow; run it off the event loop); all failures at once."""
    pixels, errors = [], []
    for image in images:
        try:
            pixels.append(decode(image.data, image.header, image.loc, geometry))
        except ImageRejected as exc:
            errors.append(exc)
    if errors:
        raise rejected(errors)
    return tuple(pixels)


