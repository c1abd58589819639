"""A video's headers read before decoding (bridge/media/video.py `sniff`, `check`) on hand-made MP4 and Matroska
headers: what a hostile header claims is refused from the header alone, naming the models.toml key; and the
[server] keys of the video limits."""

from __future__ import annotations

import struct

import pytest
from clef_bridge.bridge.config.registry import parse_registry
from clef_bridge.bridge.media.video import (
    MATROSKA,
    MP4,
    VideoLimits,
    VideoRejected,
    VideoTooLarge,
    check,
    sniff,
)

pytestmark = pytest.mark.unit

LOC = ("body", "videos", 0)


def box(kind: bytes, *children: bytes) -> bytes:
    payload = b"".join(children)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def mp4(seconds: float, width: int, height: int, frames: int, frame_bytes: int, mdat: int = 0) -> bytes:
    """ftyp, a moov with one video track (tkhd, mdhd, hdlr, stsz of frames x frame_bytes), an mdat of mdat bytes."""
    scale = 1000
    mvhd = box(b"mvhd", struct.pack(">B3xIIII", 0, 0, 0, scale, round(seconds * scale)), bytes(80))
    tkhd = box(b"tkhd", bytes(76), struct.pack(">II", width << 16, height << 16))
    mdhd = box(b"mdhd", struct.pack(">B3xIIII", 0, 0, 0, scale, round(seconds * scale)), bytes(4))
    hdlr = box(b"hdlr", bytes(8), b"vide", bytes(13))
    stsz = box(b"stsz", struct.pack(">B3xII", 0, 0, frames), struct.pack(f">{frames}I", *[frame_bytes] * frames))
    trak = box(b"trak", tkhd, box(b"mdia", mdhd, hdlr, box(b"minf", box(b"stbl", stsz))))
    return box(b"ftyp", b"isom", bytes(4)) + box(b"moov", mvhd, trak) + box(b"mdat", bytes(mdat))


def ebml(ident: int, payload: bytes) -> bytes:
    size = len(payload) | (1 << 56)  # an 8-byte size
    return ident.to_bytes((ident.bit_length() + 7) // 8, "big") + size.to_bytes(8, "big") + payload


def mkv(seconds: float, width: int, height: int, fps: float) -> bytes:
    info = ebml(0x1549A966, ebml(0x2AD7B1, (1_000_000).to_bytes(3, "big")) + ebml(0x4489, struct.pack(">d", seconds
                                                                                                        * 1000)))
    video = ebml(0xE0, ebml(0xB0, width.to_bytes(2, "big")) + ebml(0xBA, height.to_bytes(2, "big")))
    track = ebml(0xAE, ebml(0x83, b"\x01") + ebml(0x23E383, round(1e9 / fps).to_bytes(4, "big")) + video)
    return ebml(0x1A45DFA3, ebml(0x4282, b"webm")) + ebml(0x18538067, info + ebml(0x1654AE6B, track))


def test_mp4_headers_give_length_size_rate_frames_and_sample_bytes():
    header = sniff(mp4(2.0, 640, 480, 24, 100, mdat=2400), LOC)
    assert (header.format, header.width, header.height, header.frames) == (MP4, 640, 480, 24)
    assert header.duration_s == 2.0 and header.fps == 12.0 and header.sample_bytes == 2400
    check(header, 10_000, VideoLimits(), LOC)


def test_matroska_headers_give_length_size_and_rate():
    header = sniff(mkv(2.5, 400, 300, 6.0), LOC)
    assert (header.format, header.width, header.height, header.frames) == (MATROSKA, 400, 300, None)
    assert header.duration_s == pytest.approx(2.5) and header.fps == pytest.approx(6.0)


@pytest.mark.parametrize("data, key", [
    (mp4(3600.0, 64, 64, 10, 10), "max_video_seconds"),  # an hour, in a few hundred bytes
    (mkv(61.0, 64, 64, 2.0), "max_video_seconds"),
    (mp4(10.0, 64, 64, 100_000, 1), "max_video_seconds"),  # 10,000 fps: more frames than 120 per allowed second
])
def test_a_header_over_the_limits_is_refused_before_decoding(data, key):
    with pytest.raises(VideoTooLarge) as caught:
        check(sniff(data, LOC), len(data), VideoLimits(), LOC)
    assert key in str(caught.value.problems[0].msg) and caught.value.loc == LOC


def test_huge_frames_and_a_header_claiming_more_than_the_bytes_hold():
    with pytest.raises(VideoTooLarge, match="pixels"):
        data = mp4(1.0, 20_000, 20_000, 2, 10)
        check(sniff(data, LOC), len(data), VideoLimits(), LOC)
    data = mp4(1.0, 64, 64, 10, 1_000_000)  # 10 MB of samples claimed by a file of a few hundred bytes
    with pytest.raises(VideoRejected, match="claim") as caught:
        check(sniff(data, LOC), len(data), VideoLimits(), LOC)
    assert not isinstance(caught.value, VideoTooLarge)


def test_frames_the_processor_cannot_size_are_a_422():
    data = mp4(1.0, 4020, 20, 2, 10)
    with pytest.raises(VideoRejected, match="200-fold") as caught:
        check(sniff(data, LOC), len(data), VideoLimits(), LOC)
    assert not isinstance(caught.value, VideoTooLarge)


def test_not_a_video_and_an_mp4_without_its_index():
    for data in (b"", b"\x89PNG\r\n\x1a\n" + bytes(20), b"RIFF\x00\x00\x00\x00WAVEfmt "):
        with pytest.raises(VideoRejected, match="not an MP4"):
            sniff(data, LOC)
    with pytest.raises(VideoRejected, match="moov"):
        sniff(box(b"ftyp", b"isom", bytes(4)) + box(b"mdat", bytes(100)), LOC)


def test_video_limits_are_server_keys(tmp_path):
    registry = parse_registry({"models": {"m": {"gguf": "m.gguf"}},
                               "server": {"max_videos": 1, "max_video_bytes": 1000, "max_video_seconds": 2.5}},
                              tmp_path / "models.toml")
    assert registry.server.videos == VideoLimits(max_videos=1, max_bytes=1000, max_seconds=2.5)
    assert registry.server.media_limits["video"] is registry.server.videos
    assert VideoLimits().max_count == 2 and VideoLimits().max_seconds == 60 and VideoLimits().max_bytes == 16 * 2**20


def test_a_model_without_video_refuses_it_by_name():
    from clef_bridge.bridge.media.request import VIDEO, refuse_unsupported
    from clef_bridge.head.errors import RequestInvalid

    with pytest.raises(RequestInvalid) as caught:
        refuse_unsupported((VIDEO,), ("image",), "clef")
    [problem] = caught.value.problems
    assert problem.type == "videos_not_supported" and problem.loc == ("body", "videos") and "'clef'" in problem.msg
    refuse_unsupported((VIDEO,), ("image", "audio", "video"), "clef-omni")


def test_a_request_with_videos_holds_max_media_bytes_of_media_at_most():
    """Workers AI's bound: a request's media together; requests without videos keep their own limits."""
    import base64

    from clef_bridge.bridge.media.request import VIDEO, extract

    clip = mp4(1.0, 64, 64, 2, 10, mdat=20)
    body = {"state": "s", "questions": {"q": {"type": "noul"}}, "videos": [base64.b64encode(clip).decode()] * 2}
    extract(body, None, {VIDEO: VideoLimits(max_media_bytes=2 * len(clip))})
    with pytest.raises(VideoTooLarge) as caught:
        extract(body, None, {VIDEO: VideoLimits(max_media_bytes=2 * len(clip) - 1)})
    [problem] = caught.value.problems
    assert problem.loc == ("body", "videos") and "max_media_bytes" in problem.msg
