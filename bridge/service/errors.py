"""The service's own refusals (the server's middleware gives each its status)."""

from __future__ import annotations

from ...head.errors import Category, ClefError


class BodyTooLarge(ClefError):
    category = Category.TOO_LARGE
    error_type = "request_too_large"


class DeadlineExceeded(ClefError):
    category = Category.UNAVAILABLE
    error_type = "timeout"
