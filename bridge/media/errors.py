"""The errors of a request's media: one that cannot be used (422) and one over a limit (413), each naming it;
and what a decoder process answers when it is stopped (decoders.py)."""

from __future__ import annotations

from typing import Any

from ...head.errors import Category, Problem, RequestInvalid


def _rebuilt(cls: type[MediaRejected], args: tuple, state: dict[str, Any]) -> MediaRejected:
    """An error as MediaRejected.__reduce__ pickled it: its fields back, without its __init__'s arguments."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def detached(error: BaseException) -> BaseException:
    """error without its traceback and the exceptions it was raised from, to be kept in a list: their frames (and
    each frame's callers) hold the list, a cycle that would keep every frame's buffers until a full collection."""
    error.__traceback__ = error.__context__ = error.__cause__ = None
    return error


class MediaRejected(RequestInvalid):
    """A medium of the request (an image, an audio clip) cannot be used; loc names it."""

    error_type = "invalid_media"

    def __init__(self, loc: tuple[str | int, ...], msg: str = "", kind: str = "value_error",
                 problems: list[Problem] | None = None):
        self.loc = loc
        super().__init__(problems or [Problem(loc, msg, kind)])

    def __reduce__(self) -> tuple:
        """Pickled by its fields (loc, problems, fix): errors cross back from a decoder process (decoders.py), and
        Exception's default would call __init__ with the message alone."""
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


class MediaTooLarge(MediaRejected):
    """A medium is over a configured limit (bytes, pixels, seconds): HTTP 413."""

    category = Category.TOO_LARGE
    error_type = "media_too_large"


class DecodeOverMemory(MediaTooLarge):
    """Decoding a request's media needed more memory than its decoder process may take (decode_memory_mb)."""

    error_type = "decode_memory_exceeded"


class DecodeOverTime(MediaRejected):
    """Decoding took longer than decode_timeout_s (decode_video_timeout_s for videos): its decoder was stopped."""

    error_type = "decode_timeout"


class DecoderStopped(MediaRejected):
    """A decoder process ended (a crash, a signal) before it answered: the request lost it, not the server."""

    error_type = "decoder_stopped"
