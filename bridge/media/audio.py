"""Audio bytes (WAV or MP3) to the float32 16 kHz mono samples Clef-omni's audio tower hears, as the reference
makes them.

The reference (`_decode_audio` in Cloudflare's clef-omni joint_schema_model.py) decodes with PyAV and
resamples with `av.AudioResampler(format="flt", layout="mono", rate=16000)`, FFmpeg's libswresample;
another decoder/resampler (libsndfile + soxr) differs from it by up to 0.15 per sample, so this one is
PyAV too, in the same calls: the samples are the reference's. The format and the duration come from
the bytes' own headers first (a WAV's fmt and data chunks, an MP3's frame headers), so the limits
apply before anything is decoded, and decoding stops as soon as a clip runs past max_audio_seconds
(a few KB of 8 kbit/s MP3 cannot make hours of samples).
"""

from __future__ import annotations

import io
import itertools
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...head.errors import Problem
from .errors import MediaRejected, MediaTooLarge, detached

SAMPLE_RATE = 16_000  # the reference's AUDIO_SAMPLE_RATE: Whisper-style features at 16 kHz
WAV, MP3 = "wav", "mp3"
FORMATS = (WAV, MP3)
# An MP3's frames hold the encoder's delay (LAME: 576 + 529 samples), its padding (under two frames) and an
# Info frame; FFmpeg trims them, so the decoded clip is shorter than its frames, by at most this much.
MP3_DELAY_SAMPLES = 1105
MP3_TRIM_FRAMES = 3


class AudioRejected(MediaRejected):
    """An audio clip cannot be used (not WAV/MP3, corrupt, no audio in it)."""

    error_type = "invalid_audio"

    def __init__(self, loc: tuple[str | int, ...], msg: str = "", kind: str = "value_error.audio",
                 problems: list[Problem] | None = None):
        super().__init__(loc, msg, kind, problems)


class AudioTooLarge(AudioRejected, MediaTooLarge):
    """An audio clip is over a configured limit (bytes or seconds)."""

    error_type = "audio_too_large"


@dataclass(frozen=True)
class AudioLimits:
    """[server] limits on a request's audio: max_audio_clips, max_audio_bytes, max_audio_seconds."""

    max_clips: int = 4  # per request
    max_bytes: int = 8 * 2**20  # per clip, encoded: 8 MiB is 47 s of 44.1 kHz stereo 16-bit WAV
    max_seconds: float = 60.0  # per clip, decoded: about 800 audio tokens for Qwen3-Omni's tower

    @property
    def max_samples(self) -> int:
        return round(self.max_seconds * SAMPLE_RATE)

    @property
    def max_count(self) -> int:
        """Clips per request (what every medium's limits name max_count)."""
        return self.max_clips

    @property
    def body_bytes(self) -> int:
        """The most a request's audio clips take in its body: base64-inflated, with room for the JSON around each."""
        return -(-self.max_clips * self.max_bytes * 4 // 3) + 4096 * self.max_clips


@dataclass(frozen=True)
class AudioHeader:
    format: str  # WAV or MP3, from the bytes
    duration_s: float | None  # from the WAV header or the MP3's frame headers; None: not knowable before decoding
    slack_s: float = 0.0  # how much longer than the decoded clip duration_s may be (an MP3's delay and padding)


@dataclass(frozen=True)
class AudioInput:
    """One audio clip of a request, checked from its header, not decoded yet."""

    loc: tuple[str | int, ...]
    data: bytes
    header: AudioHeader
    digest: bytes  # sha256 of the bytes: the answer cache's key

    @property
    def format(self) -> str:
        return self.header.format


# --- WAV ------------------------------------------------------------------------------------------

def _wav(data: bytes) -> float | None:
    """Seconds from a RIFF/WAVE file's fmt and data chunks (data bytes / average bytes per second)."""
    at, byte_rate, data_bytes = 12, None, None
    while at + 8 <= len(data) and (byte_rate is None or data_bytes is None):
        chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt ":
            if size < 16 or at + 24 > len(data):
                return None
            channels, rate, byte_rate = struct.unpack_from("<HII", data, at + 10)
            if not channels or not rate or not byte_rate:
                return None
        elif chunk == b"data":  # a streamed WAV says 0 or 0xFFFFFFFF: the bytes that are there count
            data_bytes = min(size, len(data) - at - 8) if size not in (0, 0xFFFFFFFF) else len(data) - at - 8
        at += 8 + size + (size & 1)  # chunks are padded to an even size
    if byte_rate is None or data_bytes is None:
        return None
    return data_bytes / byte_rate


# --- MP3 ------------------------------------------------------------------------------------------

# MPEG audio layer III bitrates (kbit/s) by index, MPEG-1 and MPEG-2/2.5; index 0 is "free format"
_KBPS = {1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
         2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by version bits


@dataclass(frozen=True)
class _Frame:
    length: int  # bytes; 0 for a free-format frame (its length is not in its header)
    samples: int
    rate: int


def _frame(data: bytes, at: int) -> _Frame | None:
    """The MPEG-1/2/2.5 layer III frame header at `at`, if one is there."""
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (data[at + 1] >> 3) & 3, (data[at + 1] >> 1) & 3
    bitrate_index, rate_index = data[at + 2] >> 4, (data[at + 2] >> 2) & 3
    if version == 1 or layer != 1 or bitrate_index == 15 or rate_index == 3:  # reserved, not layer III, bad
        return None
    rate = _RATES[version][rate_index]
    kbps = _KBPS[1 if version == 3 else 2][bitrate_index]
    samples = 1152 if version == 3 else 576
    padding = (data[at + 2] >> 1) & 1
    return _Frame(samples // 8 * kbps * 1000 // rate + padding if kbps else 0, samples, rate)


def _id3_end(data: bytes) -> int:
    """Where the audio starts after any ID3v2 tags (10-byte header, syncsafe size, optional footer)."""
    at = 0
    while data[at:at + 3] == b"ID3" and at + 10 <= len(data):
        size = data[at + 6:at + 10]
        if any(b & 0x80 for b in size):  # not a syncsafe integer: not an ID3v2 tag
            return -1
        at += 10 + ((size[0] << 21) | (size[1] << 14) | (size[2] << 7) | size[3]) + (10 if data[at + 5] & 0x10 else 0)
    return at


def _mp3(data: bytes, start: int) -> tuple[float | None, float] | None:
    """(seconds, trim slack) by walking the frame headers from `start`; None when no frame is there.

    The walk stops at the first byte that is not a frame (a trailing ID3v1 or APE tag, or damage that
    FFmpeg would resync over): the duration is then a lower bound, and decoding enforces the limit.
    """
    first = _frame(data, start)
    if first is None:
        return None
    if first.length == 0:  # free format: no length to walk by
        return None, 0.0
    at, samples = start, 0
    while True:
        frame = _frame(data, at)
        if frame is None or frame.length == 0 or frame.rate != first.rate:
            break
        samples += frame.samples
        at += frame.length
    if at == start + first.length and at < len(data) and len(data) - at >= 4 and data[at:at + 3] != b"TAG":
        return None  # one "frame" followed by no other: a chance 0xFFE bit pattern, not MP3
    return samples / first.rate, (MP3_DELAY_SAMPLES + MP3_TRIM_FRAMES * first.samples) / first.rate


def sniff(data: bytes, loc: tuple[str | int, ...]) -> AudioHeader:
    """The format (and the duration where the headers give it) from the bytes alone; the declared format is
    not trusted."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        seconds = _wav(data)
        if seconds is None:
            raise AudioRejected(loc, "is a WAV file whose fmt or data chunk is missing or corrupt; re-encode it as "
                                     "16-bit PCM WAV or MP3", "value_error.audio.corrupt")
        return AudioHeader(WAV, seconds)
    start = _id3_end(data) if data[:3] == b"ID3" else 0
    found = _mp3(data, start) if start >= 0 else None
    if found is not None:
        return AudioHeader(MP3, *found)
    if data[:3] == b"ID3":
        raise AudioRejected(loc, "has an ID3 tag but no MPEG layer III frame after it: not an MP3, or corrupt",
                            "value_error.audio.corrupt")
    raise AudioRejected(loc, "is not a WAV (RIFF/WAVE) or MP3 file (judged from its bytes); send one of those "
                             "formats", "value_error.audio.format")


def check(header: AudioHeader, n_bytes: int, limits: AudioLimits, loc: tuple[str | int, ...]) -> None:
    """Refuse a clip over the limits before decoding it (the duration where its headers say it)."""
    if n_bytes > limits.max_bytes:
        raise AudioTooLarge(loc, f"is {n_bytes} bytes; the limit is {limits.max_bytes} bytes per audio clip "
                                 "(max_audio_bytes)", "value_error.audio.bytes")
    if header.duration_s is not None and header.duration_s - header.slack_s > limits.max_seconds:
        raise too_long(loc, header.duration_s, limits)


def too_long(loc: tuple[str | int, ...], seconds: float, limits: AudioLimits, at_least: bool = False) -> AudioTooLarge:
    return AudioTooLarge(loc, f"lasts {'more than ' if at_least else ''}{seconds:.2f} s; the limit is "
                              f"{limits.max_seconds:g} s per audio clip (max_audio_seconds): cut it",
                         "value_error.audio.seconds")


# What PyAV raises on a corrupt or hostile file (its FFmpegError; InvalidDataError is also a ValueError)
def _decode_errors() -> tuple[type[BaseException], ...]:
    import av

    return av.FFmpegError, ValueError, OSError, EOFError


def decode(data: bytes, header: AudioHeader, loc: tuple[str | int, ...], limits: AudioLimits = AudioLimits()
           ) -> np.ndarray:
    """float32 [n] mono samples at 16 kHz, exactly as the reference's _decode_audio makes them; call check() first.

    The same PyAV calls as the reference (first audio stream, resampled to flt/mono/16 kHz, flushed with
    None), with the demuxer named by the sniffed format rather than probed, and a stop past max_audio_seconds.
    """
    import av

    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), format=header.format) as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise AudioRejected(loc, f"is a {header.format.upper()} file with no audio stream",
                                    "value_error.audio.empty")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in itertools.chain(container.decode(stream), (None,)):
                for resampled in resampler.resample(frame):
                    chunks.append(resampled.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if total > limits.max_samples:  # stop before a tiny file inflates to hours of samples
                    raise too_long(loc, total / SAMPLE_RATE, limits, at_least=frame is not None)
    except MemoryError:  # FFmpeg's ENOMEM too: over the decoder's memory cap (decoders.py), not a corrupt clip
        raise
    except _decode_errors() as exc:
        reason = getattr(exc, "strerror", None) or str(exc)  # PyAV's str() carries an errno and a '<none>' file
        raise AudioRejected(loc, f"cannot be decoded as {header.format.upper()} ({reason}); re-encode it as 16-bit "
                                 "PCM WAV or MP3", "value_error.audio.corrupt") from None
    if not total:
        raise AudioRejected(loc, f"is a {header.format.upper()} file that holds no audio samples",
                            "value_error.audio.empty")
    return np.concatenate(chunks).astype(np.float32, copy=False)


def decode_audio_all(clips: Sequence[AudioInput], limits: AudioLimits = AudioLimits()) -> tuple[np.ndarray, ...]:
    """Every clip's samples (PyAV; run it off the event loop); all failures at once."""
    out: list[np.ndarray] = []
    errors: list[AudioRejected] = []
    for clip in clips:
        try:
            out.append(decode(clip.data, clip.header, clip.loc, limits))
        except AudioRejected as exc:
            errors.append(detached(exc))
    if errors:
        cls = AudioTooLarge if all(isinstance(e, AudioTooLarge) for e in errors) else AudioRejected
        raise cls(errors[0].loc, problems=[p for e in errors for p in e.problems])
    return tuple(out)

