"""Media headers checked before anything decodes (bridge/media/audio.py, images.py, request.py): issue 32's
hostile WAVs and MP3s refused from their header bytes, every parse bounded (WAV chunks, ID3 tags, MP3 frames,
JPEG markers), sizes checked before any parse, and the base64 marker of a data: URL in any case. Files are built
by hand with struct: no decoder runs here (decoding's own bounds are in tests/test_audio.py); work is measured
with counters, never timings.
"""

from __future__ import annotations

import base64
import struct

import pytest
from clef_bridge.bridge.media import audio, kinds, request
from clef_bridge.bridge.media.audio import (
    MAX_CHANNELS,
    MAX_ID3_TAGS,
    MAX_RATE,
    MAX_WAV_CHUNKS,
    MIN_RATE,
    AudioLimits,
    AudioRejected,
    AudioTooLarge,
    check,
    sniff,
)
from clef_bridge.bridge.media.images import MAX_JPEG_MARKERS, ImageRejected, ImageTooLarge
from clef_bridge.bridge.media.request import AUDIO, FormPart, extract
from clef_bridge.bridge.server import multipart
from clef_bridge.head.errors import Category, RequestInvalid
from hypothesis import given, settings
from hypothesis import strategies as st

from .fixturegen_vision import encoded, picture

pytestmark = pytest.mark.unit

LOC = ("body", "audio", 0)


def fmt_chunk(rate: int = 16000, channels: int = 1, bits: int = 16, tag: int = 1, block_align: int | None = None,
              byte_rate: int | None = None, extra: bytes = b"") -> bytes:
    block_align = (channels * bits // 8 if block_align is None else block_align) & 0xFFFF  # what its field holds
    byte_rate = (rate * block_align if byte_rate is None else byte_rate) & 0xFFFFFFFF
    body = struct.pack("<HHIIHH", tag, channels, rate, byte_rate, block_align, bits) + extra
    return b"fmt " + struct.pack("<I", len(body)) + body


def riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def data_chunk(data: bytes) -> bytes:
    return b"data" + struct.pack("<I", len(data)) + data + bytes(len(data) & 1)


def wav(data: bytes = bytes(3200), **fmt) -> bytes:
    return riff(fmt_chunk(**fmt), data_chunk(data))


# issue 32's repros: 8-bit PCM built by hand, a few KB each
REPROS = {
    "rate 1 Hz, block_align 1024, byte_rate 1e9": wav(bytes(4096), rate=1, bits=8, block_align=1024,
                                                      byte_rate=10**9),
    "rate 1 Hz, block_align 8192, byte_rate 1e9": wav(bytes(32768), rate=1, bits=8, block_align=8192,
                                                      byte_rate=10**9),
    "rate = byte_rate = 99,999,999": wav(bytes(4096), rate=99_999_999, bits=8),
    "rate = byte_rate = 2^31-1": wav(bytes(4096), rate=2**31 - 1, bits=8),
}


@pytest.mark.parametrize("name", REPROS)
def test_the_issues_wavs_are_refused_from_their_header_naming_the_bounds(name):
    with pytest.raises(AudioRejected) as caught:
        sniff(REPROS[name], LOC)
    [problem] = caught.value.problems
    assert caught.value.category == Category.INVALID and problem.loc == LOC
    assert problem.type == "value_error.audio.rate" and f"{MIN_RATE} to {MAX_RATE} Hz" in problem.msg


LIES = {  # name: (the file, the problem's type)
    "block_align 1024 at a valid rate": (wav(bytes(4096), rate=16000, bits=8, block_align=1024),
                                         "value_error.audio.header"),
    "byte_rate 1e9 at a valid rate": (wav(bytes(4096), rate=16000, bits=8, byte_rate=10**9),
                                      "value_error.audio.header"),
    "byte_rate of another rate": (wav(rate=16000, byte_rate=44100 * 2), "value_error.audio.header"),
    "12-bit PCM": (wav(bits=12, block_align=2), "value_error.audio.header"),
    "16-bit float": (wav(bits=16, tag=3), "value_error.audio.header"),
    "0 channels": (wav(channels=0, block_align=2), "value_error.audio.channels"),
    f"{MAX_CHANNELS + 1} channels": (wav(bytes(18 * 10), channels=MAX_CHANNELS + 1), "value_error.audio.channels"),
    "7999 Hz": (wav(rate=MIN_RATE - 1), "value_error.audio.rate"),
    "384001 Hz": (wav(rate=MAX_RATE + 1), "value_error.audio.rate"),
    "a compressed codec at 1 Hz": (wav(rate=1, tag=0x11, bits=4, block_align=256, byte_rate=10**9),
                                   "value_error.audio.rate"),
    "no block size": (wav(tag=0x11, bits=4, block_align=0, byte_rate=4000), "value_error.audio.corrupt"),
    "fmt chunk cut short": (riff(fmt_chunk()[:20]), "value_error.audio.corrupt"),
}


@pytest.mark.parametrize("name", LIES)
def test_a_header_that_lies_or_is_out_of_bounds_is_a_422(name):
    data, kind = LIES[name]
    with pytest.raises(AudioRejected) as caught:
        sniff(data, LOC)
    assert not isinstance(caught.value, AudioTooLarge)
    [problem] = caught.value.problems
    assert problem.type == kind and problem.loc == LOC


def test_every_valid_layout_passes_with_its_duration_from_whole_blocks():
    for rate in (MIN_RATE, 11025, 44100, 96000, MAX_RATE):
        for channels in range(1, MAX_CHANNELS + 1):
            for tag, bits in ((1, 8), (1, 16), (1, 24), (1, 32), (1, 64), (3, 32), (3, 64), (6, 8), (7, 8)):
                block = channels * bits // 8
                header = sniff(wav(bytes(block * (rate // 100) + block - 1), rate=rate, channels=channels, bits=bits,
                                   tag=tag), LOC)  # a partial block at the end is not a sample
                assert header.format == "wav" and header.duration_s == (rate // 100) / rate
    extensible = fmt_chunk(rate=48000, channels=2, bits=24, tag=0xFFFE,
                           extra=struct.pack("<HHI", 22, 24, 3) + struct.pack("<H", 1) + bytes(14))
    assert sniff(riff(extensible, data_chunk(bytes(6 * 4800))), LOC).duration_s == 0.1
    lying = fmt_chunk(rate=48000, channels=2, bits=24, tag=0xFFFE, block_align=1024,
                      extra=struct.pack("<HHI", 22, 24, 3) + struct.pack("<H", 1) + bytes(14))
    with pytest.raises(AudioRejected, match="contradicts itself"):  # the sub-format is PCM: checked as PCM
        sniff(riff(lying, data_chunk(bytes(6 * 4800))), LOC)
    adpcm = sniff(wav(bytes(4000), rate=16000, tag=0x11, bits=4, block_align=256, byte_rate=8000), LOC)
    assert adpcm.duration_s == 0.5  # compressed: its byte rate is all there is; decoding enforces the limit


def test_sixty_seconds_is_allowed_and_one_sample_more_is_not():
    limits = AudioLimits()
    for rate in (8000, 22050, 44100):
        exact = wav(bytes(2 * 60 * rate), rate=rate)
        check(sniff(exact, LOC, limits), len(exact), AudioLimits(max_bytes=len(exact) + 2), LOC)
        over = wav(bytes(2 * (60 * rate + 1)), rate=rate)
        with pytest.raises(AudioTooLarge, match=r"lasts 60\.00 s; the limit is 60 s .*max_audio_seconds"):
            check(sniff(over, LOC, limits), len(over), AudioLimits(max_bytes=len(over)), LOC)


def _junk(n: int) -> bytes:
    return b"JUNK\x00\x00\x00\x00" * n


def test_the_chunk_walk_is_bounded_before_and_after_the_data():
    sniff(riff(fmt_chunk(), _junk(MAX_WAV_CHUNKS - 2), data_chunk(bytes(320))), LOC)  # 1024 chunks: read
    for data in (riff(_junk(10**6), fmt_chunk(), data_chunk(bytes(320))),
                 riff(fmt_chunk(), data_chunk(bytes(320)), _junk(10**6)),  # FFmpeg walks these too
                 riff(fmt_chunk(), _junk(MAX_WAV_CHUNKS - 1), data_chunk(bytes(320)))):
        with pytest.raises(AudioRejected, match=f"more than {MAX_WAV_CHUNKS} chunks") as caught:
            sniff(data, LOC)
        assert caught.value.problems[0].type == "value_error.audio.chunks"


MP3_FRAME = b"\xff\xfb\x90\xc4" + bytes(413)  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz, mono: 417 bytes, 1152 samples
TINY_FRAME = b"\xff\xf3\x14\xc4" + bytes(20)  # the issue's: MPEG-2 layer III, 8 kbit/s, 24 kHz: 24 bytes, 576 samples


def id3(size: int = 0) -> bytes:
    return b"ID3\x04\x00\x00" + bytes([size >> 21 & 127, size >> 14 & 127, size >> 7 & 127, size & 127]) + bytes(size)


def test_the_id3_chain_is_bounded():
    header = sniff(id3(40) * MAX_ID3_TAGS + MP3_FRAME * 10, LOC)
    assert header.format == "mp3" and header.duration_s == 10 * 1152 / 44100
    for data in (id3() * (MAX_ID3_TAGS + 1) + MP3_FRAME * 10, id3() * (8 * 2**20 // 10 - 100) + MP3_FRAME):
        with pytest.raises(AudioRejected, match=f"more than {MAX_ID3_TAGS} ID3v2 tags") as caught:
            sniff(data, LOC)
        assert caught.value.problems[0].type == "value_error.audio.tags"


def test_the_frame_walk_stops_at_the_duration_limit(monkeypatch):
    read = []
    frame = audio._frame
    monkeypatch.setattr(audio, "_frame", lambda data, at: read.append(at) or frame(data, at))
    limits = AudioLimits(max_seconds=60)
    data = TINY_FRAME * 300_000  # 7.2 MB: 172.8 s of 24 ms frames
    with pytest.raises(AudioTooLarge, match=r"lasts more than 60\.\d\d s; the limit is 60 s") as caught:
        sniff(data, LOC, limits)
    assert caught.value.category == Category.TOO_LARGE
    slack = audio.MP3_DELAY_SAMPLES + audio.MP3_TRIM_FRAMES * 576
    assert len(read) <= (60 * 24000 + slack) // 576 + 3  # the frames of 60 s and its slack, not the 300,000
    header = sniff(TINY_FRAME * 2500, LOC, limits)  # exactly 60 s of frames: walked to its end
    assert header.duration_s == 60.0


def test_an_mp3_without_a_lame_tag_may_decode_its_delay_and_padding():
    untagged = sniff(MP3_FRAME * 10, LOC)
    assert untagged.untrimmed_s == (audio.MP3_DELAY_SAMPLES + 1151) / 44100
    info = b"\xff\xfb\x90\xc4" + bytes(17) + b"Info" + struct.pack(">II", 1, 10) + b"LAME3.100" + bytes(413 - 38)
    assert sniff(info + MP3_FRAME * 10, LOC).untrimmed_s == 0  # FFmpeg trims what the LAME tag says
    no_count = b"\xff\xfb\x90\xc4" + bytes(17) + b"Info" + struct.pack(">I", 0) + b"LAME3.100" + bytes(413 - 34)
    assert sniff(no_count + MP3_FRAME * 10, LOC).untrimmed_s > 0  # no frame count: FFmpeg cannot trim the end


def test_the_jpeg_marker_walk_is_bounded():
    frame = b"\xff\xc0\x00\x11\x08\x00\x20\x00\x28\x03" + bytes(9)  # SOF0: 40x32, 3 components
    assert kinds.sniff(b"\xff\xd8" + b"\xff\xfe\x00\x02" * (MAX_JPEG_MARKERS - 1) + frame, LOC).width == 40
    for data in (b"\xff\xd8" + b"\xff\xfe\x00\x02" * MAX_JPEG_MARKERS + frame,  # empty comments
                 b"\xff\xd8\xff" + b"\xff" * (4 * 2**20 - 8) + frame,  # fill bytes
                 b"\xff\xd8" + b"\xff\xd0" * 2**20 + frame):  # restart markers
        with pytest.raises(ImageRejected, match=f"more than {MAX_JPEG_MARKERS} markers") as caught:
            kinds.sniff(data, LOC)
        assert caught.value.problems[0].type == "value_error.image.markers"


def _multipart_body(kind: str) -> dict:
    return {"model": "m", "state": "<a>", "questions": {"q": {"type": "noul"}},
            "assets": {"<a>": {"type": kind, "part": "asset-0"}}}


def test_a_parts_size_is_checked_before_anything_parses_it(monkeypatch):
    parsed = []
    monkeypatch.setattr(audio, "_frame", lambda data, at: parsed.append(at))
    monkeypatch.setattr(kinds, "sniff", lambda data, loc: parsed.append(loc))
    part = TINY_FRAME * (9 * 2**20 // 24)  # 9 MiB, over max_audio_bytes (and the issue's 55 MB scan)
    with pytest.raises(AudioTooLarge, match=r"holds 9437184 bytes of audio; the limit is 8388608 bytes per audio "
                                            r"clip \(max_audio_bytes\)") as caught:
        extract(_multipart_body("audio"), {"asset-0": FormPart("asset-0", "audio/mpeg", part)})
    assert caught.value.problems[0].loc == ("body", "assets", "<a>")
    with pytest.raises(ImageTooLarge, match=r"max_image_bytes"):
        extract(_multipart_body("image"), {"asset-0": FormPart("asset-0", "image/jpeg", b"\xff\xd8\xff" * 2**21)})
    assert parsed == []  # no frame header read, no image header sniffed


def test_a_parts_header_block_is_bounded_before_it_is_parsed(monkeypatch):
    parsed = []
    headers = multipart._HEADERS

    class Counting:
        def parsebytes(self, text: bytes):
            parsed.append(len(text))
            return headers.parsebytes(text)

    monkeypatch.setattr(multipart, "_HEADERS", Counting())
    lines = b"X-Pad: " + b"a" * 90 + b"\r\n"

    def form(pad: int) -> bytes:
        return (b"--XyZ\r\nContent-Disposition: form-data; name=\"request\"\r\n" + lines * pad + b"\r\n{}\r\n"
                b"--XyZ--\r\n")

    within = (multipart.MAX_PART_HEAD - 60) // len(lines)
    assert multipart.parse_body(form(within), "multipart/form-data; boundary=XyZ").data == {}
    parsed.clear()
    with pytest.raises(RequestInvalid, match=f"longer than {multipart.MAX_PART_HEAD} bytes"):
        multipart.parse_body(form(80_000), "multipart/form-data; boundary=XyZ")  # 8 MB of header lines
    assert parsed == [parsed[0]] and parsed[0] < 100  # the boundary's Content-Type alone was parsed


def test_a_data_urls_size_is_checked_before_its_base64_is_decoded(monkeypatch):
    decoded = []
    b64decode = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda *a, **k: decoded.append(a) or b64decode(*a, **k))
    limits = AudioLimits(max_bytes=3000)
    fits = base64.b64encode(wav(bytes(3000 - 44))).decode()  # 3,000 bytes exactly: its padding counted out
    extract({"state": "s", "audio": [f"data:audio/wav;base64,{fits}"]}, None, {AUDIO: limits})
    assert len(decoded) == 1
    over = base64.b64encode(wav(bytes(3002 - 44))).decode()  # 3,002 bytes: 4,004 characters, one of them "="
    with pytest.raises(AudioTooLarge, match=r"holds about 3002 bytes of audio; the limit is 3000 bytes"):
        extract({"state": "s", "audio": [f"data:audio/wav;base64,{over}"]}, None, {AUDIO: limits})
    assert len(decoded) == 1


@pytest.mark.parametrize("marker", ["base64", "BASE64", "Base64", "bAsE64"])
def test_the_base64_marker_is_read_in_any_case_for_images_and_audio(marker):
    clip, png = wav(), encoded(picture(40, 32), "PNG")
    body = {"state": "s", "audio": [f"data:audio/wav;{marker},{base64.b64encode(clip).decode()}"],
            "images": [f"DATA:image/png;charset=x;{marker},{base64.b64encode(png).decode()}"]}
    media = extract(body).media
    assert [a.data for a in media.audio] == [clip] and [i.data for i in media.images] == [png]


def test_a_data_urls_head_is_read_within_its_bound():
    head = "data:audio/wav;" + "x" * request.DATA_URL_HEAD + ";base64,"
    with pytest.raises(AudioRejected, match="without ;base64") as caught:
        extract({"state": "s", "audio": [head + base64.b64encode(wav()).decode()]})
    assert caught.value.problems[0].type == "value_error.audio.data_url"


# --- the header-lie family, generated -------------------------------------------------------------

RATES = st.sampled_from([0, 1, 7999, 8000, 16000, 44100, 384000, 384001, 99_999_999, 2**31 - 1, 2**32 - 1])
WAV_HEADERS = st.builds(
    lambda rate, channels, bits, tag, block_align, byte_rate, data, cut, junk, size: (
        (lambda whole: whole[:cut] if cut is not None else whole)(riff(
            _junk(junk), fmt_chunk(rate, channels, bits, tag, block_align, byte_rate),
            b"data" + struct.pack("<I", size if size is not None else data) + bytes(data)))),
    rate=RATES, channels=st.sampled_from([0, 1, 2, 8, 9, 255, 65535]), bits=st.sampled_from([0, 4, 8, 12, 16, 32, 64]),
    tag=st.sampled_from([1, 3, 6, 0x11, 0x55, 0xFFFE, 0]),
    block_align=st.none() | st.sampled_from([0, 1, 2, 1024, 8192, 65535]),
    byte_rate=st.none() | st.sampled_from([0, 1, 8000, 10**9, 2**32 - 1]), data=st.integers(0, 40_000),
    cut=st.none() | st.integers(0, 200), junk=st.sampled_from([0, 1, 3, MAX_WAV_CHUNKS]),
    size=st.none() | st.sampled_from([0, 1, 0xFFFFFFFF, 2**31]))


@settings(max_examples=100, deadline=None)
@given(WAV_HEADERS)
def test_every_generated_wav_header_is_refused_as_4xx_or_within_its_bounds(data):
    limits = AudioLimits(max_seconds=2.0)
    try:
        header = sniff(data, LOC, limits)
        check(header, len(data), limits, LOC)
    except AudioRejected as exc:  # a 422 or a 413, never another exception
        assert exc.category in (Category.INVALID, Category.TOO_LARGE) and exc.problems[0].loc == LOC
        return
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", data, data.index(b"fmt ") + 8)
    assert header.duration_s is not None and 0 <= header.duration_s <= 2.0
    assert MIN_RATE <= rate <= MAX_RATE and 1 <= channels <= MAX_CHANNELS and block_align and byte_rate
    if tag in (1, 3, 6, 7):
        assert block_align == channels * bits // 8 and byte_rate == rate * block_align
