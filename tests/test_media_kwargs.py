"""A body's media_kwargs read as the reference's processor reads them (bridge/media/media_kwargs.py), and frame
arrays checked as they are converted (bridge/media/frames.py): no model, no server (tests/test_video_frames.py
serves both and compares with the reference)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clef_bridge.bridge.media import frames, media_kwargs
from clef_bridge.bridge.media.media_kwargs import VideoOptions, applied, check_audio_in_video, parse
from clef_bridge.bridge.media.request import VIDEO, extract
from clef_bridge.bridge.media.video import (
    DecodedVideo,
    VideoLimits,
    VideoRejected,
    VideoTooLarge,
    tower_geometry,
)
from clef_bridge.head.errors import RequestInvalid

pytestmark = pytest.mark.unit

LOC = ("body", "videos", 0)
BODY = {"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}}


def parsed(kwargs) -> tuple[VideoOptions, list]:
    problems: list = []
    return parse(kwargs, problems), [(p.loc, p.type) for p in problems]


def test_left_out_or_null_changes_nothing():
    assert parsed(None) == (VideoOptions(), []) and parsed({}) == (VideoOptions(), [])
    assert VideoOptions().fps == 2.0 and VideoOptions().audio_in_video is None


def test_videos_kwargs_replaces_the_references_whole():
    """A key left out takes the processor's default: fps 1.0, use_audio_in_video false."""
    assert parsed({"videos_kwargs": {}}) == (VideoOptions(1.0, False), [])
    assert parsed({"videos_kwargs": {"fps": None, "use_audio_in_video": None}}) == (VideoOptions(1.0, False), [])
    assert parsed({"videos_kwargs": {"do_sample_frames": False, "use_audio_in_video": True}}) == (
        VideoOptions(1.0, True), [])
    own = {"fps": 2.0, "do_sample_frames": False, "use_audio_in_video": True, "position_id_per_seconds": 13,
           "seconds_per_chunk": 2.0, "cap_pixels_per_frame": False,
           "size": {"shortest_edge": 131072, "longest_edge": 786432}}
    assert parsed({"videos_kwargs": own, "images_kwargs": media_kwargs.IMAGES}) == (VideoOptions(2.0, True), [])


@pytest.mark.parametrize("fps", [2, 1, 2 / 3, 0.5, 0.4, 2 / 60])
def test_an_fps_of_two_over_a_whole_number_is_taken(fps):
    assert parsed({"videos_kwargs": {"fps": fps}})[0].fps == fps


@pytest.mark.parametrize("fps", [4, 3, 1.5, 0.3, 2 / 61, 0, -1, True, "2"])
def test_another_fps_is_refused(fps):
    _, problems = parsed({"videos_kwargs": {"fps": fps}})
    assert [loc for loc, _ in problems] == [("body", "media_kwargs", "videos_kwargs", "fps")]


@pytest.mark.parametrize("kwargs, loc", [
    ({"fps": 1}, ("body", "media_kwargs", "fps")),
    ({"size": media_kwargs.IMAGES["size"]}, ("body", "media_kwargs", "size")),
    ({"text_kwargs": {}}, ("body", "media_kwargs", "text_kwargs")),
    ({"images_kwargs": {}}, ("body", "media_kwargs", "images_kwargs")),
    ({"videos_kwargs": []}, ("body", "media_kwargs", "videos_kwargs")),
    ({"videos_kwargs": {"num_frames": 4}}, ("body", "media_kwargs", "videos_kwargs", "num_frames")),
    ({"videos_kwargs": {"do_sample_frames": True}}, ("body", "media_kwargs", "videos_kwargs", "do_sample_frames")),
    ({"videos_kwargs": {"use_audio_in_video": "yes"}},
     ("body", "media_kwargs", "videos_kwargs", "use_audio_in_video")),
    ({"videos_kwargs": {"position_id_per_seconds": 25}},
     ("body", "media_kwargs", "videos_kwargs", "position_id_per_seconds")),
    ({"videos_kwargs": {"size": {"shortest_edge": 3136}}}, ("body", "media_kwargs", "videos_kwargs", "size")),
    ({"videos_kwargs": {"seconds_per_chunk": -1}}, ("body", "media_kwargs", "videos_kwargs", "seconds_per_chunk")),
    ([], ("body", "media_kwargs")),
])
def test_every_other_key_is_refused_where_it_is(kwargs, loc):
    assert [where for where, _ in parsed(kwargs)[1]] == [loc]


def test_every_problem_at_once_in_the_requests_422():
    body = {**BODY, "media_kwargs": {"audio_kwargs": {}, "videos_kwargs": {"fps": 3, "bogus": 1}}}
    with pytest.raises(RequestInvalid) as refused:
        extract(body)
    assert sorted(p.loc for p in refused.value.problems) == [
        ("body", "media_kwargs", "audio_kwargs"), ("body", "media_kwargs", "videos_kwargs", "bogus"),
        ("body", "media_kwargs", "videos_kwargs", "fps")]


def test_an_fps_keys_the_answer_and_reaches_the_decoded_video():
    pixels = np.arange(2 * 32 * 32 * 3, dtype=np.uint8).reshape(2, 32, 32, 3) % 251
    plain = extract({**BODY, "videos": [pixels.tolist()]}).media
    slow = extract({**BODY, "videos": [pixels.tolist()], "media_kwargs": {"videos_kwargs": {"fps": 1.0}}}).media
    assert plain.digests != slow.digests and slow.of(VIDEO)[0].fps == 1.0
    assert applied(plain.of(VIDEO), VideoOptions()) == plain.of(VIDEO)
    decoded = frames.decode(slow.of(VIDEO)[0], tower_geometry(32))  # what the decoder process runs for it
    assert decoded.fps == 1.0 and decoded.seconds_per_grid == 2.0 and decoded.audio is None
    assert decoded.frames.shape == (2, 384, 384, 3)  # 32 x 32 upscaled to the tower's 131,072 pixels at least


def test_use_audio_in_video_must_be_the_references_rule():
    silent, sounded = DecodedVideo(np.zeros((2, 2, 2, 3), np.uint8), None), DecodedVideo(
        np.zeros((2, 2, 2, 3), np.uint8), np.zeros(16000, np.float32))
    found = extract({**BODY, "videos": [[[[[1, 2, 3]]]]]}).media.of(VIDEO)
    check_audio_in_video(found, [sounded])  # not asked: the rule, whatever it gives
    for asked, decoded in ((True, [silent]), (True, [sounded, silent]), (False, [sounded])):
        with pytest.raises(VideoRejected) as refused:
            check_audio_in_video(applied(found, VideoOptions(2.0, asked)), decoded)
        assert refused.value.problems[0].loc == ("body", "media_kwargs", "videos_kwargs", "use_audio_in_video")
    check_audio_in_video(applied(found, VideoOptions(2.0, True)), [sounded, sounded])
    check_audio_in_video(applied(found, VideoOptions(2.0, False)), [sounded, silent])


# --- frame arrays ---------------------------------------------------------------------------------

def test_a_frame_array_is_uint8_frames_and_its_compact_json_counts_as_media():
    pixels = np.random.default_rng(0).integers(0, 256, (3, 5, 7, 3))
    got, chars = frames.array(pixels.tolist(), LOC, VideoLimits())
    assert got.dtype == np.uint8 and np.array_equal(got, pixels)
    assert chars == len(json.dumps(pixels.tolist(), separators=(",", ":")))
    found = extract({**BODY, "videos": [pixels.tolist()]})
    assert found.inline_chars == chars and found.media.of(VIDEO)[0].header.frames == 3


@pytest.mark.parametrize("bad, kind", [
    ([[[1, 2, 3]]], "frames_shape"), ([[[[[1, 2, 3]]]]], "frames_shape"), ([[[[1, 2, 3, 4]]]], "frames_shape"),
    ([[[[1, 2, 3]], [[1, 2, 3], [4, 5, 6]]]], "frames_shape"), ([[[]]], "frames_shape"), ([], "frames_shape"),
    ([[[[1, 2, 256]]]], "frames_range"), ([[[[1, 2, -1]]]], "frames_range"), ([[[[1, 2, 3.0]]]], "frames_type"),
    ([[[[1, False, 3]]]], "frames_type"), ([[[[True, False, True]]]], "frames_type"),
    ([[[[1, None, 3]]]], "frames_type"), ([[[[1, 2**70, 3]]]], "frames_type"), ([[[[1, {}, 3]]]], "frames_type"),
])
def test_a_malformed_frame_array_is_refused_at_its_place(bad, kind):
    with pytest.raises(VideoRejected) as refused:
        frames.array(bad, LOC, VideoLimits())
    assert not isinstance(refused.value, VideoTooLarge)
    assert [(p.loc, p.type) for p in refused.value.problems] == [(LOC, f"value_error.video.{kind}")]


def test_the_video_limits_hold_before_the_lists_are_converted():
    limits = VideoLimits(max_seconds=2.0, max_bytes=100)
    with pytest.raises(VideoTooLarge, match="max_video_seconds"):
        frames.array([[[[0, 0, 0]]]] * 5, LOC, limits)  # 5 frames: 2 s at 2 fps is 4
    with pytest.raises(VideoTooLarge, match="max_video_bytes"):
        frames.array([[[[0, 0, 0]] * 10] * 2] * 2, LOC, limits)  # 120 bytes
    with pytest.raises(VideoRejected, match="200-fold"):
        frames.array([[[[0, 0, 0]] * 201]], LOC, limits)


def test_a_frame_array_beside_a_file_is_still_a_list_of_videos():
    with pytest.raises(RequestInvalid) as refused:
        extract({**BODY, "videos": [[[[[1, 2, 3]]]], 5]})
    assert [p.loc for p in refused.value.problems] == [("body", "videos", 1)]
    assert "frame array" in refused.value.problems[0].msg
