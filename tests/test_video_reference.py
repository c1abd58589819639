"""Videos against Cloudflare's clef-omni reference run in its own environment (tests/fixturegen_video.py: torch
2.13's index build, torchvision 0.28, transformers 5.20.2, made under .fixtures/video/oracle on first use):
the pixels the vision tower sees, the frame grids, the audio-in-video rule, the audio token counts of clips and
soundtracks, and every token's M-RoPE position (bridge/llama/omni_positions.py) equal to the reference's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from clef_bridge.bridge.llama.omni_positions import OmniTokens, rope_chunks, rope_positions
from clef_bridge.bridge.media.audio import decode as decode_audio
from clef_bridge.bridge.media.audio import sniff as sniff_audio
from clef_bridge.bridge.media.audio_tower import audio_tokens, mel_filters, request_features, request_frames
from clef_bridge.bridge.media.images import ImageGeometry
from clef_bridge.bridge.media.video import decode, patches, smart_resize, tower_frames, tower_geometry
from clef_bridge.bridge.model.video_prompt import video_prompt

from . import fixturegen_omni, fixturegen_video

pytestmark = pytest.mark.slow  # the first run builds the oracle environment (about 5 GB, minutes)

LOC = ("body", "videos", 0)
# the reference's own requests (not the one run with the processor's default fps, the mistake to catch)
CASES = {name: case for name, case in fixturegen_video.CASES.items() if case.videos and not case.media_kwargs}


@pytest.fixture(scope="module")
def fx():
    return fixturegen_video.build()


@pytest.fixture(scope="module")
def answers(fx):
    return fx.load()


@pytest.fixture(scope="module")
def decoded(fx):
    return {name: decode(path.read_bytes(), LOC) for name, path in fx.clips.items() if name in fixturegen_video.CLIPS}


@pytest.fixture(scope="module")
def tokens(fx):
    """The markup ids as the reference reads them: the tiny Qwen3-Omni's own thinker config."""
    thinker = json.loads((fixturegen_omni.build().hf_model / "config.json").read_text())[
        "thinker_config"]
    return OmniTokens(vision_start=thinker["vision_start_token_id"], image=thinker["image_token_id"],
                      video=thinker["video_token_id"], audio_start=thinker["audio_start_token_id"],
                      audio=thinker["audio_token_id"])


def _audio(fx, name: str) -> np.ndarray:
    data = fx.clips[name].read_bytes()
    return decode_audio(data, sniff_audio(data, LOC), LOC)


def test_the_oracle_ran_the_pinned_transformers(answers):
    assert answers["_versions"]["transformers"] == "5.20.2"  # 5.24 fails on sounded videos (issue 29)


@pytest.mark.parametrize("name", ["video_silent", "video_sounded", *fixturegen_video.ISSUE38])
def test_pixels_are_the_processors(fx, decoded, name):
    want = np.load(fx.arrays)[f"{name}.pixel_values_videos"]
    got = np.concatenate([patches(tower_frames(decoded[v].frames, tower_geometry(32)))
                          for v in fixturegen_video.CASES[name].videos])
    assert got.shape == want.shape
    off = np.abs(got - want)
    # upscaled frames are equal; downscaled ones differ by up to two uint8 steps (Pillow's vs torch's antialiased
    # bicubic; one step is 2/255 after normalizing) in 0.3 % of the values
    assert off.max() <= 4 / 255 + 1e-6 and (off > 1e-5).mean() < 0.01


@pytest.mark.parametrize("case", list(CASES))
def test_frame_grids_and_the_audio_in_video_rule(answers, decoded, case):
    want = answers[case]
    videos = [decoded[v] for v in CASES[case].videos]
    grids = [[len(v.frames) // 2, *(s // 16 for s in smart_resize(*v.frames.shape[1:3], tower_geometry(32)))]
             for v in videos]
    assert grids == want["video_grid_thw"]
    assert all(v.audio is not None for v in videos) == want["use_audio_in_video"]


def test_a_small_frame_is_upscaled_as_the_reference_does(decoded, answers):
    """76,800-pixel frames: the processor's 131,072-pixel floor applies (320 x 448), not the release config's
    3,136 (which would keep 256 x 320)."""
    frames = decoded["mp4_silent_small"].frames
    assert frames.shape[1] * frames.shape[2] < 131_072
    assert answers["video_silent"]["video_grid_thw"] == [[2, 20, 28]]
    assert smart_resize(*frames.shape[1:3], tower_geometry(32)) == (320, 448)
    assert smart_resize(*frames.shape[1:3], ImageGeometry(32, 3136, 12845056)) == (256, 320)


def test_a_rotated_clip_is_read_as_stored(answers, decoded):
    """A phone's portrait shot stored landscape, with a 90-degree display matrix: the reference's PyAV reads the
    rotation (so the fixture carries it), yet its load_video hands the frames over as stored, 640 wide, and so does
    ours; a bridge that applied the matrix would send 360 x 640 frames, other grids and another token count."""
    want = answers["rotated_phone"]
    assert want["video_rotation"] == [90]
    assert want["video_frames_shape"] == [list(decoded["mp4_phone_rot90"].frames.shape)] == [[4, 360, 640, 3]]
    assert want["video_grid_thw"] == [[2, 22, 40]]
    assert all(answers[c]["video_rotation"] == [0] * len(CASES[c].videos) for c in CASES if c != "rotated_phone")


def _audio_items(fx, decoded, case: str, in_video: bool) -> list[np.ndarray]:
    clips = [_audio(fx, a) for a in fixturegen_video.CASES[case].audio]
    return clips + ([decoded[v].audio for v in fixturegen_video.CASES[case].videos] if in_video else [])


@pytest.mark.parametrize("case", list(CASES))
def test_audio_frames_of_clips_and_soundtracks(fx, answers, decoded, case):
    want = answers[case]
    items = _audio_items(fx, decoded, case, want["use_audio_in_video"])
    assert request_frames([len(x) for x in items]) == want["audio_frames"]


HEARD = [c for c in fixturegen_video.ISSUE38 if fixturegen_video.CASES[c].audio
         or all(fixturegen_video.CLIPS[v].audio_codec for v in fixturegen_video.CASES[c].videos)]


@pytest.mark.parametrize("case", HEARD)
def test_audio_features_of_clips_and_soundtracks(fx, answers, decoded, case):
    """The log-mel features of every audio item (16 kHz mono PCM, 44.1 kHz stereo AAC, 48 kHz Opus, 8 kHz PCM, 5.1
    AAC, 22.05 kHz MP3 ending early), padded together as the feature extractor pads them, are the processor's."""
    want = np.load(fx.arrays)[f"{case}.input_features"]
    items = _audio_items(fx, decoded, case, answers[case]["use_audio_in_video"])
    ours = request_features(items, mel_filters(want.shape[1]))
    assert len(ours) == len(want)
    for got, ref, n in zip(ours, want, answers[case]["audio_frames"]):
        assert got.shape[1] == n and np.abs(got - ref[:, :n]).max() < 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_positions_are_the_references(fx, answers, decoded, tokens, case):
    want = answers[case]
    in_video = want["use_audio_in_video"]
    counts = audio_tokens([len(x) for x in _audio_items(fx, decoded, case, in_video)])
    spg = [decoded[v].seconds_per_grid for v in CASES[case].videos]
    got = rope_positions(want["input_ids"], want["image_grid_thw"], want["video_grid_thw"], counts, spg, in_video,
                         tokens=tokens, merge=2)
    assert np.array_equal(got, np.array(want["position_ids"]))


def test_positions_catch_the_processors_default_fps(answers, fx, decoded, tokens):
    """Passing the processor nothing (fps 1.0) gives each frame pair 2 s: the reference's fps-1 answer has other
    positions than ours, which are the fps-2 answer's (its probabilities move by under 1e-2 on the tiny model, so
    the positions are what catches it)."""
    right, wrong = answers["video_sounded"], answers["video_sounded_fps1"]
    assert right["video_second_per_grid"] == [1.0] and wrong["video_second_per_grid"] == [2.0]
    counts = audio_tokens([len(decoded["mp4_sounded_big"].audio)])
    ours = rope_positions(right["input_ids"], [], right["video_grid_thw"], counts,
                          [decoded["mp4_sounded_big"].seconds_per_grid], True, tokens=tokens, merge=2)
    assert np.array_equal(ours, np.array(right["position_ids"]))
    assert not np.array_equal(ours, np.array(wrong["position_ids"]))


def test_every_video_moves_the_references_answer(answers):
    """The fidelity cases are worth comparing: a path that ignored the video would be off by more than 1e-2."""
    text = answers["text"]["probabilities"]
    for case in CASES:
        got = answers[case]["probabilities"]
        assert max(np.abs(np.subtract(got[q], text[q])).max() for q in text) > 1e-2, case


@pytest.mark.parametrize("case", list(CASES))
def test_the_tokens_decoded_alone_are_those_the_mask_would_hide_from(fx, answers, decoded, tokens, case):
    """The tokens that llama.cpp's rule (a later temporal position, or a tie and a later row, or a later column on
    the same row) would hide an earlier token from, found pair by pair on the reference's own ids and positions, are
    the ones the bridge decodes alone with the causal mask off (rope_chunks): sound tokens of audio in video only."""
    want = answers[case]
    ids, (t, y, x) = np.array(want["input_ids"]), np.array(want["position_ids"])
    i, j = np.arange(len(ids))[:, None], np.arange(len(ids))[None, :]
    hidden = (j < i) & ((t[j] > t[i]) | ((t[j] == t[i]) & ((y[j] > y[i]) | ((y[j] == y[i]) & (x[j] > x[i])))))
    flagged = np.flatnonzero(hidden.any(1))
    spec = fixturegen_video.CASES[case]
    plan = video_prompt([decoded[v] for v in spec.videos], [_audio(fx, a) for a in spec.audio], 32, 2)
    positions = rope_positions(ids, want["image_grid_thw"], plan.grids, plan.audio_counts, plan.seconds_per_grid,
                               plan.audio_in_video, tokens=tokens, merge=2)
    rows = {tokens.image: np.zeros(((ids == tokens.image).sum(), 1), np.float32),
            tokens.video: np.zeros(((ids == tokens.video).sum(), 1), np.float32),
            tokens.audio: np.zeros(((ids == tokens.audio).sum(), 1), np.float32)}
    chunks = rope_chunks(ids, positions, rows, 1)
    starts = np.cumsum([0] + [len(c) for c in chunks])[:-1]
    assert [int(at) for at, c in zip(starts, chunks) if not c.causal] == flagged.tolist()
    assert set(ids[flagged].tolist()) <= {tokens.audio}
    assert bool(len(flagged)) == want["use_audio_in_video"]
