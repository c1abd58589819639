"""Media kinds (head/media.py's vocabulary) as the bridge uses them: the ones a model may read, the body fields."""

from __future__ import annotations

from ...head.media import ASSETS_FIELD, AUDIO, IMAGE, MEDIA_KINDS, VIDEO, MediaKind

__all__ = ["ASSETS_FIELD", "AUDIO", "IMAGE", "MEDIA_KINDS", "VIDEO", "MediaKind", "READABLE", "FIELDS"]

READABLE = tuple(kind.name for kind in MEDIA_KINDS.values() if kind.supported)  # x_media's and an asset's values
FIELDS = tuple(kind.field for kind in MEDIA_KINDS.values()) + (ASSETS_FIELD,)  # what a body's media come in
