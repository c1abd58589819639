"""The body size a request's media allow (bridge/service finds, checks and decodes them)."""

from __future__ import annotations

from ..media.audio import AudioLimits
from ..media.images import ImageLimits


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
