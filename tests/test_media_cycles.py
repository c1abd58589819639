"""A refused medium frees its memory at once: no error of a refusal sits in a reference cycle (error -> traceback
-> the frame that collected it -> its error list -> error) that only a full collection would free, keeping the
decoder's frames and their buffers meanwhile; media errors pickle by their fields (they cross back from a
decoder process); the decoder pool's models.toml keys are checked."""

from __future__ import annotations

import base64
import gc
import io
import pickle
import wave
from contextlib import contextmanager

import pytest
from clef_bridge.bridge.config.registry_keys import SERVER_KEYS, values_by_group
from clef_bridge.bridge.media import decoders
from clef_bridge.bridge.media.audio import (
    AudioHeader,
    AudioInput,
    AudioLimits,
    AudioRejected,
    AudioTooLarge,
)
from clef_bridge.bridge.media.errors import DecodeOverMemory, DecodeOverTime, DecoderStopped, MediaRejected
from clef_bridge.bridge.media.images import ImageGeometry, ImageRejected
from clef_bridge.bridge.media.request import AUDIO, VIDEO, DecodeSettings, decode_kind, extract
from clef_bridge.bridge.media.video import VideoHeader, VideoInput, VideoLimits, VideoRejected
from clef_bridge.head.errors import Problem

pytestmark = pytest.mark.unit


def wav(seconds: float, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(b"\x00\x10" * int(seconds * rate))
    return out.getvalue()


def live_media_errors() -> int:
    return sum(issubclass(type(o), MediaRejected) for o in gc.get_objects())


@contextmanager
def no_collector():
    """gc off: what a refusal leaves behind stays countable (a cycle is freed by the collector alone)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def codec(data: bytes, tag: int) -> bytes:
    """A WAV whose fmt chunk names another codec (FFmpeg refuses an unknown one)."""
    at = data.index(b"fmt ") + 8
    return data[:at] + tag.to_bytes(2, "little") + data[at + 2:]


@pytest.mark.parametrize("data, error", [(wav(1.0), AudioTooLarge), (codec(wav(0.5), 0x3F3F), AudioRejected)],
                         ids=["too long", "undecodable"])
def test_a_clip_refused_while_decoding_leaves_no_cycle(data, error):
    """The issue's item 2: each refused clip's error held the decode frame, whose error list held the error."""
    clip = AudioInput(("body", "audio", 0), data, AudioHeader("wav", 0.01), b"")  # a header that lied about its length
    with no_collector():
        before = live_media_errors()
        with pytest.raises(error):
            decode_kind(AUDIO, [clip, clip], DecodeSettings(None, {AUDIO: AudioLimits(max_seconds=0.1)}))
        assert live_media_errors() == before


def test_videos_refused_while_decoding_leave_no_cycle():
    """Issue 39: the videos' decoding kept its errors undetached (the near-copy of the clips' bug fixed before)."""
    data = b"\x1a\x45\xdf\xa3" + bytes(300)  # a Matroska magic and nothing decodable after it
    video = VideoInput(("body", "videos", 0), data, VideoHeader("matroska", None, None, None, None, None), b"")
    with no_collector():
        before = live_media_errors()
        with pytest.raises(VideoRejected):
            decode_kind(VIDEO, [video, video], DecodeSettings(ImageGeometry(), {VIDEO: VideoLimits()}))
        assert live_media_errors() == before


@pytest.mark.parametrize("audio", [[b"not audio at all"], ["data:audio/wav;base64,@@@"]], ids=["garbage", "base64"])
def test_clips_refused_from_their_headers_leave_no_cycle(audio):
    body = {"state": "s", "questions": {"q": {"type": "noul"}},
            "audio": [a if isinstance(a, str) else base64.b64encode(a).decode() for a in audio * 2]}
    with no_collector():
        before = live_media_errors()
        with pytest.raises(AudioRejected):
            extract(body)
        assert live_media_errors() == before


def test_videos_refused_from_their_headers_leave_no_cycle():
    garbage = "data:video/mp4;base64," + base64.b64encode(b"\x00\x00\x00\x18ftypisom" + bytes(64)).decode()
    body = {"state": "s", "questions": {"q": {"type": "noul"}}, "videos": [garbage, garbage]}
    with no_collector():
        before = live_media_errors()
        with pytest.raises(VideoRejected):
            extract(body)
        assert live_media_errors() == before


def test_an_error_received_from_a_decoder_leaves_no_cycle():
    import multiprocessing

    ours, theirs = multiprocessing.Pipe()
    decoders._send(theirs, (decoders._REJECTED, AudioRejected(("body", "audio", 0), "bad")))
    with no_collector():
        before = live_media_errors()
        with pytest.raises(AudioRejected):
            decoders._receive(ours)
        assert live_media_errors() == before
    ours.close(), theirs.close()


@pytest.mark.parametrize("cls", [MediaRejected, AudioRejected, AudioTooLarge, ImageRejected, DecodeOverMemory,
                                 DecodeOverTime, DecoderStopped])
def test_media_errors_pickle_by_their_fields(cls):
    problems = [Problem(("body", "audio", 0), "first", "a"), Problem(("body", "audio", 1), "second", "b")]
    error = cls(("body", "audio"), problems=problems)
    error.fix = "send less"
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and back.loc == ("body", "audio") and back.problems == tuple(problems)
    assert str(back) == str(error) and back.fix == "send less" and back.category == error.category


def test_the_decoder_keys_reach_the_pool_limits_and_a_too_small_cap_is_refused():
    problems: list[str] = []
    groups = values_by_group({"decode_workers": 3, "decode_memory_mb": 512, "decode_timeout_s": 2.5}, SERVER_KEYS,
                             "server", problems)
    assert not problems and decoders.DecoderLimits(**groups["decoders"]) == decoders.DecoderLimits(3, 512, 2.5)
    values_by_group({"decode_memory_mb": 100, "decode_workers": 0, "decode_timeout_s": 0}, SERVER_KEYS, "server",
                    problems)
    assert problems == ["server.decode_memory_mb: must be at least 384 (MB): a decoder process maps about 260 MB "
                        "before it decodes anything, got 100", "server.decode_workers: must be positive, got 0",
                        "server.decode_timeout_s: must be above 0, got 0"]
