"""Video bytes (MP4/MOV, WebM, Matroska) to the frames and soundtrack Clef-omni reads, as the reference makes them.

The reference (`load_video` in Cloudflare's clef-omni joint_schema_model.py) decodes the first video stream with
PyAV, keeps a frame when its time reaches the next 0.5 s mark (`frame.time + 1e-6 >= kept / 2.0`: 2 fps whatever
the source rate), scales each kept frame down only, to at most 262,144 pixels with even sides, through
`to_ndarray("rgb24", width, height)` (FFmpeg's swscale), pads an odd count with the last frame, and decodes the
clip's first audio stream as an audio clip (16 kHz mono float32, libswresample). `decode` makes the same calls,
so frames and samples are the reference's bit for bit.

Before any frame is decoded, `sniff` reads the container's own headers in pure Python (an MP4's moov boxes, a
Matroska/WebM's EBML Info and Tracks): duration, frame size, frame rate and, for MP4, the frame count and the
bytes its samples claim. `check` refuses a clip over the limits (413, naming the models.toml key) or whose
headers claim more than its bytes hold (422); decoding stops as soon as a clip runs past max_video_seconds or
decodes more source frames than MAX_SOURCE_FPS allows (headers can lie).
"""

from __future__ import annotations

import io
import itertools
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from ...head.errors import Problem
from . import images
from .audio import SAMPLE_RATE
from .errors import MediaRejected, MediaTooLarge
from .images import ImageGeometry

FPS = 2.0  # the reference's VIDEO_FPS: frames kept per second, and the processor's fps (seconds per grid = 2 / fps)
MAX_FRAME_PIXELS = 256 * 32 * 32  # the reference's MAX_VIDEO_FRAME_PIXELS: 262,144
MAX_SOURCE_FPS = 120  # source frames decoded per second of clip at most (each is decoded, even when not kept)
# a source frame larger than 8K UHD is refused before decoding: decode_memory_mb's default is measured to hold two
# 60 s clips of it (bridge/media/decoders.py memory_for); 8192 x 8192 was allowed before and did not fit
MAX_SOURCE_PIXELS = 7680 * 4320
MAX_ASPECT = 200  # the processor's smart_resize refuses a longer side over 200 times the shorter one
DECODE_THREADS = 2  # FFmpeg's threads per clip (frame threading decodes bit-exactly whatever the count)
MP4, MATROSKA = "mp4", "matroska"  # PyAV's demuxers (mov,mp4,m4a,... and matroska,webm)
FORMATS = ("mp4", "mov", "webm", "mkv")  # what an asset's `format` may declare; the bytes decide


class VideoRejected(MediaRejected):
    """A video cannot be used (not MP4/WebM/Matroska, corrupt, no video stream)."""

    error_type = "invalid_video"

    def __init__(self, loc: tuple[str | int, ...], msg: str = "", kind: str = "value_error.video",
                 problems: list[Problem] | None = None):
        super().__init__(loc, msg, kind, problems)


class VideoTooLarge(VideoRejected, MediaTooLarge):
    """A video is over a configured limit (bytes, seconds, frame size)."""

    error_type = "video_too_large"


@dataclass(frozen=True)
class VideoLimits:
    """[server] limits on a request's videos: max_videos, max_video_bytes, max_video_seconds (Workers AI's)."""

    max_videos: int = 2  # per request
    max_bytes: int = 16 * 2**20  # per clip, encoded
    max_seconds: float = 60.0  # per clip: 120 frames at 2 fps
    max_media_bytes: int = 16 * 2**20  # a request with videos: all its media together (images, audio, videos)

    @property
    def max_count(self) -> int:
        return self.max_videos

    @property
    def body_bytes(self) -> int:
        """The most a request's videos take in its body: base64-inflated, with room for the JSON around each."""
        return -(-self.max_videos * self.max_bytes * 4 // 3) + 4096 * self.max_videos


@dataclass(frozen=True)
class VideoHeader:
    """What the container's headers say, before decoding: None where they do not say it."""

    format: str  # MP4 or MATROSKA, from the bytes
    duration_s: float | None
    width: int | None
    height: int | None
    frames: int | None  # the video track's sample count (MP4)
    fps: float | None
    sample_bytes: int | None = None  # what the video track's samples claim to take (MP4's stsz)


@dataclass(frozen=True)
class VideoInput:
    """One video of a request, checked from its headers (or a frame array, checked: frames.py), not decoded yet."""

    loc: tuple[str | int, ...]
    data: bytes  # the file's bytes; b"" for a frame array
    header: VideoHeader
    digest: bytes  # sha256 of the bytes (with media_kwargs' fps where it is not 2.0): the answer cache's key
    frames: np.ndarray | None = field(default=None, compare=False)  # a frame array: uint8 [n, h, w, 3], as given
    fps: float = FPS  # the processor's fps (media_kwargs' videos_kwargs): each frame pair spans 2 / fps seconds
    audio_in_video: bool | None = None  # what media_kwargs asks; None: the reference's rule (every video sounded)


@dataclass(frozen=True)
class DecodedVideo:
    """A clip as the reference loads it: uint8 [n, h, w, 3] RGB frames at 2 fps (n even) and the 16 kHz mono
    float32 soundtrack (None: the clip has none)."""

    frames: np.ndarray
    audio: np.ndarray | None
    fps: float = FPS  # the processor's (media_kwargs' videos_kwargs), not the source's: frames are at 2 fps

    @property
    def seconds_per_grid(self) -> float:
        """Seconds one temporal patch (two frames) spans: the processor's temporal_patch_size / fps."""
        return 2 / self.fps


# --- MP4 / QuickTime ------------------------------------------------------------------------------

def _boxes(data: bytes, start: int, end: int):
    """(type, payload start, payload end) of the ISO BMFF boxes in data[start:end]."""
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, at)
        head = 8
        if size == 1 and at + 16 <= end:
            size, head = struct.unpack_from(">Q", data, at + 8)[0], 16
        elif size == 0:
            size = end - at
        if size < head or at + size > end:
            return
        yield kind, at + head, at + size
        at += size


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((s, e) for k, s, e in _boxes(data, start, end) if k == kind), None)


def _mvhd_like(data: bytes, s: int, e: int) -> float | None:
    """The seconds an mvhd or mdhd box's payload data[s:e] says; None where it is too short to say them (version 1
    puts a 64-bit duration after 64-bit times: 32 bytes, version 0 20) or its timescale is 0."""
    version_1 = s < e and data[s] == 1
    if e - s < (32 if version_1 else 20):
        return None
    scale, length = struct.unpack_from(">IQ", data, s + 20) if version_1 else struct.unpack_from(">II", data, s + 12)
    return length / scale if scale else None


def _mp4(data: bytes) -> VideoHeader | None:
    moov = _child(data, 0, len(data), b"moov")
    if moov is None:
        return None
    duration = None
    mvhd = _child(data, *moov, b"mvhd")
    if mvhd:
        duration = _mvhd_like(data, *mvhd)
    for kind, s, e in _boxes(data, *moov):
        if kind != b"trak":
            continue
        mdia = _child(data, s, e, b"mdia")
        hdlr = mdia and _child(data, *mdia, b"hdlr")
        if not hdlr or data[hdlr[0] + 8:hdlr[0] + 12] != b"vide":
            continue
        tkhd = _child(data, s, e, b"tkhd")
        width = height = None
        if tkhd and tkhd[1] - tkhd[0] >= 84:
            w, h = struct.unpack_from(">II", data, tkhd[1] - 8)
            width, height = w >> 16, h >> 16
        mdhd = _child(data, *mdia, b"mdhd")
        track_s = _mvhd_like(data, *mdhd) if mdhd else None
        stbl = _child(data, *(_child(data, *mdia, b"minf") or (0, 0)), b"stbl")
        stsz = stbl and _child(data, *stbl, b"stsz")
        frames = sample_bytes = None
        if stsz and stsz[1] - stsz[0] >= 12:
            size, frames = struct.unpack_from(">II", data, stsz[0] + 4)
            if size:
                sample_bytes = size * frames
            elif stsz[0] + 12 + 4 * frames <= stsz[1]:
                sample_bytes = sum(struct.unpack_from(f">{frames}I", data, stsz[0] + 12))
            else:
                sample_bytes = len(data) + 1  # a table longer than its box: claims more than the bytes hold
        seconds = track_s if track_s else duration
        fps = frames / seconds if frames and seconds else None
        return VideoHeader(MP4, seconds, width, height, frames or None, fps, sample_bytes)
    return VideoHeader(MP4, duration, None, None, None, None)


# --- Matroska / WebM ------------------------------------------------------------------------------

EBML, SEGMENT, INFO, TRACKS, CLUSTER = 0x1A45DFA3, 0x18538067, 0x1549A966, 0x1654AE6B, 0x1F43B675
TRACK_ENTRY, TRACK_TYPE, DEFAULT_DURATION, VIDEO = 0xAE, 0x83, 0x23E383, 0xE0
TIMESTAMP_SCALE, DURATION, PIXEL_WIDTH, PIXEL_HEIGHT = 0x2AD7B1, 0x4489, 0xB0, 0xBA


def _vint(data: bytes, at: int, keep_marker: bool) -> tuple[int, int] | None:
    """An EBML variable-length integer at `at`: (value, its length); None past the end or for a bad first byte."""
    if at >= len(data) or data[at] == 0:
        return None
    n = 8 - data[at].bit_length() + 1
    if at + n > len(data):
        return None
    value = int.from_bytes(data[at:at + n], "big")
    if not keep_marker:
        value &= (1 << (7 * n)) - 1
        if value == (1 << (7 * n)) - 1:  # all ones: unknown size
            value = -1
    return value, n


def _elements(data: bytes, start: int, end: int):
    """(id, payload start, payload end) of the EBML elements in data[start:end]; an unknown size runs to end."""
    at = start
    while at < end:
        ident = _vint(data, at, keep_marker=True)
        size = ident and _vint(data, at + ident[1], keep_marker=False)
        if not size:
            return
        s = at + ident[1] + size[1]
        e = end if size[0] < 0 else min(s + size[0], end)
        yield ident[0], s, e
        if size[0] < 0 and ident[0] not in (SEGMENT, CLUSTER):
            return
        at = e


class _Corrupt(ValueError):
    """A Matroska element whose value no valid file holds."""


def _uint(data: bytes, s: int, e: int) -> int:
    """An EBML unsigned integer: at most 8 bytes (RFC 8794), so every later product stays small."""
    if e - s > 8:
        raise _Corrupt(f"an integer element of {e - s} bytes (at most 8)")
    return int.from_bytes(data[s:e], "big")


def _matroska(data: bytes, loc: tuple[str | int, ...]) -> VideoHeader:
    try:
        return _matroska_fields(data)
    except _Corrupt as exc:
        raise VideoRejected(loc, f"has corrupt Matroska headers: {exc}", "value_error.video.corrupt") from None


def _matroska_fields(data: bytes) -> VideoHeader:
    scale, duration, width, height, fps = 1_000_000, None, None, None, None
    segment = next(((s, e) for i, s, e in _elements(data, 0, len(data)) if i == SEGMENT), None)
    for ident, s, e in _elements(data, *segment) if segment else ():
        if ident == CLUSTER:  # the headers come before the first cluster
            break
        if ident == INFO:
            for i, a, b in _elements(data, s, e):
                if i == TIMESTAMP_SCALE:
                    scale = _uint(data, a, b)
                elif i == DURATION and b - a in (4, 8):
                    duration = struct.unpack(">f" if b - a == 4 else ">d", data[a:b])[0]
                    if not math.isfinite(duration) or duration < 0:
                        raise _Corrupt(f"a duration of {duration}")
        elif ident == TRACKS:
            for i, a, b in _elements(data, s, e):
                fields = {j: (c, d) for j, c, d in _elements(data, a, b)} if i == TRACK_ENTRY else {}
                if TRACK_TYPE not in fields or _uint(data, *fields[TRACK_TYPE]) != 1 or width is not None:
                    continue
                video = {j: (c, d) for j, c, d in _elements(data, *fields[VIDEO])} if VIDEO in fields else {}
                width = _uint(data, *video[PIXEL_WIDTH]) if PIXEL_WIDTH in video else None
                height = _uint(data, *video[PIXEL_HEIGHT]) if PIXEL_HEIGHT in video else None
                if DEFAULT_DURATION in fields and _uint(data, *fields[DEFAULT_DURATION]):
                    fps = 1e9 / _uint(data, *fields[DEFAULT_DURATION])
    seconds = duration * scale / 1e9 if duration is not None else None
    return VideoHeader(MATROSKA, seconds, width, height, None, fps)


def sniff(data: bytes, loc: tuple[str | int, ...]) -> VideoHeader:
    """The container (and what its headers say) from the bytes alone; a declared format is not trusted."""
    if data[4:8] == b"ftyp":
        header = _mp4(data)
        if header is None:
            raise VideoRejected(loc, "is an MP4/QuickTime file without a moov box (its index): re-encode it, or "
                                     "move the index to the front (ffmpeg -movflags +faststart)",
                                "value_error.video.corrupt")
        return header
    if data[:4] == EBML.to_bytes(4, "big"):
        return _matroska(data, loc)
    raise VideoRejected(loc, "is not an MP4, WebM or Matroska video (judged from its bytes); send one of those "
                             "formats", "value_error.video.format")


def check(header: VideoHeader, n_bytes: int, limits: VideoLimits, loc: tuple[str | int, ...]) -> None:
    """Refuse a clip over the limits, or whose headers claim more than its bytes hold, before decoding it."""
    if n_bytes > limits.max_bytes:
        raise VideoTooLarge(loc, f"is {n_bytes} bytes; the limit is {limits.max_bytes} bytes per video "
                                 "(max_video_bytes)", "value_error.video.bytes")
    if header.duration_s is not None and header.duration_s > limits.max_seconds:
        raise too_long(loc, header.duration_s, limits)
    if header.width and header.height and header.width * header.height > MAX_SOURCE_PIXELS:
        raise VideoTooLarge(loc, f"has {header.width} x {header.height} frames; at most {MAX_SOURCE_PIXELS} pixels "
                                 "per source frame are decoded (each kept frame is scaled to 262,144)",
                            "value_error.video.pixels")
    if header.width and header.height:
        check_aspect(header.width, header.height, loc)
    if header.frames and header.frames > MAX_SOURCE_FPS * limits.max_seconds:
        raise VideoTooLarge(loc, f"holds {header.frames} frames; at most {MAX_SOURCE_FPS} per second of the "
                                 f"{limits.max_seconds:g} s allowed (max_video_seconds) are decoded",
                            "value_error.video.frames")
    if header.sample_bytes is not None and header.sample_bytes > n_bytes:
        raise VideoRejected(loc, f"its headers claim {header.sample_bytes} bytes of video samples, but the file "
                                 f"holds {n_bytes} bytes: truncated or corrupt", "value_error.video.corrupt")


def check_aspect(width: int, height: int, loc: tuple[str | int, ...]) -> None:
    """The reference's processor fails on frames whose sides differ more than 200-fold: a 422 here instead."""
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise VideoRejected(loc, f"has {width} x {height} frames; the sides may differ at most {MAX_ASPECT}-fold "
                                 "(the reference's video processor refuses longer ones)", "value_error.video.aspect")


def too_long(loc: tuple[str | int, ...], seconds: float, limits: VideoLimits, at_least: bool = False) -> VideoTooLarge:
    return VideoTooLarge(loc, f"lasts {'more than ' if at_least else ''}{seconds:.2f} s; the limit is "
                              f"{limits.max_seconds:g} s per video (max_video_seconds): cut it",
                         "value_error.video.seconds")


# --- decoding -------------------------------------------------------------------------------------

def kept_size(width: int, height: int) -> tuple[int, int]:
    """A kept frame's (width, height): scaled down only, to at most 262,144 pixels, even sides (the reference's)."""
    scale = min(1.0, math.sqrt(MAX_FRAME_PIXELS / (width * height)))
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


def _decode_errors() -> tuple[type[BaseException], ...]:
    import av

    return av.FFmpegError, ValueError, OSError, EOFError


class _Kept:
    """The kept frames in ONE array, sized for the frames the headers' duration promises (2 fps plus the padding
    frame), grown by doubling where they lied: no list of frames and a stacked copy side by side; each frame sized
    for the tower as it comes when a geometry is given (no second array of resized frames)."""

    def __init__(self, limits: VideoLimits, geometry: ImageGeometry | None, loc: tuple[str | int, ...],
                 seconds: float | None):
        self.most = int(limits.max_seconds * FPS) + 2  # a clip over max_seconds is refused before it keeps more
        self.capacity = min(self.most, int(min(seconds, limits.max_seconds) * FPS) + 2) if seconds else 8
        self.geometry, self.loc = geometry, loc
        self.frames: np.ndarray | None = None
        self.sizes: list[tuple[int, int]] = []  # (width, height) of each kept size, as decoded
        self.n = 0

    def add(self, image: np.ndarray) -> None:
        size = (image.shape[1], image.shape[0])
        if self.sizes and size != self.sizes[0]:  # the reference's load_video stacks its frames and fails there too
            raise VideoRejected(self.loc, f"changes its frame size mid-stream ({self.sizes[0][0]} x "
                                          f"{self.sizes[0][1]} then {size[0]} x {size[1]}); the reference reads clips "
                                          "of one frame size: re-encode it at one size", "value_error.video.frame_size")
        self.sizes = self.sizes or [size]
        if self.geometry is not None:
            image = tower_frame(image, self.geometry)
        if self.frames is None:
            self.frames = np.empty((self.capacity, *image.shape), dtype=np.uint8)
        self._room()
        self.frames[self.n] = image
        self.n += 1

    def _room(self) -> None:
        if self.n == len(self.frames):
            grown = np.empty((min(self.most, 2 * len(self.frames)), *self.frames.shape[1:]), dtype=np.uint8)
            grown[:self.n] = self.frames[:self.n]
            self.frames = grown

    def stacked(self) -> np.ndarray:
        """uint8 [n, h, w, 3], n even: an odd count padded with its last frame (the reference's)."""
        if self.n % 2:
            self._room()
            self.frames[self.n] = self.frames[self.n - 1]
            self.n += 1
        return self.frames[:self.n]


def _frames(container, loc: tuple[str | int, ...], limits: VideoLimits, kept: _Kept) -> None:
    stream = next((s for s in container.streams if s.type == "video"), None)
    if stream is None:
        raise VideoRejected(loc, "holds no video stream", "value_error.video.empty")
    stream.thread_type = "AUTO"
    # FFmpeg's default is a thread per core plus one, each with its stack and, in glibc, a malloc arena of up to
    # 64 MB of address space: on a 16-core host that alone passed the decoder's address-space cap (decode_memory_mb)
    stream.thread_count = DECODE_THREADS
    for decoded, frame in enumerate(container.decode(stream), 1):
        if decoded > MAX_SOURCE_FPS * limits.max_seconds:
            raise VideoTooLarge(loc, f"decodes to more than {decoded - 1} frames; at most {MAX_SOURCE_FPS} per "
                                     f"second of the {limits.max_seconds:g} s allowed (max_video_seconds)",
                                "value_error.video.frames")
        if frame.width * frame.height > MAX_SOURCE_PIXELS:
            raise VideoTooLarge(loc, f"has {frame.width} x {frame.height} frames; at most {MAX_SOURCE_PIXELS} "
                                     "pixels per source frame", "value_error.video.pixels")
        if frame.time is not None and frame.time > limits.max_seconds:  # the headers said less, or nothing
            raise too_long(loc, frame.time, limits, at_least=True)
        if frame.time is None or frame.time + 1e-6 < kept.n / FPS:
            continue
        width, height = kept_size(frame.width, frame.height)
        check_aspect(width, height, loc)
        kept.add(frame.to_ndarray(format="rgb24", width=width, height=height))


def _soundtrack(data: bytes, limits: VideoLimits, loc: tuple[str | int, ...]) -> np.ndarray | None:
    """The first audio stream at 16 kHz mono float32 (the reference's _decode_audio, bounded); None without one."""
    import av

    chunks: list[np.ndarray] = []
    total, cap = 0, round((limits.max_seconds + 1) * SAMPLE_RATE)  # a soundtrack may outlast its frames a little
    with av.open(io.BytesIO(data)) as container:
        stream = next((s for s in container.streams if s.type == "audio"), None)
        if stream is None:
            return None
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        for frame in itertools.chain(container.decode(stream), (None,)):
            for resampled in resampler.resample(frame):
                chunks.append(resampled.to_ndarray().reshape(-1))
                total += chunks[-1].size
            if total > cap:
                raise too_long(loc, total / SAMPLE_RATE, limits, at_least=frame is not None)
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else None
    return samples if samples is not None and samples.size else None


def decode(data: bytes, loc: tuple[str | int, ...], limits: VideoLimits = VideoLimits(),
           geometry: ImageGeometry | None = None, seconds: float | None = None) -> DecodedVideo:
    """The reference's load_video on a clip's bytes, bounded by the limits; call check() first. The container is
    probed as the reference probes it (no format named), so both read it with the same demuxer. With a geometry
    (tower_geometry), each kept frame is sized for the vision tower as it is decoded (tower_frames' result);
    seconds: the length its headers say (VideoHeader.duration_s), which sizes the frames' array."""
    import av

    kept = _Kept(limits, geometry, loc, seconds)
    try:
        with av.open(io.BytesIO(data)) as container:
            _frames(container, loc, limits, kept)
        audio = _soundtrack(data, limits, loc)
    except MemoryError:  # FFmpeg's ENOMEM too: over the decoder's memory cap (decoders.py), not a corrupt clip
        raise
    except _decode_errors() as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise VideoRejected(loc, f"cannot be decoded ({reason}); re-encode it as MP4 (H.264, AAC) or WebM",
                            "value_error.video.corrupt") from None
    if not kept.n:
        raise VideoRejected(loc, "holds no decodable frames", "value_error.video.empty")
    return DecodedVideo(kept.stacked(), audio)


# --- what the vision tower sees -------------------------------------------------------------------

# The frame-size bounds the reference's processor applies: Qwen3-Omni's processor defaults (128 to 768 merged
# 32 x 32 patches per frame). The release's preprocessor_config.json says 3,136 to 12,845,056 pixels, but
# transformers (5.20.2, the reference's) passes the processor's defaults to its video processor as call
# arguments, which win: a 320 x 240 frame becomes 448 x 320 there (measured), not 320 x 256.
MIN_TOWER_PIXELS = 128 * 32 * 32  # 131,072
MAX_TOWER_PIXELS = 768 * 32 * 32  # 786,432


def tower_geometry(factor: int) -> ImageGeometry:
    """How the video processor sizes frames for a vision tower of this factor (its projector's patch x merge pixels a
    token side; Qwen3-Omni's 16 x 2 = 32): the pixel bounds above."""
    return ImageGeometry(factor, MIN_TOWER_PIXELS, MAX_TOWER_PIXELS)


def smart_resize(height: int, width: int, geometry: ImageGeometry) -> tuple[int, int]:
    """(height, width) the video processor resizes a frame to (Qwen2-VL's smart_resize, as for images)."""
    return images.smart_resize(height, width, geometry)


def tower_frame(frame: np.ndarray, geometry: ImageGeometry) -> np.ndarray:
    """uint8 [H, W, 3] at the processor's size (bicubic with antialiasing, as torchvision's uint8 resize, through
    Pillow); unchanged when the size already fits."""
    from PIL import Image

    height, width = smart_resize(frame.shape[0], frame.shape[1], geometry)
    if (height, width) == frame.shape[:2]:
        return frame
    return np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.BICUBIC))


def tower_frames(frames: np.ndarray, geometry: ImageGeometry) -> np.ndarray:
    """uint8 [n, H, W, 3] frames at the processor's size (tower_frame's); unchanged when the size already fits."""
    if smart_resize(frames.shape[1], frames.shape[2], geometry) == frames.shape[1:3]:
        return frames
    return np.stack([tower_frame(f, geometry) for f in frames])


def patches(frames: np.ndarray, patch: int = 16, merge: int = 2, temporal: int = 2) -> np.ndarray:
    """The processor's pixel_values_videos for frames already at the tower's size: float32
    [t/2 * gh * gw, 3 * temporal * patch * patch], rescaled to [0, 1], normalized by mean = std = 0.5, in
    Qwen2-VL's patch order (merge blocks of merge x merge patches, row by row)."""
    n, height, width, _ = frames.shape
    x = (frames.astype(np.float32) / 255 - 0.5) / 0.5
    x = x.transpose(0, 3, 1, 2)  # [n, 3, H, W]
    gt, gh, gw = n // temporal, height // patch, width // patch
    x = x.reshape(gt, temporal, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * temporal * patch * patch))
