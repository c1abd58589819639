"""Image bytes to the RGB pixels Qwen3.5's vision tower sees, as the reference's processor makes them.

The format and the size come from the bytes' own header, read without decoding, so limits apply
before a single pixel is allocated (a 20000x20000 PNG of a few KB is refused from its 24-byte IHDR).
Decoding is Pillow's, as in the reference, which receives images as base64 strings: transformers'
load_image applies the EXIF orientation and `convert("RGB")`s (dropping an alpha channel, expanding
greyscale and palettes); the processor's convert_to_rgb then paints a single transparent colour (a
PNG tRNS chunk, which survives that conversion) white. The resize to the processor's grid
(`smart_resize`, bicubic) is Pillow's too. llama.cpp then receives pixels at their
final size and only normalizes them.
"""

from __future__ import annotations

import io
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ...head.errors import Problem
from .errors import MediaRejected, MediaTooLarge

PNG, JPEG, WEBP = "png", "jpeg", "webp"
PILLOW_FORMATS = {PNG: "PNG", JPEG: "JPEG", WEBP: "WEBP"}
MAX_ASPECT = 200  # the reference's smart_resize raises above this ratio


class ImageRejected(MediaRejected):
    """An image asset cannot be used (not PNG/JPEG/WebP, corrupt, or of an impossible shape)."""

    error_type = "invalid_image"

    def __init__(self, loc: tuple[str | int, ...], msg: str = "", kind: str = "value_error.image",
                 problems: list[Problem] | None = None):
        super().__init__(loc, msg, kind, problems)


class ImageTooLarge(ImageRejected, MediaTooLarge):
    """An image asset is over a configured limit (bytes or pixels)."""

    error_type = "image_too_large"


@dataclass(frozen=True)
class ImageHeader:
    format: str  # PNG, JPEG or WEBP, from the bytes
    width: int
    height: int


@dataclass(frozen=True)
class ImageLimits:
    """Cloudflare's published limits for Clef images."""

    max_images: int = 4  # per request
    max_bytes: int = 4 * 2**20  # per image, encoded
    max_total_bytes: int = 8 * 2**20  # all images of a request, encoded (after base64)
    max_pixels: int = 16 * 2**20  # per image: 4096 x 4096, Qwen3.5's own largest input

    @property
    def max_count(self) -> int:
        """Images per request (what every medium's limits name max_count)."""
        return self.max_images

    @property
    def body_bytes(self) -> int:
        """The most a request's images take in its body: base64-inflated, with room for the JSON around each."""
        return -(-self.max_total_bytes * 4 // 3) + 4096 * self.max_images


@dataclass(frozen=True)
class ImageGeometry:
    """How the processor sizes an image: Qwen3.5's preprocessor_config.json by default."""

    factor: int = 32  # patch_size 16 x merge_size 2: one token per 32x32 pixels
    min_pixels: int = 65536  # size.shortest_edge
    max_pixels: int = 16777216  # size.longest_edge

    def tokens(self, width: int, height: int) -> int:
        """The number of image tokens for an image of this (decoded, upright) size."""
        h, w = smart_resize(height, width, self)
        return (h // self.factor) * (w // self.factor)


def _be16(data: bytes, at: int) -> int:
    return struct.unpack_from(">H", data, at)[0]


def _png(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return struct.unpack_from(">II", data, 16)


# Start-of-frame markers (baseline, progressive, lossless, arithmetic); C4, C8 and CC are not frames
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}
# Markers (fill bytes included) read before the frame header: a JPEG has a few dozen (APPn, DQT, DHT; an ICC
# profile split over up to 255 APP2 segments); 4 MB of fill bytes or empty segments would cost a second here
# and again in Pillow, which walks them the same way.
MAX_JPEG_MARKERS = 1024


def _jpeg(data: bytes, loc: tuple[str | int, ...]) -> tuple[int, int] | None:
    at = 2
    for _ in range(MAX_JPEG_MARKERS):
        if at + 1 >= len(data):
            return None
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in (0xD9, 0xDA) or at + 4 > len(data):  # end of image or scan data before any frame
            return None
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            return _be16(data, at + 7), _be16(data, at + 5)
        at += 2 + _be16(data, at + 2)
    raise ImageRejected(loc, f"is a JPEG image of more than {MAX_JPEG_MARKERS} markers before its frame header; "
                             "re-encode it", "value_error.image.markers")


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack_from("<HH", data, 26)
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = struct.unpack_from("<I", data, 21)[0]
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def sniff(data: bytes, loc: tuple[str | int, ...]) -> ImageHeader:
    """The format and size from the header bytes alone (the declared format is not trusted)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        fmt, size = PNG, _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        fmt, size = JPEG, _jpeg(data, loc)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        fmt, size = WEBP, _webp(data)
    else:
        raise ImageRejected(loc, "is not a PNG, JPEG or WebP image (judged from its bytes); send one of those "
                                 "formats", "value_error.image.format")
    if size is None or min(size) <= 0:
        raise ImageRejected(loc, f"is a {fmt.upper()} image whose header is truncated or corrupt",
                            "value_error.image.corrupt")
    return ImageHeader(fmt, *size)


def check(header: ImageHeader, n_bytes: int, limits: ImageLimits, loc: tuple[str | int, ...]) -> None:
    """Refuse an image over the limits, or of a shape the model cannot take, before decoding it."""
    if n_bytes > limits.max_bytes:
        raise ImageTooLarge(loc, f"is {n_bytes} bytes; the limit is {limits.max_bytes} bytes per image "
                                 "(max_image_bytes)", "value_error.image.bytes")
    pixels = header.width * header.height
    if pixels > limits.max_pixels:
        raise ImageTooLarge(loc, f"is {header.width}x{header.height} ({pixels} pixels); the limit is "
                                 f"{limits.max_pixels} pixels per image (max_image_pixels): scale it down",
                            "value_error.image.pixels")
    if max(header.width, header.height) > MAX_ASPECT * min(header.width, header.height):
        raise ImageRejected(loc, f"is {header.width}x{header.height}; Qwen3.5's processor takes aspect ratios up to "
                                 f"{MAX_ASPECT}:1: crop or pad it", "value_error.image.aspect")


def smart_resize(height: int, width: int, geometry: ImageGeometry = ImageGeometry()) -> tuple[int, int]:
    """(height, width) the processor resizes to: multiples of factor, pixels within [min, max], same aspect."""
    f = geometry.factor
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > geometry.max_pixels:
        beta = math.sqrt(height * width / geometry.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < geometry.min_pixels:
        beta = math.sqrt(geometry.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


# What Pillow raises on a corrupt or hostile file of a format it knows
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error)


def decode(data: bytes, header: ImageHeader, loc: tuple[str | int, ...],
           geometry: ImageGeometry = ImageGeometry()) -> np.ndarray:
    """uint8 [h, w, 3] RGB at the processor's size; call check() first (this allocates the pixels)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data), formats=[PILLOW_FORMATS[header.format]]) as img:
            if img.size != (header.width, header.height):
                raise ValueError(f"the decoder reads {img.size[0]}x{img.size[1]}, the header says "
                                 f"{header.width}x{header.height}")
            img.load()
            rgb = ImageOps.exif_transpose(img).convert("RGB")
            if rgb.info.get("transparency") is not None:  # a tRNS colour survives convert("RGB") ...
                white = Image.new("RGBA", rgb.size, (255, 255, 255, 255))  # ... and the processor paints it white
                rgb = Image.alpha_composite(white, rgb.convert("RGBA")).convert("RGB")
            h, w = smart_resize(rgb.height, rgb.width, geometry)
            if (w, h) != rgb.size:
                rgb = rgb.resize((w, h), Image.Resampling.BICUBIC)
            return np.asarray(rgb, dtype=np.uint8)
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
        raise ImageRejected(loc, f"cannot be decoded as {header.format.upper()} ({exc}); re-encode it as an "
                                 "8-bit RGB PNG, JPEG or WebP", "value_error.image.corrupt") from None
