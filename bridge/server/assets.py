"""The server's steps for a request's images: the body size they allow, and finding and decoding them off
the event loop where they cost (bridge/media/request.py does the work)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from ...head.schema import Limits
from ..media.images import ImageLimits
from ..media.request import Media, decode_all, extract, no_projector
from .body import BodyTooLarge
from .multipart import RequestBody


def body_limit(max_body_bytes: int, limits: ImageLimits, takes_images: bool = True) -> int:
    """The most a request body may hold: the text's max_body_bytes, plus its images (base64-inflated) where
    a served model takes images."""
    if not takes_images:
        return max_body_bytes
    return max_body_bytes + -(-limits.max_total_bytes * 4 // 3) + 4096 * limits.max_images


# --- the server's steps, off the event loop where they cost --------------------------------------

INLINE_BYTES = 64 * 1024  # smaller JSON bodies are searched for images on the event loop


async def find_images(body: RequestBody, max_body_bytes: int, limits: ImageLimits, text_limits: Limits) -> Media:
    """extract() for a read body; its text (the JSON without inlined images) must fit max_body_bytes."""
    def run() -> Media:
        media = extract(body.data, body.parts, limits, text_limits)
        if body.json_bytes - media.inline_chars > max_body_bytes:
            raise BodyTooLarge(f"the request's JSON exceeds {max_body_bytes} bytes"
                               f"{' without its images' if media.inline_chars else ''} (max_body_bytes in "
                               "models.toml [server])")
        return media

    if body.parts is None and body.json_bytes <= INLINE_BYTES:
        return run()
    return await asyncio.get_running_loop().run_in_executor(None, run)


async def decode_for(model: Any, media: Media) -> tuple[np.ndarray, ...]:
    """The images' pixels for this ClefModel's projector (422 when it has none), decoded in a thread."""
    if not media.images:
        return ()
    if model.geometry is None:
        raise no_projector(model.name)
    return await asyncio.get_running_loop().run_in_executor(None, decode_all, media.images, model.geometry)
