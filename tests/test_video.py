"""Videos without a model (bridge/media/video.py): frames and soundtracks equal to Cloudflare's clef-omni reference's
`load_video` on the same bytes (mp4/H.264 + AAC, WebM/VP9 + Opus, Matroska/MPEG-4 + MP3; silent and sounded; odd
frame counts; a frame scaled down), what the headers say before decoding, and the limits refused before
decoding or while decoding.

The clips are tests/fixturegen_video.py's, made with PyAV in a second; the reference's load_video needs only PyAV
and numpy, so it runs here (its video processor does not: see tests/test_video_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.media.images import ImageGeometry
from clef_bridge.bridge.media.request import VIDEO, DecodeSettings, decode_kind
from clef_bridge.bridge.media.video import (
    FPS,
    MATROSKA,
    MP4,
    VideoHeader,
    VideoInput,
    VideoLimits,
    VideoRejected,
    VideoTooLarge,
    check,
    decode,
    kept_size,
    sniff,
)

from . import fixturegen_video
from .fixturegen import FIXTURES
from .omni_reference import reference

pytestmark = pytest.mark.integration

LOC = ("body", "videos", 0)
CLIPS = fixturegen_video.CLIPS


@pytest.fixture(scope="module")
def clips():
    return fixturegen_video.build_clips(FIXTURES / "video")


@pytest.mark.parametrize("name", list(CLIPS))
def test_decode_is_the_references_load_video(clips, name):
    data = clips[name].read_bytes()
    want_frames, want_audio = reference().load_video(data)
    got = decode(data, LOC)
    assert got.frames.dtype == np.uint8 and got.frames.shape == want_frames.shape
    assert np.array_equal(got.frames, want_frames)
    assert (got.audio is None) == (want_audio is None) == (CLIPS[name].audio_codec is None)
    if want_audio is not None:
        assert got.audio.dtype == np.float32 and np.array_equal(got.audio, want_audio)


@pytest.mark.parametrize("name", list(CLIPS))
def test_frames_at_two_fps_scaled_down_and_padded(clips, name):
    clip = CLIPS[name]
    got = decode(clips[name].read_bytes(), LOC)
    kept = 0
    for i in range(clip.frames):  # the reference's rule over the source frames' times (jittered: variable rate)
        kept += clip.pts(i) / (clip.ticks * clip.fps) + 1e-6 >= kept / FPS
    assert len(got.frames) == kept + kept % 2
    w, h = kept_size(clip.width, clip.height)
    # about 262,144 pixels at most: rounding to even sides may pass it a little (592 x 444 = 262,848)
    assert got.frames.shape[1:] == (h, w, 3) and w * h <= 1.01 * 262_144 and w % 2 == h % 2 == 0
    if kept % 2:  # an odd count is padded with the last frame
        assert np.array_equal(got.frames[-1], got.frames[-2])


def test_kept_size_scales_down_only():
    assert kept_size(320, 240) == (320, 240)
    assert kept_size(640, 480) == (592, 444)
    assert kept_size(1920, 1080) == (682, 384)
    assert kept_size(3, 100_000) == (2, 93_478)  # never below 2 pixels a side


@pytest.mark.parametrize("name", list(CLIPS))
def test_headers_say_size_length_and_rate_before_decoding(clips, name):
    clip = CLIPS[name]
    header = sniff(clips[name].read_bytes(), LOC)
    assert header.format == (MP4 if clip.container == "mp4" else MATROSKA)
    assert (header.width, header.height) == (clip.width, clip.height)
    assert header.duration_s == pytest.approx(clip.end_s, abs=0.05)
    assert header.fps == pytest.approx(clip.fps, rel=1e-3)
    if header.format == MP4:
        assert header.frames == clip.frames and 0 < header.sample_bytes < len(clips[name].read_bytes())


def test_a_clip_over_the_limit_is_refused_from_its_headers(clips):
    data = clips["mp4_sounded_big"].read_bytes()
    with pytest.raises(VideoTooLarge, match="max_video_seconds"):
        check(sniff(data, LOC), len(data), VideoLimits(max_seconds=1.5), LOC)
    with pytest.raises(VideoTooLarge, match="max_video_bytes"):
        check(sniff(data, LOC), len(data), VideoLimits(max_bytes=len(data) - 1), LOC)
    check(sniff(data, LOC), len(data), VideoLimits(), LOC)


@pytest.mark.parametrize("name", ["mkv_sounded", "mp4_silent_small"])
def test_decoding_stops_past_the_limit(clips, name):
    """Headers can lie (or say nothing): decoding itself stops at max_video_seconds."""
    with pytest.raises(VideoTooLarge, match="max_video_seconds"):
        decode(clips[name].read_bytes(), LOC, VideoLimits(max_seconds=1.0))


def test_garbage_and_truncated_clips_are_422s(clips):
    with pytest.raises(VideoRejected, match="not an MP4, WebM or Matroska") as caught:
        sniff(b"RIFF\x00\x00\x00\x00WAVEfmt ", LOC)
    assert not isinstance(caught.value, VideoTooLarge) and caught.value.loc == LOC
    data = clips["mp4_sounded_big"].read_bytes()  # PyAV writes the index (moov) last: half a file has none
    with pytest.raises(VideoRejected, match="moov"):
        sniff(data[:len(data) // 2], LOC)
    mkv = clips["mkv_sounded"].read_bytes()
    with pytest.raises(VideoRejected) as caught:
        header = VideoHeader("matroska", None, None, None, None, None)
        decode_kind(VIDEO, [VideoInput(LOC, mkv[:200], header, b"")], DecodeSettings(ImageGeometry(),
                                                                                    {VIDEO: VideoLimits()}))
    assert caught.value.loc == LOC and not isinstance(caught.value, VideoTooLarge)


def test_decode_kind_decodes_videos_to_picklable_values(clips):
    """What an isolated decoder process returns travels by pickle (bridge/media/request.decode_kind)."""
    import pickle

    data = clips["webm_sounded"].read_bytes()
    item = VideoInput(LOC, data, sniff(data, LOC), b"")
    [got] = decode_kind(VIDEO, [item], DecodeSettings(ImageGeometry(), {VIDEO: VideoLimits()}))
    back = pickle.loads(pickle.dumps(got))
    assert np.array_equal(back.frames, got.frames) and np.array_equal(back.audio, got.audio)
    with pytest.raises(VideoTooLarge):
        decode_kind(VIDEO, [item], DecodeSettings(ImageGeometry(), {VIDEO: VideoLimits(max_seconds=0.4)}))


def test_a_soundtrack_too_short_to_frame_is_refused_where_its_video_is(clips, monkeypatch):
    """Clef-omni's feature extractor cannot frame under 201 samples: with every video sounded (the reference's rule
    for audio in video) a short soundtrack is a 422 at its own video, found while decoding, before any prompt; beside
    a video without sound the soundtracks are dropped, the short one with them."""
    from dataclasses import replace

    import clef_bridge.bridge.media.kinds as kinds

    decoded_video = kinds._decode_video

    def second_cut_short(video, limits, factor):
        got = decoded_video(video, limits, factor)
        return replace(got, audio=got.audio[:100]) if video.loc[-1] == 1 and got.audio is not None else got

    monkeypatch.setattr(kinds, "_decode_video", second_cut_short)
    settings = DecodeSettings(ImageGeometry(), {VIDEO: VideoLimits()})

    def inputs(*names: str) -> list[VideoInput]:
        data = [clips[name].read_bytes() for name in names]
        return [VideoInput(("body", "videos", i), d, sniff(d, LOC), b"") for i, d in enumerate(data)]

    with pytest.raises(VideoRejected) as caught:
        decode_kind(VIDEO, inputs("webm_sounded", "webm_sounded"), settings)
    assert [(p.loc, p.type) for p in caught.value.problems] == [(("body", "videos", 1), "value_error.audio_too_short")]
    assert "soundtrack of 100 samples" in caught.value.problems[0].msg
    got = decode_kind(VIDEO, inputs("mp4_silent_small", "webm_sounded"), settings)
    assert got[0].audio is None and len(got[1].audio) == 100


def resizing_mjpeg(container: str) -> bytes:
    """An MJPEG clip whose frames change size mid-stream (each packet from an encoder of its own size)."""
    import io
    from fractions import Fraction

    import av

    out_bytes = io.BytesIO()
    with av.open(out_bytes, "w", format=container) as out:
        stream = out.add_stream("mjpeg", rate=4)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuvj420p"
        for i, (w, h) in enumerate([(64, 48), (64, 48), (96, 64), (96, 64)]):
            encoder = av.CodecContext.create("mjpeg", "w")
            encoder.width, encoder.height, encoder.pix_fmt, encoder.time_base = w, h, "yuvj420p", Fraction(1, 4)
            frame = av.VideoFrame.from_ndarray(np.full((h, w, 3), 40 * i, np.uint8), format="rgb24")
            for packet in [*encoder.encode(frame.reformat(format="yuvj420p")), *encoder.encode(None)]:
                packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 4)
                out.mux(packet)
    return out_bytes.getvalue()


@pytest.mark.parametrize("container", ["matroska", "mp4"])
def test_frames_that_change_size_mid_stream_are_a_422(container):
    """Issue 50: np.stack failed on them outside the decoding's error handling (a 500); the reference's load_video
    stacks its frames the same way and fails too, so it is the request's fault."""
    with pytest.raises(VideoRejected) as caught:
        decode(resizing_mjpeg(container), LOC)
    assert caught.value.problems[0].type == "value_error.video.frame_size"
    assert "64 x 48 then 96 x 64" in str(caught.value)


def test_ffmpeg_out_of_memory_is_the_decoders_memory_limit_not_a_corrupt_clip(clips, monkeypatch):
    """FFmpeg's ENOMEM (av.error.MemoryError, an FFmpegError too) under the decoder's RLIMIT_AS leaves decode as a
    MemoryError, which the decoder pool answers 413 decode_memory_exceeded (it answered 422 invalid_video)."""
    import av

    from clef_bridge.bridge.media import video as video_module

    def exhausted(*args):
        raise av.error.MemoryError(12, "Cannot allocate memory")

    monkeypatch.setattr(video_module, "_frames", exhausted)
    with pytest.raises(MemoryError):
        decode(clips["mp4_silent_small"].read_bytes(), LOC)
