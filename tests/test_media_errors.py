"""bridge/media/errors.py: a medium that cannot be used, or is over a limit, is a validation error naming it."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.media.errors import MediaRejected, MediaTooLarge
from clef_bridge.head.errors import Problem, RequestInvalid

pytestmark = pytest.mark.unit


def test_a_rejected_medium_is_one_problem_at_its_place():
    exc = MediaRejected(("images", 2), "not an image", "value_error.image.format")
    assert isinstance(exc, RequestInvalid)
    assert exc.loc == ("images", 2)
    assert exc.problems == (Problem(("images", 2), "not an image", "value_error.image.format"),)
    assert str(exc) == "images.2: not an image"


def test_the_default_kind_is_a_value_error():
    assert MediaRejected(("audio", 0), "silent").problems[0].type == "value_error"


def test_given_problems_replace_the_single_one_and_keep_the_loc():
    many = [Problem(("audio", 0), "too long", "value_error.audio.seconds"),
            Problem(("audio", 1), "too long", "value_error.audio.seconds")]
    exc = MediaTooLarge(("audio",), problems=many)
    assert exc.problems == tuple(many) and exc.loc == ("audio",)
    assert str(exc) == "audio.0: too long; audio.1: too long"


def test_too_large_is_a_rejection_of_its_own_type():
    exc = MediaTooLarge(("images", 0), "over max_image_bytes")
    assert isinstance(exc, MediaRejected) and isinstance(exc, RequestInvalid)
    assert MediaTooLarge.error_type != MediaRejected.error_type != RequestInvalid.error_type
    assert not issubclass(MediaRejected, MediaTooLarge)


def test_unprintable_text_in_the_place_is_escaped():
    exc = MediaRejected(("images", "\ud800"), "bad")
    assert exc.problems[0].loc == ("images", "\\ud800")
    str(exc).encode("utf-8")  # serializes
