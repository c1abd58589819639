"""The errors of a request's media: one that cannot be used (422) and one over a limit (413), each naming it."""

from __future__ import annotations

from ...head.errors import Category, Problem, RequestInvalid


class MediaRejected(RequestInvalid):
    """A medium of the request (an image, an audio clip) cannot be used; loc names it."""

    error_type = "invalid_media"

    def __init__(self, loc: tuple[str | int, ...], msg: str = "", kind: str = "value_error",
                 problems: list[Problem] | None = None):
        self.loc = loc
        super().__init__(problems or [Problem(loc, msg, kind)])


class MediaTooLarge(MediaRejected):
    """A medium is over a configured limit (bytes, pixels, seconds): HTTP 413."""

    category = Category.TOO_LARGE
    error_type = "media_too_large"
