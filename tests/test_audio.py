"""Audio clips without a model (bridge/media/audio.py, bridge/media/request.py): samples equal to Cloudflare's
clef-omni reference's `_decode_audio` on the same bytes, the format and duration from the header bytes,
every garbage clip a 422 naming it, the limits refused before decoding, and audio found in every body shape.

Clips are made here with numpy and PyAV's own encoders (16-bit PCM WAV, LAME MP3): no file, no network.
"""

from __future__ import annotations

import base64
import io
import itertools
import struct
import tomllib

import av
import numpy as np
import pytest
from clef_bridge.bridge.config.registry import RegistryError, parse_registry
from clef_bridge.bridge.media import audio as audio_module
from clef_bridge.bridge.media.audio import (
    SAMPLE_RATE,
    AudioLimits,
    AudioRejected,
    AudioTooLarge,
    check,
    decode,
    sniff,
)
from clef_bridge.bridge.media.request import AUDIO, DecodeSettings, FormPart, decode_kind, extract
from clef_bridge.bridge.server.assets import body_limit
from clef_bridge.head.errors import RequestInvalid

from .fixturegen_vision import encoded, picture

pytestmark = pytest.mark.integration

LOC = ("body", "audio", 0)


def signal(seconds: float, rate: int, channels: int, seed: int = 0) -> np.ndarray:
    """[channels, n] float32: a chirp on the left, a tone and noise on the right (distinct channels, so the
    downmix matters)."""
    t = np.arange(int(round(seconds * rate))) / rate
    rng = np.random.default_rng(seed)
    left = 0.4 * np.sin(2 * np.pi * (220 + 200 * t) * t)
    right = 0.3 * np.sin(2 * np.pi * 660 * t) + 0.02 * rng.standard_normal(t.shape)
    return np.stack([left, right][:channels]).astype(np.float32)


def encode(samples: np.ndarray, rate: int, fmt: str, lame_tag: bool = True) -> bytes:
    """[channels, n] float32 in [-1, 1] as a 16-bit PCM WAV or a LAME MP3 file, by PyAV's encoders (lame_tag=False:
    without the Info frame whose LAME tag tells a decoder the encoder's delay and padding)."""
    layout = "stereo" if samples.shape[0] == 2 else "mono"
    out = io.BytesIO()
    with av.open(out, "w", format=fmt, options={} if lame_tag else {"write_xing": "0"}) as container:
        stream = container.add_stream("pcm_s16le" if fmt == "wav" else "libmp3lame", rate=rate, layout=layout)
        if fmt == "wav":  # packed s16: one plane, channels interleaved
            frame = av.AudioFrame.from_ndarray((samples.T.reshape(1, -1) * 32767).astype(np.int16), format="s16",
                                               layout=layout)
        else:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            container.mux(packet)
    return out.getvalue()


def clip(seconds: float = 1.0, rate: int = 44100, channels: int = 2, fmt: str = "wav", seed: int = 0) -> bytes:
    return encode(signal(seconds, rate, channels, seed), rate, fmt)


def data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


CLIPS = {  # name: (seconds, rate, channels, format)
    "wav 44.1 kHz stereo": (2.3, 44100, 2, "wav"),
    "mp3 44.1 kHz stereo": (2.3, 44100, 2, "mp3"),
    "wav 8 kHz mono": (1.7, 8000, 1, "wav"),
    "mp3 22.05 kHz mono": (3.1, 22050, 1, "mp3"),
    "wav 48 kHz stereo, 0.3 s": (0.3, 48000, 2, "wav"),
}


@pytest.mark.parametrize("name", CLIPS)
def test_samples_equal_the_references_decode_audio(name):
    from .omni_reference import reference

    seconds, rate, channels, fmt = CLIPS[name]
    data = clip(seconds, rate, channels, fmt)
    header = sniff(data, LOC)
    ours = decode(data, header, LOC)
    theirs = reference()._decode_audio(data)
    assert header.format == fmt
    assert ours.dtype == np.float32 and ours.ndim == 1
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs), np.abs(ours - theirs).max()
    assert ours.size == round(seconds * SAMPLE_RATE)  # FFmpeg trims an MP3's encoder delay and padding
    assert np.abs(ours).max() > 0.1  # a real signal, not silence that any decoder would match


@pytest.mark.parametrize("name", CLIPS)
def test_format_and_duration_come_from_the_header_bytes(name):
    seconds, rate, channels, fmt = CLIPS[name]
    data = clip(seconds, rate, channels, fmt)
    header = sniff(data, LOC)
    decoded = decode(data, header, LOC).size / SAMPLE_RATE
    if fmt == "wav":
        assert header.duration_s == pytest.approx(seconds, abs=1 / rate) and header.slack_s == 0
    else:  # frames include the encoder's delay, padding and the Info frame: a little more, within the slack
        assert decoded <= header.duration_s <= decoded + header.slack_s
    assert header.format == sniff(data, ("other",)).format


def _mp3_with_a_gap(frames: int) -> bytes:
    """An MP3 whose frame walk stops after a few frames (a run of junk bytes), while FFmpeg resyncs and decodes
    everything after it: the header's duration is a lower bound, and decoding must enforce the limit."""
    data = clip(6.0, 16000, 1, "mp3")
    with av.open(io.BytesIO(data)) as container:  # the frames' byte positions, from FFmpeg's demuxer
        at = [packet.pos for packet in container.demux(audio=0) if packet.size][frames]
    return data[:at] + bytes(600) + data[at:]  # zeros: FFmpeg resyncs over them


def test_decoding_stops_past_max_audio_seconds_when_the_header_cannot_tell():
    data = _mp3_with_a_gap(5)
    header = sniff(data, LOC)
    assert header.duration_s < 1.0  # the walk stopped at the junk
    whole = decode(data, header, LOC)
    assert whole.size / SAMPLE_RATE > 5.0  # FFmpeg went on past it
    limits = AudioLimits(max_seconds=2.0)
    check(header, len(data), limits, LOC)  # nothing to refuse from the header ...
    with pytest.raises(AudioTooLarge, match=r"lasts more than 2\.\d+ s; the limit is 2 s .*max_audio_seconds"):
        decode(data, header, LOC, limits)  # ... so decoding stops


def test_limits_refuse_before_decoding_and_a_clip_at_the_limit_passes():
    data = clip(3.0, 22050, 2, "wav")
    header = sniff(data, LOC)
    with pytest.raises(AudioTooLarge, match="max_audio_bytes") as bytes_error:
        check(header, len(data), AudioLimits(max_bytes=len(data) - 1), LOC)
    with pytest.raises(AudioTooLarge, match=r"lasts 3\.00 s; the limit is 2\.5 s .*max_audio_seconds"):
        check(header, len(data), AudioLimits(max_seconds=2.5), LOC)
    assert bytes_error.value.problems[0].loc == LOC
    exact = AudioLimits(max_bytes=len(data), max_seconds=3)
    check(header, len(data), exact, LOC)
    assert decode(data, header, LOC, exact).size == exact.max_samples == 3 * SAMPLE_RATE
    mp3 = clip(3.0, 44100, 2, "mp3")
    check(sniff(mp3, LOC), len(mp3), exact, LOC)  # its frames run 3.08 s; the decoded clip is 3 s
    assert decode(mp3, sniff(mp3, LOC), LOC, exact).size == 3 * SAMPLE_RATE


@pytest.mark.parametrize("rate", [44100, 8000])
def test_a_sixty_second_mp3_is_allowed_as_a_wav_is_with_the_references_samples(rate):
    """FFmpeg trims an MP3's encoder delay and padding only where a LAME tag says them: a 60.0 s clip with one
    decodes to 960,000 samples, without one to 60 s plus the delay and padding (+470 samples at 44.1 kHz stereo,
    +3,072 at 8 kHz), in the reference too. Both are allowed."""
    from .omni_reference import reference

    for lame_tag, extra in ((True, 0), (False, (audio_module.MP3_DELAY_SAMPLES + 1) * SAMPLE_RATE // rate)):
        data = encode(signal(60.0, rate, 1), rate, "mp3", lame_tag)
        header = sniff(data, LOC)
        check(header, len(data), AudioLimits(), LOC)
        ours = decode(data, header, LOC)
        assert np.array_equal(ours, reference()._decode_audio(data))
        assert (ours.size == 60 * SAMPLE_RATE) if lame_tag else (60 * SAMPLE_RATE + extra <= ours.size)


@pytest.mark.parametrize("lame_tag", [True, False])
def test_an_mp3_a_tenth_of_a_second_longer_is_not(lame_tag):
    data = encode(signal(60.1, 8000, 1), 8000, "mp3", lame_tag)
    header = sniff(data, LOC)
    check(header, len(data), AudioLimits(), LOC)  # its frames' slack hides it ...
    with pytest.raises(AudioTooLarge, match=r"lasts more than 60\.\d\d s; the limit is 60 s"):
        decode(data, header, LOC)  # ... decoding does not


class _Fed:
    """av.AudioResampler, counting the seconds of audio handed to it."""

    seconds: list[float] = []

    def __init__(self, *args, **kwargs):
        self.resampler = _RESAMPLER(*args, **kwargs)

    def resample(self, frame):
        if frame is not None:
            self.seconds.append(frame.samples / frame.sample_rate)
        return self.resampler.resample(frame)


_RESAMPLER = av.AudioResampler


@pytest.fixture
def fed(monkeypatch) -> list[float]:
    monkeypatch.setattr(av, "AudioResampler", _Fed)
    monkeypatch.setattr(_Fed, "seconds", [])
    return _Fed.seconds


def test_no_frame_past_the_limit_reaches_the_resampler(fed):
    data = _mp3_with_a_gap(5)  # the header cannot tell: only decoding finds the clip's length
    with pytest.raises(AudioTooLarge, match=r"lasts more than 2\.\d+ s"):
        decode(data, sniff(data, LOC), LOC, AudioLimits(max_seconds=2.0))
    assert 1.9 < sum(fed) <= 2.0  # the frame that would cross 2 s was counted, not resampled


def _lies():
    """Issue 32's repros and their family: rates, block aligns, byte rates, channels, bit depths, codecs, chunk
    sizes and truncations."""
    rates = (1, 7999, 8000, 44100, 384000, 99_999_999, 2**31 - 1)
    for rate, align, byte_rate, channels, bits, tag in itertools.product(
            rates, (None, 1, 1024, 8192), (None, 10**9), (1, 2, 9), (8, 16), (1, 0x11)):
        ba = channels * bits // 8 if align is None else align
        yield wav_file(bytes(4096), rate, channels, bits, tag, ba, rate * ba if byte_rate is None else byte_rate)
    whole = wav_file(bytes(32768), 8000, 1, 8, 1, 1, 8000)
    yield from (whole[:cut] for cut in (0, 11, 12, 20, 35, 36, 43, 44, 45, 4000))
    for size in (0, 1, 0xFFFFFFFF, 2**31):
        yield whole[:40] + struct.pack("<I", size) + whole[44:]  # the data chunk's size
        yield whole[:16] + struct.pack("<I", size) + whole[20:]  # the fmt chunk's size


def wav_file(data: bytes, rate: int, channels: int, bits: int, tag: int, block_align: int, byte_rate: int) -> bytes:
    fmt = struct.pack("<HHIIHH", tag, channels, rate & 0xFFFFFFFF, byte_rate & 0xFFFFFFFF, block_align & 0xFFFF, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_every_header_lie_is_refused_or_decoded_within_the_limits(fed):
    limits = AudioLimits(max_seconds=0.5)
    refused = decoded = 0
    for data in _lies():
        try:
            header = sniff(data, LOC, limits)
            check(header, len(data), limits, LOC)
            samples = decode(data, header, LOC, limits)
        except AudioRejected as exc:  # 422 or 413; anything else fails the test
            assert exc.problems[0].loc == LOC
            refused += 1
            continue
        assert samples.size <= limits.max_samples
        decoded += 1
    assert refused > 300 and decoded >= 4  # the family reaches both sides
    assert max(fed, default=0) <= limits.max_seconds  # no frame over the limit was ever resampled


WAV = clip(1.0, 44100, 2, "wav")
MP3 = clip(1.0, 44100, 2, "mp3")
GARBAGE = {  # name: (bytes, the problem's type)
    "empty": (b"", "value_error.audio.format"),
    "text": (b"hello, this is not audio\n" * 40, "value_error.audio.format"),
    "a PNG": (encoded(picture(32, 32), "PNG"), "value_error.audio.format"),
    "WAV header only": (WAV[:30], "value_error.audio.corrupt"),
    "RIFF/WAVE without fmt": (b"RIFF\x10\x00\x00\x00WAVEdata\x04\x00\x00\x00abcd", "value_error.audio.corrupt"),
    "WAV with zero channels": (WAV[:22] + b"\x00\x00" + WAV[24:], "value_error.audio.channels"),
    "ID3 tag then junk": (b"ID3\x04\x00\x00\x00\x00\x00\x10" + bytes(range(256)) * 10, "value_error.audio.corrupt"),
    "MP3 cut inside its first frame": (MP3[:MP3.index(b"\xff\xfb") + 100], "value_error.audio.corrupt"),
    "MPEG sync then zeros": (b"\xff\xfb\x90\x00" + bytes(5000), "value_error.audio.format"),
}


@pytest.mark.parametrize("name", GARBAGE)
def test_garbage_is_a_422_that_names_the_clip(name):
    data, kind = GARBAGE[name]
    with pytest.raises(AudioRejected) as caught:
        decode_kind(AUDIO, [_input(data)], DecodeSettings(None, {AUDIO: AudioLimits()}))
    assert not isinstance(caught.value, AudioTooLarge)
    [problem] = caught.value.problems
    assert problem.loc == LOC and problem.type == kind and problem.msg


def test_a_clip_too_short_to_frame_is_refused_where_the_request_holds_it():
    """Known only once decoded; located at its asset (the model's own check would only know its index)."""
    assets = {"<v>": {"type": "audio", "format": "wav", "data_base64": b64(clip(0.005, 16000, 1))}}
    [found] = extract(body("<v>", assets=assets)).media.audio
    with pytest.raises(AudioRejected) as caught:
        decode_kind(AUDIO, [found], DecodeSettings(None, {AUDIO: AudioLimits()}))
    assert [(p.loc, p.type) for p in caught.value.problems] == [(("body", "assets", "<v>"),
                                                                  "value_error.audio_too_short")]
    assert "holds 80 samples" in caught.value.problems[0].msg


def _input(data: bytes):
    """An AudioInput as extract() makes it, or the AudioRejected that sniffing raises, raised on decode."""
    body = {"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}, "audio": [data_url(data)]}
    [found] = extract(body).media.audio
    return found


# --- audio in request bodies ------------------------------------------------------------------------

def body(state, **extra) -> dict:
    return {"model": "m", "state": state, "questions": {"q": {"type": "noul", "instructions": "Is <v> calm?"}},
            **extra}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


CLIP = {name: clip(0.4 + 0.1 * i, 16000, 1, fmt, seed=i) for i, (name, fmt) in enumerate(
    (("A", "wav"), ("B", "mp3"), ("C", "wav")))}
PNG = encoded(picture(40, 32), "PNG")


def test_audio_assets_become_markers_numbered_apart_from_images():
    assets = {"<v>": {"type": "audio", "format": "mp3", "data_base64": b64(CLIP["B"])},
              "<w>": {"type": "audio", "format": "wav", "data_base64": b64(CLIP["A"])},
              "<unnamed>": {"type": "audio", "format": "wav", "data_base64": b64(CLIP["C"])},
              "<scan>": {"type": "image", "format": "png", "data_base64": b64(PNG)}}
    found = extract(body({"call": "<w> then <v>", "scan": "<scan>"}, assets=assets))
    # the state renders with sorted keys: "call" (<w>, <v>) before "scan"; then the instructions (<v> again)
    assert found.body["state"] == {"call": "[audio 1] then [audio 2]", "scan": "[image 1]"}
    assert found.body["questions"]["q"]["instructions"] == "Is [audio 2] calm?"
    assert [a.data for a in found.media.audio] == [CLIP["A"], CLIP["B"], CLIP["C"]]  # unnamed assets last
    assert [a.loc for a in found.media.audio] == [("body", "assets", n) for n in ("<w>", "<v>", "<unnamed>")]
    assert [a.format for a in found.media.audio] == ["wav", "mp3", "wav"] and len(found.media.images) == 1
    assert "assets" not in found.body and len(set(found.media.digests)) == 5  # 1 image, a separator, 3 clips


def test_audio_list_takes_data_urls_base64_and_objects_in_order():
    entries = [data_url(CLIP["B"], "audio/mpeg"), b64(CLIP["A"]),
               {"content_type": "audio/wav", "base64": b64(CLIP["C"])}]
    found = extract(body("s", audio=entries, images=[b64(PNG)]))
    assert [a.data for a in found.media.audio] == [CLIP["B"], CLIP["A"], CLIP["C"]]
    assert [a.loc for a in found.media.audio] == [("body", "audio", i) for i in range(3)]
    assert len(found.media.images) == 1 and "audio" not in found.body
    assert found.inline_chars == sum(len(e if isinstance(e, str) else e["base64"]) for e in entries) + len(b64(PNG))


def test_multipart_audio_parts_are_claimed_by_audio_assets():
    raw = body("<v>", assets={"<v>": {"type": "audio", "part": "asset-0"},
                              "<i>": {"type": "image", "part": "asset-1"}})
    parts = {"asset-0": FormPart("asset-0", "application/octet-stream", CLIP["B"]),
             "asset-1": FormPart("asset-1", "image/png", PNG)}
    found = extract(raw, parts)
    assert [a.data for a in found.media.audio] == [CLIP["B"]] and [i.data for i in found.media.images] == [PNG]


def problems(raw, limits=AudioLimits()) -> list[tuple[str, str, str]]:
    with pytest.raises(RequestInvalid) as caught:
        extract(raw, None, {AUDIO: limits})
    return [(".".join(map(str, p.loc)), p.type, p.msg) for p in caught.value.problems]


def test_refusals_name_their_place_and_their_limit():
    [(loc, kind, msg)] = problems(body("s", audio=[b64(CLIP["A"])] * 3), AudioLimits(max_clips=2))
    assert (loc, kind) == ("body.audio", "too_many_audio_clips") and "max_audio_clips" in msg
    [(loc, kind, msg)] = problems(body("s", audio=[b64(CLIP["A"])], assets={"<v>": {"type": "image"}}))
    assert loc == "body" and "not both" in msg
    [(loc, kind, msg)] = problems(body("s", assets={"<v>": {"type": "audio", "format": "ogg", "data_base64": "AA=="}}))
    assert loc == "body.assets.<v>.format" and "wav, mp3" in msg
    [(loc, kind, msg)] = problems(body("s", assets={"<v>": {"type": "speech", "data_base64": "AA=="}}))
    assert loc == "body.assets.<v>.type" and '"image", "audio" or "video"' in msg
    [(loc, kind, msg)] = problems(body("s", audio=["https://example.com/a.wav"]))
    assert (loc, kind) == ("body.audio.0", "value_error.audio.url")
    [(loc, kind, msg)] = problems(body("s", audio=[{"content_type": "image/png", "base64": b64(CLIP["A"])}]))
    assert (loc, kind) == ("body.audio.0.content_type", "value_error.audio.content_type")
    [(loc, kind, msg)] = problems(body("s", audio="data:audio/wav;base64,AA=="))
    assert (loc, kind) == ("body.audio", "type_error")


def test_over_max_audio_bytes_is_a_413_before_base64_is_decoded():
    big = b64(CLIP["A"])
    with pytest.raises(AudioTooLarge, match=r"max_audio_bytes") as caught:
        extract(body("s", audio=["@" * len(big)]), None, {AUDIO: AudioLimits(max_bytes=1000)})
    assert caught.value.problems[0].type == "value_error.audio.bytes"  # not "invalid base64": never decoded
    with pytest.raises(AudioTooLarge, match=r"max_audio_seconds"):
        extract(body("s", audio=[big]), None, {AUDIO: AudioLimits(max_seconds=0.25)})


def test_a_video_that_is_no_video_is_refused_where_it_is():
    """Videos are read now (tests/test_video*.py); bytes that are no video get a 422 naming them."""
    for raw, where in ((body("s", videos=["data:video/mp4;base64,AAAA"]), "body.videos.0"),
                       (body("s", assets={"<m>": {"type": "video", "format": "mp4", "data_base64": "AAAA"}}),
                        "body.assets.<m>")):
        [(loc, kind, msg)] = problems(raw)
        assert (loc, kind) == (where, "value_error.video.format") and "not an MP4, WebM or Matroska" in msg


def test_audio_limits_are_server_keys(tmp_path):
    raw = tomllib.loads('[models.m]\ngguf = "m.gguf"\n[server]\nmax_audio_clips = 2\nmax_audio_bytes = 3000\n'
                        'max_audio_seconds = 12.5\nmax_body_bytes = 100\n')
    registry = parse_registry(raw, tmp_path / "models.toml")
    assert registry.server.audio == AudioLimits(max_clips=2, max_bytes=3000, max_seconds=12.5)
    # a body may hold the text, plus the clips base64-inflated where a served model takes audio
    assert body_limit(registry.server, ["audio"]) == 100 + 8000 + 2 * 4096
    both = body_limit(registry.server, ["image", "audio"])
    assert both == body_limit(registry.server, ["audio"]) + body_limit(registry.server, ["image"]) - 100
    assert body_limit(registry.server, []) == 100
    for key, value, error in (("max_audio_clips", 0, "must be positive"), ("max_audio_seconds", 0, "must be above 0"),
                              ("max_audio_bytes", "1 MB", "wrong type")):
        with pytest.raises(RegistryError, match=f"{key}: {error}"):
            parse_registry({**raw, "server": {key: value}}, tmp_path / "models.toml")
