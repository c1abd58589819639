"""Videos given as frame arrays, as the reference takes them.

Cloudflare's `load_video` takes any value that is not encoded (bytes, a string, a path) as frames: "Frame arrays are
used as given (already sampled at ``VIDEO_FPS``) and have no audio track", `np.asarray(value), None`. In a JSON body
such a value is nested arrays of integers, which np.asarray stacks into int64 [frames, height, width, 3]: RGB, as
its own decoding makes them (`to_ndarray(format="rgb24")` stacked). So a `videos` entry that is an array is read as
that, and nothing else: exactly four levels, three channels last, every value an integer from 0 to 255 (the
reference's processor would take other shapes and values, each its own way; refused here, each by its location).
"As given": no 2 fps sampling, no 262,144-pixel cap, no soundtrack; the frames are sized for the vision tower as a
decoded clip's are (video.tower_frames), an odd count padded with the last frame (the processor's patchify does
the same).

One difference from the reference remains, where frames are resized: its processor resizes int64 frames (what
np.asarray makes of JSON integers) in float and rounds them without clamping to 0..255, where it clamps uint8 ones
(a file's frames, torchvision's resize). llama.cpp's vision tower takes uint8 bitmaps, so the bridge clamps: the
pixels differ where bicubic overshoots (docs/media.md gives what it costs). Frames already at the tower's size
(sides multiples of 32, 131,072 to 786,432 pixels) are not resized, and are the reference's exactly.
"""

from __future__ import annotations

import hashlib
from itertools import chain

import numpy as np

from .images import ImageGeometry
from .video import (
    FPS,
    MAX_SOURCE_PIXELS,
    DecodedVideo,
    VideoHeader,
    VideoInput,
    VideoLimits,
    VideoRejected,
    VideoTooLarge,
    check_aspect,
    tower_frames,
)

FRAMES = "frames"  # VideoHeader.format of a frame array
SHAPE = "[frames][height][width][3]"
Loc = tuple[str | int, ...]


def max_frames(limits: VideoLimits) -> int:
    """The frames an array may hold: max_video_seconds at the reference's 2 fps (120 at the default 60 s)."""
    return int(limits.max_seconds * FPS)


def _claimed(value: list) -> tuple[int, ...]:
    """The shape the first element of each level claims (len of value, value[0], value[0][0], ...): checked against
    the limits before the lists are converted, and against the array once they are."""
    shape, level = [], value
    while isinstance(level, list) and len(shape) < 5:
        shape.append(len(level))
        level = level[0] if level else None
    return tuple(shape)


def _shape_error(loc: Loc, shape: tuple[int, ...], ragged: bool = False) -> VideoRejected:
    what = (f"whose frames, rows or pixels differ in length (the first of each level: {list(shape)})" if ragged
            else f"of shape {list(shape)}")
    return VideoRejected(loc, f"is a frame array {what}; a frame array is {SHAPE}: RGB frames at 2 fps, each value an "
                              "integer from 0 to 255 (what the reference's load_video makes of a clip; channels last, "
                              "at least one frame)", "value_error.video.frames_shape")


def _check_size(loc: Loc, n: int, height: int, width: int, limits: VideoLimits) -> None:
    """The video limits, read on frames: their count (max_video_seconds at 2 fps), their pixels and aspect, their
    bytes (one a value, as uint8)."""
    if n > max_frames(limits):
        raise VideoTooLarge(loc, f"holds {n} frames; at most {max_frames(limits)} (max_video_seconds "
                                 f"{limits.max_seconds:g} s at {FPS:g} fps, the rate frame arrays are taken at)",
                            "value_error.video.frames")
    if height * width > MAX_SOURCE_PIXELS:
        raise VideoTooLarge(loc, f"has {width} x {height} frames; at most {MAX_SOURCE_PIXELS} pixels per frame",
                            "value_error.video.pixels")
    check_aspect(width, height, loc)
    if n * height * width * 3 > limits.max_bytes:
        raise VideoTooLarge(loc, f"is a frame array of {n * height * width * 3} bytes; the limit is "
                                 f"{limits.max_bytes} bytes per video (max_video_bytes)", "value_error.video.bytes")


def _leaves(value: list):
    """The values of a rectangular four-level array, in order (three levels of lists flattened at C speed)."""
    return chain.from_iterable(chain.from_iterable(chain.from_iterable(value)))


def array(value: list, loc: Loc, limits: VideoLimits) -> tuple[np.ndarray, int]:
    """A `videos` entry that is an array, as uint8 [n, h, w, 3] frames, and the characters its compact JSON takes
    (counted as media, not as the body's text); every problem a VideoRejected (or VideoTooLarge) at loc."""
    claimed = _claimed(value)
    if len(claimed) != 4 or claimed[3] != 3 or 0 in claimed:
        raise _shape_error(loc, claimed)
    _check_size(loc, claimed[0], claimed[1], claimed[2], limits)  # before the lists are converted
    try:
        frames = np.array(value)
    except (ValueError, TypeError, OverflowError):  # ragged: numpy refuses an inhomogeneous shape
        raise _shape_error(loc, claimed, ragged=True) from None
    if frames.shape != claimed:
        raise _shape_error(loc, claimed, ragged=True)
    kind = frames.dtype.kind
    if kind in "iu" and bool in set(map(type, _leaves(value))):  # np.array takes true/false among integers as 1/0
        kind = "b"
    if kind not in "iu":
        what = {"b": "true/false", "f": "non-integer numbers"}.get(kind, "values other than integers")
        raise VideoRejected(loc, f"is a frame array holding {what}; each value is an integer from 0 to 255",
                            "value_error.video.frames_type")
    outside = (frames < 0) | (frames > 255)
    if outside.any():
        at = tuple(int(i) for i in np.argwhere(outside)[0])
        raise VideoRejected(loc, f"is a frame array holding {int(frames[at])} at {list(at)} (frame, row, column, "
                                 "channel); each value is an integer from 0 to 255", "value_error.video.frames_range")
    frames = frames.astype(np.uint8)
    return frames, json_chars(frames)


def json_chars(frames: np.ndarray) -> int:
    """The characters of frames as compact JSON (`[[[[0,255,3],...]]]`): the digits, a comma between neighbours and
    the brackets of every array; spaces a client adds count as the body's text."""
    n, h, w, c = frames.shape
    digits = frames.size + int(np.count_nonzero(frames >= 10)) + int(np.count_nonzero(frames >= 100))
    commas = n * h * w * (c - 1) + n * h * (w - 1) + n * (h - 1) + (n - 1)
    return digits + commas + 2 * (n * h * w + n * h + n + 1)


def inspect(loc: Loc, frames: np.ndarray) -> VideoInput:
    """A frame array as a video of the request, its digest the frames' shape and bytes (never a file's)."""
    n, height, width, _ = frames.shape
    header = VideoHeader(FRAMES, n / FPS, width, height, n, FPS)
    digest = hashlib.sha256(f"{FRAMES} {n} {height} {width}\n".encode())
    digest.update(np.ascontiguousarray(frames))
    return VideoInput(loc, b"", header, digest.digest(), frames=frames)


def decode(video: VideoInput, geometry: ImageGeometry) -> DecodedVideo:
    """A frame array as the vision tower reads it: an odd count padded with its last frame, each frame at the tower's
    size (as a decoded clip's: tower_frames); no soundtrack."""
    frames = video.frames
    if len(frames) % 2:
        frames = np.concatenate([frames, frames[-1:]])
    return DecodedVideo(tower_frames(frames, geometry), None, video.fps)

