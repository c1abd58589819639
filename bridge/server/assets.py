"""The body size a request's media allow (bridge/service finds, checks and decodes them)."""

from __future__ import annotations

from typing import Collection

from ..config.registry import ServerSpec


def body_limit(server: ServerSpec, kinds: Collection[str]) -> int:
    """The most a request body may hold: the text's max_body_bytes, plus the media of every kind a served model
    takes (kinds: ClefModel.media of every model served), each within its limits' body_bytes."""
    limits = server.media_limits
    return server.max_body_bytes + sum(limits[kind].body_bytes for kind in sorted(set(kinds)))
