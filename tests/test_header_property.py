"""Every header reader, on ANY bytes, returns its header or raises its typed refusal (MediaRejected: a 4xx), and
quickly: random bytes and real headers mutated byte by byte, spliced and grown (issue 50: a Matroska
TimestampScale of 2^1600 raised OverflowError, a 7,225-digit width ValueError, a version-1 mdhd box of 24 bytes
struct.error, all answered 500; two 4 MB integers multiplied for 44 s with the GIL held). `check` takes whatever
`sniff` returned and refuses or passes it the same way."""

from __future__ import annotations

import struct
import time

import pytest
from clef_bridge.bridge.media import audio, images, video
from clef_bridge.bridge.media.errors import MediaRejected
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_media_headers import wav
from .test_video_headers import box, ebml, mkv, mp4

pytestmark = pytest.mark.unit

LOC = ("body", "x", 0)
PNG = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 640, 480) + bytes(5)
JPEG = b"\xff\xd8\xff\xc0" + struct.pack(">HBHHB", 11, 8, 480, 640, 3) + bytes(9) + b"\xff\xd9"
WEBP = b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + struct.pack("<I", 10) + bytes(6) + struct.pack("<HH", 640, 480)
MP3 = bytes.fromhex("fffb9064") + bytes(413)
REAL = [mp4(2.0, 640, 480, 24, 100, mdat=2400), mkv(2.0, 640, 480, 25.0), wav(), PNG, JPEG, WEBP, MP3 * 3]


def read(data: bytes) -> None:
    """Each reader and its check, as the service runs them: a header or a MediaRejected, nothing else."""
    for sniff, check, limits in ((video.sniff, video.check, video.VideoLimits()),
                                 (images.sniff, images.check, images.ImageLimits()),
                                 (lambda d, loc: audio.sniff(d, loc, audio.AudioLimits()), audio.check,
                                  audio.AudioLimits())):
        try:
            header = sniff(data, LOC)
        except MediaRejected as exc:
            assert exc.problems and len(str(exc)) < 4096
            continue
        try:
            check(header, len(data), limits, LOC)
        except MediaRejected as exc:
            assert len(str(exc)) < 4096


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(REAL)))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["set", "insert", "cut", "grow"]))
        at = draw(st.integers(0, len(data)))
        if op == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(max_size=16))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 32))]
        else:  # a field grown huge: many 0xff or 0x01 bytes where a small integer was
            data[at:at] = bytes([draw(st.sampled_from([0x01, 0xFF]))]) * draw(st.integers(8, 4096))
    return bytes(data)


@st.composite
def structured(draw) -> bytes:
    """Well-formed containers whose fields hold any bytes: integer elements of any length, durations of any bits,
    MP4 boxes of any version and length."""
    field = st.one_of(st.binary(max_size=16), st.integers(9, 4000).map(lambda n: b"\x7f" * n))
    if draw(st.booleans()):
        info = ebml(0x2AD7B1, draw(field)) + ebml(0x4489, draw(st.binary(min_size=8, max_size=8)))
        return mkv_with(info, ebml(0xB0, draw(field)) + ebml(0xBA, draw(field)), ebml(0x23E383, draw(field)))
    version = bytes([draw(st.sampled_from([0, 1, 2]))])
    mvhd = box(b"mvhd", version + draw(st.binary(max_size=40)))
    mdhd = box(b"mdhd", version + draw(st.binary(max_size=40)))
    tkhd = box(b"tkhd", draw(st.binary(max_size=90)))
    stsz = box(b"stsz", draw(st.binary(max_size=40)))
    hdlr = box(b"hdlr", bytes(8), b"vide", bytes(13))
    trak = box(b"trak", tkhd, box(b"mdia", hdlr, box(b"minf", box(b"stbl", stsz)), mdhd))
    return box(b"ftyp", b"isom", bytes(4)) + box(b"moov", mvhd, trak)  # mdhd last: nothing to read past it


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=512), mutated(), structured()))
def test_any_bytes_are_read_or_refused_by_every_reader(data):
    t0 = time.perf_counter()
    read(data)
    assert time.perf_counter() - t0 < 2.0  # generous: a reader's work is bounded by its bytes, not their values


def uint_element(ident: int, value_bytes: bytes) -> bytes:
    return ebml(ident, value_bytes)


def mkv_with(info: bytes = b"", video_fields: bytes = b"", track_fields: bytes = b"") -> bytes:
    track = ebml(0xAE, ebml(0x83, b"\x01") + track_fields + ebml(0xE0, video_fields))
    return ebml(0x1A45DFA3, ebml(0x4282, b"webm")) + ebml(0x18538067, ebml(0x1549A966, info) + ebml(0x1654AE6B, track))


@pytest.mark.parametrize("data", [
    mkv_with(info=ebml(0x2AD7B1, (1 << 1600).to_bytes(201, "big")) + ebml(0x4489, struct.pack(">d", 2000.0))),
    mkv_with(track_fields=ebml(0x23E383, (1 << 1600).to_bytes(201, "big"))),
    mkv_with(video_fields=ebml(0xB0, b"\x7f" * 3001) + ebml(0xBA, b"\x01\xe0")),
    mkv_with(video_fields=ebml(0xB0, b"\xff" * 4_000_000) + ebml(0xBA, b"\xff" * 4_000_000)),
    mkv_with(info=ebml(0x4489, struct.pack(">d", float("nan")))),
    mkv_with(info=ebml(0x4489, struct.pack(">d", float("inf")))),
], ids=["timestamp_scale_2^1600", "default_duration_2^1600", "width_7225_digits", "two_4mb_sides", "nan_duration",
        "infinite_duration"])
def test_the_issues_matroska_headers_are_refused_quickly(data):
    t0 = time.perf_counter()
    with pytest.raises(MediaRejected) as caught:
        video.check(video.sniff(data, LOC), len(data), video.VideoLimits(), LOC)
    assert time.perf_counter() - t0 < 1.0 and len(str(caught.value)) < 1000


def test_a_version_1_mdhd_too_short_for_its_fields_is_refused():
    """A version-1 mdhd holds 32 bytes before its language; 24 at the end of the file was read past its end."""
    mdhd = box(b"mdhd", b"\x01" + bytes(23))
    hdlr = box(b"hdlr", bytes(8), b"vide", bytes(13))
    data = box(b"ftyp", b"isom", bytes(4)) + box(b"moov", box(b"trak", box(b"mdia", hdlr, mdhd)))
    try:
        header = video.sniff(data, LOC)
    except MediaRejected:
        return
    assert header.duration_s is None  # a field it could not read is one it does not say
