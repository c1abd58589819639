"""A body's `media_kwargs`: the reference's processor options, applied where their effect is reproduced, refused by
name where it is not (never ignored).

The reference (`_encode_media` in Cloudflare's clef-omni joint_schema_model.py) builds its processor call's options,
then lets the record's `media_kwargs` replace them key by key:

    options = {"images_kwargs": {"size": IMAGE_SIZE},
               "videos_kwargs": {"fps": VIDEO_FPS, "do_sample_frames": False, "use_audio_in_video": use_audio_in_video}}
    options.update(record.get("media_kwargs") or {})

so a `videos_kwargs` sent REPLACES the reference's whole: a key it leaves out takes the processor's own default, not
the reference's (transformers 5.20.2, its pin, measured in its environment):

- `fps`: the processor's 1.0 when left out (or null). It is the frame pairs' spacing in time, not a sampling rate:
  the frames are taken at 2 fps whatever it says (do_sample_frames is off), each pair spans 2 / fps seconds, so at
  1.0 pair k sits at temporal position 26 k instead of 13 k (and a soundtrack's tokens interleave accordingly).
  Taken where 2 / fps is a whole number from 1 to MAX_GRID_SECONDS (fps 2, 1, 2/3, 0.5, ...): the reference's
  positions are then whole numbers, as llama.cpp's are; another fps gives fractional ones (fps 4: 6.5 k);
- `use_audio_in_video`: false when left out. Only the value the reference's own rule gives is taken (true exactly
  when every video of the request has a soundtrack): false beside soundtracks makes the reference hand them to its
  thinker anyway, which then places every frame token as text (positions 0, 1, 2, ... measured); true beside a
  silent video (or a frame array) fails in its processor (StopIteration);
- `do_sample_frames`: false or null only; true fails in the reference (its frames carry no metadata to sample by);
- `position_id_per_seconds`: 13 only, the thinker's own; another value reorders a sounded video's frame and sound
  tokens in the reference's prompt without moving their positions;
- `size`: the processor's own frame bounds only ({"shortest_edge": 131072, "longest_edge": 786432});
- `seconds_per_chunk` (any positive number) and `cap_pixels_per_frame` (a boolean): taken, they change nothing
  there: the processor pops the first and never reads it, and the second caps a frame at 1,966,080 pixels or more
  for the 120 frames a video may hold, above the 786,432 it is sized to anyway.

`images_kwargs` is taken when it is the reference's own ({"size": {"shortest_edge": 65536, "longest_edge":
1048576}}). Every other key (audio_kwargs, text_kwargs, common_kwargs, processor keys sent flat) is refused by name:
422, loc ["body", "media_kwargs", key, ...]. The keys are checked whatever media the request holds, so a request
answers or is refused the same way with or without its videos.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ...head.errors import Problem
from .video import FPS, MAX_TOWER_PIXELS, MIN_TOWER_PIXELS, DecodedVideo, VideoInput, VideoRejected

FIELD = "media_kwargs"
LOC = ("body", FIELD)
PROCESSOR_FPS = 1.0  # the processor's fps where videos_kwargs names none (Qwen3OmniMoeProcessor.__call__)
POSITION_ID_PER_SECONDS = 13  # the thinker's, and the processor's default (bridge/llama/omni_positions.py's)
MAX_GRID_SECONDS = 60  # 2 / fps at most: a frame pair a minute; the last of 60 pairs then sits at 46,020
IMAGES = {"size": {"shortest_edge": 65_536, "longest_edge": 1_048_576}}  # the reference's IMAGE_SIZE
VIDEO_SIZE = {"shortest_edge": MIN_TOWER_PIXELS, "longest_edge": MAX_TOWER_PIXELS}
TAKEN = ("fps", "use_audio_in_video", "do_sample_frames", "position_id_per_seconds", "size", "seconds_per_chunk",
         "cap_pixels_per_frame")
OTHER_GROUPS = ("audio_kwargs", "text_kwargs", "common_kwargs")


@dataclass(frozen=True)
class VideoOptions:
    """What media_kwargs changes about a request's videos."""

    fps: float = FPS  # the processor's fps: a frame pair spans 2 / fps seconds
    audio_in_video: bool | None = None  # use_audio_in_video as asked; None: the reference's own rule

    @property
    def default(self) -> bool:
        return self == VideoOptions()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fps(value: Any, loc: tuple, problems: list[Problem]) -> float:
    if value is None:
        return PROCESSOR_FPS
    if not _number(value) or value <= 0:
        problems.append(Problem(loc, f"fps must be a positive number, got {value!r}", "type_error"))
        return FPS
    grid = 2 / value
    if not grid.is_integer() or grid > MAX_GRID_SECONDS:
        problems.append(Problem(loc, f"fps {value!r} puts frame pair k at temporal position {grid * 13:g} k; "
                                "clef-bridge takes an fps whose 2 / fps is a whole number from 1 to "
                                f"{MAX_GRID_SECONDS} (2, 1, 0.5, 0.4, ...): the reference's positions are whole "
                                "numbers then, as llama.cpp's are", "value_error.media_kwargs.fps"))
        return FPS
    return float(value)


def _flag(value: Any, loc: tuple, problems: list[Problem]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    problems.append(Problem(loc, f"{loc[-1]} must be true or false, got {value!r}", "type_error"))
    return None


def _videos(kwargs: Any, loc: tuple, problems: list[Problem]) -> VideoOptions:
    """videos_kwargs as the processor reads it: the reference's own replaced whole, left-out keys its defaults."""
    if not isinstance(kwargs, dict):
        problems.append(Problem(loc, "videos_kwargs must be an object (it replaces the reference's own: "
                                f"{{\"fps\": {FPS:g}, \"do_sample_frames\": false, \"use_audio_in_video\": ...}})",
                                "type_error"))
        return VideoOptions()
    for key in kwargs:
        if key not in TAKEN:
            problems.append(Problem(loc + (key,), f"videos_kwargs.{key} is not applied by clef-bridge; it takes "
                                    f"{', '.join(TAKEN)}", "value_error.media_kwargs.unknown"))
    fps = _fps(kwargs.get("fps"), loc + ("fps",), problems)
    in_video = _flag(kwargs.get("use_audio_in_video"), loc + ("use_audio_in_video",), problems)
    if _flag(kwargs.get("do_sample_frames"), loc + ("do_sample_frames",), problems):
        problems.append(Problem(loc + ("do_sample_frames",), "do_sample_frames true fails in the reference (its "
                                "load_video hands the processor frames without the metadata sampling needs); frames "
                                "are taken at 2 fps already: leave it out or send false",
                                "value_error.media_kwargs.do_sample_frames"))
    per_second = kwargs.get("position_id_per_seconds", POSITION_ID_PER_SECONDS)
    if not _number(per_second) or per_second != POSITION_ID_PER_SECONDS:
        problems.append(Problem(loc + ("position_id_per_seconds",), f"position_id_per_seconds must be "
                                f"{POSITION_ID_PER_SECONDS}, the thinker's own, got {per_second!r}: another value "
                                "reorders a sounded video's frame and sound tokens in the reference's prompt without "
                                "moving their positions, which clef-bridge does not reproduce",
                                "value_error.media_kwargs.position_id_per_seconds"))
    if "size" in kwargs and kwargs["size"] != VIDEO_SIZE:
        problems.append(Problem(loc + ("size",), f"size must be the processor's own, {VIDEO_SIZE}, got "
                                f"{kwargs['size']!r}: frames are sized for the vision tower within those bounds",
                                "value_error.media_kwargs.size"))
    chunk = kwargs.get("seconds_per_chunk", 2.0)
    if not _number(chunk) or chunk <= 0:
        problems.append(Problem(loc + ("seconds_per_chunk",), f"seconds_per_chunk must be a positive number, got "
                                f"{chunk!r}", "type_error"))
    _flag(kwargs.get("cap_pixels_per_frame"), loc + ("cap_pixels_per_frame",), problems)
    return VideoOptions(fps, bool(in_video))


def parse(kwargs: Any, problems: list[Problem]) -> VideoOptions:
    """A body's media_kwargs (None: left out) as what it changes, each problem added to problems."""
    if kwargs is None:
        return VideoOptions()
    if not isinstance(kwargs, dict):
        problems.append(Problem(LOC, "media_kwargs must be an object of the reference's processor options "
                                "(videos_kwargs, images_kwargs)", "type_error"))
        return VideoOptions()
    options = VideoOptions()
    for key, value in kwargs.items():
        loc = LOC + (key,)
        if key == "videos_kwargs":
            options = _videos(value, loc, problems)
        elif key == "images_kwargs":
            if value != IMAGES:
                problems.append(Problem(loc, f"images_kwargs must be the reference's own, {IMAGES}, got {value!r}: "
                                        "images are sized for the vision tower within those bounds",
                                        "value_error.media_kwargs.images_kwargs"))
        elif key in OTHER_GROUPS:
            problems.append(Problem(loc, f"{key} is not applied by clef-bridge: it takes videos_kwargs and "
                                    "images_kwargs", "value_error.media_kwargs.unknown"))
        else:
            problems.append(Problem(loc, f"{key} is not applied by clef-bridge: media_kwargs takes videos_kwargs and "
                                    "images_kwargs (a processor option sent flat goes inside one of them)",
                                    "value_error.media_kwargs.unknown"))
    return options


def applied(videos: Sequence[VideoInput], options: VideoOptions) -> tuple[VideoInput, ...]:
    """The videos with what media_kwargs asks of them; an fps other than 2.0 moves the answer, so it keys it too."""
    if options.default:
        return tuple(videos)
    fps = b"" if options.fps == FPS else f"fps {options.fps!r}\n".encode()
    return tuple(replace(v, fps=options.fps, audio_in_video=options.audio_in_video,
                         digest=hashlib.sha256(fps + v.digest).digest() if fps else v.digest) for v in videos)


def check_audio_in_video(inputs: Sequence[VideoInput], decoded: Sequence[DecodedVideo]) -> None:
    """A use_audio_in_video asked that is not what the reference's rule gives for these videos (true exactly when
    every one has a soundtrack), refused: both ways the reference departs from itself (see above)."""
    asked = inputs[0].audio_in_video if inputs else None
    sounded = all(v.audio is not None for v in decoded)
    if asked is None or asked == sounded:
        return
    loc = LOC + ("videos_kwargs", "use_audio_in_video")
    if asked:
        raise VideoRejected(loc, "use_audio_in_video is true, but a video of this request has no soundtrack (a frame "
                                 "array never has one): the reference's processor fails on that; send false",
                            "value_error.media_kwargs.use_audio_in_video")
    raise VideoRejected(loc, "use_audio_in_video is false (videos_kwargs replaces the reference's own whole: a key "
                             "left out takes the processor's default, false), but every video of this request has a "
                             "soundtrack: the reference then still hands the soundtracks to its thinker, which "
                             "places every frame as text, and clef-bridge does not reproduce that; send true, or "
                             "videos without sound", "value_error.media_kwargs.use_audio_in_video")
