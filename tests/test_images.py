"""Image assets: format and size from the header bytes, limits before decoding, and pixels equal to
the reference's processor (transformers' Qwen2VLImageProcessorPil with Qwen3.5's settings, fed the
base64 data URL as the reference's systemone receives it)."""

from __future__ import annotations

import math
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from clef_bridge.bridge.media.images import (
    ImageGeometry,
    ImageLimits,
    ImageRejected,
    ImageTooLarge,
    check,
    decode,
    smart_resize,
    sniff,
)

from .fixturegen_vision import QWEN35_IMAGE_PROCESSOR, data_url, encoded, image_processor, picture

pytestmark = pytest.mark.integration  # the reference processors of transformers: seconds to import

PIL = pytest.importorskip("PIL.Image")
LOC = ("body", "assets", "receipt")

FORMATS = [  # (mode, format, save options)
    ("RGB", "PNG", {}), ("RGBA", "PNG", {}), ("L", "PNG", {}), ("LA", "PNG", {}), ("P", "PNG", {}),
    ("RGB", "JPEG", {"quality": 90}), ("L", "JPEG", {}), ("RGB", "JPEG", {"progressive": True}),
    ("RGB", "WEBP", {"quality": 80}), ("RGB", "WEBP", {"lossless": True}), ("RGBA", "WEBP", {"quality": 80}),
]


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def png_bomb(side: int) -> bytes:
    """A real PNG of side x side black 1-bit pixels: tens of KB on the wire, side^2 * 3 bytes as RGB."""
    row = b"\x00" * (1 + (side + 7) // 8)
    body = zlib.compress(row * side, 9)
    idat = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return png_header(side, side) + idat + struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))


@pytest.mark.parametrize("mode,fmt,save", FORMATS)
@pytest.mark.parametrize("size", [(37, 20), (640, 480), (1, 300)])
def test_header_gives_format_and_size(mode, fmt, save, size):
    data = encoded(picture(*size, mode=mode), fmt, **save)
    header = sniff(data, LOC)
    assert header.format == fmt.lower()
    assert (header.width, header.height) == size == PIL.open(__import__("io").BytesIO(data)).size


def test_webp_extended_header():
    exif = PIL.Exif()
    exif[0x0112] = 6
    data = encoded(picture(300, 200), "WEBP", exif=exif)
    assert data[12:16] == b"VP8X"
    assert (sniff(data, LOC).width, sniff(data, LOC).height) == (300, 200)


@pytest.mark.parametrize("data,kind", [
    (b"", "format"), (b"hello world, not an image", "format"),
    (encoded(picture(20, 20), "GIF"), "format"), (encoded(picture(20, 20), "BMP"), "format"),
    (png_header(20, 20)[:20], "corrupt"), (png_header(0, 20), "corrupt"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 20, "corrupt"),  # no frame header
    (encoded(picture(20, 20), "JPEG")[:30], "corrupt"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 \x00", "corrupt"),
])
def test_unusable_bytes_are_refused_naming_the_asset(data, kind):
    with pytest.raises(ImageRejected) as err:
        sniff(data, LOC)
    assert err.value.problems[0].loc == LOC
    assert err.value.problems[0].type == f"value_error.image.{kind}"
    assert not isinstance(err.value, ImageTooLarge)


def test_png_bomb_is_refused_from_its_header_without_allocating():
    bomb = png_bomb(20000)
    assert len(bomb) < 200_000  # 1.2 GB of RGB pixels once decoded
    tracemalloc.start()
    try:
        header = sniff(bomb, LOC)
        with pytest.raises(ImageTooLarge) as err:
            check(header, len(bomb), ImageLimits(), LOC)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (header.width, header.height) == (20000, 20000)
    assert peak < 64 * 1024
    assert err.value.problems[0].loc == LOC and "400000000 pixels" in err.value.problems[0].msg


def test_limits():
    limits = ImageLimits()
    header = sniff(encoded(picture(1600, 8), "PNG"), LOC)
    check(header, 1000, limits, LOC)
    with pytest.raises(ImageTooLarge, match="bytes per image"):
        check(header, limits.max_bytes + 1, limits, LOC)
    with pytest.raises(ImageTooLarge, match="pixels per image"):
        check(sniff(png_header(4097, 4096), LOC), 100, limits, LOC)
    check(sniff(png_header(4096, 4096), LOC), 100, limits, LOC)  # 16 MiB pixels: the limit itself passes
    with pytest.raises(ImageRejected, match="aspect ratios up to 200") as err:
        check(sniff(png_header(2010, 10), LOC), 100, limits, LOC)
    assert not isinstance(err.value, ImageTooLarge)
    check(sniff(png_header(2000, 10), LOC), 100, limits, LOC)


@pytest.mark.parametrize("seed", range(3))
def test_smart_resize_is_the_processors(seed):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference

    rng = np.random.default_rng(seed)
    geometries = [ImageGeometry(), ImageGeometry(32, 64 * 1024, 256 * 1024), ImageGeometry(28, 56 * 56, 28 * 28 * 1280)]
    for g in geometries:
        for h, w in rng.integers(1, 6000, (300, 2)):
            if max(h, w) / min(h, w) > 200:
                continue
            assert smart_resize(int(h), int(w), g) == reference(int(h), int(w), g.factor, g.min_pixels, g.max_pixels)


def reference_pixels(data: bytes, **overrides) -> np.ndarray:
    """The processor's pixels for a data URL, un-patchified and un-normalized back to uint8 [h, w, 3]."""
    proc = image_processor(**overrides)
    out = proc(images=[data_url(data)], return_tensors="np")
    _, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    p, m, c = proc.patch_size, proc.merge_size, 3
    x = out["pixel_values"].reshape(gh // m, gw // m, m, m, c, 2, p, p)[..., 0, :, :]  # both temporal copies equal
    x = x.transpose(4, 0, 2, 5, 1, 3, 6).reshape(c, gh * p, gw * p)  # back to [C, H, W]
    return np.rint((x * 0.5 + 0.5) * 255).astype(np.int64).transpose(1, 2, 0)


def rotated_jpeg() -> bytes:
    exif = PIL.Exif()
    exif[0x0112] = 6  # stored landscape, shown portrait
    return encoded(picture(320, 224), "JPEG", exif=exif, quality=95)


FEW_COLOURS = picture(256, 256).quantize(8).convert("RGB")
PIXEL_CASES = {
    "rgb-png-exact": encoded(picture(320, 256), "PNG"),  # multiples of 32 within limits: no resize
    "rgb-png-upscale": encoded(picture(300, 200), "PNG"),  # below 65,536 pixels: scaled up
    "rgb-png-round": encoded(picture(700, 333), "PNG"),  # rounded to multiples of 32
    "rgba-png": encoded(picture(256, 300, "RGBA"), "PNG"),
    "la-png": encoded(picture(256, 256, "LA"), "PNG"),
    "grey-png": encoded(picture(400, 250, "L"), "PNG"),
    "palette-transparency-png": encoded(picture(256, 256, "P"), "PNG"),
    "rgb-trns-png": encoded(FEW_COLOURS, "PNG", transparency=FEW_COLOURS.getpixel((0, 0))),
    "grey-trns-png": encoded(picture(256, 256, "L").point(lambda v: v // 32 * 32), "PNG", transparency=64),
    "grey-jpeg": encoded(picture(512, 288, "L"), "JPEG"),
    "rgb-jpeg-progressive": encoded(picture(333, 444), "JPEG", progressive=True),
    "exif-rotated-jpeg": rotated_jpeg(),
    "rgba-webp": encoded(picture(260, 270, "RGBA"), "WEBP", quality=70),
    "rgb-webp-lossless": encoded(picture(256, 320), "WEBP", lossless=True),
}


@pytest.mark.parametrize("name", PIXEL_CASES)
def test_pixels_are_the_reference_processors(name):
    data = PIXEL_CASES[name]
    ours = decode(data, sniff(data, LOC), LOC)
    want = reference_pixels(data)
    assert ours.dtype == np.uint8 and ours.shape == want.shape
    assert np.array_equal(ours, want)
    if name == "exif-rotated-jpeg":
        assert ours.shape[:2] == (320, 224)  # upright, as load_image's exif_transpose makes it


def test_downscaling_is_the_reference_processors():
    """A smaller max_pixels makes both shrink the picture (bicubic with Pillow's antialiasing support)."""
    small = {"size": {"shortest_edge": 64 * 1024, "longest_edge": 128 * 1024}}
    geometry = ImageGeometry(32, 64 * 1024, 128 * 1024)
    for data in (encoded(picture(1000, 700), "PNG"), encoded(picture(900, 900, "RGBA"), "WEBP", quality=90)):
        ours = decode(data, sniff(data, LOC), LOC, geometry)
        assert ours.shape[0] * ours.shape[1] <= 128 * 1024
        assert np.array_equal(ours, reference_pixels(data, **small))
    assert QWEN35_IMAGE_PROCESSOR["size"] != small["size"]


def test_corrupt_body_is_refused_naming_the_asset():
    good = encoded(picture(300, 300), "PNG")
    for data in (good[: len(good) // 2], good[:40] + bytes(len(good) - 40), encoded(picture(300, 300), "JPEG")[:200]):
        header = sniff(data, LOC)
        with pytest.raises(ImageRejected, match="cannot be decoded") as err:
            decode(data, header, LOC)
        assert err.value.problems[0].loc == LOC


def test_header_and_decoder_must_agree():
    data = bytearray(encoded(picture(64, 48), "PNG"))
    data[16:24] = struct.pack(">II", 48, 64)  # IHDR says 48x64 (its CRC now fails too)
    with pytest.raises(ImageRejected):
        decode(bytes(data), sniff(bytes(data), LOC), LOC)


def test_token_counts():
    g = ImageGeometry()
    assert g.tokens(256, 256) == 64  # the minimum: 65,536 pixels
    assert g.tokens(300, 200) == 70  # scaled up to 320 x 224
    assert g.tokens(4096, 4096) == 16384
    assert g.tokens(1000, 700) == math.prod(smart_resize(700, 1000)) // 1024
