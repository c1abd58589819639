"""bridge/media/request.py: a body's media found as ONE Media value (kinds in prompt order, placeholders turned
into markers, each medium's sha256 once), and the one capability check."""

from __future__ import annotations

import base64
import hashlib

import pytest
from clef_bridge.bridge.media.request import (
    AUDIO,
    IMAGE,
    NO_MEDIA,
    VIDEO,
    extract,
    named_kinds,
    refuse_unsupported,
)
from clef_bridge.head.errors import RequestInvalid

from .fixturegen_vision import encoded, picture
from .omni_cases import tone, wav

pytestmark = pytest.mark.unit

PNG = encoded(picture(48, 32, seed=5), "PNG")
WAV = wav(tone(0.5, 2))
QUESTIONS = {"q": {"type": "noul", "instructions": "Urgent?"}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_an_image_and_a_clip_become_one_value_with_their_markers_and_digests():
    body = {"model": "m", "questions": QUESTIONS, "state": {"call": "<voice>", "photo": "<pic>"},
            "assets": {"<pic>": {"type": "image", "format": "png", "data_base64": b64(PNG)},
                       "<voice>": {"type": "audio", "format": "wav", "data_base64": b64(WAV)}}}
    found = extract(body)
    assert found.body["state"] == {"call": "[audio 1]", "photo": "[image 1]"} and "assets" not in found.body
    media = found.media
    assert media.kinds == (IMAGE, AUDIO) and media.images[0].data == PNG and media.audio[0].data == WAV
    # each medium's digest once, a kind's name between kinds: the same bytes never key as another kind
    assert media.digests == (hashlib.sha256(PNG).digest(), b"audio", hashlib.sha256(WAV).digest())
    assert found.inline_chars == len(b64(PNG)) + len(b64(WAV))


def test_a_body_without_media_is_left_as_it_is():
    body = {"model": "m", "state": "no media here", "questions": QUESTIONS}
    found = extract(body)
    assert found.body == body and found.media == NO_MEDIA and not found.media and found.inline_chars == 0


def test_decoded_media_keep_the_digests_of_their_bytes():
    found = extract({"model": "m", "state": "s", "questions": QUESTIONS, "images": [b64(PNG)]})
    decoded = found.media.decoded({IMAGE: ("pixels",)})
    assert decoded.images == ("pixels",) and decoded.digests == found.media.digests


@pytest.mark.parametrize("takes, refused", [((), "images_not_supported"), ((IMAGE,), "audio_not_supported"),
                                            ((IMAGE, AUDIO), None)])
def test_the_first_kind_the_model_cannot_take_is_refused_naming_the_model(takes, refused):
    kinds = named_kinds({"audio": ["a"], "images": ["i"]})
    if refused is None:
        refuse_unsupported(kinds, takes, "clef")
        return
    with pytest.raises(RequestInvalid) as e:
        refuse_unsupported(kinds, takes, "clef")
    [problem] = e.value.problems
    assert problem.type == refused and "'clef'" in problem.msg


@pytest.mark.parametrize("body, kinds", [
    ({"videos": ["v"], "images": ["i"]}, (IMAGE, VIDEO)),  # in the prompt's order of kinds
    ({"assets": {"<a>": {"type": "audio"}, "<b>": {}, "<c>": {"type": None}}}, (IMAGE, AUDIO)),  # no type: an image
    ({"assets": {"<a>": {"type": "gif"}, "<b>": "not an object"}, "images": []}, ()),  # extract() refuses those
    ({"audio": "not a list"}, (AUDIO,)),  # named: a model without audio refuses it before its shape is read
    ("not an object", ()),
])
def test_named_kinds_are_read_from_the_fields_alone(body, kinds):
    assert named_kinds(body) == kinds


def test_a_video_is_refused_by_a_model_without_video():
    with pytest.raises(RequestInvalid) as e:
        refuse_unsupported((VIDEO,), (IMAGE, AUDIO), "clef-flash")
    assert [p.loc for p in e.value.problems] == [("body", "videos")] and "Clef-omni" in e.value.problems[0].msg
