"""The media a request may carry, as words: each kind's name, its body field and its refusal. The catalogue
(bridge/catalogue) builds on these; head/ needs them to refuse media on its text-only path."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaKind:
    """One medium: `name` is also an asset's `type` and the word of its prompt marker ([image 1])."""

    name: str
    field: str  # the body's list of them (the reference's and Workers AI's shape)
    supported: bool  # some model here reads it

    @property
    def error_type(self) -> str:
        """The problem type of a request whose model cannot take this medium."""
        return f"{self.field}_not_supported"


IMAGE = MediaKind("image", "images", True)
AUDIO = MediaKind("audio", "audio", True)
VIDEO = MediaKind("video", "videos", True)
MEDIA_KINDS = {kind.name: kind for kind in (IMAGE, AUDIO, VIDEO)}
ASSETS_FIELD = "assets"  # placeholder -> medium of any kind, its `type` naming the kind
