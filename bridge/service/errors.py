"""The service's own refusals (the server's middleware gives each its status)."""

from __future__ import annotations

from ...head.errors import ClefError


class BodyTooLarge(ClefError):
    error_type = "request_too_large"


class DeadlineExceeded(ClefError):
    error_type = "timeout"
