"""The media kinds as ONE table: each kind's checked input, how its body field reads in messages and in
/openapi.json, how it is checked from its header and against its limits, decoded (in the capped decoder processes
or in a thread), which towers' times x_timings reports, and its refusal by a model that cannot take it. request.py
(finding media in a body), the decoder pool, the service and the OpenAPI description iterate it: a new kind is its
own module (bridge/media/<kind>.py: header check, limits, decoding) plus one row here."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...head import media as media_kinds
from ...head.errors import Problem, RequestInvalid
from ..gguf.projector import PROJECTOR_HOME
from . import audio as audio_files
from . import frames as frame_arrays
from . import media_kwargs
from . import video as video_files
from .audio import AudioInput, AudioRejected, AudioTooLarge
from .audio_tower import MIN_AUDIO_SAMPLES, SAMPLE_RATE
from .errors import MediaRejected, MediaTooLarge, detached
from .images import ImageGeometry, ImageHeader, ImageLimits, ImageRejected, ImageTooLarge, check, decode, sniff
from .video import VideoInput, VideoRejected, VideoTooLarge

IMAGE, AUDIO, VIDEO = media_kinds.IMAGE.name, media_kinds.AUDIO.name, media_kinds.VIDEO.name
FORMATS = ("png", "jpeg", "jpg", "webp")  # what an image's `format` may declare; the bytes decide
Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, checked from its header, not decoded yet."""

    loc: Loc
    data: bytes
    header: ImageHeader
    digest: bytes  # sha256 of the bytes: the answer cache's key


@dataclass(frozen=True)
class DecodeSettings:
    """What decoding needs beside the bytes: the projector's image geometry, each medium's limits by kind."""

    geometry: ImageGeometry | None
    limits: Mapping[str, Any]  # each kind's limits by its name: ServerSpec.media_limits


@dataclass(frozen=True)
class Kind:
    """One medium's row: its words, its errors, and the functions each stage of a request calls for it."""

    name: str  # IMAGE, AUDIO or VIDEO: an asset's `type`, its marker's word, a Media kind
    field: str  # its list field in the body (the reference's and Workers AI's shape), and its decode stage
    noun: str  # one of them, in messages
    content_type: str  # a typical one, for messages
    formats: tuple[str, ...]  # what an asset's `format` may declare; the bytes decide
    count_key: str  # the [server] key of its count per request
    bytes_key: str  # the [server] key of one item's bytes
    description: str  # its body field in /openapi.json
    rejected: type[MediaRejected]
    too_large: type[MediaTooLarge]
    inspect: Callable[[Loc, bytes, Any], Any]  # (loc, bytes, its limits) -> its input, checked from its header
    # (its items' bytes, all the request's media bytes, its limits, where the body holds them) -> a refusal of a
    # request holding some of it, by their total, if any: checked before any header is read
    total: Callable[[int, int, Any, Loc], MediaRejected | None]
    decode: Callable[[Sequence[Any], DecodeSettings], tuple[Any, ...]]  # its inputs, decoded; all failures at once
    isolated: bool  # decoded in the capped decoder processes (untrusted containers and codecs), else in a thread
    towers: Mapping[str, str]  # x_timings stage -> the Timings field of a tower it runs through in the worker
    refusal: Callable[[str, Loc], RequestInvalid]  # its 422 (located) for a model (named) that cannot take it
    limits: Callable[[], Any]  # its limits dataclass: the defaults where a server names none
    # (a JSON array in its body field, loc, its limits) -> the array checked and the characters its JSON takes: how
    # it takes a medium given as values (a video's frames); None: such an entry is refused as no medium
    array: Callable[[Any, Loc, Any], tuple[np.ndarray, int]] | None = None

    @property
    def example(self) -> str:
        return f"data:{self.content_type};base64,..."


def combined(errors: list[MediaRejected]) -> MediaRejected:
    """Several media's problems as one error: too large (413) when every one is about size, else 422; typed by
    its medium when they share one."""
    too_large = all(isinstance(e, MediaTooLarge) for e in errors)
    for base, big in [(k.rejected, k.too_large) for k in TABLE.values()] + [(MediaRejected, MediaTooLarge)]:
        if all(isinstance(e, base) for e in errors):
            return (big if too_large else base)(errors[0].loc, problems=[p for e in errors for p in e.problems])
    raise TypeError("not media errors")  # unreachable: every error is a MediaRejected


def _image(loc: Loc, data: bytes, limits: Any) -> ImageInput:
    header = sniff(data, loc)
    check(header, len(data), limits, loc)
    return ImageInput(loc, data, header, hashlib.sha256(data).digest())


def _clip(loc: Loc, data: bytes, limits: Any) -> AudioInput:
    audio_files.check_bytes(len(data), limits, loc)  # before anything parses the bytes
    header = audio_files.sniff(data, loc, limits)
    audio_files.check(header, len(data), limits, loc)
    return AudioInput(loc, data, header, hashlib.sha256(data).digest())


def _video(loc: Loc, data: bytes | np.ndarray, limits: Any) -> VideoInput:
    if isinstance(data, np.ndarray):  # a frame array, checked as it was converted (frames.array)
        return frame_arrays.inspect(loc, data)
    header = video_files.sniff(data, loc)
    video_files.check(header, len(data), limits, loc)
    return VideoInput(loc, data, header, hashlib.sha256(data).digest())


def _images_total(total: int, media_bytes: int, limits: Any, loc: Loc) -> MediaRejected | None:
    if total <= limits.max_total_bytes:
        return None
    return ImageTooLarge(loc, f"the images hold {total} bytes together; the limit is "
                         f"{limits.max_total_bytes} bytes per request (max_image_total_bytes)",
                         "value_error.image.total_bytes")


def _videos_total(total: int, media_bytes: int, limits: Any, loc: Loc) -> MediaRejected | None:
    if media_bytes <= limits.max_media_bytes:
        return None
    return VideoTooLarge(loc, f"the media of this request hold {media_bytes} bytes together; with "
                         f"videos the limit is {limits.max_media_bytes} bytes (max_media_bytes)",
                         "value_error.video.total_bytes")


def _no_total(total: int, media_bytes: int, limits: Any, loc: Loc) -> MediaRejected | None:
    return None


def _each(inputs: Sequence[Any], one: Callable[[Any], Any]) -> tuple[Any, ...]:
    """Every input decoded by one(); all failures at once, detached from their frames (a kept traceback would hold
    the request's bytes)."""
    out, errors = [], []
    for item in inputs:
        try:
            out.append(one(item))
        except MediaRejected as exc:
            errors.append(detached(exc))
    if errors:
        raise combined(errors)
    return tuple(out)


def decode_images(images: Sequence[ImageInput], settings: DecodeSettings) -> tuple[np.ndarray, ...]:
    """Every image's pixels at the projector's size (Pillow; run it off the event loop)."""
    return _each(images, lambda image: decode(image.data, image.header, image.loc, settings.geometry))


def _decode_audio(clips: Sequence[AudioInput], settings: DecodeSettings) -> tuple[np.ndarray, ...]:
    limits = settings.limits[AUDIO]
    return _each(clips, lambda clip: _framed(audio_files.decode(clip.data, clip.header, clip.loc, limits), clip.loc))


def _framed(samples: np.ndarray, loc: Loc) -> np.ndarray:
    """A clip's samples, refused where the request holds it when the reference's feature extractor cannot frame
    them (known only once decoded)."""
    if len(samples) < MIN_AUDIO_SAMPLES:
        raise AudioRejected(loc, f"holds {len(samples)} samples; at least {MIN_AUDIO_SAMPLES} "
                                 f"({1000 * MIN_AUDIO_SAMPLES / SAMPLE_RATE:.1f} ms at {SAMPLE_RATE} Hz) are needed: "
                                 "the reference's feature extractor cannot frame a shorter clip",
                            "value_error.audio_too_short")
    return samples


def _decode_video(video: VideoInput, limits: Any, factor: int) -> video_files.DecodedVideo:
    """A clip's frames at the vision tower's size (resized here, in the decoder process) and its soundtrack; a frame
    array's frames, sized the same way."""
    if video.frames is not None:
        return frame_arrays.decode(video, video_files.tower_geometry(factor))
    decoded = video_files.decode(video.data, video.loc, limits, video_files.tower_geometry(factor),
                                 video.header.duration_s)
    return replace(decoded, fps=video.fps)


def _decode_videos(videos: Sequence[VideoInput], settings: DecodeSettings) -> tuple[Any, ...]:
    limits, factor = settings.limits[VIDEO], settings.geometry.factor  # a model taking videos has a projector
    decoded = _each(videos, lambda video: _decode_video(video, limits, factor))
    media_kwargs.check_audio_in_video(videos, decoded)  # whether each has a soundtrack is known only now
    if all(v.audio is not None for v in decoded):  # the reference's rule: then every soundtrack is an audio item
        _each(list(zip(videos, decoded)), lambda pair: _framed_soundtrack(pair[1].audio, pair[0].loc))
    return decoded


def _framed_soundtrack(samples: np.ndarray, loc: Loc) -> None:
    if len(samples) < MIN_AUDIO_SAMPLES:
        raise VideoRejected(loc, f"has a soundtrack of {len(samples)} samples at {SAMPLE_RATE} Hz; at least "
                                 f"{MIN_AUDIO_SAMPLES} are needed: the reference's feature extractor cannot frame a "
                                 "shorter one; strip the sound or send a longer clip", "value_error.audio_too_short")


def no_projector(model: str, loc: Loc) -> RequestInvalid:
    return RequestInvalid([Problem(loc, f"model {model!r} has no vision projector, so it takes no "
                                   f"images; {PROJECTOR_HOME}", "images_not_supported")])


def no_audio(model: str, loc: Loc) -> RequestInvalid:
    return RequestInvalid([Problem(loc, f"model {model!r} takes no audio: it has no audio encoder "
                                   "(Clef-omni's projector has one; Clef's and Clef-flash's do not); send the audio "
                                   "to a Clef-omni model, or leave it out", "audio_not_supported")])


def no_video(model: str, loc: Loc) -> RequestInvalid:
    return RequestInvalid([Problem(loc, f"model {model!r} takes no videos: Clef-omni reads them "
                                   "(frames through its vision tower, the soundtrack through its audio encoder); Clef "
                                   "and Clef-flash do not: send key frames as images, or send the video to a "
                                   "Clef-omni model", media_kinds.VIDEO.error_type)])


# in the prompt's order of kinds: images, audio clips, then videos (the reference's)
TABLE: dict[str, Kind] = {kind.name: kind for kind in (
    Kind(IMAGE, media_kinds.IMAGE.field, "image", "image/png", FORMATS, "max_images", "max_image_bytes",
         "PNG, JPEG or WebP images as data: URLs, base64 or {content_type, base64} (the reference's and Workers AI's "
         "shape); needs a vision projector; max_images counts the assets' images too",
         ImageRejected, ImageTooLarge, _image, _images_total, decode_images, False, {"vision": "vision"},
         no_projector, ImageLimits),
    Kind(AUDIO, media_kinds.AUDIO.field, "audio clip", "audio/wav", audio_files.FORMATS, "max_audio_clips",
         "max_audio_bytes",
         "WAV or MP3 clips as data: URLs, base64 or {content_type, base64}, heard after the images; needs a model "
         "with audio (x_media lists \"audio\"); max_audio_clips counts the assets' clips too",
         AudioRejected, AudioTooLarge, _clip, _no_total, _decode_audio, True, {"audio_tower": "audio"}, no_audio,
         audio_files.AudioLimits),
    # a video's soundtrack goes through the audio tower (0 ms for a silent one)
    Kind(VIDEO, media_kinds.VIDEO.field, "video", "video/mp4", video_files.FORMATS, "max_videos", "max_video_bytes",
         "MP4, WebM or Matroska videos as data: URLs, base64 or {content_type, base64}, or frame arrays "
         "([frames][height][width][3] integers 0 to 255, at 2 fps, silent), seen after the audio clips: frames at 2 "
         "fps and, when every video has one, the soundtrack; needs a model with video (x_media lists \"video\"); "
         "max_videos counts the assets' videos too; media_kwargs.videos_kwargs as the reference's (fps ...)",
         VideoRejected, VideoTooLarge, _video, _videos_total, _decode_videos, True,
         {"vision": "vision", "audio_tower": "audio"}, no_video, video_files.VideoLimits, frame_arrays.array),
)}
