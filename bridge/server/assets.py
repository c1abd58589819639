"""The server's steps for a request's media: the body size they allow, and finding and decoding them off
the event loop where they cost (bridge/media/request.py and bridge/media/audio.py do the work)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from ...head.schema import Limits
from ..media.audio import AudioLimits, decode_audio_all
from ..media.images import ImageLimits
from ..media.request import Media, decode_all, extract, no_audio, no_projector
from .body import INLINE_BYTES, BodyTooLarge
from .multipart import RequestBody


def body_limit(max_body_bytes: int, limits: ImageLimits, takes_images: bool = True,
               audio: AudioLimits | None = None) -> int:
    """The most a request body may hold: the text's max_body_bytes, plus its images where a served model takes
    images, plus its audio clips where one takes audio (audio: those limits), base64-inflated."""
    out = max_body_bytes
    if takes_images:
        out += -(-limits.max_total_bytes * 4 // 3) + 4096 * limits.max_images
    if audio is not None:
        out += -(-audio.max_clips * audio.max_bytes * 4 // 3) + 4096 * audio.max_clips
    return out


# --- the server's steps, off the event loop where they cost --------------------------------------


async def find_images(body: RequestBody, max_body_bytes: int, limits: ImageLimits, text_limits: Limits,
                      audio_limits: AudioLimits = AudioLimits()) -> Media:
    """extract() for a read body; its text (the JSON without inlined media) must fit max_body_bytes."""
    def run() -> Media:
        media = extract(body.data, body.parts, limits, text_limits, audio_limits)
        if body.json_bytes - media.inline_chars > max_body_bytes:
            raise BodyTooLarge(f"the request's JSON exceeds {max_body_bytes} bytes"
                               f"{' without its images and audio' if media.inline_chars else ''} (max_body_bytes "
                               "in models.toml [server])")
        return media

    if body.parts is None and body.json_bytes <= INLINE_BYTES:
        return run()
    return await asyncio.get_running_loop().run_in_executor(None, run)


def check_media(model: Any, media: Media) -> None:
    """A 422 for media this ClefModel cannot take (images without a projector, audio without an encoder)."""
    if media.images and model.geometry is None:
        raise no_projector(model.name)
    if media.audio and not model.takes_audio:
        raise no_audio(model.name)


async def decode_for(model: Any, media: Media) -> tuple[np.ndarray, ...]:
    """The images' pixels for this ClefModel's projector (422 when it has none), decoded in a thread."""
    if not media.images:
        return ()
    check_media(model, media)
    return await asyncio.get_running_loop().run_in_executor(None, decode_all, media.images, model.geometry)


async def decode_audio_for(model: Any, media: Media, limits: AudioLimits) -> tuple[np.ndarray, ...]:
    """The audio clips' samples (422 when this ClefModel takes no audio), decoded in a thread."""
    if not media.audio:
        return ()
    check_media(model, media)
    return await asyncio.get_running_loop().run_in_executor(None, decode_audio_all, media.audio, limits)
