"""Media at their limits, decoded (bridge/media/video.py, audio.py): a real clip whose header says exactly
max_video_seconds is checked and decoded, frames and soundtrack, and one a hundredth of a second over is a 413;
a WAV with an odd-sized chunk padded to even before its data decodes to the very samples of the same WAV without
it. tests/test_media_limits.py has the same boundaries on headers built by hand."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from clef_bridge.bridge.media import audio
from clef_bridge.bridge.media.video import VideoLimits, VideoTooLarge, check, decode, sniff

from . import fixturegen_video
from .fixturegen import FIXTURES
from .test_audio import clip
from .test_media_limits import odd_chunk_wav

pytestmark = pytest.mark.integration

LOC = ("body", "videos", 0)


@pytest.fixture(scope="module")
def clips():
    return fixturegen_video.build_clips(FIXTURES / "video")


@pytest.mark.parametrize("name", ["mp4_sounded_big", "mkv_sounded", "webm_sounded"])
def test_a_clip_of_exactly_max_video_seconds_decodes_and_one_just_over_is_a_413(clips, name):
    data = clips[name].read_bytes()
    header = sniff(data, LOC)
    exact = VideoLimits(max_seconds=header.duration_s)
    check(header, len(data), exact, LOC)
    got = decode(data, LOC, exact)
    whole = decode(data, LOC)
    assert np.array_equal(got.frames, whole.frames) and len(got.frames) >= 2
    assert (got.audio is None) == (whole.audio is None) and (got.audio is None or np.array_equal(got.audio,
                                                                                                  whole.audio))
    with pytest.raises(VideoTooLarge, match="max_video_seconds"):
        check(header, len(data), VideoLimits(max_seconds=header.duration_s - 0.01), LOC)


def with_odd_chunk(wav: bytes) -> bytes:
    """The same WAV with an odd-sized LIST chunk (and its pad byte) put before its data chunk."""
    fmt, samples = _chunk(wav, b"fmt "), _chunk(wav, b"data")
    odd = odd_chunk_wav(1, 16000)
    listed = odd[odd.index(b"LIST"):odd.index(b"data")]
    assert struct.unpack_from("<I", listed, 4)[0] % 2 == 1 and len(listed) % 2 == 0
    body = b"WAVE" + fmt + listed + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _chunk(wav: bytes, name: bytes) -> bytes:
    at = 12
    while at + 8 <= len(wav):
        size = struct.unpack_from("<I", wav, at + 4)[0]
        if wav[at:at + 4] == name:
            return wav[at:at + 8 + size + (size & 1)]
        at += 8 + size + (size & 1)
    raise AssertionError(f"no {name!r} chunk")


@pytest.mark.parametrize("seconds, rate, channels", [(1.3, 44100, 2), (0.7, 16000, 1)])
def test_a_wav_with_an_odd_sized_chunk_before_its_data_decodes_to_its_true_length(seconds, rate, channels):
    plain = clip(seconds, rate, channels, "wav")
    odd = with_odd_chunk(plain)
    header = audio.sniff(odd, ("body", "audio", 0))
    assert header.duration_s == audio.sniff(plain, ("body", "audio", 0)).duration_s == pytest.approx(seconds,
                                                                                                     abs=1 / rate)
    got = audio.decode(odd, header, ("body", "audio", 0))
    assert got.size == round(seconds * audio.SAMPLE_RATE) and np.abs(got).max() > 0.1
    assert np.array_equal(got, audio.decode(plain, header, ("body", "audio", 0)))
