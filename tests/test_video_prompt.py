"""A request's videos as the prompt holds them (bridge/model/video_prompt.py), and the audio-in-video token layout
and positions on hand-made grids (bridge/llama/omni_positions.py); the reference's own positions are compared in
tests/test_video_reference.py."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.omni_positions import OmniTokens, interleaved, rope_chunks, rope_positions, video_temporal
from clef_bridge.bridge.media.audio_tower import audio_tokens
from clef_bridge.bridge.media.video import DecodedVideo
from clef_bridge.bridge.model.video_prompt import video_prompt

pytestmark = pytest.mark.unit

V, A, VS, AS = 151656, 151675, 151652, 151669
TOKENS = OmniTokens(vision_start=VS, image=151655, video=V, audio_start=AS, audio=A)


def video(frames: int, h: int, w: int, seconds: float | None) -> DecodedVideo:
    audio = None if seconds is None else np.zeros(round(seconds * 16000), np.float32)
    return DecodedVideo(np.zeros((frames, h, w, 3), np.uint8), audio)


def test_audio_in_video_only_when_every_video_has_a_soundtrack():
    both = video_prompt([video(4, 64, 96, 2.0), video(2, 64, 64, 1.0)], [np.zeros(8000, np.float32)], 32, 2)
    assert both.audio_in_video and len(both.audio) == 3 and both.clip_counts == tuple(audio_tokens([8000, 32000,
                                                                                                    16000])[:1])
    assert both.grids[0] == (2, 20, 28)  # 64 x 96 frames are upscaled past 131,072 pixels: 320 x 448
    one = video_prompt([video(4, 64, 96, None), video(2, 64, 64, 1.0)], [], 32, 2)
    assert not one.audio_in_video and one.audio == () and all(all(layout) for layout in one.layouts)


def test_interleaving_puts_video_first_on_ties():
    order, looped = interleaved(video_temporal(2, 1, 2, 1.0), 15)  # pairs at 0 and 13, two tokens each
    assert order.tolist() == [True, True] + [False] * 13 + [True, True] + [False] * 2
    assert looped == 17  # the last two sound tokens follow as one block


def test_positions_of_a_silent_video_and_the_fps_that_makes_them():
    ids = [1, VS] + [V] * 8 + [151653, 2]  # one video: 2 frame pairs of 2 x 2 tokens
    got = rope_positions(ids, [], [(2, 4, 4)], [], [1.0], False, tokens=TOKENS, merge=2)
    assert got[:, 2:6].tolist() == [[2] * 4, [2, 2, 3, 3], [2, 3, 2, 3]]
    assert got[0, 6] == 2 + 13  # pair 1 at 13 x seconds_per_grid 1.0 (2 fps)
    slow = rope_positions(ids, [], [(2, 4, 4)], [], [2.0], False, tokens=TOKENS, merge=2)  # the processor's default fps 1.0
    assert slow[0, 6] == 2 + 26 and not np.array_equal(slow, got)
    assert got[:, -1].tolist() == [got.max() + 0, got.max(), got.max()] and got[0, -2] == got[0, -1] - 1


def test_chunks_take_each_pad_kinds_rows_in_order():
    ids = [1, VS, AS, V, A, A, 151670, 151653, 2]
    pos = rope_positions(ids, [], [(2, 2, 2)], [2], [1.0], True, tokens=TOKENS, merge=2)
    rows = {V: np.full((1, 4), 7.0, np.float32), A: np.arange(4, dtype=np.float32).reshape(2, 2)}
    chunks = rope_chunks(ids, pos, rows, 4)
    assert [len(c) for c in chunks] == [3, 1, 2, 3]  # frame and sound rows decode apart: llama.cpp masks by position
    assert chunks[1].embd.tolist() == [[7, 7, 7, 7]] and chunks[2].embd.tolist() == [[0, 1, 0, 0], [2, 3, 0, 0]]
    assert chunks[2].pos.shape == (4, 2) and chunks[0].tokens.tolist() == [1, VS, AS]
    with pytest.raises(ValueError, match="differ"):
        rope_chunks(ids, pos, {V: rows[V], A: rows[A][:1]}, 4)


def test_a_frame_pair_costs_the_tower_less_than_the_largest_image():
    """`fit` sizes the projector's compute buffer for the largest image Clef-omni takes (1,024 tokens): every frame
    pair the reference keeps (at most about 262,144 pixels, sides at most 200-fold apart) makes fewer, so video
    frames' compute is inside what `fit` counts (their tokens are in n_ctx like any other)."""
    from clef_bridge.bridge.gguf.projector import max_image_tokens
    from clef_bridge.bridge.media.video import kept_size, smart_resize, tower_geometry

    most = 0
    for width in (16, 100, 320, 512, 640, 1280, 1920, 3840, 8192):
        for height in (16, 90, 240, 480, 720, 1080, 2160, 8192):
            if max(width, height) > 200 * min(width, height):
                continue
            w, h = kept_size(width, height)
            rows, cols = smart_resize(h, w, tower_geometry(32))
            most = max(most, rows // 32 * cols // 32)
    assert 200 < most <= 320 < max_image_tokens("qwen3vlmoe")  # 306: 8192 x 90 kept as 4884 x 54, then 4896 x 64


def prompt(plan) -> list[int]:
    """Two text tokens, the plan's one video as the encoder writes it, one text token."""
    [layout] = plan.layouts
    body = [V if is_video else A for is_video in layout]
    markup = ([VS, AS], [151670, 151653]) if plan.audio_in_video else ([VS], [151653])
    return [1, 2, *markup[0], *body, *markup[1], 7]


def alone(plan) -> list[tuple[int, int]]:
    """(token index, temporal position from the video's start) of each token rope_chunks decodes alone, mask off."""
    ids = prompt(plan)
    pos = rope_positions(ids, [], plan.grids, plan.audio_counts, plan.seconds_per_grid, plan.audio_in_video,
                         tokens=TOKENS, merge=2)
    rows = {V: np.zeros((sum(plan.layouts[0]), 4), np.float32)}
    if plan.audio_in_video:
        rows[A] = np.zeros((plan.audio_counts[0], 4), np.float32)
    chunks = rope_chunks(ids, pos, rows, 4)
    assert sum(len(c) for c in chunks) == len(ids)
    starts = np.cumsum([0] + [len(c) for c in chunks])
    out = [(int(at), int(c.pos[0, 0]) - 4) for at, c in zip(starts, chunks) if not c.causal]
    assert all(len(c) == 1 and ids[at] == A for at, c in zip(starts, chunks) if not c.causal)
    return out


def test_a_sound_token_tied_with_a_frame_pair_is_decoded_alone_seeing_the_whole_pair():
    """A 2 s clip of 320 x 448 frames (10 x 14 tokens a pair, pairs at 0 and 13) with 26 sound tokens: llama.cpp's
    mask would show sound token 0 only pair 0's token (0, 0), so it is decoded alone with the mask off (it then sees
    every cell so far, as the reference's token order lets it); sound token 13 ties pair 1 but every row of it is
    above 13: decoded with the others. Frames 16 x 9 tokens a pair: rows 14 and 15 pass 13, so sound token 13 too."""
    wide = video_prompt([video(4, 320, 448, 2.0)], [], 32, 2)
    assert wide.audio_counts == (26,)
    assert alone(wide) == [(4 + 140, 0)]  # after two text tokens, the two start marks and pair 0's 140 tokens
    tall = video_prompt([video(4, 512, 288, 2.0)], [], 32, 2)
    assert [t for _, t in alone(tall)] == [0, 13]
    assert alone(video_prompt([video(4, 320, 448, None)], [], 32, 2)) == []  # silent: positions never tie


def test_every_token_sees_exactly_the_tokens_before_it():
    """Whatever the prompt, the chunks reproduce the reference's token-order mask under llama.cpp's rule: a token
    in a causal chunk sees the cells whose order key is at most its own, those of earlier chunks and its own chunk's
    up to itself; a chunk with the mask off holds one token that sees every earlier cell."""
    from clef_bridge.bridge.llama.omni_positions import order_keys

    for plan in (video_prompt([video(6, 512, 288, 3.0)], [], 32, 2), video_prompt([video(2, 64, 64, 1.0)], [], 32, 2)):
        ids = prompt(plan)
        pos = rope_positions(ids, [], plan.grids, plan.audio_counts, plan.seconds_per_grid, True, tokens=TOKENS,
                             merge=2)
        key = order_keys(pos)
        rows = {V: np.zeros((sum(plan.layouts[0]), 4), np.float32), A: np.zeros((plan.audio_counts[0], 4), np.float32)}
        chunk_of = np.repeat(np.arange(len(c := rope_chunks(ids, pos, rows, 4))), [len(x) for x in c])
        causal = np.array([x.causal for x in c])[chunk_of]
        i, j = np.arange(len(ids))[:, None], np.arange(len(ids))[None, :]
        in_cache = chunk_of[j] <= chunk_of[i]
        sees = in_cache & np.where(causal[i], key[j] <= key[i], True)
        assert np.array_equal(sees, j <= i)
