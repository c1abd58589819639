"""Audio bytes (WAV or MP3) to the float32 16 kHz mono samples Clef-omni's audio tower hears, as the reference
makes them.

The reference (`_decode_audio` in Cloudflare's clef-omni joint_schema_model.py) decodes with PyAV and
resamples with `av.AudioResampler(format="flt", layout="mono", rate=16000)`, FFmpeg's libswresample;
another decoder/resampler (libsndfile + soxr) differs from it by up to 0.15 per sample, so this one is
PyAV too, in the same calls: the samples are the reference's. The format and the duration come from
the bytes' own headers first (a WAV's fmt and data chunks, an MP3's frame headers), every field held to
sane bounds and to the others (a header that lies is refused), every walk bounded, so the limits apply
before anything is decoded; decoding counts each frame before it is resampled and stops at
max_audio_seconds (a few KB of 8 kbit/s MP3 cannot make hours of samples, a 1 Hz WAV cannot inflate).
"""

from __future__ import annotations

import io
import itertools
import struct
from dataclasses import dataclass

import numpy as np

from ...head.errors import Problem
from .errors import MediaRejected, MediaTooLarge

SAMPLE_RATE = 16_000  # the reference's AUDIO_SAMPLE_RATE: Whisper-style features at 16 kHz
WAV, MP3 = "wav", "mp3"
Loc = tuple[str | int, ...]  # where a clip is in the request body
FORMATS = (WAV, MP3)
# An MP3's frames hold the encoder's delay (LAME: 576 + 529 samples), its padding (under two frames) and an
# Info frame; FFmpeg trims them, so the decoded clip is shorter than its frames, by at most this much.
MP3_DELAY_SAMPLES = 1105
MP3_TRIM_FRAMES = 3


class AudioRejected(MediaRejected):
    """An audio clip cannot be used (not WAV/MP3, corrupt, no audio in it)."""

    error_type = "invalid_audio"

    def __init__(self, loc: Loc, msg: str = "", kind: str = "value_error.audio",
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
    untrimmed_s: float = 0.0  # what decoding yields beyond the clip: an MP3's delay and padding FFmpeg cannot trim


@dataclass(frozen=True)
class AudioInput:
    """One audio clip of a request, checked from its header, not decoded yet."""

    loc: Loc
    data: bytes
    header: AudioHeader
    digest: bytes  # sha256 of the bytes: the answer cache's key

    @property
    def format(self) -> str:
        return self.header.format


# --- WAV ------------------------------------------------------------------------------------------

# Bounds on what a header may claim, so the resampler never sees a rate or a layout it would build a huge
# filter bank or an inflated frame for: telephony's 8 kHz to the 384 kHz of the fastest studio converters
# (a 99,999,999 Hz header makes FFmpeg spend seconds and gigabytes on the filter; a 1 Hz one inflates every
# packet 16,000-fold), and 8 channels, the most FFmpeg's resampler downmixes from a WAV (9 and more have
# no layout it can map to mono: it fails on them anyway).
MIN_RATE, MAX_RATE = 8_000, 384_000
MAX_CHANNELS = 8
# Bits per sample of the codecs whose every header field can be cross-checked, by format tag: integer PCM
# (FFmpeg reads 8 to 64), IEEE float, A-law and mu-law. Other codecs (ADPCM, GSM, MP3 in WAV) are read as
# FFmpeg reads them, bounded while decoding.
WAV_PCM, WAV_FLOAT, WAV_ALAW, WAV_MULAW, WAV_EXTENSIBLE = 0x0001, 0x0003, 0x0006, 0x0007, 0xFFFE
WAV_BITS = {WAV_PCM: (8, 16, 24, 32, 64), WAV_FLOAT: (32, 64), WAV_ALAW: (8,), WAV_MULAW: (8,)}
# A WAV holds a handful of chunks (fmt, fact, LIST, bext, iXML, cue, JUNK, data, ...); FFmpeg walks every one,
# after the data chunk too, so a file of a million empty chunks costs seconds of parsing before decoding.
MAX_WAV_CHUNKS = 1024
# An MP3 starts with one ID3v2 tag, two where a second tagger prepended its own; FFmpeg reads every one.
MAX_ID3_TAGS = 8


def _corrupt(loc: Loc, msg: str, kind: str = "value_error.audio.corrupt") -> AudioRejected:
    return AudioRejected(loc, msg, kind)


@dataclass(frozen=True)
class _Format:
    rate: int
    block_align: int  # bytes of one sample of every channel (uncompressed), or of one coded block
    byte_rate: int
    exact: bool  # uncompressed: the sizes follow from rate, channels and bits, and were checked


def _fmt(data: bytes, at: int, size: int, loc: Loc) -> _Format:
    """A fmt chunk at `at`, every field within its bounds and, for uncompressed samples, consistent with the others."""
    if size < 16 or at + 24 > len(data):
        raise _corrupt(loc, "is a WAV file whose fmt chunk is truncated or corrupt; re-encode it as 16-bit PCM WAV "
                            "or MP3")
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", data, at + 8)
    if tag == WAV_EXTENSIBLE and size >= 40 and at + 34 <= len(data):  # the sub-format GUID starts with the tag
        tag = struct.unpack_from("<H", data, at + 32)[0]
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _corrupt(loc, f"is a WAV file at {rate} Hz; the sample rate must be {MIN_RATE} to {MAX_RATE} Hz",
                       "value_error.audio.rate")
    if not 1 <= channels <= MAX_CHANNELS:
        raise _corrupt(loc, f"is a WAV file with {channels} channels; 1 to {MAX_CHANNELS} are read",
                       "value_error.audio.channels")
    if not block_align or not byte_rate:
        raise _corrupt(loc, "is a WAV file whose fmt chunk gives no block size or byte rate: corrupt")
    if tag not in WAV_BITS:  # compressed: the byte rate is all there is, and decoding enforces the limit
        return _Format(rate, block_align, byte_rate, exact=False)
    if bits not in WAV_BITS[tag]:
        raise _corrupt(loc, f"is a WAV file of {bits}-bit samples; format {tag:#06x} takes "
                            f"{', '.join(map(str, WAV_BITS[tag]))} bits", "value_error.audio.header")
    if block_align != channels * bits // 8 or byte_rate != rate * block_align:
        raise _corrupt(loc, f"is a WAV file whose header contradicts itself: {channels} channel(s) of {bits} bits at "
                            f"{rate} Hz make blocks of {channels * bits // 8} bytes and {rate * channels * bits // 8} "
                            f"bytes per second, the header says {block_align} and {byte_rate}; re-encode it",
                       "value_error.audio.header")
    return _Format(rate, block_align, byte_rate, exact=True)


def _wav(data: bytes, loc: Loc) -> float:
    """Seconds from a RIFF/WAVE file's fmt and data chunks (whole blocks at the checked rate), every chunk walked
    (as FFmpeg walks them, after the data chunk too) up to MAX_WAV_CHUNKS."""
    at, fmt, data_bytes = 12, None, None
    for _ in range(MAX_WAV_CHUNKS):
        if at + 8 > len(data):
            break
        chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and fmt is None:
            fmt = _fmt(data, at, size, loc)
        elif chunk == b"data" and data_bytes is None:  # streamed: 0 or 0xFFFFFFFF, the bytes that are there count
            data_bytes = min(size, len(data) - at - 8) if size not in (0, 0xFFFFFFFF) else len(data) - at - 8
        at += 8 + size + (size & 1)  # chunks are padded to an even size
    if at + 8 <= len(data):
        raise _corrupt(loc, f"is a WAV file of more than {MAX_WAV_CHUNKS} chunks; re-encode it as 16-bit PCM WAV or "
                            "MP3", "value_error.audio.chunks")
    if fmt is None or data_bytes is None:
        raise _corrupt(loc, "is a WAV file whose fmt or data chunk is missing or corrupt; re-encode it as 16-bit PCM "
                            "WAV or MP3")
    return data_bytes // fmt.block_align / fmt.rate if fmt.exact else data_bytes / fmt.byte_rate


# --- MP3 ------------------------------------------------------------------------------------------

# MPEG audio layer III bitrates (kbit/s) by index, MPEG-1 and MPEG-2/2.5; index 0 is "free format"
_KBPS = {1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
         2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by version bits
# Where a Xing/Info tag starts after the 4-byte frame header: the side information's size, by MPEG-1 and
# channels (FFmpeg's xing_offtbl)
_SIDE_INFO = {(True, 2): 32, (True, 1): 17, (False, 2): 17, (False, 1): 9}
_GAPLESS_ENCODERS = (b"LAME", b"Lavf", b"Lavc")  # the encoder tags whose delay and padding FFmpeg trims


@dataclass(frozen=True)
class _Frame:
    length: int  # bytes; 0 for a free-format frame (its length is not in its header)
    samples: int
    rate: int
    channels: int


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
    channels = 1 if data[at + 3] >> 6 == 3 else 2
    return _Frame(samples // 8 * kbps * 1000 // rate + padding if kbps else 0, samples, rate, channels)


def _gapless(data: bytes, at: int, frame: _Frame) -> bool:
    """Whether the first frame is an Info/Xing frame whose LAME tag gives FFmpeg the encoder's delay and padding
    and the frame count, so that it trims both (as mp3_parse_info_tag does); without it they are decoded."""
    tag = at + 4 + _SIDE_INFO[frame.samples == 1152, frame.channels]
    if data[tag:tag + 4] not in (b"Xing", b"Info") or tag + 8 > len(data):
        return False
    flags = struct.unpack_from(">I", data, tag + 4)[0]
    encoder = tag + 8 + 4 * (flags & 1) + 4 * (flags >> 1 & 1) + 100 * (flags >> 2 & 1) + 4 * (flags >> 3 & 1)
    return bool(flags & 1) and data[encoder:encoder + 4] in _GAPLESS_ENCODERS


def _id3_end(data: bytes, loc: Loc) -> int:
    """Where the audio starts after any ID3v2 tags (10-byte header, syncsafe size, optional footer), up to
    MAX_ID3_TAGS of them."""
    at = 0
    for _ in range(MAX_ID3_TAGS):
        if data[at:at + 3] != b"ID3" or at + 10 > len(data):
            return at
        size = data[at + 6:at + 10]
        if any(b & 0x80 for b in size):  # not a syncsafe integer: not an ID3v2 tag
            return -1
        at += 10 + ((size[0] << 21) | (size[1] << 14) | (size[2] << 7) | size[3]) + (10 if data[at + 5] & 0x10 else 0)
    if data[at:at + 3] == b"ID3":
        raise _corrupt(loc, f"is an MP3 file with more than {MAX_ID3_TAGS} ID3v2 tags before its audio; strip them",
                       "value_error.audio.tags")
    return at


def _mp3(data: bytes, start: int, limits: AudioLimits, loc: Loc) -> AudioHeader | None:
    """The header from walking the frames from `start`; None when no frame is there.

    The walk stops at the first byte that is not a frame (a trailing ID3v1 or APE tag, or damage that
    FFmpeg would resync over): the duration is then a lower bound, and decoding enforces the limit. The clip is
    refused as soon as its frames run past what a clip within max_audio_seconds could hold.
    """
    first = _frame(data, start)
    if first is None:
        return None
    untrimmed = 0.0 if _gapless(data, start, first) else (MP3_DELAY_SAMPLES + first.samples - 1) / first.rate
    slack = (MP3_DELAY_SAMPLES + MP3_TRIM_FRAMES * first.samples) / first.rate
    if first.length == 0:  # free format: no length to walk by
        return AudioHeader(MP3, None, 0.0, untrimmed)
    at, samples, most = start, 0, (limits.max_seconds + slack) * first.rate
    while frame := _frame(data, at):
        if frame.length == 0 or frame.rate != first.rate:
            break
        samples += frame.samples
        at += frame.length
        if samples > most:
            raise too_long(loc, samples / first.rate, limits, at_least=True)
    if at == start + first.length and at < len(data) and len(data) - at >= 4 and data[at:at + 3] != b"TAG":
        return None  # one "frame" followed by no other: a chance 0xFFE bit pattern, not MP3
    return AudioHeader(MP3, samples / first.rate, slack, untrimmed)


def sniff(data: bytes, loc: Loc, limits: AudioLimits = AudioLimits()) -> AudioHeader:
    """The format (and the duration where the headers give it) from the bytes alone, every header field within
    its bounds; the declared format is not trusted. Call check_bytes() first: the work is bounded by the limits."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return AudioHeader(WAV, _wav(data, loc))
    start = _id3_end(data, loc) if data[:3] == b"ID3" else 0
    found = _mp3(data, start, limits, loc) if start >= 0 else None
    if found is not None:
        return found
    if data[:3] == b"ID3":
        raise AudioRejected(loc, "has an ID3 tag but no MPEG layer III frame after it: not an MP3, or corrupt",
                            "value_error.audio.corrupt")
    raise AudioRejected(loc, "is not a WAV (RIFF/WAVE) or MP3 file (judged from its bytes); send one of those "
                             "formats", "value_error.audio.format")


def check_bytes(n_bytes: int, limits: AudioLimits, loc: Loc) -> None:
    """Refuse a clip over max_audio_bytes: before anything reads it."""
    if n_bytes > limits.max_bytes:
        raise AudioTooLarge(loc, f"is {n_bytes} bytes; the limit is {limits.max_bytes} bytes per audio clip "
                                 "(max_audio_bytes)", "value_error.audio.bytes")


def check(header: AudioHeader, n_bytes: int, limits: AudioLimits, loc: Loc) -> None:
    """Refuse a clip over the limits before decoding it (the duration where its headers say it)."""
    check_bytes(n_bytes, limits, loc)
    if header.duration_s is not None and header.duration_s - header.slack_s > limits.max_seconds:
        raise too_long(loc, header.duration_s, limits)


def too_long(loc: Loc, seconds: float, limits: AudioLimits, at_least: bool = False) -> AudioTooLarge:
    return AudioTooLarge(loc, f"lasts {'more than ' if at_least else ''}{seconds:.2f} s; the limit is "
                              f"{limits.max_seconds:g} s per audio clip (max_audio_seconds): cut it",
                         "value_error.audio.seconds")


# What PyAV raises on a corrupt or hostile file (its FFmpegError; InvalidDataError is also a ValueError)
def _decode_errors() -> tuple[type[BaseException], ...]:
    import av

    return av.FFmpegError, ValueError, OSError, EOFError


def _admit(frame, consumed: int, header: AudioHeader, limits: AudioLimits, loc: Loc) -> int:
    """The samples decoded so far with this frame's; a frame of a rate or layout out of bounds, or one that takes the
    clip past max_audio_seconds, is refused before the resampler sees it (it would inflate it to 16 kHz first)."""
    rate, channels = frame.sample_rate, frame.layout.nb_channels
    if not MIN_RATE <= rate <= MAX_RATE or not 1 <= channels <= MAX_CHANNELS:
        raise _corrupt(loc, f"decodes to {channels} channels at {rate} Hz; {MIN_RATE} to {MAX_RATE} Hz and 1 to "
                            f"{MAX_CHANNELS} channels are read", "value_error.audio.rate")
    consumed += frame.samples
    if consumed / rate > limits.max_seconds + header.untrimmed_s:
        raise too_long(loc, consumed / rate, limits, at_least=True)
    return consumed


def decode(data: bytes, header: AudioHeader, loc: Loc, limits: AudioLimits = AudioLimits()) -> np.ndarray:
    """float32 [n] mono samples at 16 kHz, exactly as the reference's _decode_audio makes them; call check() first.

    The same PyAV calls as the reference (first audio stream, resampled to flt/mono/16 kHz, flushed with
    None), with the demuxer named by the sniffed format rather than probed, and each decoded frame counted
    before it is resampled: decoding stops at max_audio_seconds (plus what an MP3 without a LAME tag decodes
    beyond its clip: the reference hears that too).
    """
    import av

    chunks: list[np.ndarray] = []
    consumed = 0
    try:
        with av.open(io.BytesIO(data), format=header.format) as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise AudioRejected(loc, f"is a {header.format.upper()} file with no audio stream",
                                    "value_error.audio.empty")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in itertools.chain(container.decode(stream), (None,)):
                if frame is not None:
                    consumed = _admit(frame, consumed, header, limits, loc)
                chunks.extend(resampled.to_ndarray().reshape(-1) for resampled in resampler.resample(frame))
    except MemoryError:  # FFmpeg's ENOMEM too: over the decoder's memory cap (decoders.py), not a corrupt clip
        raise
    except _decode_errors() as exc:
        reason = getattr(exc, "strerror", None) or str(exc)  # PyAV's str() carries an errno and a '<none>' file
        raise AudioRejected(loc, f"cannot be decoded as {header.format.upper()} ({reason}); re-encode it as 16-bit "
                                 "PCM WAV or MP3", "value_error.audio.corrupt") from None
    if not sum(chunk.size for chunk in chunks):
        raise AudioRejected(loc, f"is a {header.format.upper()} file that holds no audio samples",
                            "value_error.audio.empty")
    return np.concatenate(chunks).astype(np.float32, copy=False)
