"""The body size a request's media allow (bridge/service finds, checks and decodes them)."""

from __future__ import annotations

from typing import Callable, Collection

from ..config.registry import ServerSpec
from ..media.request import AUDIO, IMAGE

# each kind's most bytes in one body, base64-inflated, with room for its JSON around each medium
MEDIA_BYTES: dict[str, Callable[[ServerSpec], int]] = {
    IMAGE: lambda s: -(-s.images.max_total_bytes * 4 // 3) + 4096 * s.images.max_images,
    AUDIO: lambda s: -(-s.audio.max_clips * s.audio.max_bytes * 4 // 3) + 4096 * s.audio.max_clips,
}


def body_limit(server: ServerSpec, kinds: Collection[str]) -> int:
    """The most a request body may hold: the text's max_body_bytes, plus the media of every kind a served model
    takes (kinds: ClefModel.media of every model served)."""
    return server.max_body_bytes + sum(MEDIA_BYTES[kind](server) for kind in sorted(set(kinds)))
